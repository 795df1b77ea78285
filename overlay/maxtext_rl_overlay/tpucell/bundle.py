"""`tpu-cell bundle`, run in a checkout with the package registry in reach:
a release made into a bundle that a TPU host with its own JAX, its own
package index and no network installs offline (host.py runs there).

What the host has is read, not assumed: its index (a folder or file:// URL
standing for it: the same path exists on the host), the JAX version that
index holds (or --host-jax); its Python is given (--host-python) and checked
again on the host, as are its JAX and its index. The bundle holds:

- requirements.txt: the closure of the form (--form: the plain one,
  `maxtext-rl-overlay`, or `maxtext-rl-overlay[maxtext]`) resolved for the
  host (its Python, its JAX, the release's pins everywhere else;
  --host-override NAME==VERSION where the host must take another version;
  --leave-out NAME:REASON left out of it, with what only they need), exact
  pins; a distribution of the form whose Requires-Python excludes the host's
  (MaxText 0.2.4: >=3.12) resolved and installed with that check relaxed,
  named as a deviation;
- release-closure.txt: the release's own closure of the form (Python
  3.12), what `verify --host-deviations` compares the host with;
- wheels/: the release's wheels (vLLM rebuilt for the host's Python where
  the release's is built for another, from the same source and series) and
  every wheel of requirements.txt the host's index lacks; SHA256SUMS;
- tests/ with the checkout's pyproject.toml and patches/ beside it (the
  tests read the matrix from pyproject and make upstream's version of an
  installed module by reverse-applying the series), upstream/ (tpu-inference's sampler and
  ragged-paged-attention kernel tests at the pin), stand-ins/ (the host
  stand-ins, active only where named), cell.py (with host_facts.py, its probe) and run.sh.

A bundle larger than one call carries (--part-size) is also written in
parts, BUNDLE/parts/ (parts.py: put together on the host from a folder the
parts gather in across calls).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pathlib
import re
import shutil
import sys
import zipfile
from typing import Any

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from .. import probes
from ..cache import buildcache
from ..config import reader
from ..config.pins import load_project
from ..config.target import TARGET_PLATFORM, TARGET_PYTHON
from ..core import proc
from ..core.digest import sha256_file
from ..core.errors import ExitCode, OverlayError
from ..core.output import step
from ..core.staging import check_replaceable, scratch_dir, staged_dir
from ..stages import sources
from ..stages.constraintsfile import recorded_cutoff
from . import host, hostindex, parts

#: The file that marks a folder as a bundle (and holds its facts).
MARKER = "bundle.json"
#: What the host keeps of its own by default: its preinstalled JAX.
HOST_KEEP = ("jax", "jaxlib", "libtpu")
#: tpu-inference's tests the cell runs at the pin: the sampler's, and the
#: kernel the engine's attention runs (ragged paged attention v3).
UPSTREAM_TESTS = ("tests/layers/jax/sample", "tests/kernels/ragged_paged_attention_kernel_v3_test.py",
                  "tests/kernels/ragged_paged_attention_kernel_v3_hd64_test.py")
#: Where the host stand-ins live in the checkout (never in a wheel).
STAND_INS = pathlib.Path("scripts") / "tpu-cell" / "stand_ins"
#: What one call to the host may carry.
LIMIT = 64 << 20
#: The largest part of a bundle written in parts (--part-size): what one call
#: carries, less room for the sending checkout's tracked files (2.5 MiB
#: measured, 2026-12) and their growth.
PART_SIZE = 56 << 20
#: Where a bundle's parts go, inside it (parts.split leaves the folder out of them).
PARTS = "parts"
#: The forms of the overlay a bundle installs: the requirement, by --form.
FORMS = {"plain": "maxtext-rl-overlay", "maxtext": "maxtext-rl-overlay[maxtext]"}
#: Distributions of a form that say a Requires-Python the host's Python
#: (3.11) does not meet, installed there regardless: resolved with a copy of
#: their metadata saying the host's Python, installed with pip's
#: --ignore-requires-python; each named as a deviation. MaxText 0.2.4 says
#: >=3.12; on 3.11 only its two PEP 695 aliases (maxtext.kernels.mhc) fail
#: in what train_rl imports, which the host stand-in maxtext-py311-aliases
#: rewrites (docs/tpu-cell.md).
RELAXED = {"plain": (), "maxtext": ("maxtext",)}

RUN_SH = """#!/usr/bin/env bash
# The TPU cell, on the host: installs this bundle offline next to the host's
# JAX and runs the steps; docs/tpu-cell.md. Usage:
#   bash run.sh --report DIR [--steps install,verify,...] [--host-stand-ins NAME,...]
# PYTHON: the host's interpreter (default: python3).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "${PYTHON:-python3}" "$here/cell.py" --bundle "$here" "$@"
"""


@dataclasses.dataclass(frozen=True)
class BundleOptions:
    project_root: pathlib.Path
    release: pathlib.Path
    out: pathlib.Path
    host_index: tuple[str, ...]
    host_python: str = "3.11"
    host_platform: str = TARGET_PLATFORM
    host_jax: str | None = None  # default: the one JAX the host's index holds
    host_keep: tuple[str, ...] = HOST_KEEP
    host_overrides: tuple[str, ...] = ()  # NAME==VERSION the host takes instead of the release's
    #: distributions of the closure not installed on the host, each with why (named as deviations)
    leave_out: dict[str, str] = dataclasses.field(default_factory=dict)
    form: str = "plain"  # FORMS
    part_size: int = PART_SIZE  # bytes: a larger bundle is also written in parts
    sources: dict[str, str] = dataclasses.field(default_factory=dict)  # as build's --source
    python: str | None = None  # a local interpreter of the host's Python version (vLLM's rebuild)
    allow_unpinned: bool = False
    torch_standin: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> BundleOptions:
        def names(text: str) -> tuple[str, ...]:  # NAME,NAME,...
            return tuple(n.strip() for n in text.split(",") if n.strip())

        leave_out: dict[str, str] = {}
        given = list(args.leave_out)
        if args.leave_out_file:
            try:
                given += [line for line in args.leave_out_file.read_text().splitlines() if line.strip() and not line.startswith("#")]
            except OSError as exc:
                raise OverlayError(f"--leave-out-file {args.leave_out_file}: cannot read it ({exc.strerror}).") from None
        for text in given:  # NAME[,NAME...][:REASON]
            which, _, why = text.partition(":")
            for name in names(which):
                leave_out[str(canonicalize_name(name))] = why.strip() or "no reason given (--leave-out without one)"
        return cls(project_root=reader.project_root(args.project), release=args.release, out=args.out, host_index=tuple(args.host_index),
                   host_python=args.host_python, host_platform=args.host_platform, host_jax=args.host_jax, host_keep=names(args.host_keep),
                   host_overrides=tuple(args.host_override), sources=reader.named_sources(args.source), leave_out=leave_out,
                   form=args.form, part_size=int(args.part_size * 2**20), python=args.python, allow_unpinned=args.unpinned,
                   torch_standin=args.torch_standin)


@dataclasses.dataclass(frozen=True)
class Bundle:
    out: pathlib.Path
    size: int
    carried: dict[str, str]  # wheel -> why it is carried
    on_host: dict[str, str]  # name==version -> the host index's file
    deviations: list[str]
    parts: list[pathlib.Path] = dataclasses.field(default_factory=list)  # where it is also written in parts
    left_out: dict[str, str] = dataclasses.field(default_factory=dict)


def _release(release: pathlib.Path) -> tuple[dict[str, pathlib.Path], str]:
    """The release's wheels by distribution, and its overlay's version."""
    if not (release / "constraints.txt").is_file():
        raise OverlayError(f"--release {release}: no constraints.txt there (give the folder a build made: its --out).")
    wheels = {str(parse_wheel_filename(p.name)[0]): p for p in sorted(release.glob("*.whl"))}
    if "maxtext-rl-overlay" not in wheels:
        raise OverlayError(f"--release {release}: no maxtext-rl-overlay wheel there.")
    return wheels, str(parse_wheel_filename(wheels["maxtext-rl-overlay"].name)[1])


def _metadata(wheel: pathlib.Path) -> str:
    with zipfile.ZipFile(wheel) as zf:
        meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        return zf.read(meta).decode()


def _requires_python(wheel: pathlib.Path) -> str:
    for line in _metadata(wheel).splitlines():
        if line.startswith("Requires-Python:"):
            return line.split(":", 1)[1].strip()
    return ""


def _relaxed_copy(wheel: pathlib.Path, python: str, dest: pathlib.Path) -> pathlib.Path:
    """A copy of `wheel` whose metadata says Requires-Python >=`python`,
    for the host's resolution only (never carried, never installed)."""
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / wheel.name
    with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zout:
        for item in zin.infolist():
            data = zin.read(item)
            if item.filename.endswith(".dist-info/METADATA"):
                data = re.sub(rb"(?m)^Requires-Python:.*$", f"Requires-Python: >={python}".encode(), data)
            zout.writestr(item, data)
    return out


