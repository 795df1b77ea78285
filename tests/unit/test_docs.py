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


#: The project's own issues, cited as a reason ("issue 61", "#61"): a page
#: says its reason itself. An upstream's issue or pull request is cited with
#: its repository or commit just before it ("tpu-inference #1386",
#: "995930220 (#3336)", "upstream #3423", "jax issue #37830").
ISSUE = re.compile(r"\bissues?\s+#?\d+|(?<![\w&/])#\d+\b", re.IGNORECASE)
UPSTREAM_BEFORE = re.compile(r"(?:\bjax|\bflax|\btunix|tpu-inference|\bvllm|\bmaxtext|\bupstream|\b[0-9a-f]{7,40})(?:'s)?\s*\(?\s*$",
                             re.IGNORECASE)
#: How the project came to a result rather than the result: its development's
#: numbered sessions ("the eleventh session", "a later session", "over the
#: four sessions", "the session's …"), their chip-time budgets, machines
#: handed or taken back, and one remote runner's output folder. A process's
#: session ("engines run in sessions of their own") or pytest's ("for the
#: whole session") is never counted or ordered, so it is not caught.
_ORDER = (r"first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|\w+teenth|\w+tieth|\d+(?:st|nd|rd|th)"
          r"|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|several|later|earlier|next|previous|last|another|this|that")
NARRATIVE = re.compile(rf"\b(?:{_ORDER})\s+(?:(?:chip|v5e|TPU|hardware|development)\s+)?sessions?\b|\bsessions?'s?(?=\s)|\bchip time\b"
                       r"|\b1800 s\b|\b(?:handed|taken|went) back\b|\$OUT\b", re.IGNORECASE)


def narratives(text: str) -> list[str]:
    """The issue references and development narratives in a page's prose."""
    found = []
    for line in _prose(text).splitlines():
        found += [m.group(0) for m in ISSUE.finditer(line) if not UPSTREAM_BEFORE.search(line[:m.start()])]
        found += [m.group(0) for m in NARRATIVE.finditer(line)]
    return found


@pytest.mark.parametrize("path", [ROOT / "README.md", *PAGES], ids=lambda p: str(p.relative_to(ROOT)))
def test_the_docs_are_references_not_a_log(path):
    """A page says what works, at which commit, and how to run it: not the
    project's issue numbers, nor how a development session got there."""
    found = narratives(path.read_text())
    assert not found, f"{path.relative_to(ROOT)}: {found}"


def test_the_narrative_check_catches_what_it_is_for():
    caught = ["the steady state issue 61 asked about", "a step run again (#12)", "The eleventh session: both configurations",
              "A later session, the same host", "over the four sessions", "of the session's 1800 s", "25 minutes of chip time",
              "the machine handed back", "copied into `$OUT`"]
    assert [bool(narratives(line)) for line in caught] == [True] * (len(caught) - 1) + [False], "code spans are not prose"
    assert narratives("copied into $OUT") == ["$OUT"]
    kept = ["tpu-inference #1386 made every rollout greedy", "tpu-inference 995930220 (#3336): the Mamba allocators",
            "upstream #3423", "jax issue #37830", "engines run in sessions of their own", "active for the whole session",
            "[the form](#the-maxtext-form)", "the K-th run, `NAME#2`"]
    assert [narratives(line) for line in kept] == [[]] * len(kept)


#: docs/hardware.md's reference part ends here: every table above it is a
#: results table, each row a result a reader looks up by its commit and date.
DETAILS = "## The runs in detail"
COMMIT = re.compile(r"\b[0-9a-f]{7,40}\b")
DATE = re.compile(r"20\d\d-[01]\d-[0-3]\d")


def tables(text: str) -> list[tuple[int, list[list[str]]]]:
    """Each Markdown table of the text's prose: its first line's number and
    its rows' cells (the separator row dropped; code spans blanked, so a `|`
    in code does not split a cell)."""
    found: list[tuple[int, list[list[str]]]] = []
    previous = False
    for number, line in enumerate(_prose(text).splitlines(), 1):
        row = line.startswith("|")
        if row and not re.fullmatch(r"\|(\s*:?-+:?\s*\|)+", line):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if previous:
                found[-1][1].append(cells)
            else:
                found.append((number, [cells]))
        previous = row
    return found


def hardware_results(text: str) -> list[str]:
    """What is wrong with docs/hardware.md's results tables: a row without a
    commit or a date, a table without those columns, or none in the first
    screen."""
    head, found, _ = text.partition(DETAILS)
    if not found:
        return [f"no {DETAILS!r} heading"]
    results = tables(head)
    if not results or results[0][0] > 40:
        return ["no results table in the first 40 lines"]
    wrong = []
    for first, (header, *rows) in results:
        if not {"commit", "date"} <= set(header):
            wrong.append(f"line {first}: a table without commit and date columns: {header}")
            continue
        commit, date = header.index("commit"), header.index("date")
        wrong += [f"a row without a commit and a date: {row[0]}" for row in rows
                  if len(row) != len(header) or not COMMIT.search(row[commit]) or not DATE.fullmatch(row[date])]
    if "command" not in results[0][1][0]:
        wrong.append("the first results table has no command column")
    return wrong


def test_every_hardware_result_says_its_commit_and_date():
    text = (ROOT / "docs" / "hardware.md").read_text()
    assert hardware_results(text) == []
    # The check itself: a row that lost its commit, or its date, is named.
    row = next(line for line in text.splitlines() if line.startswith("| install, the plain form |"))
    assert "| 161aebd | 2026-12-05 |" in row
    for bad in (row.replace("161aebd", "main"), row.replace("2026-12-05", "December")):
        assert hardware_results(text.replace(row, bad)) == ["a row without a commit and a date: install, the plain form"]
