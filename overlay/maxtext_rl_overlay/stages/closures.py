"""Stage 4, the closure: the pinned closure the stack needs on a TPU VM.

`uv pip compile` of the overlay, resolved for the target platform together
with the MaxText environment and the closure's torch; constraints.txt
(constraintsfile.py) pins what it answers.

What the registry lists changes by the hour; the project declares which
moment of it a build resolves against: [tool.maxtext-rl-overlay]
resolution-cutoff, given to uv as --exclude-newer (a file uploaded after it
is never picked; the overlay's own wheels, in a --find-links folder, have no
upload time and are always found: measured with uv 0.13.9). The cutoff
alone does not make the answer stable: a registry (or a mirror of one) can
list a release uploaded before the cutoff days after it (pandas 3.1.2,
uploaded at 17:12 on the cutoff's day, was first served a week later), and
uv then picks it. So the project's committed constraints.txt, where it was
resolved against the same cutoff, is the lock: its third-party pins are
given to uv as preferences (uv keeps a preferred version wherever it still
resolves), and a moved cutoff resolves afresh. The closure is then a
function of the project's commit (constraints.txt is part of it), not of
the day, of uv's cache, or of a constraints file at the output path.

Resolving the closure is the slowest step of a rebuild whose inputs did not
change, so its answer is cached (<cache>/closures/<key>.json, a
buildcache.Entry), keyed by everything the resolver is given: the
requirement, the cutoff, the name and sha256 of every file in the index
folder, the MaxText constraints, torch's requirements and find-links, the
overrides, the target Python and platform, the resolver interpreter, the uv
version, the resolver's flags, and uv's own settings (UV_* variables,
uv.toml files, [tool.uv] tables). With the cutoff in the key, a cached
answer is what a fresh resolution gives, on any day; MRL_REFRESH=1 resolves
afresh all the same (to see whether the registry still serves it: what the
cutoff cannot pin is a file yanked or deleted upstream, which the build's
check against the file it replaces names: build._compare_with_previous),
deleting the folder clears it, and the build
output says when a cached resolution was used. The torch pin check runs on
every answer, cached or not."""

from __future__ import annotations

import hashlib
import os
import pathlib
from collections.abc import Collection
from typing import Any

from packaging.utils import canonicalize_name

from ..cache import buildcache, cachekeys
from ..config import reader
from ..config.target import TARGET_PLATFORM, TARGET_PYTHON, Target
from ..core import proc
from ..core.digest import sha256_file
from ..core.errors import OverlayError
from ..core.output import step
from ..core.staging import scratch_dir
from .indexpages import STANDIN_OVERRIDES

#: The resolver's flags (besides the inputs' files), part of the cache key.
#: Its annotations (`# via ...`: why each package is in the closure) are kept.
COMPILE_FLAGS = ("--quiet", "--no-header", "--generate-hashes")
#: Bump when the cache entry's layout or the key's meaning changes.
CLOSURE_CACHE_FORMAT = 4


def resolve(index_dir: pathlib.Path, requirement: str, python: str, env: Target, *, cutoff: str,
            cache: pathlib.Path | None = None, prefer: str = "") -> str:
    """`uv pip compile` of the overlay for the target, together with the
    MaxText environment (its overrides file as constraints) and the
    closure's torch, against the registry as of `cutoff` (the project's
    resolution-cutoff), keeping the versions of `prefer` (`name==version`
    lines: the lock's, constraintsfile.lock_preferences) where they still
    resolve: the pinned closure. A cached answer for the same inputs is
    reused."""
    key, inputs = cache_key(index_dir, requirement, python, env, cutoff, prefer)
    entry = buildcache.KINDS["closures"].entry(reader.cache_dir(cache), f"{key}.json", key, who="constraints", one_file=True)
    # Under the entry's lock: a concurrent build of the same closure waits, then reuses it.
    with entry.locked():
        return _resolve(index_dir, requirement, python, env, cutoff, prefer, entry, inputs, reader.settings().refresh)


def _resolve(index_dir: pathlib.Path, requirement: str, python: str, env: Target, cutoff: str, prefer: str,
             entry: buildcache.Entry, inputs: dict[str, Any], refresh: bool) -> str:
    cached = None if refresh else _cached(entry)
    if cached is not None:
        closure = cached
        step.note("constraints", f"closure unchanged: reusing the resolution of {entry.key[:12]} (the registry as of {cutoff}; "
                                 "MRL_REFRESH=1 resolves afresh)")
    else:
        closure = uv_compile(index_dir, requirement, python, env, cutoff, prefer)
    pinned = pins(closure)
    for name, want in (("torch", env.torch.version), ("torchvision", env.torch.torchvision)):
        if pinned.get(name) != want:
            raise OverlayError(f"the closure pins {name} {pinned.get(name, 'not at all')}, not {want}, the torch vLLM is built "
                               "against; check the pins' requirement overrides.")
    if cached is None:
        record = {"format": CLOSURE_CACHE_FORMAT, "sha256": closure_sha256(closure), "inputs": inputs, "closure": closure}
        if entry.store(record):
            step.note("constraints", f"resolution cached as {entry.key[:12]}")
    return closure


