"""The upstream side of a rebase: a git directory holding the old pin and
the new ref (a --source repository, or one fetched into the cache), and the
work clone the series is applied in."""

from __future__ import annotations

import os
import pathlib
import shutil

from ..cache import buildcache
from ..config.pins import Pin
from ..core.errors import OverlayError
from ..core.git import git, inside_package, lock_file, missing_blobs, out, reason
from ..core.output import step
from ..core.staging import copy_atomically


def resolve(pin: Pin, new_ref: str, source: str | None, cache: pathlib.Path) -> tuple[pathlib.Path, str]:
    """A git directory holding the old pin and NEW_REF, and NEW_REF's commit."""
    if source:
        path = pathlib.Path(source).expanduser()
        proc = git("rev-parse", "--absolute-git-dir", cwd=path, check=False) if path.is_dir() else None
        if proc is None or proc.returncode != 0:
            raise OverlayError(f"{pin.distribution}: --source {source} is not a git repository or mirror; a rebase needs the upstream's history.")
        git_dir = pathlib.Path(proc.stdout.strip())
        origin = source
    else:
        git_dir = _fetch(pin, new_ref, cache)
        new_ref = "refs/mrl/new"
        origin = pin.repository
    proc = git("rev-parse", "--verify", "--quiet", f"{new_ref}^{{commit}}", git_dir=git_dir, check=False)
    if proc.returncode != 0:
        raise OverlayError(f"{pin.distribution}: {origin} has no commit, tag or branch {new_ref!r}; fetch it there or name another.")
    return git_dir, proc.stdout.strip()


def _fetch(pin: Pin, new_ref: str, cache: pathlib.Path) -> pathlib.Path:
    """NEW_REF (as refs/mrl/new), the tags and the pin, fetched from the pin's repository."""
    buildcache.claim(cache)  # tagged as the tool's before anything goes in, as a build does
    git_dir = cache / "git" / f"{pin.distribution}-rebase.git"
    # Every time, not only when the folder is missing: git init completes a
    # repository a killed run left half made, and changes nothing in a whole one.
    git_dir.parent.mkdir(parents=True, exist_ok=True)
    git("init", "-q", "--bare", str(git_dir))
    with step(pin.distribution, f"fetching {new_ref} and the pin {pin.commit[:12]} from {pin.repository}"):
        proc = git("fetch", "-q", "--no-tags", pin.repository, new_ref, "+refs/tags/*:refs/tags/*", git_dir=git_dir, check=False)
        if proc.returncode != 0:
            lock = lock_file(proc.stderr)
            if lock is not None:  # not the network's nor the repository's fault: --source would not help
                raise OverlayError(
                    f"{pin.distribution}: cannot fetch {new_ref} into the cache's {git_dir}: git's lock file {lock} exists. "
                    "A git command stopped there (a rebase that was killed) left it, or another rebase is fetching "
                    f"into it now. If no other rebase is running, remove {lock} and run again."
                )
            raise OverlayError(
                f"{pin.distribution}: cannot fetch {new_ref} from {pin.repository} ({pin.pin_file}): "
                f"{reason(proc.stderr, 'git fetch failed').rstrip('.')}. Pass --source PATH with a local clone or mirror."
            )
        git("update-ref", "refs/mrl/new", "FETCH_HEAD", git_dir=git_dir)
        if not has_commit(git_dir, pin.commit):
            git("fetch", "-q", "--no-tags", pin.repository, pin.commit, git_dir=git_dir, check=False)
    return git_dir


def has_commit(git_dir: pathlib.Path, commit: str) -> bool:
    return git("cat-file", "-e", f"{commit}^{{commit}}", git_dir=git_dir, check=False).returncode == 0


