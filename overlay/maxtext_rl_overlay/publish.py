"""Stage 4: the package index over the wheels, and constraints.txt.

The index is a flat find-links page (index.html with #sha256= fragments, and
SHA256SUMS) and a PEP 503 simple/ tree over the same wheels; every link in
them is relative, so the folder served as it is by any static HTTP server is
a complete release. constraints.txt points uv at it, pins every overlay wheel
with `==` and `--hash`, and pins the closure the stack needs on a TPU VM,
resolved for the target platform, so that `uv pip install -c constraints.txt
maxtext-rl-overlay` can only take our builds of the patched distributions.

Resolving the closure is the slowest step of a rebuild whose inputs did not
change, so its answer is cached (<cache>/closures/<key>.json), keyed by
everything the resolver is given: the requirement, the name and sha256 of
every file in the index folder, the MaxText constraints, torch's requirements
and find-links, the overrides, the target Python and platform, the resolver
interpreter, the uv version, the resolver's flags, and uv's own settings
(UV_* variables, uv.toml files, [tool.uv] tables). What the key cannot cover
is the registry: an unpinned dependency may get a new release on PyPI, so a
cached answer is what the same inputs resolved to when it was made. It is
reused for at most MRL_CLOSURE_MAX_AGE seconds (a day by default: the first
build of a day resolves afresh), MRL_REFRESH=1 resolves afresh whatever its
age, deleting the folder clears it, and the build output says when a cached
resolution was used. The torch pin check runs on every answer, cached or not.

A fresh resolution prefers the versions the project's committed
constraints.txt pins (uv pip compile keeps the pins of an existing output
file unless the inputs rule them out), so that resolving again, in CI or
on another day, gives the same closure rather than whatever the registry
lists that minute (a freshly released package can be listed by one request
and missing from the next). The build says how many pins it kept and which
moved; deleting the committed file resolves from scratch.

Its header also records a digest of every input it was made from
(input_digests: the overlay's own files, each pin and series), and
stale_constraints recomputes them from a checkout, offline: tests/unit fails
on a committed file that the checkout no longer builds, with the command that
makes it again."""

from __future__ import annotations

import email.parser
import hashlib
import html
import json
import os
import pathlib
import re
import shlex
import shutil
import time
import urllib.parse
import zipfile
from collections.abc import Iterable, Mapping
from typing import Any

from packaging.utils import canonicalize_name, parse_wheel_filename

from . import buildcache, buildenv, options, overlayfiles, proc, sources
from .digest import sha256_file
from .environment import TARGET_PLATFORM, TARGET_PYTHON, Environment
from .errors import OverlayError
from .pins import Project
from .progress import step
from .staging import scratch_dir, write_atomically

#: In the index of a stand-in-torch build: what the MaxText form of the install needs.
STANDIN_OVERRIDES = "torch-standin-overrides.txt"
#: In every index the tool makes: what says that a build may replace the folder (and nothing else it finds).
INDEX_MARKER = ".maxtext-rl-overlay-index"
_MARKER_TEXT = ("This folder is an index made by `maxtext-rl-overlay build`; the next build to it replaces it whole.\n"
                "Keep nothing else here. A build refuses to replace a non-empty folder without this file.\n")

#: The resolver's flags (besides the inputs' files), part of the cache key.
#: Its annotations (`# via ...`: why each package is in the closure) are kept.
COMPILE_FLAGS = ("--quiet", "--no-header", "--generate-hashes")
#: Bump when the cache entry's layout or the key's meaning changes.
CLOSURE_CACHE_FORMAT = 2
#: The oldest uv that checks the `--hash` lines of a `-c` file by default,
#: measured with PyPI's uv releases (a tampered hash in -c, a find-links
#: wheel): 0.5.2 and older install the wheel anyway; 0.4.6 to 0.5.2 check it
#: only with --verify-hashes (uv#7093 read hashes from constraints in 0.4.6;
#: verification became the default in 0.5.3); 0.5.3 and later refuse it.
UV_CHECKS_CONSTRAINT_HASHES = "0.5.3"


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


def resolve_closure(index_dir: pathlib.Path, requirement: str, python: str, env: Environment, *, cache: pathlib.Path | None = None,
                    preferences: pathlib.Path | None = None) -> str:
    """`uv pip compile` of the overlay for the target, together with the
    MaxText environment (its overrides file as constraints) and the
    closure's torch: the pinned closure. A cached answer for the same inputs
    is reused; a fresh one prefers the versions pinned in `preferences`, the
    committed constraints.txt (see the module's docstring)."""
    preferred = _preferred_pins(preferences, index_dir) if preferences is not None else {}
    key, inputs = closure_key(index_dir, requirement, python, env, preferred)
    entry = (cache or sources.cache_root()) / "closures" / f"{key}.json"
    settings = options.settings()
    # Under the entry's lock: a concurrent build of the same closure waits, then reuses it.
    with buildcache.locked(entry, who="constraints"):
        return _resolve_closure(index_dir, requirement, python, env, entry, key, inputs, settings.refresh, settings.closure_max_age,
                                preferred, preferences)


