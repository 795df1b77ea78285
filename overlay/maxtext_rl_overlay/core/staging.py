"""Making a folder or a file appear whole or not at all, and scratch folders.

Every stage that writes a result (a source tree in the cache, a patched tree,
the index) builds it in a private folder beside its destination and moves it
into place in one rename at the end; on any failure, or an interrupt, the
private folder is removed and the destination is as it was. A signal does
not cut a move or a removal short (interrupts.held): it is raised after.

What is atomic, and where:
- rename(2) of a file or folder onto a name in the same folder (os.replace)
  is atomic on POSIX local filesystems (ext4, xfs, btrfs, tmpfs, ...): every
  reader, and a process killed at any instant, sees the old name's target
  or the new one. That is why everything is staged beside its destination,
  in the destination's own folder: across filesystems rename fails (EXDEV)
  and a move would become a copy, which a kill cuts in half. (NFS and other
  network filesystems: a rename is atomic on the server, but a client may
  retry it, or see the old name for a while; CIFS may refuse to replace an
  open file. Keep the index and the cache on a local filesystem.)
- Replacing a folder that exists: rename(2) cannot, so replace_dir uses
  Linux's renameat2(RENAME_EXCHANGE), one atomic swap of the two folders,
  where the filesystem has it (ext4, xfs, btrfs, tmpfs, f2fs; Linux 3.15+,
  glibc 2.28+). Elsewhere it takes two renames, between which the
  destination is missing; a run killed there leaves the old folder in
  `DEST.old-*/x`, which the next run puts back (recover).
- An index and its constraints file are two names, in two folders: no
  single operation replaces both. The file is renamed right after the
  folder's swap (before the old folder is removed), and a record written
  before the swap (publication.begin_pair) lets the next build finish a
  publication a kill cut between the two (publication.finish_pair): until then a reader can see the
  new index with the old constraints file, for a window of two system calls.
- Durability against a lost machine (power, a host crash; a SIGKILL needs
  none of this): a published folder's files and folders, and every staged
  file, are fsynced before their rename, and the rename's folder after it.
  Cache entries are not fsynced: each is checked when it is reused (a
  wheel's sha256, a tree's git id, a record's own sha256), so one a crash
  left wrong is made again, never used.
- The rebase writes the project's files (each patch, series, pin.toml,
  pyproject.toml) with write_atomically and its state record too; the
  record, written after the work it names and removed first at the end, is
  the commit point that makes a set of such files one step (rebase/state.py):
  a killed rebase leaves each file old or new, and the record says which
  step to do again.
- What a killed run leaves beside a destination (`DEST.partial-*`,
  `DEST.<8 hex>`) is removed by the next run that writes that destination,
  under the lock every writer of it holds (recover), saying so: the index,
  the constraints file, a cache entry, a download into the cache
  (staged_path, under the file's cache lock), the cache's CACHEDIR.TAG
  (under a lock of the cache folder itself: buildcache.claim).
- A scratch folder in TMPDIR (`mrl-*`: scratch_dir, and the few
  TemporaryDirectory and mkdtemp folders named so) is left by a killed run,
  and no run removes it: none reads another's (each makes its own, by a new
  name), it is outside the index and the cache, and one may be a build's
  that is still running, which the next run cannot tell from a dead one.
  The user removes them when no build runs, or the system's cleaning of
  TMPDIR does (docs/failures.md, "What a failure leaves behind").
- git's own lock files (`*.lock`) in the cache's rebase repository, left
  by a killed fetch, are not removed either (a live git may hold one): the
  next fetch stops naming the file and what to do (rebase/upstream.py).

Removing a folder never raises: the exception on its way out (an interrupt
above all) stays the one the user sees, and a folder that could not be
removed is named in a warning.

A destination the user named (the index, constraints.txt, the refresh's
pr.md and pr.json; smoke's --json is to call the same check) is replaced
only when it is absent, empty or marked as the tool's own (check_replaceable for a folder,
check_replaceable_file with a FileOwner for a file), and a failure to write
one is an OverlayError naming it ("cannot write X: reason"), never a bug; a
full filesystem or quota (ENOSPC, EDQUOT) is NoSpace, "no space left on
device: cannot write X", what was staged removed."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import errno
import functools
import os
import pathlib
import re
import secrets
import shutil
import stat
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from . import interrupts, output
from .errors import OverlayError

#: What a staging folder's name adds to its destination's.
PARTIAL = ".partial-"


@contextlib.contextmanager
def staged_dir(dest: pathlib.Path, *, replace: str | None = None, mode: int | None = None,
               then: Callable[[], None] | None = None) -> Iterator[pathlib.Path]:
    """Yield an empty folder beside `dest`; move it to `dest` when the block
    ends without an exception, remove it when one escapes.

    Without `replace`, `dest` must not exist by then (a cache entry a
    concurrent run made first is an error of that run's caller to avoid).
    With `replace` (the name of the marker file the caller writes into every
    folder it makes), an existing `dest` that is empty or carries that marker
    is swapped out so that a reader sees the old or the new folder, never a
    mix, and then removed; any other is refused and left as it was (see
    check_replaceable), and a failure to put the folder in place is an
    OverlayError naming `dest`. A replaced folder (a published index) is
    flushed to the disk before the swap (`sync_tree`), and the swap after it;
    `then` runs right after the swap, before the old folder is removed (the
    constraints file that goes with an index: the two are apart for as
    short a time as two renames can be).

    The caller holds a lock that every writer of `dest` takes (or `dest` is
    its own private path): what a killed run left beside `dest` is then
    that run's, and is cleared first (see recover)."""
    with room_for(dest):
        dest.parent.mkdir(parents=True, exist_ok=True)
        recover(dest)
        tmp = pathlib.Path(tempfile.mkdtemp(prefix=f"{dest.name}{PARTIAL}", dir=dest.parent))
    if mode is not None:
        tmp.chmod(mode)  # mkdtemp makes it 0700
    try:
        with room_for(dest, tmp):
            yield tmp
            interrupts.check()
            if replace is not None:
                sync_tree(tmp)
            with interrupts.held():
                if replace is None:
                    os.replace(tmp, dest)
                    if then is not None:
                        then()
                else:
                    check_replaceable(dest, replace)  # again: it may have changed during the block
                    with cannot_write(dest):
                        replace_dir(tmp, dest, then=functools.partial(_after_swap, dest.parent, then))
    except BaseException:
        remove_tree(tmp)
        raise


def _after_swap(folder: pathlib.Path, then: Callable[[], None] | None) -> None:
    sync_dir(folder)  # the swap on the disk
    if then is not None:
        then()


#: What a folder that replace_dir moves aside is named after (its only entry is "x").
OLD = ".old-"


def replace_dir(new: pathlib.Path, dest: pathlib.Path, then: Callable[[], None] | None = None) -> None:
    """Put `new` where `dest` is, run `then` (what must follow at once), and
    remove the old one. Where the system
    and filesystem can (Linux's renameat2 RENAME_EXCHANGE: ext4, xfs, btrfs,
    tmpfs, ...), the two are exchanged in one atomic step, so `dest` is the
    old folder or the new one at every instant, a killed process included;
    elsewhere in two renames, between which `dest` is missing (a signal
    waits for both; a SIGKILL there leaves the old folder in `dest.old-*/x`,
    which recover puts back)."""
    with interrupts.held():
        old = None
        if os.path.lexists(dest) and _exchange(new, dest):
            old = new  # the old folder, now at `new`'s name
        else:
            if os.path.lexists(dest):
                old = pathlib.Path(tempfile.mkdtemp(prefix=f"{dest.name}{OLD}", dir=dest.parent))
                os.replace(dest, old / "x")
            os.replace(new, dest)
        if then is not None:
            then()
    if old is not None:
        remove_tree(old)


#: renameat2's flag (linux/fs.h) and "the current folder" for its fds.
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


@functools.cache
def _renameat2() -> Any:
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    except OSError:
        return None


def _exchange(a: pathlib.Path, b: pathlib.Path) -> bool:
    """Swap the paths `a` and `b` atomically; False where the system or the
    filesystem cannot (nothing moved then)."""
    call = _renameat2()
    if call is None:
        return False
    if call(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), str(b))


