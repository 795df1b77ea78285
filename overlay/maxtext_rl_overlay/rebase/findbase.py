"""--find-base: the newest upstream commit the whole series still applies to."""

from __future__ import annotations

import pathlib
import shutil
from typing import NotRequired, TypedDict

from ..cache import buildcache
from ..config.pins import Pin, load_project
from ..config.reader import cache_dir
from ..core.errors import OverlayError
from ..core.git import git, out
from ..core.output import step
from . import upstream
from .options import RebaseOptions
from .state import Paths


class BaseFound(TypedDict):
    base: str  # the commit
    base_line: str  # "<commit> <committer date> <subject>"
    position: int  # first-parent commits after the pin
    commits: int  # of how many up to NEW_REF
    tried: int
    first_conflict: NotRequired[str]  # its first-parent successor, described likewise


def find_base(opts: RebaseOptions) -> BaseFound:
    """The newest first-parent commit between the old pin and NEW_REF on which
    every patch of the series applies without conflict (git am -3), by
    bisection. Applying is assumed monotone: once a later upstream change
    conflicts, later commits keep conflicting. That holds in practice (a
    conflicting change is rarely undone); the answer is checked, not trusted:
    the commit found applies, its first-parent successor does not."""
    root = opts.project_root.resolve()
    pin = load_project(root).pins[opts.name]
    cache = cache_dir(opts.cache)
    with buildcache.using(cache):  # its work clone borrows from the cache's repository, as a rebase's does
        return _find_base(opts, root, pin, cache)


def _find_base(opts: RebaseOptions, root: pathlib.Path, pin: Pin, cache: pathlib.Path) -> BaseFound:
    git_dir, new_commit = upstream.resolve(pin, opts.new_ref, opts.source, cache)
    if not upstream.has_commit(git_dir, pin.commit):
        raise OverlayError(f"{opts.name}: the upstream repository lacks the pin {pin.commit} ({pin.pin_file}); --find-base needs it.")
    chain = out("rev-list", "--first-parent", "--reverse", f"{pin.commit}..{new_commit}", git_dir=git_dir).split()
    if git("merge-base", "--is-ancestor", pin.commit, new_commit, git_dir=git_dir, check=False).returncode != 0:
        raise OverlayError(f"{opts.name}: the pin {pin.commit[:12]} is not an ancestor of {opts.new_ref}; --find-base walks first-parent history from the pin.")
    chain = [pin.commit] + chain
    work = Paths(root, opts.name).find
    upstream.work_clone(pin, git_dir, new_commit, work, pin.commit, list(pin.series))
    tried: dict[str, bool] = {}

    def ok(i: int) -> bool:
        commit = chain[i]
        if commit not in tried:
            with step(opts.name, f"trying the series on {commit[:12]} ({i}/{len(chain) - 1} first-parent commits after the pin)"):
                tried[commit] = _series_applies(pin, git_dir, work, commit)
        return tried[commit]

    try:
        if ok(len(chain) - 1):
            good = len(chain) - 1
        else:
            lo, hi = 0, len(chain) - 1  # ok(lo) assumed (the pin), not ok(hi)
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if ok(mid):
                    lo = mid
                else:
                    hi = mid
            good = lo
            if not ok(lo):
                raise OverlayError(f"{opts.name}: the series does not apply even to the pin {pin.commit[:12]}; fix the series first.")
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def describe(commit: str) -> str:
        return out("log", "-1", "--format=%H %cI %s", commit, git_dir=git_dir)

    result = BaseFound(base=chain[good], base_line=describe(chain[good]), position=good, commits=len(chain) - 1, tried=len(tried))
    if good < len(chain) - 1:
        result["first_conflict"] = describe(chain[good + 1])
    return result


def _series_applies(pin: Pin, git_dir: pathlib.Path, work: pathlib.Path, commit: str) -> bool:
    upstream.checkout(pin, git_dir, commit, work)
    try:
        for patch in pin.series:
            if git("am", "-3", "--keep-cr", str(patch), cwd=work, check=False).returncode != 0:
                return False
        return True
    finally:
        git("am", "--abort", cwd=work, check=False)