def _extras_asked(wheels: list[pathlib.Path], name: str) -> list[str]:
    """The extras of `name` that the release's wheels ask for (as the overlay's `maxtext` extra asks for maxtext[tpu-post-train])."""
    extras: set[str] = set()
    for wheel in wheels:
        for line in _metadata(wheel).splitlines():
            if line.startswith("Requires-Dist:"):
                req = Requirement(line.split(":", 1)[1].strip())
                if canonicalize_name(req.name) == name:
                    extras |= req.extras
    return sorted(extras)


def _pins(text: str) -> dict[str, str]:
    """name -> version of a requirements file's `name==version` lines."""
    pins: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#")[0].strip().rstrip("\\").strip()
        if line and not line.startswith("-") and "==" in line:
            req = Requirement(line)
            pins[canonicalize_name(req.name)] = next(iter(req.specifier)).version
    return pins


def _pip_download(spec: str, python: str, platform: str, dest: pathlib.Path) -> pathlib.Path:
    """One wheel from the registry, for `python` on `platform` (its Requires-Python not asked)."""
    env = {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    dest.mkdir(parents=True, exist_ok=True)
    proc.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--ignore-requires-python",
              "--python-version", python, "--implementation", "cp", *(f"--platform={p}" for p in hostindex.platforms(platform)),
              "--dest", str(dest), spec], env=env, what=f"downloading {spec}")
    name = canonicalize_name(Requirement(spec).name)
    found = [w for w in dest.glob("*.whl") if parse_wheel_filename(w.name)[0] == name]
    if not found:
        raise OverlayError(f"downloading {spec}: no wheel came.")
    return found[0]


