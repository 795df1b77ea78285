"""Stage 4: the package index over the wheels, and constraints.txt.

The index is a flat find-links page (index.html with #sha256= fragments, and
SHA256SUMS) and a PEP 503 simple/ tree over the same wheels; every link in
them is relative, so the folder served as it is by any static HTTP server is
a complete release. constraints.txt points uv at it, pins every overlay wheel
with `==` and `--hash`, and pins the closure the stack needs on a TPU VM,
resolved for the target platform, so that `uv pip install -c constraints.txt
maxtext-rl-overlay` can only take our builds of the patched distributions."""

from __future__ import annotations

import email.parser
import html
import os
import pathlib
import shutil
import subprocess
import tempfile
import urllib.parse
import zipfile

from packaging.utils import canonicalize_name, parse_wheel_filename

from .errors import OverlayError
from .manifest import sha256_file
from .progress import step

#: What the stack runs on: a TPU VM (x86_64 Linux, Python 3.12).
TARGET_PYTHON = "3.12"
TARGET_PLATFORM = "x86_64-manylinux_2_31"


def write_index(index_dir: pathlib.Path) -> dict[str, str]:
    """index.html and SHA256SUMS over the wheels in `index_dir`; returns
    {wheel file name: sha256}."""
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


def resolve_closure(index_dir: pathlib.Path, requirement: str, python: str) -> str:
    """`uv pip compile` of the overlay for the target: the pinned closure."""
    with step("constraints", f"resolving the closure of {requirement} for Python {TARGET_PYTHON} on {TARGET_PLATFORM}"):
        proc = subprocess.run(
            [
                "uv", "pip", "compile", "-", "--quiet", "--no-header", "--no-annotate", "--generate-hashes",
                "--find-links", str(index_dir), "--python-version", TARGET_PYTHON,
                "--python-platform", TARGET_PLATFORM, "--python", python,
            ],
            input=requirement + "\n",
            capture_output=True,
            text=True,
            env=dict(os.environ, UV_PYTHON_DOWNLOADS="never"),
        )
    if proc.returncode != 0:
        raise OverlayError("resolving the stack's closure failed (uv pip compile):\n    " + "\n    ".join(proc.stderr.strip().splitlines()[-20:]))
    return proc.stdout


def constraints_text(closure: str, overlay_wheels: dict[str, str], find_links: str, *, note: str, location: str = "") -> str:
    """constraints.txt: the index line, then every pin; an overlay wheel's
    line carries exactly its own sha256, whatever the resolver printed."""
    ours = {}
    for name, sha in overlay_wheels.items():
        dist, version, _, _ = parse_wheel_filename(name)
        ours[canonicalize_name(dist)] = f"{dist}=={version} \\\n    --hash=sha256:{sha}\n"
    blocks, current = [], ""
    for line in closure.splitlines(keepends=True):
        if line[:1] not in (" ", "\t") and current:
            blocks.append(current)
            current = ""
        current += line
    if current:
        blocks.append(current)
    out = []
    for block in blocks:
        name = canonicalize_name(block.split("==", 1)[0].strip())
        out.append(ours.pop(name, block))
    if ours:
        raise OverlayError(f"the resolved closure lacks overlay wheels {', '.join(sorted(ours))}: they would not be pinned.")
    header = (
        "# maxtext-rl-overlay constraints: generated by scripts/build-wheels.sh; do not edit.\n"
        f"# {note}\n"
        f"# Install with:  uv pip install -c {location}constraints.txt maxtext-rl-overlay\n"
        f"# Resolved for Python {TARGET_PYTHON} on {TARGET_PLATFORM} (a TPU VM).\n"
        f"--find-links {find_links}\n"
    )
    return header + "".join(out)


def replace_dir(staging: pathlib.Path, dest: pathlib.Path) -> None:
    """Put `staging` where `dest` is, so a reader sees the old or the new
    index, never a mix (two renames; the old one is removed last)."""
    old = None
    if dest.exists():
        old = pathlib.Path(tempfile.mkdtemp(prefix=dest.name + ".old-", dir=dest.parent))
        os.replace(dest, old / "x")
    os.replace(staging, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_atomically(path: pathlib.Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def local_view(index_dir: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    """The constraints file to install `index_dir`'s own wheels with. A build
    with --base-url names its index by the URL it will be published at, which
    does not serve these wheels yet (and must not be what a test of them
    installs from): then `dest` gets links to the wheels and a copy of the
    constraints naming "." instead. Returns the constraints file to use."""
    constraints = index_dir / "constraints.txt"
    text = constraints.read_text()
    local = "".join("--find-links .\n" if line.startswith("--find-links ") and "://" in line else line for line in text.splitlines(keepends=True))
    if local == text:
        return constraints
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for wheel in sorted(index_dir.glob("*.whl")):
        (dest / wheel.name).symlink_to(wheel.resolve())
    (dest / "constraints.txt").write_text(local)
    return dest / "constraints.txt"
