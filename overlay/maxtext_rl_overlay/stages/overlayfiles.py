"""The files the overlay's own wheel is made of, and the project commit they are.

One list, read by the build (the wheel is made of these files) and by the
constraints header's digest of its inputs (inputdigests.input_digests), so the
two can never disagree on what the wheel holds."""

from __future__ import annotations

import dataclasses
import fnmatch
import pathlib
import shutil

from ..core import manifest
from ..core.git import git
from ..core.git import out as gitout
from ..core.output import step

#: What the overlay's own wheel is made of, in the project (the build adds
#: the manifest and the exact dependencies on the overlay builds).
OVERLAY_INPUTS = ("README.md", "LICENSE", "pyproject.toml", "overlay")
#: Never part of it: the build's own products and Python's caches.
_NOT_INPUTS = ("__pycache__", "*.pyc", manifest.RESOURCE, "*.egg-info")


@dataclasses.dataclass(frozen=True)
class OverlayInputs:
    files: tuple[str, ...]  # project-relative
    project: manifest.ProjectRecord | None


def overlay_inputs(root: pathlib.Path, *, say: bool = True) -> OverlayInputs:
    """The files of the overlay's own wheel, and the project commit they are.

    In a git checkout: the files git tracks (an untracked file in overlay/
    would change the wheel and its label unseen: it is left out, and said
    so), with the newest commit that changed one of them and those that
    differ from it. Elsewhere (a copy of the files without .git): every
    file, and no commit. `say`: report what was left out and the commit in
    the output (a build does; a check of a constraints file does not)."""
    note = step.note if say else (lambda who, text: None)
    found = git("rev-parse", "--show-toplevel", cwd=root, check=False) if shutil.which("git") else None
    if found is None or found.returncode != 0 or pathlib.Path(found.stdout.strip()).resolve() != root.resolve():
        if (root / ".git").exists():
            note("maxtext-rl-overlay", f"git cannot read the checkout {root} ({found.stderr.strip() if found else 'git is not installed'}): "
                                            "the overlay's wheel is made of every file there, and records no commit")
        files = [str(p.relative_to(root)) for name in OVERLAY_INPUTS for p in _walk(root / name)]
        return OverlayInputs(tuple(sorted(files)), None)
    listed = git("ls-files", "-z", "--", *OVERLAY_INPUTS, cwd=root).stdout.split("\0")
    files = [f for f in listed if f and (root / f).is_file() and not _excluded(f)]
    untracked = [f for f in git("ls-files", "-z", "--others", "--exclude-standard", "--", *OVERLAY_INPUTS, cwd=root).stdout.split("\0") if f]
    if untracked:
        note("maxtext-rl-overlay", f"left out of the overlay's wheel, as git does not track them: {', '.join(untracked)}")
    commit = gitout("log", "-1", "--format=%H", "--", *OVERLAY_INPUTS, cwd=root)
    shallow = gitout("rev-parse", "--is-shallow-repository", cwd=root) == "true"
    if shallow and commit in (root / gitout("rev-parse", "--git-path", "shallow", cwd=root)).read_text().split():
        # The history that would tell is not here: the answer is the clone's cut.
        note("maxtext-rl-overlay", "the checkout is shallow: which commit last changed the overlay's own files is unknown "
                                        "(git fetch --unshallow tells); the manifest records no commit")
        commit = ""
    if not commit:
        return OverlayInputs(tuple(sorted(files)), None)
    dirty = [f for f in git("diff", "--name-only", "-z", "--no-renames", "HEAD", "--", *OVERLAY_INPUTS, cwd=root).stdout.split("\0") if f]
    note("maxtext-rl-overlay", f"made from the project's commit {commit[:12]}"
              + (f", with uncommitted changes to {', '.join(dirty)} (recorded as dirty)" if dirty else ""))
    return OverlayInputs(tuple(sorted(files)), manifest.ProjectRecord(commit, tuple(sorted(dirty))))


def _walk(path: pathlib.Path) -> list[pathlib.Path]:
    if path.is_file():
        return [path]
    return [p for p in path.rglob("*") if p.is_file() and not _excluded(str(p.relative_to(path)))]


def _excluded(relpath: str) -> bool:
    return any(fnmatch.fnmatch(part, pattern) for part in pathlib.PurePosixPath(relpath).parts for pattern in _NOT_INPUTS)
