"""Stage 1: get the pinned upstream tree, verified, into the source cache.

A source is a local git repository or mirror holding the pinned commit, an
unpacked source tree, or a packed one (.tar.gz, .tgz, .tar, .zip); without one
we try the network (git fetch of the commit). Git sources are checked by
commit and tree id, trees by their git tree id computed here. A tree that is
not the pinned one (a PyPI sdist standing in for the pin, say) is refused
unless the caller allows unpinned sources, and is then labelled as such; it
is never substituted silently.
"""

from __future__ import annotations

import dataclasses
import email.parser
import os
import pathlib
import re
import shutil
import tarfile
import zipfile
from typing import Any

from packaging.utils import parse_wheel_filename

from ..cache import buildcache
from ..config import reader, registry
from ..config.pins import Pin
from ..core import gittree
from ..core.digest import sha256_file
from ..core.errors import OverlayError, TimedOut
from ..core.git import git, inside_package, reason, tree_entries
from ..core.git import out as gitout
from ..core.output import step
from ..core.staging import scratch_dir


@dataclasses.dataclass(frozen=True)
class Source:
    distribution: str
    path: pathlib.Path  # a cached tree, checked by its tree id on reuse: copy before changing it
    tree: str  # its git tree id
    commit: str | None  # None for a tree that came without git history
    from_pin: bool
    origin: str  # what the user gave, for the manifest and messages
    upstream_version: str | None  # PKG-INFO's Version, when the tree is an sdist
    date: str = ""  # the commit date, where git history came with the tree
    release: pathlib.Path | None = None  # the release wheel the tree was unpacked from (a pin with [release])


#: A git object id: a tree's, which names its entry.
_HEX40 = re.compile(r"[0-9a-f]{40}")

#: How long fetching one pinned commit may take before we give up on the network.
FETCH_TIMEOUT = 600


def obtain(pin: Pin, given: str | None, *, allow_unpinned: bool, cache: pathlib.Path | None = None) -> Source:
    """The verified source tree of `pin`, from `given` (a path) or the network."""
    cache = reader.cache_dir(cache)
    if pin.release is not None:
        return _from_release(pin, given, cache, allow_unpinned=allow_unpinned)
    if given is None:
        return _from_network(pin, cache)
    path = pathlib.Path(given).expanduser()
    if not path.exists():
        raise OverlayError(f"{pin.distribution}: --source {pin.distribution}={given}: no such file or directory.")
    if path.is_dir() and _is_git_dir(path):
        return _from_git(pin, path, cache, origin=str(given))
    if path.is_dir():
        return _from_tree(pin, path, cache, allow_unpinned=allow_unpinned, origin=str(given))
    return _from_archive(pin, path, cache, allow_unpinned=allow_unpinned, origin=str(given))


def _is_git_dir(path: pathlib.Path) -> bool:
    if shutil.which("git") is None:
        return (path / ".git").exists() or ((path / "HEAD").is_file() and (path / "objects").is_dir())
    proc = git("rev-parse", "--git-dir", cwd=path, check=False)
    return proc.returncode == 0 and pathlib.Path(path, proc.stdout.strip()).resolve() in (
        path.resolve(),
        (path / ".git").resolve(),
    )


def _resolve_git_dir(path: pathlib.Path) -> pathlib.Path:
    return pathlib.Path(gitout("rev-parse", "--absolute-git-dir", cwd=path))


#: The folder of a cached source's entry that holds its tree; the entry's
#: record (buildcache.RECORD) beside it says the git tree id of the files as
#: written (the pinned tree, less any file the repository lacked), the
#: commit, and the files left out.
TREE = "tree"


def _entry(cache: pathlib.Path, pin: Pin, tree: str) -> buildcache.Entry:
    """A source's cache entry, `sources/<dist>-<tree id>`: found by the tree id of what it was made from."""
    return buildcache.KINDS["sources"].entry(cache, f"{pin.distribution}-{tree}", tree, who=pin.distribution)


def _record(tree: pathlib.Path, **record: object) -> dict[str, object]:
    return dict(record, tree=gittree.tree_id(tree))


def _reusable(entry: buildcache.Entry) -> bool:
    """Whether the entry holds a whole cached tree that is still the tree it
    was made as (its files' tree id recomputed, against its record's: a file
    edited in the cache would otherwise go into the next wheel, labelled as
    the pin). A damaged one (an altered tree, one an older tool made) is
    said and removed, to be made again; the caller holds the entry's lock,
    so no other build is making it."""

    def check(record: dict[str, Any]) -> bool:
        if gittree.tree_id(entry.path / TREE) != record["tree"]:
            raise buildcache.Damaged
        return True

    return entry.reuse(check) is not None