def _compile(what: str, requirement: str, python_version: str, flags: list[str], cwd: pathlib.Path, cutoff: str) -> str:
    # cutoff: the release's resolution cutoff (uv's --exclude-newer), "" for none (a host index serving no upload times).
    with step("tpu-cell", what):
        done = proc.run(["uv", "pip", "compile", "-", "--quiet", "--no-header", "--no-annotate", "--python-version", python_version,
                         "--python-platform", TARGET_PLATFORM, *flags, *(["--exclude-newer", cutoff] if cutoff else [])],
                        input=requirement + "\n", check=False, cwd=cwd,
                        env={"UV_PYTHON_DOWNLOADS": "never"}, what=what)
    if done.returncode != 0:
        raise OverlayError(f"{what} failed (uv pip compile exited with {done.returncode}):\n{done.stderr.strip()}")
    return str(done.stdout)


def command(opts: BundleOptions) -> int:
    """`tpu-cell bundle`: the bundle made; each wheel carried and why, each
    deviation, and what to run on the host, printed."""
    bundle = make(opts)
    for wheel, why in sorted(bundle.carried.items()):
        print(f"carried  {wheel}  ({why})")
    for name, why in sorted(bundle.left_out.items()):
        print(f"left out  {name}  ({why})")
    for line in bundle.deviations:
        print(f"deviation  {line}")
    print(f"tpu-cell: bundle {bundle.out}: {bundle.size / 2**20:.1f} MiB ({len(bundle.carried)} wheels carried, {len(bundle.on_host)} "
          f"from the host's index). On the host: bash {bundle.out.name}/run.sh --report DIR")
    if bundle.parts:
        for part in bundle.parts:
            print(f"part  {part.relative_to(bundle.out.parent)}  {part.stat().st_size / 2**20:.1f} MiB")
        print(f"tpu-cell: over {opts.part_size / 2**20:.1f} MiB, so also in {len(bundle.parts)} parts in {bundle.out / PARTS} (with their "
              f"{parts.SUMS}): carry one or more a call with {parts.SUMS}, staged on the host with parts.py (docs/tpu-cell.md)")
    return ExitCode.OK