def _resolve_closure(index_dir: pathlib.Path, requirement: str, python: str, env: Environment, entry: pathlib.Path, key: str,
                     inputs: dict[str, Any], refresh: bool, max_age: float, preferred: dict[str, str],
                     preferences: pathlib.Path | None) -> str:
    cached = None if refresh else _cached_closure(entry, key, max_age)
    if cached is not None:
        closure, age = cached
        step.note("constraints", f"closure unchanged: reusing the resolution of {key[:12]} (resolved {_age(age)} ago; "
                                 "MRL_REFRESH=1 resolves afresh)")
    else:
        if preferred and preferences is not None:
            step.note("constraints", f"preferring the {len(preferred)} versions pinned in {preferences.name} (uv keeps each one the inputs "
                                     f"allow; delete {preferences.name} to resolve from scratch)")
        closure = _compile(index_dir, requirement, python, env, preferred)
        if preferred:
            step.note("constraints", _preference_report(preferred, _pins(closure)))
    pinned = _pins(closure)
    for name, want in (("torch", env.torch.version), ("torchvision", env.torch.torchvision)):
        if pinned.get(name) != want:
            raise OverlayError(f"the closure pins {name} {pinned.get(name, 'not at all')}, not {want}, the torch vLLM is built "
                               "against; check the pins' requirement overrides.")
    if cached is None:
        _store_closure(entry, key, inputs, closure)
    return closure


def _pins(text: str) -> dict[str, str]:
    """{name: version} of the `name==version` lines of a requirements file."""
    return {canonicalize_name(line.split("==", 1)[0]): line.split("==", 1)[1].split()[0].rstrip("\\")
            for line in text.splitlines() if "==" in line and line[:1] not in " \t#-"}