def _from_git(pin: Pin, path: pathlib.Path, cache: pathlib.Path, *, origin: str) -> Source:
    if shutil.which("git") is None:
        raise OverlayError(f"{pin.distribution}: {origin} is a git repository but git is not installed.")
    git_dir = _resolve_git_dir(path)
    proc = git("rev-parse", "--verify", "--quiet", f"{pin.commit}^{{commit}}", git_dir=git_dir, check=False)
    if proc.returncode != 0:
        raise OverlayError(
            f"{pin.distribution}: {origin} does not hold the pinned commit {pin.commit} "
            f"({pin.pin_file}). Fetch it there (git fetch {pin.repository} {pin.commit}) or give another --source."
        )
    tree = gitout("rev-parse", f"{pin.commit}^{{tree}}", git_dir=git_dir, who=pin.distribution)
    if pin.tree and tree != pin.tree:
        raise OverlayError(
            f"{pin.distribution}: commit {pin.commit} in {origin} has tree {tree}, but {pin.pin_file} "
            f"records tree {pin.tree}. The pin file is wrong or the repository is corrupt; fix the pin."
        )
    date = gitout("log", "-1", "--format=%cI", pin.commit, git_dir=git_dir, who=pin.distribution)
    if pin.date and date != pin.date:
        raise OverlayError(f"{pin.distribution}: commit {pin.commit} is dated {date}, but {pin.pin_file} says {pin.date}; fix the pin.")
    entry = _entry(cache, pin, tree)
    with entry.locked():
        if not _reusable(entry):
            with step(pin.distribution, f"checking out {pin.commit[:12]} from {origin}"):
                record = entry.make(lambda staged: _materialize(git_dir, pin, staged / TREE))
            if record["absent"]:
                step.note(pin.distribution, f"{len(record['absent'])} file(s) outside the package are absent from the repository and left "
                                            f"out: {', '.join(record['absent'])}")
    return Source(pin.distribution, entry.path / TREE, tree, pin.commit, True, origin, None, date)


def _materialize(git_dir: pathlib.Path, pin: Pin, tmp: pathlib.Path) -> dict[str, object]:
    """Write the tree of the pinned commit into `tmp`, file by file (a
    mirror may lack large blobs: those are allowed only outside the import
    package); its cache record."""
    entries = tree_entries(git_dir, pin.commit)
    for e in entries:
        if e.kind != "blob":
            raise OverlayError(f"{pin.distribution}: the pinned tree has a {e.kind} at {e.path}; submodules are not supported.")
    batch = git("cat-file", "--batch", git_dir=git_dir, input="".join(e.oid + "\n" for e in entries).encode(), text=False,
                who=pin.distribution).stdout
    tmp.mkdir()
    absent = []
    pos = 0
    for e in entries:
        mode, oid, name = e.mode, e.oid, e.path
        end = batch.index(b"\n", pos)
        header = batch[pos:end].split()
        pos = end + 1
        if header[-1] == b"missing":
            absent.append(name)
            continue
        size = int(header[2])
        data = batch[pos : pos + size]
        pos += size + 1
        if gittree.blob_id(data) != oid:
            raise OverlayError(f"{pin.distribution}: blob {oid} ({name}) in {git_dir} is corrupt.")
        dest = tmp / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        if mode == "120000":
            os.symlink(data.decode(), dest)
        else:
            dest.write_bytes(data)
            os.chmod(dest, 0o755 if mode == "100755" else 0o644)
    inside = inside_package(absent, pin.import_package)
    if inside:
        raise OverlayError(
            f"{pin.distribution}: the repository lacks files of the package itself: {', '.join(inside)}. "
            "Use a complete clone as --source."
        )
    return _record(tmp, commit=pin.commit, absent=absent)


def _ensure(path: pathlib.Path) -> pathlib.Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def _from_tree(pin: Pin, path: pathlib.Path, cache: pathlib.Path, *, allow_unpinned: bool, origin: str) -> Source:
    with step(pin.distribution, f"hashing the tree {origin}"):
        tree = gittree.tree_id(path)
    from_pin = bool(pin.tree) and tree == pin.tree
    version = _sdist_version(path)
    if not from_pin and not allow_unpinned:
        raise OverlayError(
            f"{pin.distribution}: {origin} is not the pinned tree (its tree id is {tree}; "
            f"{pin.pin_file} pins commit {pin.commit}, tree {pin.tree or 'unrecorded'}). "
            "Give a repository holding the pinned commit, or pass --unpinned to build this tree as a "
            "stand-in, labelled as not built from the pin."
        )
    entry = _entry(cache, pin, tree)
    with entry.locked():
        if not _reusable(entry):
            entry.make(lambda staged: _record(_copy(path, staged / TREE)))
    if not from_pin:
        step.note(pin.distribution, f"UNPINNED source {origin} (tree {tree[:12]}, version {version or '?'}): wheels will be labelled unpinned")
    return Source(pin.distribution, entry.path / TREE, tree, None, from_pin, origin, version)