def make(opts: BundleOptions) -> Bundle:
    release = opts.release.resolve()
    out = opts.out.resolve()
    if opts.form not in FORMS:
        raise OverlayError(f"--form {opts.form}: expected one of {', '.join(FORMS)}.")
    if not 1 << 20 <= opts.part_size <= LIMIT:
        raise OverlayError(f"--part-size {opts.part_size / 2**20:.1f}: expected 1 to {LIMIT >> 20} MiB (what one call to the host carries, "
                           "less the sending checkout's tracked files).")
    wheels, overlay_version = _release(release)
    wanted = _requires_python(wheels["maxtext-rl-overlay"])
    if wanted and Version(opts.host_python + ".0") not in SpecifierSet(wanted):
        raise OverlayError(f"the release's maxtext-rl-overlay says Requires-Python {wanted}: it cannot be installed on Python "
                           f"{opts.host_python}. Build the release from a checkout whose pyproject.toml allows it.")
    index = hostindex.read(opts.host_index)
    compatible = hostindex.host_tags(opts.host_python, opts.host_platform)
    host_jax = opts.host_jax or _one_version(index, "jax", compatible)
    overrides = {"jax": host_jax, "jaxlib": host_jax}
    for name in opts.host_keep:
        if canonicalize_name(name) not in overrides:
            overrides[canonicalize_name(name)] = _one_version(index, name, compatible)
    for text in opts.host_overrides:
        req = Requirement(text)
        pinned = [s.version for s in req.specifier if s.operator == "=="]
        if len(pinned) != 1:
            raise OverlayError(f"--host-override {text!r}: expected NAME==VERSION.")
        overrides[canonicalize_name(req.name)] = pinned[0]
    check_replaceable(out, MARKER)
    requirement = f"{FORMS[opts.form]}=={overlay_version}"
    with scratch_dir("mrl-tpu-cell-") as tmp, staged_dir(out, replace=MARKER, mode=0o755) as staging:
        carried: dict[str, str] = {}
        (staging / "wheels").mkdir()
        for name, wheel in wheels.items():
            if set(compatible) & set(parse_wheel_filename(wheel.name)[3]):
                shutil.copy2(wheel, staging / "wheels" / wheel.name)
                carried[wheel.name] = "the release's"
            else:
                rebuilt = _rebuild(opts, name, staging / "wheels", str(parse_wheel_filename(wheel.name)[1]))
                carried[rebuilt] = f"the release's {name}, rebuilt for Python {opts.host_python} (the release's: {wheel.name})"
        # The release's own closure of the form, for verify --host-deviations (the MaxText form of a
        # stand-in release with its torch overrides, as its install command takes them).
        release_flags = ["-c", str(release / "constraints.txt")]
        if opts.form == "maxtext" and (release / "torch-standin-overrides.txt").is_file():
            release_flags += ["--override", str(release / "torch-standin-overrides.txt")]
        cutoff = recorded_cutoff((release / "constraints.txt").read_text())
        closure = _compile(f"resolving the release's closure of the {opts.form} form (Python 3.12)", requirement, TARGET_PYTHON,
                           release_flags, release, cutoff)
        release_pins = _pins(closure)
        left_out = dict(opts.leave_out)
        unknown = sorted(set(left_out) - set(release_pins))
        if unknown:
            raise OverlayError(f"--leave-out {', '.join(unknown)}: not in the release's closure of the {opts.form} form.")
        # What the host's Python is below a Requires-Python of: resolved with a copy saying the host's, carried as it is.
        relaxed: dict[str, str] = {}  # name -> its Requires-Python
        relaxed_overrides = []
        for name in RELAXED[opts.form]:
            # The release's own build where it holds one (the overlay's MaxText), else the registry's.
            original = wheels.get(name) or _pip_download(f"{name}=={release_pins[name]}", TARGET_PYTHON, opts.host_platform,
                                                         tmp / "relaxed-original")
            wanted_python = _requires_python(original)
            if not wanted_python or Version(opts.host_python + ".0") in SpecifierSet(wanted_python):
                continue  # the host's Python is allowed: nothing to relax
            relaxed[name] = wanted_python
            copy = _relaxed_copy(original, opts.host_python, tmp / "relaxed")
            extras = _extras_asked([p for p in wheels.values()], name)
            relaxed_overrides.append(f"{name}{'[' + ','.join(extras) + ']' if extras else ''} @ {copy.as_uri()}")
            if not index.provides(name, release_pins[name], compatible):
                shutil.copy2(original, staging / "wheels" / original.name)
        (staging / "release-closure.txt").write_text(f"# The release's closure ({requirement}, Python {TARGET_PYTHON} on {TARGET_PLATFORM}).\n"
                                                      + "".join(f"{n}=={v}\n" for n, v in sorted(release_pins.items())))
        # Preferences (uv keeps each pin of an existing output file that the
        # inputs allow): the release's version where the host's index holds
        # it, else the host's newest (what one call can carry is small: a
        # version the host lacks is carried), else the release's; the host's
        # own JAX and the overrides are forced.
        preferred = {}
        for name, version in release_pins.items():
            if name in overrides or name in left_out or name in relaxed:
                continue
            held = index.versions(name, compatible)
            preferred[name] = version if not held or Version(version) in held else str(held[0])
        (tmp / "host.txt").write_text("".join(f"{n}=={v}\n" for n, v in preferred.items()))
        (tmp / "overrides.txt").write_text("".join(f"{n}=={v}\n" for n, v in overrides.items())
                                           # left out: with what only they need (a marker that never holds)
                                           + "".join(f"{n} ; sys_platform == 'never'\n" for n in sorted(left_out))
                                           + "".join(f"{line}\n" for line in relaxed_overrides))
        flags = ["--output-file", str(tmp / "host.txt"), "--override", str(tmp / "overrides.txt"), "--find-links", str(staging / "wheels"),
                 "--index-strategy", "unsafe-best-match"]
        for loc in index.locations:
            flags += ["--extra-index-url", loc.url] if loc.simple else ["--find-links", str(loc.folder)]
        what = f"resolving the closure for the host (Python {opts.host_python}, JAX {host_jax}, the host's index first)"
        ours = {canonicalize_name(str(parse_wheel_filename(w)[0])) for w in carried}
        keep = {canonicalize_name(n) for n in opts.host_keep} | {"jax", "jaxlib"}
        no_build: set[str] = set()  # their sdists compile: another version of them
        while True:
            no_build_flags = [f for n in sorted(no_build) for f in ("--only-binary", n)]
            # uv drops every file of an index that serves no upload time under --exclude-newer (find-links keep theirs).
            host_cutoff = "" if any(loc.simple for loc in index.locations) else cutoff
            _resolve_for_host(what, requirement, opts.host_python, [*flags, *no_build_flags], tmp, index, compatible, preferred, host_cutoff)
            host_pins = _pins((tmp / "host.txt").read_text())  # --output-file: uv writes its answer there
            host_pins |= {n: release_pins[n] for n in relaxed}  # resolved from its relaxed copy (a file:// line)
            host_pins = {n: v for n, v in host_pins.items() if n not in left_out}
            on_host, missing = {}, {}
            for name, version in sorted(host_pins.items()):
                if name in ours or name in keep:
                    continue
                found = index.provides(name, version, compatible)
                if found:
                    on_host[f"{name}=={version}"] = found
                elif not any(parse_wheel_filename(w.name)[:2] == (name, Version(version)) for w in (staging / "wheels").glob("*.whl")):
                    missing[name] = version  # (not downloaded in an earlier round)
            compiled = _download(missing, opts.host_python, opts.host_platform, staging / "wheels") if missing else set()
            if not compiled:
                break
            no_build |= compiled
        for wheel in sorted((staging / "wheels").glob("*.whl")):
            got, at = parse_wheel_filename(wheel.name)[:2]
            if got in ours:
                continue
            if got in relaxed:
                carried[wheel.name] = (f"the host's index lacks it; it says Requires-Python {relaxed[got]}: installed on Python "
                                       f"{opts.host_python} with that check relaxed")
            elif host_pins.get(got) == str(at):
                carried.setdefault(wheel.name, "the host's index lacks it")
            else:
                wheel.unlink()  # an earlier round's, whose version moved
        (staging / "requirements.txt").write_text(
            f"# The TPU cell's closure for the host: {requirement}, Python {opts.host_python}, JAX {host_jax} (the host's).\n"
            + "".join(f"{n}=={v}\n" for n, v in sorted(host_pins.items())))
        (staging / "wheels" / "SHA256SUMS").write_text("".join(f"{sha256_file(p)}  {p.name}\n" for p in sorted((staging / "wheels").glob("*.whl"))))
        deviations = [f"Python {opts.host_python} (the release's: {TARGET_PYTHON})"]
        deviations += [f"{n} {host_pins.get(n, 'not installed')} (the release's: {v})" for n, v in sorted(release_pins.items())
                       if host_pins.get(n) != v and n not in ours]
        deviations += [f"{n} {v} (not in the release's closure)" for n, v in sorted(host_pins.items()) if n not in release_pins]
        deviations += [f"{w}: {why}" for w, why in carried.items() if "rebuilt" in why]
        deviations += [relaxed_line(n, host_pins[n], wanted, opts.host_python) for n, wanted in sorted(relaxed.items())]
        deviations += [f"left out: {n} ({why})" for n, why in sorted(left_out.items())]
        _copy_tests(opts.project_root, staging)
        _copy_upstream_tests(opts, staging)
        shutil.copytree(opts.project_root / STAND_INS, staging / "stand-ins", ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy2(pathlib.Path(__file__).with_name("host.py"), staging / "cell.py")
        shutil.copy2(probes.HERE / "host_facts.py", staging / host.FACTS)
        (staging / "run.sh").write_text(RUN_SH)
        (staging / "run.sh").chmod(0o755)
        facts: dict[str, Any] = {
            "written_by": "maxtext-rl-overlay tpu-cell bundle",
            "release": requirement,
            "host_python": opts.host_python,
            "host_platform": opts.host_platform,
            "host_jax": host_jax,
            "host_index": list(opts.host_index),
            "host_keep": sorted(keep),
            "host_overrides": overrides,
            "form": opts.form,
            "left_out": left_out,
            "requires_python_relaxed": relaxed,
            "release_python": TARGET_PYTHON,
            "carried": carried,
            "on_host": on_host,
            "deviations": deviations,
            "upstream_tests": list(UPSTREAM_TESTS),
        }
        size = sum(p.stat().st_size for p in staging.rglob("*") if p.is_file()) + len(json.dumps(facts, indent=1)) + 200
        if size > opts.part_size:
            facts["parts"] = {"max_bytes": opts.part_size, "folder": PARTS}
        (staging / MARKER).write_text(json.dumps(facts, indent=1) + "\n")
        size = sum(p.stat().st_size for p in staging.rglob("*") if p.is_file())
        made: list[pathlib.Path] = []
        if "parts" in facts:
            with step("tpu-cell", f"writing the bundle ({size / 2**20:.1f} MiB) in parts of at most {opts.part_size / 2**20:.1f} MiB"):
                try:
                    made = parts.split(staging, staging / PARTS, opts.part_size, skip=(PARTS,))
                except parts.PartsError as exc:
                    raise OverlayError(f"the bundle's parts: {exc}") from None
    step.note("tpu-cell", f"bundle {out}: {size / 2**20:.1f} MiB; {len(carried)} wheel(s) carried, {len(on_host)} from the host's index"
              + (f"; in {len(made)} parts" if made else ""))
    for line in deviations:
        step.note("tpu-cell", f"deviation: {line}")
    return Bundle(out, size, carried, on_host, deviations, [out / PARTS / p.name for p in made], left_out)


def relaxed_line(name: str, version: str, wanted: str, python: str) -> str:
    """The deviation of a distribution installed below its Requires-Python."""
    return (f"{name} {version} says Requires-Python {wanted}: resolved and installed on Python {python} with that check relaxed "
            "(pip --ignore-requires-python)")


def _resolve_for_host(what: str, requirement: str, python: str, flags: list[str], tmp: pathlib.Path, index: hostindex.HostIndex,
                      compatible: list[Any], preferred: dict[str, str], cutoff: str) -> None:
    """The host's closure into tmp/host.txt. uv does not always keep an
    output file's pin it could (seen: certifi, fastapi): the versions the
    host's index holds are constraints, each one uv names in a conflict
    dropped (a few rounds), then preferences alone."""
    hosts = {n: v for n, v in preferred.items() if index.provides(n, v, compatible)}
    for _ in range(12):
        (tmp / "held.txt").write_text("".join(f"{n}=={v}\n" for n, v in hosts.items()))
        (tmp / "host.txt").write_text("".join(f"{n}=={v}\n" for n, v in preferred.items()))
        try:
            _compile(what, requirement, python, [*flags, "-c", str(tmp / "held.txt")], tmp, cutoff)
            return
        except OverlayError as exc:
            said = str(exc).lower().replace("_", "-")
            named = {n for n in hosts if re.search(rf"(?<![\w-]){re.escape(n)}[=<>!~ ]", said)}
            if not named:
                break
            step.note("tpu-cell", f"the host's {', '.join(f'{n} {hosts[n]}' for n in sorted(named))} cannot hold: resolving again without")
            for n in named:
                del hosts[n]
    step.note("tpu-cell", "the host's versions cannot hold as constraints: resolving with them as preferences alone")
    (tmp / "host.txt").write_text("".join(f"{n}=={v}\n" for n, v in preferred.items()))
    _compile(what, requirement, python, flags, tmp, cutoff)


def _one_version(index: hostindex.HostIndex, name: str, compatible: list[Any]) -> str:
    versions = index.versions(name, compatible)
    if len(versions) != 1:
        held = ", ".join(map(str, versions)) or "none"
        raise OverlayError(f"the host's index holds {held} of {name} for this host: say which the host has installed "
                           f"({'--host-jax' if name == 'jax' else '--host-override'} {name}==VERSION).")
    return str(versions[0])


def _rebuild(opts: BundleOptions, name: str, dest: pathlib.Path, version: str) -> str:
    """The release's `name` rebuilt for the host's Python, from the same source and series."""
    from ..stages.run import build_one

    if not opts.python:
        raise OverlayError(f"the release's {name} wheel is built for another Python than the host's {opts.host_python}: give --python, "
                           f"an interpreter of Python {opts.host_python} here, and --source {name}=PATH as build takes it, to rebuild it.")
    record = build_one(opts.project_root, name, opts.sources.get(name), dest, python=opts.python, allow_unpinned=opts.allow_unpinned,
                       torch_standin=opts.torch_standin)
    if record.version != version:
        raise OverlayError(f"{name} rebuilt for Python {opts.host_python} is {record.version}, the release's is {version}: "
                           "give the --source (and --unpinned, --torch-standin) the release was built with.")
    return record.wheel.filename


def _download(missing: dict[str, str], python: str, platform: str, dest: pathlib.Path) -> set[str]:
    """The wheels the host's index lacks, from the registry (pip's default
    index). One published only as an sdist is built here where it is pure
    Python (its wheel, py3-none-any, serves any host); the names of those
    whose sdist would compile (the host cannot build, nor can it run what
    this machine compiles for itself) are returned, for the resolution to
    take another version of them."""
    env = {"PIP_CONFIG_FILE": os.devnull, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    download = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--python-version", python,
                "--implementation", "cp", *(f"--platform={p}" for p in hostindex.platforms(platform)), "--dest", str(dest)]
    left, compiled = dict(missing), set[str]()
    with step("tpu-cell", f"downloading {len(missing)} wheel(s) the host's index lacks: {', '.join(f'{n}=={v}' for n, v in missing.items())}"):
        while left:
            done = proc.run([*download, *(f"{n}=={v}" for n, v in left.items())], env=env, check=False, what="downloading the wheels")
            if done.returncode == 0:
                break
            found = re.search(r"No matching distribution found for ([A-Za-z0-9_.-]+)==", done.stderr)
            name = canonicalize_name(found.group(1)) if found else None
            if name not in left:
                raise OverlayError(f"downloading the wheels the host's index lacks failed: {done.stderr.strip()[-800:]}")
            version = left.pop(name)
            if not _wheel_from_sdist(name, version, dest, env):
                compiled.add(name)
    return compiled


def _wheel_from_sdist(name: str, version: str, dest: pathlib.Path, env: dict[str, str]) -> bool:
    """`name` built from its sdist into a pure Python wheel in `dest`. False
    (nothing built) where it publishes wheels for other Pythons or
    platforms (it is native code: the host needs another version of it), or
    its sdist builds a wheel that is not pure Python."""
    with scratch_dir("mrl-tpu-cell-wheel-") as tmp:
        native = proc.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "--dest", str(tmp / "any"),
                           f"{name}=={version}"], env=env, check=False, what=f"asking whether {name}=={version} publishes wheels")
        if native.returncode == 0:
            step.note("tpu-cell", f"{name}=={version}: no wheel for the host (only for other Pythons or platforms): another version")
            return False
        proc.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-binary", name, "--wheel-dir", str(tmp / "wheel"),
                  f"{name}=={version}"], env=env, what=f"building {name}=={version} from its sdist (no wheel published)")
        for wheel in (tmp / "wheel").glob("*.whl"):
            if not wheel.name.endswith(("-py3-none-any.whl", "-py2.py3-none-any.whl")):
                step.note("tpu-cell", f"{name}=={version}: its sdist builds {wheel.name}, not pure Python: another version")
                return False
            shutil.copy2(wheel, dest / wheel.name)
            step.note("tpu-cell", f"{name}=={version}: no wheel published; built {wheel.name} from its sdist here")
    return True