def _preferred_pins(path: pathlib.Path, index_dir: pathlib.Path) -> dict[str, str]:
    """The versions a constraints file pins, but for the overlay's own
    builds (the index under resolution has them, at their new versions)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    ours = {canonicalize_name(parse_wheel_filename(w.name)[0]) for w in index_dir.glob("*.whl")}
    return {name: version for name, version in sorted(_pins(text).items()) if name not in ours}


def _preference_report(preferred: dict[str, str], got: dict[str, str]) -> str:
    moved = [f"{n} {v} -> {got[n]}" for n, v in preferred.items() if n in got and got[n] != v]
    gone = [n for n in preferred if n not in got]
    new = [f"{n} {v}" for n, v in got.items() if n not in preferred]
    kept = len(preferred) - len(moved) - len(gone)
    parts = [f"kept {kept} of the {len(preferred)} preferred versions"]
    for label, items in (("moved", moved), ("new", new), ("no longer needed", gone)):
        if items:
            parts.append(f"{label}: {', '.join(items)}")
    return "; ".join(parts)


def _compile(index_dir: pathlib.Path, requirement: str, python: str, env: Environment, preferred: dict[str, str]) -> str:
    with scratch_dir("mrl-resolve-") as tmp:
        # Named for what they hold: uv's annotations name them (`# via -c ...`).
        constraints = tmp / "maxtext-and-torch-constraints.txt"
        constraints.write_text("".join(f"{line}\n" for line in (*env.constraints, *env.torch.requirements)))
        # uv keeps the pins of an existing output file where the inputs allow: the preferences.
        output = tmp / "closure.txt"
        output.write_text("".join(f"{name}=={version}\n" for name, version in preferred.items()))
        cmd = [
            "uv", "pip", "compile", "-", *COMPILE_FLAGS, "--output-file", str(output),
            "--find-links", str(index_dir), "--python-version", TARGET_PYTHON,
            "--python-platform", TARGET_PLATFORM, "--python", python, "-c", str(constraints),
        ]
        for link in env.torch.find_links:
            cmd += ["--find-links", link]
        if env.overrides:
            overrides = tmp / STANDIN_OVERRIDES
            overrides.write_text("".join(f"{line}\n" for line in env.overrides))
            cmd += ["--override", str(overrides)]
        # Run in the folder that holds the inputs: uv's annotations name a file by its path relative to
        # the current folder, so anywhere else (above it: /tmp) its folder's name would leak into the result.
        with step("constraints", f"resolving the closure of {requirement} for Python {TARGET_PYTHON} on {TARGET_PLATFORM}"):
            proc.run(cmd, what="resolving the stack's closure", who="constraints", input=requirement + "\n",
                     env={"UV_PYTHON_DOWNLOADS": "never"}, log=True, tail=20, cwd=tmp)
        # The annotations name the files by their names alone: no temporary path in the result.
        return output.read_text().replace(f"{tmp}{os.sep}", "")


def closure_key(index_dir: pathlib.Path, requirement: str, python: str, env: Environment,
                preferred: dict[str, str] | None = None) -> tuple[str, dict[str, Any]]:
    """(key, inputs): the sha256 of everything the resolution of
    `requirement` against `index_dir` is given, and those inputs as stored
    beside the answer (uv variables only as digests: they may hold secrets)."""
    inputs = {
        "format": CLOSURE_CACHE_FORMAT,
        "requirement": requirement,
        # By content, not path: the index is resolved in a fresh staging folder each build.
        "index": {f.name: sha256_file(f) for f in sorted(index_dir.iterdir()) if f.is_file()},
        "constraints": [*env.constraints, *env.torch.requirements],
        "find_links": list(env.torch.find_links),
        "overrides": list(env.overrides),
        "python_version": TARGET_PYTHON,
        "python_platform": TARGET_PLATFORM,
        "flags": list(COMPILE_FLAGS),
        "preferences": dict(preferred or {}),
        "uv": buildcache.uv_identity(python),
    }
    return buildcache.key(inputs), inputs


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _cached_closure(entry: pathlib.Path, key: str, max_age: float) -> tuple[str, float] | None:
    """(closure, age in seconds) of a whole, young enough entry; None for
    none, a damaged one (ignored: it is rewritten) or an old one."""
    try:
        data = json.loads(entry.read_text())
        closure, created = data["closure"], float(data["created"])
        whole = data["format"] == CLOSURE_CACHE_FORMAT and data["key"] == key and isinstance(closure, str) and _sha(closure) == data["sha256"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        whole = False
    if not whole:
        step.note("constraints", f"ignoring a damaged cached resolution {entry.name[:12]}: resolving afresh")
        return None
    age = time.time() - created
    if not 0 <= age <= max_age:
        step.note("constraints", f"the cached resolution {key[:12]} is {_age(age)} old (kept {_age(max_age)}): resolving afresh")
        return None
    return closure, age


def _store_closure(entry: pathlib.Path, key: str, inputs: dict[str, Any], closure: str) -> None:
    entry.parent.mkdir(parents=True, exist_ok=True)
    data = {"format": CLOSURE_CACHE_FORMAT, "key": key, "created": time.time(), "sha256": _sha(closure),
            "inputs": inputs, "closure": closure}
    write_atomically(entry, json.dumps(data, indent=1, sort_keys=True) + "\n")
    step.note("constraints", f"resolution cached as {key[:12]}")


def _age(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# -- the inputs a constraints file was made from --------------------------------

#: The part of input_digests() that is the overlay's own wheel.
OVERLAY = "maxtext-rl-overlay"
INPUTS_TITLE = "Inputs, sha256 of the files each is made from (tests/unit recomputes them from the checkout):"


def input_digests(project: Project, names: Iterable[str], overlay_files: Iterable[str] | None = None) -> dict[str, str]:
    """{part: sha256} of every input a build reads from the project: the
    overlay's own wheel (OVERLAY: pyproject.toml, README.md, LICENSE, the
    tool's code and resources) and, for each distribution in `names`, its pin
    file, series file, patches and build toolchain file. Each part is the
    sha256 of its files' project-relative paths and contents, so it is the
    same on every machine, wherever the checkout is. `overlay_files`: the
    overlay wheel's files as the build took them (default: as
    overlayfiles.overlay_inputs lists them now)."""
    if overlay_files is None:
        overlay_files = overlayfiles.overlay_inputs(project.root, say=False).files
    parts = {OVERLAY: _files_digest(project.root, [project.root / f for f in overlay_files])}
    for name in names:
        pin = project.pins[name]
        files = [pin.pin_file, pin.directory / "series", *pin.series, pin.directory / buildenv.TOOLCHAIN_FILE]
        parts[name] = _files_digest(project.root, [f for f in files if f.is_file()])
    return parts


def _files_digest(root: pathlib.Path, files: Iterable[pathlib.Path]) -> str:
    rows = sorted(f"{f.relative_to(root).as_posix()}\0{sha256_file(f)}\n" for f in files)
    return hashlib.sha256("".join(rows).encode()).hexdigest()


def _inputs_lines(inputs: Mapping[str, str]) -> list[str]:
    own = "its own wheel: " + ", ".join(f"{n}/" if n == "overlay" else n for n in overlayfiles.OVERLAY_INPUTS)
    lines = [INPUTS_TITLE]
    for part, sha in inputs.items():
        what = own if part == OVERLAY else f"patches/{part}/: pin.toml, series, patches, {buildenv.TOOLCHAIN_FILE} if any"
        lines.append(f"  {part}: {sha} ({what})")
    return lines


def recorded_inputs(text: str) -> dict[str, str]:
    """{part: sha256} that a constraints file's header records ({} for none)."""
    lines = text.splitlines()
    try:
        at = lines.index(f"# {INPUTS_TITLE}")
    except ValueError:
        return {}
    recorded = {}
    for line in lines[at + 1:]:
        m = re.match(r"#   ([\w.-]+): ([0-9a-f]{64}) \(", line)
        if not m:
            break
        recorded[m.group(1)] = m.group(2)
    return recorded


