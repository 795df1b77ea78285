"""Stage 4, the index: the pages over the built wheels.

The index is a flat find-links page (index.html with #sha256= fragments, and
SHA256SUMS) and a PEP 503 simple/ tree over the same wheels; every link in
them is relative, so the folder served as it is by any static HTTP server is
a complete release (scripts/publish-pages.sh publishes it). Its
constraints.txt (constraintsfile.py) points uv at it."""

from __future__ import annotations

import email.parser
import html
import pathlib
import shutil
import urllib.parse
import zipfile

from packaging.utils import canonicalize_name, parse_wheel_filename

from ..core.digest import sha256_file
from ..core.errors import OverlayError

#: In the index of a stand-in-torch build: what the MaxText form of the install needs.
STANDIN_OVERRIDES = "torch-standin-overrides.txt"
#: In every index the tool makes: what says that a build may replace the folder (and nothing else it finds).
INDEX_MARKER = ".maxtext-rl-overlay-index"
_MARKER_TEXT = ("This folder is an index made by `maxtext-rl-overlay build`; the next build to it replaces it whole.\n"
                "Keep nothing else here. A build refuses to replace a non-empty folder without this file.\n")


def write_index(index_dir: pathlib.Path) -> dict[str, str]:
    """index.html and SHA256SUMS over the wheels in `index_dir`, and the
    INDEX_MARKER; returns {wheel file name: sha256}."""
    (index_dir / INDEX_MARKER).write_text(_MARKER_TEXT)
    sums = {w.name: sha256_file(w) for w in sorted(index_dir.glob("*.whl"))}
    links = "\n".join(f'    <a href="{_href(n)}#sha256={s}">{html.escape(n)}</a><br>' for n, s in sums.items())
    (index_dir / "index.html").write_text(
        "<!DOCTYPE html>\n<html>\n  <head><meta charset=\"utf-8\"><title>maxtext-rl-overlay wheels</title></head>\n"
        f"  <body>\n{links}\n  </body>\n</html>\n"
    )
    (index_dir / "SHA256SUMS").write_text("".join(f"{s}  {n}\n" for n, s in sums.items()))
    return sums


def _href(wheel_name: str, prefix: str = "") -> str:
    """A relative link to a wheel: "+" (local versions) percent-encoded, as
    some static hosts read a literal "+" in a path as a space."""
    return html.escape(prefix + urllib.parse.quote(wheel_name))


def write_simple(index_dir: pathlib.Path, sums: dict[str, str]) -> None:
    """The PEP 503 tree beside the flat index: simple/index.html lists the
    projects, simple/<normalized name>/index.html links (relatively) to that
    project's wheels in `index_dir` with their sha256 and Requires-Python."""
    by_project: dict[str, list[str]] = {}
    for name in sorted(sums):
        by_project.setdefault(canonicalize_name(parse_wheel_filename(name)[0]), []).append(name)
    head = '<!DOCTYPE html>\n<html>\n  <head><meta charset="utf-8"><meta name="pypi:repository-version" content="1.0"><title>{}</title></head>\n  <body>\n'
    tail = "  </body>\n</html>\n"
    simple = index_dir / "simple"
    simple.mkdir()
    rows = "".join(f'    <a href="{p}/">{p}</a><br>\n' for p in sorted(by_project))
    (simple / "index.html").write_text(head.format("Simple index") + rows + tail)
    for project, names in by_project.items():
        rows = ""
        for name in names:
            requires = _requires_python(index_dir / name)
            attr = f' data-requires-python="{html.escape(requires)}"' if requires else ""
            rows += f'    <a href="{_href(name, "../../")}#sha256={sums[name]}"{attr}>{html.escape(name)}</a><br>\n'
        (simple / project).mkdir()
        (simple / project / "index.html").write_text(head.format(f"Links for {project}") + rows + tail)


def _requires_python(wheel: pathlib.Path) -> str | None:
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA"))
        return email.parser.HeaderParser().parsestr(zf.read(meta).decode("utf-8"))["Requires-Python"]


def base_url(url: str) -> str:
    """--base-url: the http(s) URL the index folder will be served at, with
    one trailing slash (the folder, not a page in it)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment or any(c.isspace() for c in url):
        raise OverlayError(
            f"--base-url {url!r}: expected the http(s) URL of the folder the index will be served from, "
            "for example https://OWNER.github.io/maxtext-rl-overlay/v0.1.0/"
        )
    return url.rstrip("/") + "/"


def local_view(index_dir: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """The constraints file to install `index_dir`'s own wheels with. A build
    with --base-url names its index by the URL it will be published at, which
    does not serve these wheels yet (and must not be what a test of them
    installs from): then `dest` gets links to the wheels and a copy of the
    constraints naming "." instead (the first --find-links line is the
    index's own; the others, torch's, stay). Returns the constraints file to use."""
    constraints = index_dir / "constraints.txt"
    lines = constraints.read_text().splitlines(keepends=True)
    first = next((i for i, line in enumerate(lines) if line.startswith("--find-links ")), None)
    if first is None or "://" not in lines[first]:
        return constraints
    lines[first] = "--find-links .\n"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for item in sorted(index_dir.iterdir()):  # the wheels and the stand-in overrides file
        if item.is_file() and item.name != "constraints.txt":
            (dest / item.name).symlink_to(item.resolve())
    local = "".join(lines)
    (dest / "constraints.txt").write_text(local)
    return dest / "constraints.txt"