def work_clone(pin: Pin, git_dir: pathlib.Path, commit: str, work: pathlib.Path, old: str, patches: list[pathlib.Path]) -> list[str]:
    """A fresh work clone at `commit` that borrows the upstream's objects
    (git alternates: nothing is copied), with the blobs the series makes at
    the old pin (`patches`, in order). Returns the notes."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    git("init", "-q", cwd=work)
    objects = (git_dir / "objects").resolve()
    (work / ".git" / "objects" / "info" / "alternates").write_text(f"{objects}\n")
    git("update-ref", "refs/mrl/upstream", commit, cwd=work)
    _copy_tags(git_dir, work)  # the backport check reads release tags in the work clone
    notes = []
    if has_commit(git_dir, old):
        # Marks that the old pin is at hand: where-upstream searches from it.
        git("update-ref", "refs/mrl/old-pin", old, cwd=work)
        notes += old_series_blobs(work, old, patches)
    return notes + checkout(pin, git_dir, commit, work)


def old_series_blobs(work: pathlib.Path, old: str, patches: list[pathlib.Path]) -> list[str]:
    """Write into the work clone every file version the series makes at the
    old pin, by applying it there in a scratch index (the work tree is not
    touched). git am -3 merges a patch that no longer applies from the blobs
    its index lines name; those of a patch after the first are made by the
    patches before it, and a repository of upstream commits alone (a
    shallow one, or a mirror) has none of them. Returns a note when the
    series does not apply at the old pin."""
    index = work / ".git" / "mrl-old-series.index"
    env = {"GIT_INDEX_FILE": str(index)}
    try:
        git("read-tree", old, cwd=work, env=env)
        for patch in patches:
            proc = git("apply", "--cached", str(patch), cwd=work, env=env, check=False)
            if proc.returncode != 0:
                return [f"the series does not apply at the old pin {old[:12]} from {patch.name} on "
                        f"({reason(proc.stderr, 'git apply failed')}): a 3-way merge of it or a later patch may lack its base"]
    finally:
        index.unlink(missing_ok=True)
    return []


def _copy_tags(git_dir: pathlib.Path, work: pathlib.Path) -> None:
    tags = out("for-each-ref", "--format=%(refname) %(objectname)", "refs/tags", git_dir=git_dir)
    if tags:
        git("update-ref", "--stdin", cwd=work, input="".join(f"update {line}\n" for line in tags.splitlines()))


def stand_alone(who: str, work: pathlib.Path, git_dir: pathlib.Path) -> pathlib.Path:
    """Make the work clone borrow nothing: every object store it borrows
    from (`git_dir`'s, and any that one borrows from) goes into its own,
    with `git_dir`'s tags (the version rules read them), and the alternates
    file is dropped. A stopped rebase then survives whatever happens to
    `git_dir` (`clean` removes the cache's repositories) until --continue.
    Object files are hard-linked where the file system allows (git never
    changes one in place), else copied. Returns the work clone's git
    directory, which the rest of the rebase reads instead of `git_dir`."""
    own = work / ".git"
    alternates = own / "objects" / "info" / "alternates"
    if not alternates.is_file():
        return own  # it stands alone already (an earlier stop)
    with step(who, f"copying the objects the work clone borrows from {git_dir}, so that it stands alone"):
        for store in _object_stores(git_dir / "objects"):
            _link_objects(store, own / "objects")
        _copy_tags(git_dir, work)
        alternates.unlink()
        # Every tree of HEAD, read from the work clone's own objects now (not
        # fsck: a mirror may lack blobs outside the package, see checkout).
        git("ls-tree", "-r", "-z", "HEAD", cwd=work, text=False, what="checking that the work clone stands alone")
    return own


def _object_stores(objects: pathlib.Path, seen: set[pathlib.Path] | None = None) -> list[pathlib.Path]:
    """`objects` and, depth first, every object store its alternates name."""
    seen = seen if seen is not None else set()
    objects = objects.resolve()
    if objects in seen or not objects.is_dir():
        return []
    seen.add(objects)
    stores = [objects]
    listed = objects / "info" / "alternates"
    for line in (listed.read_text().splitlines() if listed.is_file() else []):
        if line.strip() and not line.startswith("#"):
            stores += _object_stores(objects / line.strip(), seen)  # an absolute line stays absolute
    return stores


#: What of an object store holds objects: loose ones (xx/...), and packs with
#: their indexes; not the caches derived from them (bitmaps, commit-graph, ...).
_PACK_FILES = (".pack", ".idx", ".rev", ".promisor")


def _link_objects(store: pathlib.Path, dest: pathlib.Path) -> None:
    for path in sorted(store.iterdir()):
        if path.is_dir() and len(path.name) == 2:
            files = list(path.iterdir())
        elif path.name == "pack":
            files = [f for f in path.iterdir() if f.suffix in _PACK_FILES]
        else:
            continue
        for f in files:
            target = dest / path.name / f.name
            if target.exists():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(f, target)
            except OSError:  # another file system, or links not allowed
                # Whole or absent: a file that exists is taken as copied
                # (above), so a copy a kill cut short must never be one.
                copy_atomically(f, target)


def checkout(pin: Pin, git_dir: pathlib.Path, commit: str, work: pathlib.Path) -> list[str]:
    """Check `commit` out in `work`, detached. When the repository lacks
    blobs of it (outside the package), the work clone stands on a stand-in
    commit instead: the upstream tree without those files, whose parent is
    the upstream commit. Patches touching them conflict."""
    missing = missing_blobs(git_dir, commit)
    inside = inside_package(missing, pin.import_package)
    if inside:
        raise OverlayError(
            f"{pin.distribution}: the upstream repository lacks files of the package itself at {commit[:12]}: "
            f"{', '.join(inside)}. Use a complete clone as --source."
        )
    if not missing:
        git("checkout", "-q", "-f", "--detach", commit, cwd=work)
        return []
    git("read-tree", commit, cwd=work)
    git("update-index", "--force-remove", "--", *missing, cwd=work)
    tree = out("write-tree", cwd=work)
    message = f"upstream {commit} without {len(missing)} file(s) the repository lacks\n\n" + "\n".join(missing) + "\n"
    stand_in = out("commit-tree", tree, "-p", commit, "-m", message, cwd=work)
    git("checkout", "-q", "-f", "--detach", stand_in, cwd=work)
    return [
        f"the upstream repository lacks {len(missing)} file(s) outside the package at {commit[:12]}; the work clone "
        f"stands on {stand_in[:12]}, the upstream tree without them (tree and pin are read from {commit[:12]} itself): "
        + ", ".join(missing)
    ]