#: A staged file's name: its destination's, a dot and 8 hex digits (_create_beside).
_STAGED_FILE = re.compile(r"\.[0-9a-f]{8}")


def recover(dest: pathlib.Path) -> list[str]:
    """Clear what a run killed while writing `dest` left beside it (a
    SIGKILL, the OOM killer, a lost machine: no cleanup ran), and return its
    names: a staging folder `dest.partial-*` or file `dest.<8 hex>` is
    removed, never mistaken for a result; an old folder `dest.old-*/x` that
    replace_dir had moved aside is put back if `dest` is missing (the two
    renames were cut between), else removed. Only for a caller holding the
    lock every writer of `dest` takes: what is there is no live run's."""
    found: list[str] = []
    try:
        beside = sorted(dest.parent.iterdir())
    except FileNotFoundError:
        return found
    for path in beside:
        rest = path.name[len(dest.name):] if path.name.startswith(dest.name) else ""
        if rest.startswith(OLD) and path.is_dir() and not path.is_symlink():
            if not os.path.lexists(dest) and os.path.lexists(path / "x"):
                os.replace(path / "x", dest)
                found.append(f"{path.name} (put back as {dest.name})")
            else:
                found.append(path.name)
            remove_tree(path)
        elif rest.startswith(PARTIAL) and path.is_dir() and not path.is_symlink():
            found.append(path.name)
            remove_tree(path)
        elif _STAGED_FILE.fullmatch(rest) and path.is_file() and not path.is_symlink():
            found.append(path.name)
            path.unlink(missing_ok=True)
    if found:
        output.say(f"cleared what a stopped run left beside {dest}: {', '.join(found)}")
    return found