def _copy_tests(root: pathlib.Path, staging: pathlib.Path) -> None:
    """tests/ and what it reads from the checkout: pyproject.toml (the
    matrix, support.fixes.matrix) and patches/ (support.fixes.unpatched, the
    benchmarks' upstream side)."""
    ignore = shutil.ignore_patterns("__pycache__", ".pytest_cache")
    shutil.copytree(root / "tests", staging / "tests", ignore=ignore)
    shutil.copytree(root / "patches", staging / "patches", ignore=ignore)
    shutil.copy2(root / "pyproject.toml", staging / "pyproject.toml")


def _copy_upstream_tests(opts: BundleOptions, staging: pathlib.Path) -> None:
    """tpu-inference's tests at the pin (UPSTREAM_TESTS, with the
    conftest.py and __init__.py files above them), from the pin's source."""
    project = load_project(opts.project_root)
    pin = project.pins["tpu-inference"]
    with buildcache.using(reader.cache_dir()):
        source = sources.obtain(pin, opts.sources.get("tpu-inference"), allow_unpinned=opts.allow_unpinned)
    dest = staging / "upstream"
    for rel in UPSTREAM_TESTS:
        src = source.path / rel
        if src.is_dir():
            shutil.copytree(src, dest / rel, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
        else:
            raise OverlayError(f"tpu-inference's source ({source.origin}) has no {rel}.")
        for parent in pathlib.PurePosixPath(rel).parents:
            for helper in ("conftest.py", "__init__.py"):
                if (source.path / parent / helper).is_file() and not (dest / parent / helper).exists():
                    shutil.copy2(source.path / parent / helper, dest / parent / helper)
    (dest / "SOURCE").write_text(f"tpu-inference {pin.commit} (tree {source.tree}), from {source.origin}\n")
