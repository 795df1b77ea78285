"""What the tool keeps between runs, keyed by every input that made it.

A warm rebuild with unchanged inputs must cost little more than reading its
results back, and give the same bytes as a cold build. So a kept result (an
Entry: a source tree, a patched tree, a wheel, a build environment, a
resolution of the closure, a release's record) is found by the sha256 of a
record of its inputs (cachekeys: contents rather than paths, the uv that made
it and how it was configured, the compilers, and the tool's own code). A
change to any of them is a miss, never a stale answer. The record is stored beside the result, which is written
whole and checked by its own sha256 when it is reused.

Several builds may share one cache (two checkouts, a CI runner's jobs), so
every entry is made and read under its own lock (flock on
`locks/<kind>/<entry>.lock`, so the entries' folders hold only entries):
one build makes an entry while the others wait for it, and none removes an
entry another is filling. A build holds the cache's own lock shared for its
whole run, and `clean` takes it exclusively, so the cache is never emptied
under a running build. The cache's root carries a CACHEDIR.TAG, so backup
and archiving tools skip it.

The folder MRL_CACHE_DIR names may be anything (a typo, ~/.cache, $HOME),
so the tag is also what makes it the tool's: a build starts a cache only in
an absent or empty folder (or one already tagged), and `clean` acts only on
a folder carrying the tool's own tag, removing only the KINDS the tool
keeps there and naming anything else it finds."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import pathlib
import shutil
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from ..core import output
from ..core.errors import ExitCode, OverlayError
from ..core.staging import cannot_write, recover, remove_tree, room_for, staged_dir, write_atomically

#: The cache directory tag (https://bford.info/cachedir/): its first line is fixed by that convention.
CACHEDIR_TAG = "CACHEDIR.TAG"
#: The tag's text: what makes a folder the tool's cache (see claim).
TAG_TEXT = (
    "Signature: 8a477f597d28d172789f06886806bc55\n"
    "# This file is a cache directory tag created by maxtext-rl-overlay.\n"
    "# For information about cache directory tags, see https://bford.info/cachedir/\n"
    "# Everything here can be made again; `maxtext-rl-overlay clean` empties it.\n"
)
#: Where the locks live, in the cache; the cache's own lock (held shared by
#: every build, exclusively by `clean`) is the one at its top.
LOCKS = "locks"
ROOT_LOCK = "cache.lock"
@dataclasses.dataclass(frozen=True)
class Said:
    """How the output names one kind of kept result: the words of the module
    that keeps it, given to the Entry methods that say something. `result`,
    one entry's result ("wheel"); `afresh`, what the build does instead of
    reusing a damaged one; `kept`, how it was kept ("kept"; "cached" for a
    resolution, as the resolution's other notes say). The sentences are
    made here, so that every kind says it alike."""

    result: str
    afresh: str
    kept: str = "kept"

    def damaged(self, key: str) -> str:
        return f"ignoring a damaged {self.kept} {self.result} {key[:12]}: {self.afresh}"

    def not_kept(self, why: BaseException) -> str:
        return f"the {self.result} was not kept for reuse ({why})"


@dataclasses.dataclass(frozen=True)
class Kind:
    """One folder of the cache, `<cache>/<folder>/<entry>`: what it holds
    and who makes it (`about`: clean's list), and, for a kind whose entries
    keep records, how the output names one of its results (`said`); the
    others, the git mirrors and the downloads, are named by what they hold
    (a commit, a sha256) and checked by it on every use, as Entries too,
    under the same per-entry locks (Entry.locked). A kind makes its own
    entries (`entry`)."""

    folder: str
    about: str
    said: Said | None = None

    @property
    def records(self) -> bool:
        return self.said is not None

    def entry(self, cache: pathlib.Path, name: str, key: str, *, who: str, one_file: bool = False) -> Entry:
        """Its entry `name` in the cache `cache`, found by `key`, made for `who`."""
        return Entry(cache / self.folder / name, key, who=who, kind=self.folder, one_file=one_file)


#: The folders the tool keeps in the cache: all that `clean` removes.
KINDS = {kind.folder: kind for kind in (
    Kind("sources", "checked-out source trees, and the tree each release wheel unpacked to (sources.py)", Said("source tree", "making it again")),
    Kind("git", "git mirrors of the upstreams (sources.py, rebase)"),
    Kind("patched", "patched trees (patching.py)", Said("patched tree", "patching afresh")),
    Kind("wheels", "built wheels (wheels.py)", Said("wheel", "building afresh")),
    Kind("buildenv", "build environments (buildenv.py)", Said("build environment", "making it again")),
    # "cached", as the resolution's other notes say
    Kind("closures", "resolutions of the closure (closures.py)", Said("resolution", "resolving afresh", kept="cached")),
    Kind("releases", "MaxText release wheels (registry.py, for environment.py)", Said("release record", "asking the index again")),
    Kind("standins", "the stand-in sdists of the tests (tests/standins.py)"),
)}


#: What a kept folder holds beside its result: its record.
RECORD = "record.json"
_T = TypeVar("_T")


class Damaged(Exception):
    """What an Entry's check raises for an entry that is not what its
    record says (a wheel of another sha256, a tree of another id)."""


@dataclasses.dataclass(frozen=True)
class Entry:
    """One kept result, `<cache>/<kind>/<name>`, of every kind the cache
    holds (`kind`: one of KINDS), found by `key`: the key() of the inputs
    that made it (a source tree: its git tree id), or, in a kind without
    records, what it is named by and checked against on every use (a
    download: its sha256; a git mirror: its name, as it holds every commit
    fetched into it). Every entry is made and used under its lock
    (`locked`); only a kind with records has the record-keeping below
    (`reuse`, `store`, `make`).

    A folder holds the result's files and its record (RECORD); a result that
    is text (a resolution) is one JSON file, `one_file`, that is its own
    record. A record is JSON: the key, the inputs (for whoever reads the
    cache) and what lets the result be checked when it is reused. An entry
    is made and reused under its lock (`locked`): one build makes it while
    the others wait, then reuse it. `who` is whom it is made for (a
    distribution, "constraints"): whose lines its notes are. What it is
    called in them is its kind's (Kind.said)."""

    path: pathlib.Path
    key: str
    who: str
    kind: str
    one_file: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.kind!r} is not a kind of the cache")

    def _records(self) -> None:
        # A mirror or a download has no record: what it holds is checked by its name.
        if not KINDS[self.kind].records:
            raise ValueError(f"{self.kind!r} is not a kind of the cache that keeps entries with records")

    @property
    def _said(self) -> Said:
        said = KINDS[self.kind].said
        assert said is not None  # _records() said so first
        return said

    @property
    def record_path(self) -> pathlib.Path:
        return self.path if self.one_file else self.path / RECORD

    @property
    def lock_path(self) -> pathlib.Path:
        """Its lock file, `<cache>/locks/<kind folder>/<name>.lock`: beside
        the entries' folders, so that they hold only entries."""
        return self.path.parent.parent / LOCKS / self.path.parent.name / f"{self.path.name}.lock"

    def locked(self) -> contextlib.AbstractContextManager[None]:
        """Hold its lock, exclusively, for the block: make it, or check and
        read it, while no other build touches it."""
        return _flock(self.lock_path, who=self.who, what=f"the cache's {self.path.parent.name}/{self.path.name}")

    def reuse(self, check: Callable[[dict[str, Any]], _T]) -> _T | None:
        """What `check` makes of the record of a whole entry; None for no
        entry (a folder without its record is one a build was stopped in),
        and for a damaged one, which is said (in its kind's words) and removed (the caller
        makes it again). Damaged: a record that cannot be read, is not JSON
        or is another key's, or one `check` rejects: raising Damaged, or
        KeyError, TypeError or ValueError (a field missing or of the wrong
        kind), or OSError (a file of the entry missing or unreadable)."""
        self._records()
        if not os.path.lexists(self.record_path):
            return None
        try:
            record = json.loads(self.record_path.read_text())
            if not isinstance(record, dict) or record.get("key") != self.key:
                raise Damaged
            return check(record)
        except (Damaged, OSError, ValueError, KeyError, TypeError):
            pass
        output.note(self.who, self._said.damaged(self.key))
        self._remove()
        return None

    def _remove(self) -> None:
        if self.path.is_dir() and not self.path.is_symlink():
            shutil.rmtree(self.path, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                self.path.unlink(missing_ok=True)

    def _text(self, record: dict[str, Any]) -> str:
        return json.dumps({**record, "key": self.key}, indent=1, sort_keys=True) + "\n"

    def store(self, record: dict[str, Any], fill: Callable[[pathlib.Path], object] | None = None) -> bool:
        """Keep a copy of a result made elsewhere (a wheel, a patched tree, a
        resolution): `record` (the key is added) and, in a folder, what
        `fill` puts into the (staged) folder it is given. An entry appears
        whole or not at all. False, said (in its kind's words), when the cache cannot take it
        (full, read-only): the result stands, only its reuse is lost."""
        try:
            self.make(lambda staged: (fill is not None and fill(staged), record)[1])
        except (OSError, OverlayError) as exc:  # OverlayError: staging's "cannot write", and NoSpace
            output.note(self.who, self._said.not_kept(exc))
            return False
        return True

    def make(self, fill: Callable[[pathlib.Path], dict[str, Any]], *, in_place: bool = False) -> dict[str, Any]:
        """Make a result that lives in the cache (a source tree, a build
        environment): `fill` makes it in the folder it is given and returns
        its record (the key is added), which is written last: what says the
        entry is whole. The folder is staged beside the entry and renamed
        into place; `in_place` (a venv, which cannot be moved once made) it
        is the entry's own, and the record is written whole (a rename). A
        `one_file` entry is its record alone (`fill` is given nothing). On
        any failure (a full disk, a failed install) what was made is removed
        and the error goes on: the caller needs the result, not only its
        reuse. Returns the record, as written."""
        self._records()
        if self.one_file:
            record = fill(self.path)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            recover(self.path)  # under the entry's lock: a staged copy beside it is a killed build's
            write_atomically(self.path, self._text(record))
            return {**record, "key": self.key}
        shutil.rmtree(self.path, ignore_errors=True)
        if not in_place:
            with staged_dir(self.path) as staged:
                record = fill(staged)
                (staged / RECORD).write_text(self._text(record))
            return {**record, "key": self.key}
        try:
            record = fill(self.path)
            with room_for(self.path):
                write_atomically(self.record_path, self._text(record))
        except BaseException:
            remove_tree(self.path)
            raise
        return {**record, "key": self.key}


@contextlib.contextmanager
def _flock(path: pathlib.Path, *, who: str, what: str, shared: bool = False, wait: bool = True) -> Iterator[None]:
    """Hold the flock of `path` (exclusive unless `shared`) for the block.

    A lock held elsewhere is waited for, said once in the output; with
    `wait=False` BlockingIOError is raised instead. Should a lock file be
    removed while it is waited for, the waiter finds that the file it locked
    is no longer the one at the path, and locks the one there now."""
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
            except BlockingIOError:
                if not wait:
                    raise
                output.note(who, f"waiting for another build to finish with {what}")
                fcntl.flock(fd, mode)
            held = os.fstat(fd)
            try:
                current: os.stat_result | None = os.stat(path)
            except FileNotFoundError:
                current = None
        except BaseException:
            os.close(fd)
            raise
        if current is not None and (current.st_ino, current.st_dev) == (held.st_ino, held.st_dev):
            break
        os.close(fd)  # removed while we waited: lock the file at the path now
    try:
        yield
    finally:
        os.close(fd)


def flock(path: pathlib.Path, *, who: str, what: str) -> contextlib.AbstractContextManager[None]:
    """Hold the flock of the file `path` (made if absent) exclusively for
    the block, waiting for another holder (said once in the output): how
    two builds writing one destination take turns."""
    return _flock(path, who=who, what=what)


def own_tag(cache: pathlib.Path) -> bool:
    try:
        return (cache / CACHEDIR_TAG).read_text() == TAG_TEXT
    except (OSError, UnicodeDecodeError):
        return False


def claim(cache: pathlib.Path) -> None:
    """Make `cache` the tool's cache, or check that it is: tagged with the
    tool's CACHEDIR.TAG, or absent or empty (then tagged now). A folder
    holding anything else is refused: it is not the tool's to fill (and the
    tag would hide it from backups), nor to empty with `clean`.

    The tag is written (staged beside it, `CACHEDIR.TAG.<8 hex>`) under an
    exclusive flock of the cache folder itself (no lock file can go into a
    folder not yet known to be the tool's), and every build takes that lock
    when it finds such a staged tag: it is then a killed run's, and is
    removed, saying so (staging.recover)."""
    tag = cache / CACHEDIR_TAG
    with cannot_write(cache):
        cache.mkdir(parents=True, exist_ok=True)
        if own_tag(cache) and not _staged_tags(cache):
            return
        with folder_lock(cache) as held:
            if held:
                recover(tag)  # what a run killed while tagging left: no live run's, under this lock
            if own_tag(cache):
                return
            # Without the lock (see folder_lock), another build tagging it this moment leaves only its staged tag.
            found = sorted(p.name for p in cache.iterdir() if not p.name.startswith(CACHEDIR_TAG + "."))
            if found and found != [CACHEDIR_TAG]:
                raise OverlayError(
                    f"the cache folder {cache} (MRL_CACHE_DIR) holds {_some(found)} and no {CACHEDIR_TAG} of maxtext-rl-overlay: "
                    "it is not a cache this tool made, and the build does not start one there. Set MRL_CACHE_DIR to an absent "
                    "or empty folder (or unset it for the default)."
                )
            if found:  # a tag, but not the tool's text: another program's cache
                raise OverlayError(f"the cache folder {cache} (MRL_CACHE_DIR) carries a {CACHEDIR_TAG} that is not maxtext-rl-overlay's: "
                                   "set MRL_CACHE_DIR to an absent or empty folder (or unset it for the default).")
            write_atomically(tag, TAG_TEXT)


def _staged_tags(cache: pathlib.Path) -> list[str]:
    """The staged tags (`CACHEDIR.TAG.<8 hex>`) in the cache's root."""
    return [p.name for p in cache.iterdir() if p.name.startswith(CACHEDIR_TAG + ".")]


@contextlib.contextmanager
def folder_lock(folder: pathlib.Path) -> Iterator[bool]:
    """An exclusive flock of the folder itself for the block (True): how
    builds take turns tagging the cache, and clear a staged tag a killed
    one left. False where the filesystem cannot lock a folder (NFS): the
    block runs unlocked, and clears nothing."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held = True
        except OSError as exc:
            if exc.errno not in (errno.EBADF, errno.EINVAL, errno.ENOLCK, errno.EOPNOTSUPP):
                raise
            held = False
        yield held
    finally:
        os.close(fd)


def _some(names: list[str], most: int = 5) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


@contextlib.contextmanager
def using(cache: pathlib.Path) -> Iterator[None]:
    """A build's hold on the cache: shared with other builds, not with
    `clean`. The folder is claimed first (see claim)."""
    claim(cache)
    try:
        hold = _flock(cache / LOCKS / ROOT_LOCK, who="cache", what="the cache", shared=True, wait=False)
        hold.__enter__()
    except BlockingIOError:
        raise OverlayError(f"the cache {cache} is being cleaned (maxtext-rl-overlay clean); build again when that has finished.") from None
    try:
        yield
    finally:
        hold.__exit__(None, None, None)


@dataclasses.dataclass(frozen=True)
class Cleaned:
    cache: pathlib.Path
    removed: tuple[str, ...]  # the folders removed from the cache's root: KINDS
    freed: int  # bytes
    left: tuple[str, ...] = ()  # what else the cache's root holds, not the tool's: left as it is


def command(cache: pathlib.Path) -> int:
    """`clean`: the cache emptied (`clean`), what went and what was left said; the exit status."""
    done = clean(cache)
    what = "removed " + ", ".join(done.removed) if done.removed else "nothing was kept"
    print(f"clean: {done.cache}: {what}; {done.freed / 2**30:.1f} GiB freed")
    if done.left:
        print(f"clean: left {', '.join(done.left)}: not the tool's (remove by hand what you do not need)")
    return ExitCode.OK


def clean(cache: pathlib.Path) -> Cleaned:
    """Remove everything the tool keeps in `cache` (the KINDS), keeping its
    tag and its locks (no build holds one: they are taken only under the
    cache's own lock) and whatever else is there (named in `left`). Refused
    for a folder without the tool's own tag, and while a build is using the
    cache: it may be reading any entry."""
    if not cache.is_dir() or not any(cache.iterdir()):
        return Cleaned(cache, (), 0)
    if not own_tag(cache):
        raise OverlayError(
            f"{cache} (MRL_CACHE_DIR) does not carry maxtext-rl-overlay's {CACHEDIR_TAG}: it is not a cache this tool made, "
            "so clean removes nothing from it. Check MRL_CACHE_DIR."
        )
    removed, left, freed = [], [], 0
    try:
        with _flock(cache / LOCKS / ROOT_LOCK, who="cache", what="the cache", wait=False):
            for item in sorted(cache.iterdir()):
                if item.name in (CACHEDIR_TAG, LOCKS):
                    continue
                if item.name not in KINDS or item.is_symlink() or not item.is_dir():
                    left.append(item.name)
                    continue
                freed += _size(item)
                shutil.rmtree(item)
                removed.append(item.name)
    except BlockingIOError:
        raise OverlayError(f"the cache {cache} is in use by a running build; clean it once the build has finished.") from None
    return Cleaned(cache, tuple(removed), freed, tuple(left))


def _size(path: pathlib.Path) -> int:
    if path.is_symlink() or not path.is_dir():
        return path.lstat().st_size
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