def sync_tree(root: pathlib.Path) -> None:
    """fsync every file and folder under `root` (and `root`): what is then
    renamed into place is on the disk before its name is, so a machine that
    loses power after the rename finds the whole folder, not empty files."""
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        sync_dir(pathlib.Path(folder))


def sync_dir(folder: pathlib.Path) -> None:
    """fsync a folder: the names in it (a rename into it) reach the disk."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    except OSError as exc:  # a filesystem that cannot sync a folder: nothing more to do there
        if exc.errno not in (errno.EINVAL, errno.EROFS, errno.EBADF):
            raise
    finally:
        os.close(fd)


def check_replaceable(dest: pathlib.Path, marker: str) -> None:
    """Refuse (OverlayError) to replace `dest` unless it is absent, an empty
    folder, or a folder carrying `marker`: one the tool made. Anything else
    (a file, a user's folder) is not the tool's to remove."""
    if not os.path.lexists(dest):
        return
    if dest.is_symlink() or not dest.is_dir():
        raise OverlayError(f"{dest} is a file, not a folder: it is not replaced. Name a folder (absent, empty, or one the tool made).")
    if (dest / marker).is_file() or not any(dest.iterdir()):
        return
    raise OverlayError(
        f"{dest} is a folder the tool did not make (it has files and no {marker}): it is not replaced, since everything in it "
        "would be removed. Name an absent or empty folder, or one an earlier build made (an index made before builds "
        f"marked theirs has no {marker}: remove it by hand)."
    )


#: How much of an existing file a `FileOwner` is shown: its header is at the top.
HEAD_BYTES = 64 * 1024


@dataclasses.dataclass(frozen=True)
class FileOwner:
    """How to tell a file the tool wrote, for check_replaceable_file: `what`
    it is (for the message, "a constraints file"), `mark` (what such a file
    carries, for the message), and `owns`, given the file's first HEAD_BYTES
    bytes, True when it is one the tool wrote."""

    what: str
    mark: str
    owns: Callable[[bytes], bool]

    @classmethod
    def first_line(cls, what: str, line: str, *earlier: str) -> FileOwner:
        """Files the tool writes with `line` as their first line (or, written
        by an earlier version of the tool, one of the `earlier` lines)."""
        ours = {line.encode(), *(e.encode() for e in earlier)}
        return cls(what, f"the first line {line!r}", lambda head: head.split(b"\n", 1)[0] in ours)


def check_replaceable_file(dest: pathlib.Path, owner: FileOwner, *, flag: str = "") -> None:
    """Refuse (OverlayError) to replace the file `dest` unless it is absent,
    empty, or one the tool wrote (`owner` says how to tell): a typo must not
    cost a user's README or pyproject.toml. `flag` (`--constraints`) names
    the option the path came from. Call it before any work, and again just
    before the write (staged_file's `owner`): the file may change meanwhile."""
    try:
        st = os.stat(dest)
    except FileNotFoundError:
        return
    except OSError:
        return  # not reachable: check_writable says why, naming it
    if stat.S_ISDIR(st.st_mode):
        return  # check_writable refuses a folder, naming it
    said = f"{flag} {dest}" if flag else str(dest)
    if not stat.S_ISREG(st.st_mode):
        raise OverlayError(f"{said} is not a regular file: it is not replaced. Name an absent or empty file, or {owner.what} "
                           "the tool wrote.")
    if st.st_size == 0:
        return
    with cannot_write(dest), open(dest, "rb") as f:
        head = f.read(HEAD_BYTES)
    if owner.owns(head):
        return
    raise OverlayError(
        f"{said} is not {owner.what} the tool wrote (it lacks {owner.mark}): it is not replaced, since what it holds would be "
        f"lost. Name an absent or empty file, or {owner.what} an earlier run wrote; if this one is, remove it by hand."
    )


def check_writable(dest: pathlib.Path, *, folder: bool = False) -> None:
    """Check, before any work, that `dest` (a file, or a `folder`) can be
    written where it is: its parent made, and a staging file or folder made
    and removed beside it as the real write will. OverlayError otherwise."""
    with cannot_write(dest):
        for parent in dest.parents:
            if os.path.lexists(parent) and not parent.is_dir():
                raise NotADirectoryError(errno.ENOTDIR, f"{parent} is not a folder")
        if folder:
            dest.parent.mkdir(parents=True, exist_ok=True)
            probe = tempfile.mkdtemp(prefix=f"{dest.name}{PARTIAL}", dir=dest.parent)
            with contextlib.suppress(FileNotFoundError):  # a build holding the lock may clear it first (recover)
                os.rmdir(probe)
        else:
            if dest.is_dir():
                raise IsADirectoryError(errno.EISDIR, "it is a folder; name a file")
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = _create_beside(dest)
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


@contextlib.contextmanager
def cannot_write(dest: pathlib.Path) -> Iterator[None]:
    """An OSError in the block is an OverlayError naming `dest`, the
    destination it was writing, and the system's reason (NoSpace for a full
    filesystem or quota)."""
    try:
        yield
    except OSError as exc:
        if exc.errno in NO_SPACE:
            raise NoSpace(_no_space(dest, exc, dest)) from None
        reason = exc.strerror or str(exc)
        # The file it names, unless that is `dest` or a staging file beside it (a random name says nothing).
        name = os.fsdecode(exc.filename) if exc.filename is not None else str(dest)
        if name != str(dest) and not name.startswith(f"{dest}."):
            reason += f": {name}"
        raise OverlayError(f"cannot write {dest}: {reason}.") from None


#: The errors of a filesystem without room for what is written: no space
#: left on the device, or the user's disk quota reached.
NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT})


