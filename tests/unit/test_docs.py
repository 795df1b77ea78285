"""The README and its pages under docs/: every relative link resolves (the
file, and a `#anchor` to a heading of it), every page is linked from the
README and links back, and docs/layout.md names what the checkout holds."""

from __future__ import annotations

import pathlib
import re

import pytest

from support import ROOT

PAGES = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text outside fenced and indented code blocks, inline code spans blanked."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced or line.startswith("    "):
            continue
        lines.append(re.sub(r"`[^`]*`", "``", line))
    return "\n".join(lines)


def anchors(path: pathlib.Path) -> set[str]:
    """GitHub's ids of a Markdown file's headings: lower case, punctuation
    dropped, spaces to hyphens, a repeat numbered -1, -2..."""
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        heading = None if fenced else re.match(r"#{1,6} (.+?)\s*#*\s*$", line)
        if heading is None:
            continue
        slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def test_anchors_are_githubs():
    readme = anchors(ROOT / "README.md")
    assert {"install-on-a-tpu-vm-python-312", "for-maxtext-users", "multi-host-pathways-on-xpk", "for-maintainers", "test"} <= readme


@pytest.mark.parametrize("path", [ROOT / "README.md", *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    links = LINK.findall(_prose(path.read_text()))
    assert links, f"{path.name} links nowhere"
    broken = []
    for link in links:
        if re.match(r"[a-z][a-z0-9+.-]*:", link):
            continue  # an absolute URL: not checked offline
        target, _, anchor = link.partition("#")
        file = (path.parent / target).resolve() if target else path
        if not file.exists():
            broken.append(f"{link}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{link}: no heading #{anchor} in {file.relative_to(ROOT)}")
    assert not broken, f"{path.relative_to(ROOT)}: {broken}"


def test_every_page_is_linked_from_the_readme_and_links_back():
    assert PAGES, "docs/ holds the README's detail"
    readme = {link.split("#")[0] for link in LINK.findall((ROOT / "README.md").read_text())}
    for page in PAGES:
        assert f"docs/{page.name}" in readme, f"README.md does not link docs/{page.name}"
        assert "](../README.md" in page.read_text(), f"docs/{page.name} does not link back to README.md"


#: The package's folders that docs/layout.md describes by concern, not module by module.
BY_CONCERN = {"rebase", "smoke"}


def test_the_layout_names_every_module_and_script():
    """docs/layout.md stays in step with the code: each folder of
    maxtext_rl_overlay and each module in it (but those of the folders it
    describes by concern), each script and each top-level folder of the
    project is named there."""
    layout = (ROOT / "docs" / "layout.md").read_text()
    package = ROOT / "overlay" / "maxtext_rl_overlay"
    names = {p.stem for p in [*package.glob("*.py"), *package.glob("*/*.py")]
             if p.stem != "__init__" and p.parent.name not in BY_CONCERN}
    names |= {f"{p.name}/" for p in package.iterdir() if p.is_dir() and p.name != "__pycache__"}
    scripts = {p.name for p in (ROOT / "scripts").iterdir() if p.is_file() and not p.name.startswith("bench-")}
    folders = {"patches/", "overlay/", "scripts/", "tests/", "image/", "docs/"}
    missing = sorted(n for n in names | scripts | folders if not re.search(rf"(?<![\w.-]){re.escape(n)}(?![\w-])", layout))
    assert not missing, f"docs/layout.md does not name {missing}"