def pins(text: str) -> dict[str, str]:
    """{name: version} of the `name==version` lines of a requirements file
    (a closure, or a constraints file)."""
    return {canonicalize_name(line.split("==", 1)[0]): line.split("==", 1)[1].split()[0].rstrip("\\")
            for line in text.splitlines() if "==" in line and line[:1] not in " \t#-"}


def moved_pins(old: str, new: str, *, ours: Collection[str] = ()) -> list[str]:
    """What moved between two closures or constraints files, one line a
    package, sorted by name: `name old -> new`, `name new (new)`, `name old
    (gone)`; the names in `ours` (the overlay's own builds, whose versions
    the pins and the revision set) are left out."""
    before, after = pins(old), pins(new)
    lines = []
    for name in sorted((set(before) | set(after)) - {canonicalize_name(n) for n in ours}):
        if name not in after:
            lines.append(f"{name} {before[name]} (gone)")
        elif name not in before:
            lines.append(f"{name} {after[name]} (new)")
        elif before[name] != after[name]:
            lines.append(f"{name} {before[name]} -> {after[name]}")
    return lines


def uv_compile(index_dir: pathlib.Path, requirement: str, python: str, env: Target, cutoff: str, prefer: str = "") -> str:
    """The closure as `uv pip compile` answers against the registry as of
    `cutoff`, keeping the versions of `prefer` where they resolve: no
    cache, no check."""
    with scratch_dir("mrl-resolve-") as tmp:
        # Named for what they hold: uv's annotations name them (`# via -c ...`).
        constraints = tmp / "maxtext-and-torch-constraints.txt"
        constraints.write_text("".join(f"{line}\n" for line in (*env.constraints, *env.torch.requirements)))
        # uv keeps the pins of an existing output file as preferences: a fresh folder holds none
        # but the ones given.
        output = tmp / "closure.txt"
        if prefer:
            output.write_text(prefer)
        cmd = [
            "uv", "pip", "compile", "-", *COMPILE_FLAGS, "--output-file", str(output),
            "--find-links", str(index_dir), "--python-version", TARGET_PYTHON,
            "--python-platform", TARGET_PLATFORM, "--python", python, "-c", str(constraints), "--exclude-newer", cutoff,
        ]
        for link in env.torch.find_links:
            cmd += ["--find-links", link]
        if env.overrides:
            overrides = tmp / STANDIN_OVERRIDES
            overrides.write_text("".join(f"{line}\n" for line in env.overrides))
            cmd += ["--override", str(overrides)]
        # Run in the folder that holds the inputs: uv's annotations name a file by its path relative to
        # the current folder, so anywhere else (above it: /tmp) its folder's name would leak into the result.
        with step("constraints", f"resolving the closure of {requirement} for Python {TARGET_PYTHON} on {TARGET_PLATFORM}, "
                                 f"the registry as of {cutoff}"):
            proc.run(cmd, what="resolving the stack's closure", who="constraints", input=requirement + "\n",
                     env={"UV_PYTHON_DOWNLOADS": "never"}, log=True, tail=20, cwd=tmp)
        # The annotations name the files by their names alone: no temporary path in the result.
        return output.read_text().replace(f"{tmp}{os.sep}", "")


def cache_key(index_dir: pathlib.Path, requirement: str, python: str, env: Target, cutoff: str,
              prefer: str = "") -> tuple[str, dict[str, Any]]:
    """(key, inputs): the sha256 of everything the resolution of
    `requirement` against `index_dir` is given, and those inputs as stored
    beside the answer (uv variables only as digests: they may hold secrets)."""
    inputs = {
        "format": CLOSURE_CACHE_FORMAT,
        "requirement": requirement,
        "exclude_newer": cutoff,
        "preferences": hashlib.sha256(prefer.encode()).hexdigest() if prefer else "",
        # By content, not path: the index is resolved in a fresh staging folder each build.
        "index": {f.name: sha256_file(f) for f in sorted(index_dir.iterdir()) if f.is_file()},
        "constraints": [*env.constraints, *env.torch.requirements],
        "find_links": list(env.torch.find_links),
        "overrides": list(env.overrides),
        "python_version": TARGET_PYTHON,
        "python_platform": TARGET_PLATFORM,
        "flags": list(COMPILE_FLAGS),
        "uv": cachekeys.uv_identity(python),
    }
    return cachekeys.key(inputs), inputs


def closure_sha256(closure: str) -> str:
    """What a cached resolution's record checks its closure by."""
    return hashlib.sha256(closure.encode()).hexdigest()


def _cached(entry: buildcache.Entry) -> str | None:
    """The closure of a whole entry; None for none, or a damaged one (said
    and removed: it is made again)."""

    def check(record: dict[str, Any]) -> str:
        closure = record["closure"]
        if record["format"] != CLOSURE_CACHE_FORMAT or not isinstance(closure, str) or closure_sha256(closure) != record["sha256"]:
            raise buildcache.Damaged
        return closure

    return entry.reuse(check)