class NoSpace(OverlayError):
    """A write failed for want of room (NO_SPACE). What was being made was
    staged, so it is removed on the way out and the destination is as it was;
    the message names the path and says so."""


@contextlib.contextmanager
def room_for(dest: pathlib.Path, staging: pathlib.Path | None = None) -> Iterator[None]:
    """A full filesystem (NO_SPACE) in the block is NoSpace naming `dest`,
    what the block makes (in `staging`, beside it), or the other path the
    failed call names; every other error passes as it is."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in NO_SPACE:
            raise
        raise NoSpace(_no_space(dest, exc, staging)) from None


def _no_space(dest: pathlib.Path, exc: OSError, staging: pathlib.Path | None) -> str:
    """ "no space left on device: cannot write X ..." for a full filesystem:
    X is `dest`, unless the failed call names a path outside `staging` (and
    not beside `dest`): then that path, where the room ran out."""
    said = exc.filename2 if exc.filename2 is not None else exc.filename  # a copy names its source, then what it wrote
    path = str(dest)
    if said is not None:
        name = os.fsdecode(said)
        inside = staging is not None and (name == str(staging) or name.startswith(f"{staging}{os.sep}"))
        if not (inside or name == str(dest) or name.startswith(f"{dest}.")):
            path = str(_destination_of(pathlib.Path(name)))
    why = "disk quota exceeded" if exc.errno == errno.EDQUOT else "no space left on device"
    return (f"{why}: cannot write {path}. Free space on its filesystem (df {_existing(pathlib.Path(path).parent)}) or name another place; "
            "what was being written there was removed, and what was there before is as it was.")


def _destination_of(path: pathlib.Path) -> pathlib.Path:
    """The destination a path in a staging folder (`DEST.partial-*/...`) is
    written for: what the user knows by name; any other path as it is."""
    for folder in (path, *path.parents):
        if PARTIAL in folder.name:
            return folder.parent / folder.name.split(PARTIAL, 1)[0]
    return path


def _existing(path: pathlib.Path) -> pathlib.Path:
    """The nearest folder of `path` that exists (what df can be given)."""
    for folder in (path, *path.parents):
        if folder.is_dir():
            return folder
    return path


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[pathlib.Path]:
    """A private temporary folder, removed when the block ends, however it
    ends; unlike tempfile.TemporaryDirectory, the removal cannot raise over
    the exception that ends the block."""
    with room_for(pathlib.Path(tempfile.gettempdir()) / f"{prefix}..."):
        path = pathlib.Path(tempfile.mkdtemp(prefix=prefix))
    try:
        with room_for(path, path):
            yield path
    finally:
        remove_tree(path)


#: How often a folder's removal is tried again (something may still be
#: finishing a write into it), and how long apart.
REMOVE_TRIES = 3
REMOVE_PAUSE = 0.2


def _rmtree(path: pathlib.Path, errors: list[BaseException]) -> None:
    """shutil.rmtree, each error kept in `errors` (Python 3.12's onexc; 3.11's onerror)."""
    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=lambda func, name, exc: errors.append(exc))
    else:
        shutil.rmtree(path, onerror=lambda func, name, info: errors.append(info[1]))


def remove_tree(path: pathlib.Path) -> bool:
    """Remove a folder and everything in it; False (and a warning naming it)
    if it could not be. Never raises: a signal meanwhile is only recorded,
    and the next interrupts.check raises it."""
    errors: list[BaseException] = []
    with interrupts.held(raise_after=False):
        for attempt in range(REMOVE_TRIES):
            errors.clear()
            _rmtree(path, errors)
            if not os.path.lexists(path):
                return True
            if attempt + 1 < REMOVE_TRIES:
                time.sleep(REMOVE_PAUSE)
        reason = f": {errors[0]}" if errors else ""
        output.warn(f"could not remove {path}{reason}; remove it by hand.")
        return False


def write_atomically(path: pathlib.Path, data: str | bytes, *, owner: FileOwner | None = None) -> None:
    """Write a file in one rename: a reader sees the old content or the new.
    With `owner`, an existing file is replaced only if check_replaceable_file
    lets it."""
    with staged_file(path, data, owner=owner):
        pass


@contextlib.contextmanager
def staged_file(path: pathlib.Path, data: str | bytes, *, owner: FileOwner | None = None) -> Iterator[pathlib.Path]:
    """Write `data` to a file beside `path` now (the block is given its
    name); move it to `path` when the block ends without an exception (a reader sees the old content or the
    new), remove it when one escapes. The file has the mode the umask gives
    (0644 under the usual 022), not mkstemp's 0600: what the tool publishes
    is read by others (a web server, another user). An OSError is an
    OverlayError naming `path`. With `owner`, an existing `path` is replaced
    only if check_replaceable_file lets it, checked just before the rename."""
    with cannot_write(path):
        fd, tmp = _create_beside(path)
    with _removed_if_the_block_fails(tmp):
        with cannot_write(path):
            with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())  # on the disk before its name is (a lost machine finds the old or the new file)
        yield pathlib.Path(tmp)
        if owner is not None:
            check_replaceable_file(path, owner)
        with cannot_write(path):
            os.replace(tmp, path)
            sync_dir(path.parent)


@contextlib.contextmanager
def staged_path(path: pathlib.Path) -> Iterator[pathlib.Path]:
    """An empty file `path.<8 hex>` beside `path`, for the block to fill (a
    download, too big to hold in memory for staged_file); flushed to the
    disk and moved to `path` when the block ends without an exception (a
    reader sees no file or the whole one), removed when one escapes. What a
    killed run left beside `path` is cleared first (recover): the caller
    holds the lock every writer of `path` takes. A full filesystem is
    NoSpace naming `path`."""
    with room_for(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        recover(path)
        fd, tmp = _create_beside(path)
    os.close(fd)
    with _removed_if_the_block_fails(tmp):
        with room_for(path, pathlib.Path(tmp)):
            yield pathlib.Path(tmp)
        interrupts.check()
        with room_for(path, pathlib.Path(tmp)):
            fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)  # on the disk before its name is
            finally:
                os.close(fd)
        with interrupts.held():
            os.replace(tmp, path)
            sync_dir(path.parent)


def copy_atomically(src: pathlib.Path, dest: pathlib.Path) -> None:
    """Copy a file (shutil.copy2) in one rename: `dest` is absent or whole,
    never cut short by a kill, which leaves at most a staged `dest.<8 hex>`
    beside it. For a file too big to hold in memory (write_atomically)."""
    fd, tmp = _create_beside(dest)
    os.close(fd)
    with _removed_if_the_block_fails(tmp):
        shutil.copy2(src, tmp)
        os.replace(tmp, dest)


def remove_file(path: pathlib.Path) -> None:
    """Remove a file (a record whose removal is a commit point), its
    folder then flushed: a lost machine does not find it again."""
    path.unlink(missing_ok=True)
    sync_dir(path.parent)


@contextlib.contextmanager
def _removed_if_the_block_fails(tmp: str) -> Iterator[None]:
    """Remove the staged file `tmp` when anything escapes the block (a
    KeyboardInterrupt too), held against a second interrupt so the removal
    itself is not cut short; the exception goes on."""
    try:
        yield
    except BaseException:
        with interrupts.held(raise_after=False):
            pathlib.Path(tmp).unlink(missing_ok=True)
        raise


def _create_beside(path: pathlib.Path) -> tuple[int, str]:
    """A new file `<path>.<random>` beside `path`, open for writing, made
    with mode 0666 less the umask (as open() makes files)."""
    while True:
        tmp = str(path.parent / f"{path.name}.{secrets.token_hex(4)}")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666), tmp
        except FileExistsError:
            continue