def _copy(tree: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    shutil.copytree(tree, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    return dest


def _from_archive(pin: Pin, path: pathlib.Path, cache: pathlib.Path, *, allow_unpinned: bool, origin: str) -> Source:
    with scratch_dir("mrl-unpack-") as root:
        with step(pin.distribution, f"unpacking {path.name}"):
            try:
                if zipfile.is_zipfile(path):
                    with zipfile.ZipFile(path) as zf:
                        zf.extractall(root)
                else:
                    with tarfile.open(path) as tf:
                        tf.extractall(root, filter="data")
            except (tarfile.TarError, zipfile.BadZipFile, OSError) as exc:
                raise OverlayError(f"{pin.distribution}: {origin} is neither a directory, a git repository nor a readable archive: {exc}") from None
        top = list(root.iterdir())
        tree_root = top[0] if len(top) == 1 and top[0].is_dir() else root
        return _from_tree(pin, tree_root, cache, allow_unpinned=allow_unpinned, origin=origin)


def _sdist_version(path: pathlib.Path) -> str | None:
    pkg_info = path / "PKG-INFO"
    if not pkg_info.is_file():
        return None
    return email.parser.Parser().parsestr(pkg_info.read_text(errors="replace")).get("Version")


def _from_network(pin: Pin, cache: pathlib.Path) -> Source:
    """Fetch the pinned commit with git; the only network path (no archive
    download is tried: an archive's tree id cannot be checked before
    unpacking it whole, and git checks every object it receives)."""
    flag = f"--source {pin.distribution}=PATH"
    if shutil.which("git") is None:
        raise OverlayError(f"{pin.distribution}: no source given and git is not installed to fetch {pin.repository} at {pin.commit}. Pass {flag}.")
    mirror = buildcache.Entry(_ensure(cache / "git") / f"{pin.distribution}.git", f"{pin.distribution}.git", who=pin.distribution,
                              kind="git")
    with mirror.locked():
        _fetch_pinned(pin, mirror.path, flag)
    return _from_git(pin, mirror.path, cache, origin=pin.repository)


def _fetch_pinned(pin: Pin, mirror: pathlib.Path, flag: str) -> None:
    if not mirror.exists():
        git("init", "-q", "--bare", str(mirror), who=pin.distribution)
    has = git("cat-file", "-e", f"{pin.commit}^{{commit}}", git_dir=mirror, check=False).returncode == 0
    if not has:
        with step(pin.distribution, f"fetching {pin.commit[:12]} from {pin.repository}"):
            try:
                proc = git("fetch", "-q", "--depth=1", pin.repository, pin.commit, git_dir=mirror, check=False, timeout=FETCH_TIMEOUT)
                failed = proc.returncode != 0
                why = reason(str(proc.stderr), "git fetch failed")
            except TimedOut as exc:
                failed, why = True, f"timed out after {exc.seconds:.0f} s"
        if failed:
            raise OverlayError(
                f"{pin.distribution}: cannot reach {pin.repository} to fetch the pinned commit {pin.commit} "
                f"({why}). Pass {flag} with a local clone or mirror holding that commit, "
                "or a source tree of it."
            )


def _from_release(pin: Pin, given: str | None, cache: pathlib.Path, *, allow_unpinned: bool) -> Source:
    """The files of the pin's release wheel ([release]), unpacked, its
    .dist-info aside: the package index's copy (its sha256 checked against
    the pin's), or the wheel given with --source. A wheel with another
    sha256 is a stand-in, refused unless unpinned sources are allowed."""
    release = pin.release
    assert release is not None
    if given is None:
        wheel = registry.release_wheel(pin.distribution, release.version, cache / "releases")
        origin = f"the package index's {wheel.name}"
    else:
        wheel = pathlib.Path(given).expanduser()
        origin = str(given)
        if not wheel.is_file() or not zipfile.is_zipfile(wheel):
            raise OverlayError(f"{pin.distribution}: --source {pin.distribution}={given}: {pin.distribution} is built from its release "
                               f"wheel ({release.wheel}, {pin.pin_file} [release]): give that wheel's file, or no --source to take it "
                               "from the package index.")
    sha = sha256_file(wheel)
    if sha != release.sha256 and not allow_unpinned:
        raise OverlayError(f"{pin.distribution}: {origin} has sha256 {sha}, not the pinned {release.wheel}'s {release.sha256} "
                           f"({pin.pin_file} [release]). Give the pinned wheel, or pass --unpinned to build this one as a "
                           "stand-in, labelled as not built from the pin.")
    tree, version = _release_tree(pin, wheel, sha, cache), wheel_file_version(wheel)
    from_pin = sha == release.sha256 and tree == pin.tree
    if not from_pin:
        step.note(pin.distribution, f"UNPINNED source {origin} (tree {tree[:12]}, version {version}): wheels will be labelled unpinned")
    return Source(pin.distribution, _entry(cache, pin, tree).path / TREE, tree, None, from_pin, origin, version, release=wheel)


def _wheel_entry(cache: pathlib.Path, pin: Pin, sha: str) -> buildcache.Entry:
    """What a release wheel unpacked to, `sources/<dist>-wheel-<sha256>.json`:
    a record of the tree id of its files, found by the wheel's sha256 and
    written once their tree's entry is whole, so that a build of a wheel
    unpacked before finds that entry without unpacking and hashing it again
    (MaxText's wheel: 36 MiB, some 650 files)."""
    return buildcache.KINDS["sources"].entry(cache, f"{pin.distribution}-wheel-{sha}.json", sha, who=pin.distribution, one_file=True)


def _recorded_tree(record: dict[str, Any]) -> str:
    tree = record["tree"]
    if not isinstance(tree, str) or not _HEX40.fullmatch(tree):  # it names an entry's folder: nothing else
        raise buildcache.Damaged
    return tree


def _release_tree(pin: Pin, wheel: pathlib.Path, sha: str, cache: pathlib.Path) -> str:
    """The tree id of the files of `wheel` (of sha256 `sha`), whose entry
    (_entry) holds them, whole: the one a build of the same wheel recorded
    (_wheel_entry), where that entry is still whole and unaltered (_reusable,
    as every source's), else unpacked and hashed here. Either way a tree
    other than the pin's, from the pinned wheel, is refused. Under the
    record's lock throughout: a second build of the wheel waits for the
    first, then reuses what it made."""
    index = _wheel_entry(cache, pin, sha)
    with index.locked():
        tree = index.reuse(_recorded_tree)  # none, or a damaged record (said): unpack
        if tree is not None:
            _check_release_tree(pin, tree, sha)
            entry = _entry(cache, pin, tree)
            with entry.locked():
                if _reusable(entry):
                    return tree
        with scratch_dir("mrl-unpack-") as root:
            with step(pin.distribution, f"unpacking {wheel.name}"):
                unpack_wheel(wheel, root / TREE)
            tree = gittree.tree_id(root / TREE)
            _check_release_tree(pin, tree, sha)
            entry = _entry(cache, pin, tree)
            with entry.locked():
                if not _reusable(entry):
                    entry.make(lambda staged: _record(_copy(root / TREE, staged / TREE), wheel=wheel.name, sha256=sha))
        # Written once the tree's entry is whole (atomically: a one-file
        # entry), so a record found always names a tree that was made.
        index.make(lambda _: {"tree": tree, "wheel": wheel.name})
    return tree


def _check_release_tree(pin: Pin, tree: str, sha: str) -> None:
    release = pin.release
    assert release is not None
    if sha == release.sha256 and pin.tree and tree != pin.tree:
        raise OverlayError(f"{pin.distribution}: {release.wheel} unpacks to tree {tree}, but {pin.pin_file} records tree "
                           f"{pin.tree}. The pin file is wrong; fix its tree.")


def wheel_file_version(wheel: pathlib.Path) -> str:
    """The version a wheel's file name gives."""
    return str(parse_wheel_filename(wheel.name)[1])


def unpack_wheel(wheel: pathlib.Path, dest: pathlib.Path) -> None:
    """Write a wheel's files but its .dist-info into `dest` (mode 0755 where
    the archive marks a file executable, else 0644)."""
    dest.mkdir()
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            top = info.filename.split("/", 1)[0]
            if info.is_dir() or top.endswith(".dist-info"):
                continue
            parts = pathlib.PurePosixPath(info.filename).parts
            if info.filename.startswith("/") or ".." in parts:
                raise OverlayError(f"{wheel.name} holds a file outside its tree: {info.filename}")
            if top.endswith(".data"):
                raise OverlayError(f"{wheel.name} holds {top}/: a wheel with a .data folder is not a tree a series can apply to.")
            path = dest.joinpath(*parts)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(zf.read(info))
            os.chmod(path, 0o755 if (info.external_attr >> 16) & 0o111 else 0o644)
