"""Making a folder or a file appear whole or not at all.

Every stage that writes a result (a source tree in the cache, a patched tree,
the index) builds it in a private folder beside its destination and moves it
into place in one rename at the end; on any failure, or an interrupt, the
private folder is removed and the destination is as it was."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator


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
        if replace:
            replace_dir(tmp, dest)
        else:
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def replace_dir(new: pathlib.Path, dest: pathlib.Path) -> None:
    """Put `new` where `dest` is, in two renames (the old one is removed last)."""
    old = None
    if dest.exists():
        old = pathlib.Path(tempfile.mkdtemp(prefix=dest.name + ".old-", dir=dest.parent))
        os.replace(dest, old / "x")
    os.replace(new, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_atomically(path: pathlib.Path, data: str | bytes) -> None:
    """Write a file in one rename: a reader sees the old content or the new."""
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", dir=path.parent)
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
