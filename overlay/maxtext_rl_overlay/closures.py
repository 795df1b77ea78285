"""Stage 4, the closure: the pinned closure the stack needs on a TPU VM.

`uv pip compile` of the overlay, resolved for the target platform together
with the MaxText environment and the closure's torch; constraints.txt
(constraintsfile.py) pins what it answers.

Resolving the closure is the slowest step of a rebuild whose inputs did not
change, so its answer is cached (<cache>/closures/<key>.json, a
buildcache.Entry), keyed by everything the resolver is given: the
requirement, the name and sha256 of every file in the index folder, the
MaxText constraints, torch's requirements and find-links, the overrides,
the target Python and platform, the resolver interpreter, the uv version,
the resolver's flags, and uv's own settings (UV_* variables, uv.toml
files, [tool.uv] tables). What the key cannot cover is the registry: an
unpinned dependency may get a new release on PyPI, so a cached answer is
what the same inputs resolved to when it was made. It is reused for at most
MRL_CLOSURE_MAX_AGE seconds (a day by default: the first build of a day
resolves afresh), MRL_REFRESH=1 resolves afresh whatever its age, deleting
the folder clears it, and the build output says when a cached resolution
was used. The torch pin check runs on every answer, cached or not.

A fresh resolution prefers the versions the project's committed
constraints.txt pins (uv pip compile keeps the pins of an existing output
file unless the inputs rule them out), so that resolving again, in CI or
on another day, gives the same closure rather than whatever the registry
lists that minute (a freshly released package can be listed by one request
and missing from the next). The build says how many pins it kept and which
moved; deleting the committed file resolves from scratch."""

from __future__ import annotations

import hashlib
import os
import pathlib
import time
from typing import Any

from packaging.utils import canonicalize_name, parse_wheel_filename

from . import buildcache, cachekeys, options, proc, sources
from .digest import sha256_file
from .environment import TARGET_PLATFORM, TARGET_PYTHON, Environment
from .errors import OverlayError
from .indexpages import STANDIN_OVERRIDES
from .output import step
from .staging import scratch_dir

#: The resolver's flags (besides the inputs' files), part of the cache key.
#: Its annotations (`# via ...`: why each package is in the closure) are kept.
COMPILE_FLAGS = ("--quiet", "--no-header", "--generate-hashes")
#: Bump when the cache entry's layout or the key's meaning changes.
CLOSURE_CACHE_FORMAT = 2


def resolve(index_dir: pathlib.Path, requirement: str, python: str, env: Environment, *, cache: pathlib.Path | None = None,
            preferences: pathlib.Path | None = None) -> str:
    """`uv pip compile` of the overlay for the target, together with the
    MaxText environment (its overrides file as constraints) and the
    closure's torch: the pinned closure. A cached answer for the same inputs
    is reused; a fresh one prefers the versions pinned in `preferences`, the
    committed constraints.txt (see the module's docstring)."""
    preferred = _preferred_pins(preferences, index_dir) if preferences is not None else {}
    key, inputs = cache_key(index_dir, requirement, python, env, preferred)
    entry = buildcache.Entry((cache or sources.cache_root()) / "closures" / f"{key}.json", key, who="constraints", kind="closures",
                             one_file=True)
    settings = options.settings()
    # Under the entry's lock: a concurrent build of the same closure waits, then reuses it.
    with entry.locked():
        return _resolve(index_dir, requirement, python, env, entry, inputs, settings.refresh, settings.closure_max_age,
                        preferred, preferences)


#: How the output names a kept resolution: "cached", as its other notes say.
_SAID = buildcache.Said("resolution", "resolving afresh", kept="cached")


def _resolve(index_dir: pathlib.Path, requirement: str, python: str, env: Environment, entry: buildcache.Entry,
             inputs: dict[str, Any], refresh: bool, max_age: float, preferred: dict[str, str],
             preferences: pathlib.Path | None) -> str:
    cached = None if refresh else _cached(entry, max_age)
    if cached is not None:
        closure, age = cached
        step.note("constraints", f"closure unchanged: reusing the resolution of {entry.key[:12]} (resolved {_age(age)} ago; "
                                 "MRL_REFRESH=1 resolves afresh)")
    else:
        if preferred and preferences is not None:
            step.note("constraints", f"preferring the {len(preferred)} versions pinned in {preferences.name} (uv keeps each one the inputs "
                                     f"allow; delete {preferences.name} to resolve from scratch)")
        closure = uv_compile(index_dir, requirement, python, env, preferred)
        if preferred:
            step.note("constraints", _preference_report(preferred, _pins(closure)))
    pinned = _pins(closure)
    for name, want in (("torch", env.torch.version), ("torchvision", env.torch.torchvision)):
        if pinned.get(name) != want:
            raise OverlayError(f"the closure pins {name} {pinned.get(name, 'not at all')}, not {want}, the torch vLLM is built "
                               "against; check the pins' requirement overrides.")
    if cached is None:
        record = {"format": CLOSURE_CACHE_FORMAT, "created": time.time(), "sha256": closure_sha256(closure), "inputs": inputs,
                  "closure": closure}
        if entry.store(record, said=_SAID):
            step.note("constraints", f"resolution cached as {entry.key[:12]}")
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


def uv_compile(index_dir: pathlib.Path, requirement: str, python: str, env: Environment, preferred: dict[str, str]) -> str:
    """The closure as `uv pip compile` answers, preferring the versions `preferred` pins: no cache, no check."""
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


def cache_key(index_dir: pathlib.Path, requirement: str, python: str, env: Environment,
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
        "uv": cachekeys.uv_identity(python),
    }
    return cachekeys.key(inputs), inputs


def closure_sha256(closure: str) -> str:
    """What a cached resolution's record checks its closure by."""
    return hashlib.sha256(closure.encode()).hexdigest()


def _cached(entry: buildcache.Entry, max_age: float) -> tuple[str, float] | None:
    """(closure, age in seconds) of a whole, young enough entry; None for
    none, a damaged one (said and removed: it is made again) or an old one."""

    def check(record: dict[str, Any]) -> tuple[str, float]:
        closure, created = record["closure"], float(record["created"])
        if record["format"] != CLOSURE_CACHE_FORMAT or not isinstance(closure, str) or closure_sha256(closure) != record["sha256"]:
            raise buildcache.Damaged
        return closure, created

    kept = entry.reuse(check, _SAID)
    if kept is None:
        return None
    closure, created = kept
    age = time.time() - created
    if not 0 <= age <= max_age:
        step.note("constraints", f"the cached resolution {entry.key[:12]} is {_age(age)} old (kept {_age(max_age)}): resolving afresh")
        return None
    return closure, age


def _age(seconds: float) -> str:
    seconds = abs(seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
