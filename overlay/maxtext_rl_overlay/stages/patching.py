"""Stage 2: apply a distribution's series to its source tree.

Two engines give the same answers: `git am -3` where git is installed, and
patch-ng where it is not. Both work on a private copy that replaces the
target only once every patch has applied, so a failure leaves nothing
half-patched. On the pinned tree every touched file must match the patch's
pre-image blob before, and its post-image blob after; on an unpinned stand-in
tree only the exact hunks (no fuzz) can be checked, and the result says so.
A patch whose `Unpinned-Source: left out [why]` trailer says a stand-in
release predates the code it changes is not applied to an unpinned tree: the
build says so, and the manifest lists it as left out (verify shows it).
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import tempfile
from typing import Any, Literal, get_args

from ..cache import buildcache, cachekeys
from ..config.pins import Pin
from ..core import gittree
from ..core.digest import sha256_file
from ..core.errors import OverlayError
from ..core.git import git
from ..core.manifest import PatchRecord
from ..core.output import step
from ..core.proc import output_tail
from ..core.staging import staged_dir
from . import patchfile
from .patchfile import ZERO, PatchFile
from .sources import Source

#: The two ways of applying a series; they must give the same answers.
Engine = Literal["git", "patch-ng"]
ENGINES: tuple[Engine, ...] = get_args(Engine)
#: Bumped when what a kept patched tree's record says changes.
PATCHED_CACHE_FORMAT = 2
# The private repository's commits are thrown away with it: a fixed date
# keeps even their ids the same from run to run.
_DATES = {"GIT_AUTHOR_DATE": "2000-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00Z"}


def default_engine() -> Engine:
    return "git" if shutil.which("git") else "patch-ng"


def apply_series(pin: Pin, source: Source, dest: pathlib.Path, *, engine: Engine | None = None,
                 cache: pathlib.Path | None = None) -> list[PatchRecord]:
    """Copy `source` to `dest` (which must not exist) with the series applied.

    With `cache`, the patched tree is kept, keyed by the source's tree id,
    each patch file's bytes, the engine and the tool's code, and a later call
    with the same inputs copies it instead of patching again."""
    engine = engine or default_engine()
    if engine not in ENGINES:
        raise OverlayError(f"unknown patch engine {engine!r}; choose from {', '.join(ENGINES)}.")
    if dest.exists():
        raise OverlayError(f"{dest} exists already; refusing to patch into it.")
    patches = [patchfile.parse(p) for p in pin.series]
    problems = [problem for p in patches for problem in patchfile.lint(p)]
    if problems:
        raise OverlayError("the series does not pass the patch lint:\n  " + "\n  ".join(problems))
    inputs = _patched_inputs(pin, source, engine) if cache is not None and patches else None
    if cache is None or inputs is None:
        return _apply(pin, source, dest, patches, engine)
    # Under the entry's lock: a concurrent build of the same tree waits, then reuses it.
    with _entry(cache, pin, inputs).locked():
        kept = _kept_tree(cache, pin, inputs, dest)
        if kept is not None:
            return kept
        applied = _apply(pin, source, dest, patches, engine)
        _keep_tree(cache, pin, inputs, dest, applied)
    return applied


def _apply(pin: Pin, source: Source, dest: pathlib.Path, patches: list[PatchFile], engine: Engine) -> list[PatchRecord]:
    check_blobs = source.from_pin
    with staged_dir(dest) as work:
        shutil.copytree(source.path, work, symlinks=True, dirs_exist_ok=True)
        if engine == "git" and patches:
            _git_init(work, pin.distribution)
        applied = []
        for patch in patches:
            why = patchfile.left_out_of_unpinned(patch)
            if why is not None and not source.from_pin:
                step.note(pin.distribution, f"{patch.name} LEFT OUT of this unpinned source: {why}")
                continue
            with step(pin.distribution, f"applying {patch.name} ({engine})"):
                _refuse_already_applied(pin, patch, work, engine)
                if check_blobs:
                    _check_images(pin, patch, work, "pre")
                if engine == "git":
                    _git_am(pin, patch, work)
                else:
                    _patch_ng(pin, patch, work)
                if check_blobs:
                    _check_images(pin, patch, work, "post")
                else:  # a created file's whole content is in the patch: check it on any tree
                    _check_images(pin, dataclasses.replace(patch, files=tuple(c for c in patch.files if ZERO in (c.pre, c.post))), work, "post")
            applied.append(_record(patch, check_blobs))
        shutil.rmtree(work / ".git", ignore_errors=True)
    return applied


def _record(patch: PatchFile, blobs_checked: bool) -> PatchRecord:
    """What the manifest says of an applied patch: its file's sha256 and,
    where git is installed, its patch-id too."""
    return PatchRecord(patch.name, patch.subject, patch.trailers["Upstream-Status"], blobs_checked, tuple(f.path for f in patch.files),
                       sha256_file(patch.path), patchfile.patch_id(patch.path) if shutil.which("git") else None)


def _patched_inputs(pin: Pin, source: Source, engine: Engine) -> dict[str, Any]:
    return {
        "format": PATCHED_CACHE_FORMAT,
        "distribution": pin.distribution,
        "source": source.tree,
        "from_pin": source.from_pin,  # what is checked: blob ids, or exact hunks only
        "series": [(p.name, sha256_file(p)) for p in pin.series],
        "engine": engine,
        "patch_ids": shutil.which("git") is not None,  # the records hold git's patch-ids where git is installed
        "tool": cachekeys.tool_digest(),
    }


def _entry(cache: pathlib.Path, pin: Pin, inputs: dict[str, Any]) -> buildcache.Entry:
    key = cachekeys.key(inputs)
    return buildcache.KINDS["patched"].entry(cache, f"{pin.distribution}-{key}", key, who=pin.distribution)


def _kept_tree(cache: pathlib.Path, pin: Pin, inputs: dict[str, Any], dest: pathlib.Path) -> list[PatchRecord] | None:
    """The series' outcome, with the patched tree copied to `dest`, when a
    whole one is kept for these inputs (its git tree id checked); else None."""
    entry = _entry(cache, pin, inputs)

    def check(record: dict[str, Any]) -> tuple[list[PatchRecord], str]:
        applied = [PatchRecord.from_plain(p) for p in record["applied"]]
        if not (entry.path / "tree").is_dir():
            raise buildcache.Damaged
        # The copy is checked, not the kept tree: what `dest` holds is what the id says.
        with staged_dir(dest) as work:
            shutil.copytree(entry.path / "tree", work, symlinks=True, dirs_exist_ok=True)
            if gittree.tree_id(work) != record["tree"]:
                raise buildcache.Damaged
        return applied, record["tree"]

    kept = entry.reuse(check)
    if kept is None:
        return None
    applied, tree = kept
    step.note(pin.distribution, f"source {inputs['source'][:12]} and series unchanged: reusing the patched tree "
                                f"{tree[:12]} ({len(applied)} patch(es) applied when it was kept as {entry.key[:12]})")
    return applied


def _keep_tree(cache: pathlib.Path, pin: Pin, inputs: dict[str, Any], tree: pathlib.Path, applied: list[PatchRecord]) -> None:
    """Keep the patched `tree` for these inputs (a full or read-only cache: said, and the build goes on)."""
    record = {"tree": gittree.tree_id(tree), "inputs": inputs, "applied": [dataclasses.asdict(a) for a in applied]}
    _entry(cache, pin, inputs).store(record, lambda staged: shutil.copytree(tree, staged / "tree", symlinks=True))


def _blob_of(work: pathlib.Path, relpath: str) -> str:
    path = work / relpath
    if path.is_symlink():
        return gittree.blob_id(os.readlink(path).encode())
    return gittree.blob_id(path.read_bytes()) if path.is_file() else ZERO


def _check_images(pin: Pin, patch: PatchFile, work: pathlib.Path, which: str) -> None:
    for change in patch.files:
        if not change.pre:  # a pure rename or mode change: no content to check
            continue
        path, want = (change.old_path, change.pre) if which == "pre" else (change.path, change.post)
        have = _blob_of(work, path)
        if have != want:
            if which == "pre":
                raise OverlayError(
                    f"{pin.distribution}: {patch.name} expects {path} at blob {want[:12]} but the tree has "
                    f"{'no such file' if have == ZERO else 'blob ' + have[:12]} (pin {pin.commit[:12]}). "
                    "The series no longer fits the pin: carry it forward with scripts/rebase.sh."
                )
            raise OverlayError(
                f"{pin.distribution}: after {patch.name}, {path} is blob {have[:12]}, not the patch's "
                f"post-image {want[:12]}: the patch file is damaged. Re-export it with git format-patch --full-index."
            )


def _refuse_already_applied(pin: Pin, patch: PatchFile, work: pathlib.Path, engine: Engine) -> None:
    """An already-applied patch must be an error, not a silent no-op."""
    changes = [c for c in patch.files if c.pre]
    if changes and all(c.pre != c.post and _blob_of(work, c.path) == c.post for c in changes):
        already = True
    elif engine == "git":
        # `git apply -R --check` ignores modes, so it says nothing of a patch
        # without hunks; git am itself refuses such a patch when it changes nothing.
        has_hunks = any(c.has_hunks or c.binary for c in patch.files)
        already = has_hunks and git("apply", "-R", "--check", str(patch.path), cwd=work, check=False).returncode == 0
    else:
        found = _locate_hunks(_patch_ng_set(patch), work)
        found += [(False, _blob_of(work, c.path) == c.post) for c in patch.files if c.pre == ZERO]
        already = bool(found) and all(post and not pre for pre, post in found)
    if already:
        raise OverlayError(
            f"{pin.distribution}: {patch.name} is already applied to the source (it reverse-applies cleanly). "
            "If upstream now contains it, drop it from the series (scripts/rebase.sh does this)."
        )


def _git_init(work: pathlib.Path, who: str) -> None:
    for args in (["init", "-q"], ["add", "-A", "-f"], ["commit", "-q", "--no-verify", "-m", "upstream"]):
        git(*args, cwd=work, env=_DATES, who=who, what=f"importing the source into a private repository (git {args[0]})")


def _git_am(pin: Pin, patch: PatchFile, work: pathlib.Path) -> None:
    proc = git("am", "-3", "--keep-cr", "--committer-date-is-author-date", str(patch.path), cwd=work, env=_DATES, check=False)
    if proc.returncode != 0:
        detail = output_tail(proc, 8)
        git("am", "--abort", cwd=work, check=False)
        raise OverlayError(
            f"{pin.distribution}: {patch.name} does not apply to the source ({'pin ' + pin.commit[:12]}):\n    "
            + "\n    ".join(detail)
            + "\n  Carry the series forward with scripts/rebase.sh, or fix the patch."
        )


def _patch_ng_set(patch: PatchFile) -> Any:  # a patch_ng.PatchSet (the library has no types)
    """patch-ng's parse of `patch`, with whole-file creations and deletions
    taken out of it: patch-ng skips a file created from /dev/null and still
    reports success, so those are done here (_create_and_delete)."""
    import patch_ng

    for change in patch.files:
        if change.binary or (change.mode_change and not change.has_hunks) or change.old_path != change.path:
            kind = "binary" if change.binary else "rename" if change.old_path != change.path else "mode-only"
            raise OverlayError(
                f"{patch.name}: the {kind} change to {change.path} cannot be applied without git "
                "(patch-ng handles text hunks only). Install git."
            )
    parsed = patch_ng.fromstring(patch.path.read_bytes())
    if not parsed or parsed.errors:
        raise OverlayError(f"{patch.name}: patch-ng cannot parse it ({getattr(parsed, 'errors', '?')} errors).")
    parsed.items = [i for i in parsed.items if b"/dev/null" not in (i.source, i.target)]
    return parsed


def _create_and_delete(pin: Pin, patch: PatchFile, work: pathlib.Path, *, dry_run: bool) -> None:
    for change in patch.files:
        path = work / change.path
        if change.pre == ZERO:
            if path.exists():
                raise OverlayError(f"{pin.distribution}: {patch.name} creates {change.path}, which the source already has.")
            if not dry_run:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(patchfile.new_file_content(patch, change.path))
                os.chmod(path, 0o755 if change.new_mode == "100755" else 0o644)
        elif change.post == ZERO:
            if _blob_of(work, change.old_path) != change.pre:
                raise OverlayError(f"{pin.distribution}: {patch.name} deletes {change.old_path}, which the source has changed or lacks.")
            if not dry_run:
                (work / change.old_path).unlink()


def _locate_hunks(parsed: Any, root: pathlib.Path) -> list[tuple[bool, bool]]:
    """Find where each hunk's pre-image lines stand exactly, nearest to the
    line the patch names, as `git apply` does, and move the hunk there.
    Returns, per hunk, whether its pre-image and its post-image were found.

    patch-ng looks only at the named line (so it would refuse a hunk that git
    applies at an offset), and it reports success, changing nothing, when a
    file already looks patched. Deciding both questions here keeps the two
    engines' answers the same. Context must match line for line: this finds
    offsets, it never fuzzes."""
    found = []
    for item in parsed.items:
        path = root / item.source.decode(errors="surrogateescape")
        lines = [line.rstrip(b"\r\n") for line in path.read_bytes().splitlines()] if path.is_file() else []
        offset, floor = 0, 0
        for hunk in item.hunks:
            pre = [t[1:].rstrip(b"\r\n") for t in hunk.text if t[:1] in (b" ", b"-")]
            post = [t[1:].rstrip(b"\r\n") for t in hunk.text if t[:1] in (b" ", b"+")]
            spots = [i for i in range(floor, len(lines) - len(pre) + 1) if lines[i : i + len(pre)] == pre]
            has_post = any(lines[i : i + len(post)] == post for i in range(len(lines) - len(post) + 1))
            found.append((bool(spots), has_post))
            if spots:
                want = hunk.startsrc - 1 + offset
                best = min(spots, key=lambda i: (abs(i - want), i))
                offset = best - (hunk.startsrc - 1)
                hunk.startsrc = best + 1
                floor = best + len(pre)
    return found


def _scratch_copy(work: pathlib.Path, patch: PatchFile) -> pathlib.Path:
    """A throwaway copy of just the files a patch touches, for trial runs."""
    scratch = pathlib.Path(tempfile.mkdtemp(prefix="mrl-trial-"))  # removed by the caller
    for change in patch.files:
        src = work / change.path
        if src.is_file():
            (scratch / change.path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, scratch / change.path)
    return scratch


def _patch_ng(pin: Pin, patch: PatchFile, work: pathlib.Path) -> None:
    parsed = _patch_ng_set(patch)
    if not all(pre for pre, _ in _locate_hunks(parsed, work)):
        raise OverlayError(
            f"{pin.distribution}: {patch.name} does not apply to the source exactly (patch-ng, no fuzz). "
            "Carry the series forward with scripts/rebase.sh, or fix the patch."
        )
    # strip=0: patch-ng removes git's a/ and b/ prefixes by itself.
    # patch-ng applies file by file and can stop half-way: try on a scratch
    # copy first, so that `work` only ever sees a patch that applies whole.
    _create_and_delete(pin, patch, work, dry_run=True)
    scratch = _scratch_copy(work, patch)
    try:
        if parsed.items and parsed.apply(strip=0, root=str(scratch), fuzz=False) is not True:
            raise OverlayError(
                f"{pin.distribution}: {patch.name} does not apply to the source exactly (patch-ng, no fuzz). "
                "Carry the series forward with scripts/rebase.sh, or fix the patch."
            )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if parsed.items and parsed.apply(strip=0, root=str(work), fuzz=False) is not True:
        raise OverlayError(f"{pin.distribution}: {patch.name} applied on a trial copy but not on the tree.")
    _create_and_delete(pin, patch, work, dry_run=False)
