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

from .digest import sha256_file
from .environment import TARGET_PLATFORM, TARGET_PYTHON, Environment
from .errors import OverlayError
from .progress import step

#: In the index of a stand-in-torch build: what the MaxText form of the install needs.
STANDIN_OVERRIDES = "torch-standin-overrides.txt"


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


def resolve_closure(index_dir: pathlib.Path, requirement: str, python: str, env: Environment) -> str:
    """`uv pip compile` of the overlay for the target, together with the
    MaxText environment (its overrides file as constraints) and the
    closure's torch: the pinned closure."""
    with tempfile.TemporaryDirectory(prefix="mrl-resolve-") as tmp:
        constraints = pathlib.Path(tmp) / "constraints.txt"
        constraints.write_text("".join(f"{line}\n" for line in (*env.constraints, *env.torch.requirements)))
        cmd = [
            "uv", "pip", "compile", "-", "--quiet", "--no-header", "--no-annotate", "--generate-hashes",
            "--find-links", str(index_dir), "--python-version", TARGET_PYTHON,
            "--python-platform", TARGET_PLATFORM, "--python", python, "-c", str(constraints),
        ]
        for link in env.torch.find_links:
            cmd += ["--find-links", link]
        if env.overrides:
            overrides = pathlib.Path(tmp) / "overrides.txt"
            overrides.write_text("".join(f"{line}\n" for line in env.overrides))
            cmd += ["--override", str(overrides)]
        with step("constraints", f"resolving the closure of {requirement} for Python {TARGET_PYTHON} on {TARGET_PLATFORM}"):
            proc = subprocess.run(cmd, input=requirement + "\n", capture_output=True, text=True, env=dict(os.environ, UV_PYTHON_DOWNLOADS="never"))
    if proc.returncode != 0:
        raise OverlayError("resolving the stack's closure failed (uv pip compile):\n    " + "\n    ".join(proc.stderr.strip().splitlines()[-20:]))
    pinned = {canonicalize_name(line.split("==", 1)[0]): line.split("==", 1)[1].split()[0] for line in proc.stdout.splitlines() if "==" in line and line[:1] not in " \t#"}
    for name, want in (("torch", env.torch.version), ("torchvision", env.torch.torchvision)):
        if pinned.get(name) != want:
            raise OverlayError(f"the closure pins {name} {pinned.get(name, 'not at all')}, not {want}, the torch vLLM is built against; check the pins' requirement overrides.")
    return proc.stdout


def constraints_text(closure: str, overlay_wheels: dict[str, str], find_links: str, *, notes: list[str], env: Environment, location: str = "") -> str:
    """constraints.txt: the index lines, then every pin; an overlay wheel's
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
    install = f"uv pip install -c {location}constraints.txt"
    header = [
        "# maxtext-rl-overlay constraints: generated by scripts/build-wheels.sh; do not edit.",
        *(f"# {note}" for note in notes),
        f"# Install with:  {install} maxtext-rl-overlay",
        f"#   with MaxText: {install}{' --override ' + find_links.rstrip('/') + '/' + STANDIN_OVERRIDES if env.overrides else ''} \"maxtext-rl-overlay[{env.extra}]\"   ({env.maxtext})",
        f"# Resolved for Python {TARGET_PYTHON} on {TARGET_PLATFORM} (a TPU VM), with {env.maxtext}",
        f"# under its {env.constraints_origin.split(':', 1)[1]} ({env.constraints_origin.split(':', 1)[0]}).",
        f"--find-links {find_links}",
        *(f"--find-links {link}" for link in env.torch.find_links),
    ]
    return "\n".join(header) + "\n" + "".join(out)


def overrides_text(env: Environment) -> str:
    """The stand-in torch's overrides file: MaxText's `torch==X+cpu`
    requirements replaced by PyPI's build of X (uv pip install --override)."""
    return (
        "# maxtext-rl-overlay: STAND-IN overrides, generated by scripts/build-wheels.sh; do not edit.\n"
        f"# {env.torch.describe()}.\n"
        f"# MaxText asks for torch=={env.torch.wanted} and torchvision=={env.torch.torchvision_wanted}; these replace them.\n"
        + "".join(f"{line}\n" for line in env.overrides)
    )


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
