"""Making a folder or a file appear whole or not at all, and scratch folders.

Every stage that writes a result (a source tree in the cache, a patched tree,
the index) builds it in a private folder beside its destination and moves it
into place in one rename at the end; on any failure, or an interrupt, the
private folder is removed and the destination is as it was. A signal does
not cut a move or a removal short (interrupts.held): it is raised after.

Removing a folder never raises: the exception on its way out (an interrupt
above all) stays the one the user sees, and a folder that could not be
removed is named in a warning."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator

from . import interrupts


@contextlib.contextmanager
def staged_dir(dest: pathlib.Path, *, replace: bool = False, mode: int | None = None) -> Iterator[pathlib.Path]:
    """Yield an empty folder beside `dest`; move it to `dest` when the block
    ends without an exception, remove it when one escapes.

    Without `replace`, `dest` must not exist by then (a cache entry a
    concurrent run made first is an error of that run's caller to avoid).
    With `replace`, an existing `dest` is swapped out so that a reader sees
    the old or the new folder, never a mix, and then removed."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix=f"{dest.name}.partial-", dir=dest.parent))
    if mode is not None:
        tmp.chmod(mode)  # mkdtemp makes it 0700
    try:
        yield tmp
        interrupts.check()
        with interrupts.held():
            if replace:
                replace_dir(tmp, dest)
            else:
                os.replace(tmp, dest)
    except BaseException:
        remove_tree(tmp)
        raise


def replace_dir(new: pathlib.Path, dest: pathlib.Path) -> None:
    """Put `new` where `dest` is, in two renames (the old one is removed last)."""
    with interrupts.held():  # between the renames `dest` is missing
        old = None
        if dest.exists():
            old = pathlib.Path(tempfile.mkdtemp(prefix=dest.name + ".old-", dir=dest.parent))
            os.replace(dest, old / "x")
        os.replace(new, dest)
    if old is not None:
        remove_tree(old)


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[pathlib.Path]:
    """A private temporary folder, removed when the block ends, however it
    ends; unlike tempfile.TemporaryDirectory, the removal cannot raise over
    the exception that ends the block."""
    path = pathlib.Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        remove_tree(path)


#: How often a folder's removal is tried again (something may still be
#: finishing a write into it), and how long apart.
REMOVE_TRIES = 3
REMOVE_PAUSE = 0.2


def remove_tree(path: pathlib.Path) -> bool:
    """Remove a folder and everything in it; False (and a warning naming it)
    if it could not be. Never raises: a signal meanwhile is only recorded,
    and the next interrupts.check raises it."""
    errors: list[BaseException] = []
    with interrupts.held(raise_after=False):
        for attempt in range(REMOVE_TRIES):
            errors.clear()
            shutil.rmtree(path, onexc=lambda func, name, exc: errors.append(exc))
            if not os.path.lexists(path):
                return True
            if attempt + 1 < REMOVE_TRIES:
                time.sleep(REMOVE_PAUSE)
        reason = f": {errors[0]}" if errors else ""
        print(f"maxtext-rl-overlay: warning: could not remove {path}{reason}; remove it by hand.", file=sys.stderr, flush=True)
        return False


def write_atomically(path: pathlib.Path, data: str | bytes) -> None:
    """Write a file in one rename: a reader sees the old content or the new."""
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with interrupts.held(raise_after=False):
            pathlib.Path(tmp).unlink(missing_ok=True)
        raise