def stale_constraints(text: str, project: Project) -> str:
    """Why a constraints file is stale for `project` as it is now, with the
    command that makes it again as it was made; "" when every input it
    records (all the project's pins and the overlay) is unchanged."""
    recorded = recorded_inputs(text)
    now = input_digests(project, project.pins)
    if not recorded:
        why = ["its header records no digest of its inputs (it was made by an older tool)"]
    else:
        why = [f"{part} is not among its inputs" for part in now if part not in recorded]
        why += [f"{part} changed since it was made" for part in now if recorded.get(part, now[part]) != now[part]]
        why += [f"it records {part}, which the project does not have" for part in recorded if part not in now]
    if not why:
        return ""
    return f"constraints.txt is stale: {'; '.join(why)}. Make it again, from the checkout, as it was made:\n" + regenerate_command(text)


def regenerate_command(text: str) -> str:
    """The build command of a constraints file's `Made by:` line, as run in
    the checkout (scripts/build-wheels.sh), and what each PATH was."""
    lines = text.splitlines()
    made = next((i for i, line in enumerate(lines) if line.startswith("# Made by: maxtext-rl-overlay build")), None)
    if made is None:
        return "  scripts/build-wheels.sh  (its header does not say how it was made: give the sources and flags it needs)"
    args = lines[made].removeprefix("# Made by: maxtext-rl-overlay build").split()
    said = [line.removeprefix("#   ") for line in lines[made + 1:] if line.startswith("#   ") and not line.startswith("#   with ")]
    where = [s for s in said if re.match(r"[\w.-]+: --source |[\w.-]+: fetched ", s)]
    return "  " + shlex.join(["scripts/build-wheels.sh", *args]) + "".join(f"\n    {s}" for s in where)


def constraints_text(closure: str, overlay_wheels: dict[str, str], find_links: str, *, notes: list[str], env: Environment, location: str = "",
                     made_by: tuple[str, ...] = (), inputs: Mapping[str, str] | None = None) -> str:
    """constraints.txt: how it was made (`made_by`: the build command, its
    sources, uv's version, the tool's digest; `inputs`: input_digests() of
    the project it was built from), the index lines, then every pin with
    uv's `# via` annotations; an overlay wheel's line carries exactly its own
    sha256, whatever the resolver printed."""
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
        if name in ours:
            block = ours.pop(name) + "".join(line for line in block.splitlines(keepends=True) if line.lstrip().startswith("#"))
        out.append(block)
    if ours:
        raise OverlayError(f"the resolved closure lacks overlay wheels {', '.join(sorted(ours))}: they would not be pinned.")
    install = f"uv pip install -c {location}constraints.txt"
    override = f" --override {find_links.rstrip('/')}/{STANDIN_OVERRIDES}" if env.overrides else ""
    header = [
        "# maxtext-rl-overlay constraints: generated by scripts/build-wheels.sh; do not edit.",
        *(f"# {note}" for note in notes),
        f"# Install with:  {install} maxtext-rl-overlay",
        f"#   with MaxText: {install}{override} \"maxtext-rl-overlay[{env.extra}]\"   ({env.maxtext})",
        f"# Needs uv >= {UV_CHECKS_CONSTRAINT_HASHES}: an older uv installs without checking the --hash lines of a -c file.",
        f"# Resolved for Python {TARGET_PYTHON} on {TARGET_PLATFORM} (a TPU VM), with {env.maxtext}",
        f"# under its {env.constraints_origin.split(':', 1)[1]} ({env.constraints_origin.split(':', 1)[0]}).",
        *(f"# {line}" for line in made_by),
        *(f"# {line}" for line in (_inputs_lines(inputs) if inputs else ())),
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
