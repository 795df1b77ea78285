"""One patch onto the work clone, and what became of it (state.Outcome):
applied, dropped because upstream has it (and where), or a conflict left for
a person; then, on --continue, what the person made of that conflict."""

from __future__ import annotations

import datetime
import pathlib
import re
import shutil
from collections.abc import Callable

from ..core.errors import OverlayError
from ..core.git import git, out
from ..stages import patchfile
from .state import Outcome, PatchEntry


def apply_one(work: pathlib.Path, patch: pathlib.Path, entry: PatchEntry, old: str, new: str) -> Outcome:
    """git am -3 `patch` in `work`; the outcome and its detail go to `entry`,
    and the outcome is returned."""
    head = out("rev-parse", "HEAD", cwd=work)
    entry.commit = head
    parsed = patchfile.parse(patch)
    carried = backport_in_history(work, parsed, new)
    if carried:  # the new pin descends from the commit the backport carries
        _dropped(entry, carried)
        return entry.outcome
    if git("apply", "--check", "-R", str(patch), cwd=work, check=False).returncode == 0:
        _dropped(entry, where_upstream(work, patch, old, new))
        return entry.outcome
    released = backport_released_before(work, parsed, new) or backport_in_content(work, patch, parsed, new)
    if released:  # no history to ask, but a release that has it precedes the new pin, or its lines stand there
        _dropped(entry, released)
        return entry.outcome
    clean = git("apply", "--check", str(patch), cwd=work, check=False).returncode == 0
    proc = git("am", "-3", "--keep-cr", str(patch), cwd=work, check=False)
    if proc.returncode == 0:
        after = out("rev-parse", "HEAD", cwd=work)
        if after == head:  # "No changes -- Patch already applied.": the 3-way merge changed nothing
            _dropped(entry, where_upstream(work, patch, old, new))
            return entry.outcome
        entry.outcome, entry.commit = (Outcome.APPLIED_CLEANLY if clean else Outcome.APPLIED_3WAY), after
        return entry.outcome
    unmerged = unmerged_files(work)
    if not unmerged and not _staged(work) and _in_am(work) and "already applied" in proc.stdout + proc.stderr:
        git("am", "--skip", cwd=work)  # the 3-way merge left nothing to change
        _dropped(entry, where_upstream(work, patch, old, new))
        return entry.outcome
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    # Without unmerged files the patch did not apply at all (no 3-way merge
    # could be made): git's reasons are its error lines.
    reasons = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
    entry.outcome = Outcome.CONFLICT
    entry.detail = "; ".join(unmerged) if unmerged else " / ".join(reasons or lines[-4:])
    return entry.outcome


def take_resolution(work: pathlib.Path, entry: PatchEntry, new_commit: str, patch: pathlib.Path,
                    record: Callable[[], None]) -> None:
    """--continue at the conflicted `entry`: commit what the person resolved
    in `work`, or drop the patch when they resolved it to upstream's content.
    A drop is recorded (`record`) before git am --skip: after it, the work
    clone alone could not tell it from a git am ended by hand (a kill between
    the two is then rewound to the same HEAD); a commit tells itself."""
    if _in_am(work):
        unmerged = unmerged_files(work)
        if unmerged:
            raise OverlayError(
                f"{entry.name}: {len(unmerged)} file(s) in {work} are still unmerged: {', '.join(unmerged)}. "
                "Resolve the conflict markers there, `git add` each file, then run scripts/rebase.sh --continue "
                "(or scripts/rebase.sh --abort)."
            )
        if not _staged(work):
            entry.outcome, entry.detail = Outcome.DROPPED_BY_HAND, f"resolved to the content of {new_commit[:12]}"
            record()
            git("am", "--skip", cwd=work)
        else:
            proc = git("am", "--continue", cwd=work, check=False)
            if proc.returncode != 0:
                raise OverlayError(f"{entry.name}: git am --continue failed in {work}:\n{(proc.stdout + proc.stderr).strip()}")
            entry.outcome, entry.commit = Outcome.RESOLVED, out("rev-parse", "HEAD", cwd=work)
    else:
        head = out("rev-parse", "HEAD", cwd=work)
        if head == entry.commit:  # the HEAD before the patch: git am was ended by hand
            raise OverlayError(
                f"{entry.name}: git am is no longer in progress in {work} and HEAD did not move. Apply it again "
                f"(git am -3 {patch}), resolve and git add, then --continue; or --abort."
            )
        entry.outcome, entry.commit = Outcome.RESOLVED, head  # the person ran git am --continue
    entry.detail = entry.detail or "resolved in the work clone"


def rewind(work: pathlib.Path, head: str) -> None:
    """Put the work clone back at `head`, the last patch the state records,
    for a run killed while applying the next one (in git am, or after it,
    before its record): that patch is then applied again. Nothing else
    works in the work clone meanwhile (no conflict was left to a person),
    so what a killed git left (its am folder, index.lock) is stale."""
    git("am", "--abort", cwd=work, check=False)
    shutil.rmtree(work / ".git" / "rebase-apply", ignore_errors=True)
    (work / ".git" / "index.lock").unlink(missing_ok=True)
    git("reset", "-q", "--hard", head, cwd=work)
    git("clean", "-q", "-f", "-d", cwd=work)


def where_upstream(work: pathlib.Path, patch: pathlib.Path, old: str, new: str) -> str:
    """The upstream commit with the patch's patch-id between the old and the
    new pin, if any; else the new pin commit (which contains the change)."""
    want = patchfile.patch_id(patch)
    files = [f.path for f in patchfile.parse(patch).files]
    if git("rev-parse", "--verify", "--quiet", "refs/mrl/old-pin", cwd=work, check=False).returncode == 0:
        log = git("log", "--no-merges", "-p", "--full-index", f"{old}..{new}", "--", *files, cwd=work, check=False, text=False)
        if log.returncode == 0 and log.stdout:
            ids: list[str] = git("patch-id", "--stable", cwd=work, input=log.stdout, text=False).stdout.decode().split()
            for pid, commit in zip(ids[::2], ids[1::2], strict=True):
                if pid == want:
                    return commit
    return new


def backport_in_history(work: pathlib.Path, patch: patchfile.PatchFile, new: str) -> str | None:
    """The upstream commit a backport carries, when the repository holds it
    and the new pin descends from it; else None. This is exact where the
    content check is not: upstream may have changed the backported lines
    since (the patch then neither reverse-applies nor merges), and a backport
    resolved by hand at the pin (995930220) conflicts with upstream's own
    version of the same lines."""
    commit = patchfile.backport_commit(patch)
    if not commit:
        return None
    proc = git("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}", cwd=work, check=False)
    if proc.returncode != 0:
        return None
    full = proc.stdout.strip()
    return full if git("merge-base", "--is-ancestor", full, new, cwd=work, check=False).returncode == 0 else None


#: "Applied-Upstream: v0.27.0, <commit URL>": the first upstream release that has the commit.
_RELEASE = re.compile(r"^(v?\d+(?:\.\d+)+)\b")


def backport_released_before(work: pathlib.Path, patch: patchfile.PatchFile, new: str) -> str | None:
    """Why a backport counts as upstream at `new` in a repository without
    the history to ask git (../shared/upstream holds only the named commits),
    else None: its Applied-Upstream trailer names the first release that has
    the commit, the repository holds that release's tag, and the tag's
    commit is not later than the new pin's. Upstream merges to main, and a
    release is branched from main, so a later main commit has it; this is
    read from dates, and the detail says so."""
    if not patchfile.backport_commit(patch):
        return None
    m = _RELEASE.match(patch.trailers.get("Applied-Upstream", ""))
    if not m:
        return None
    tag = m.group(1)
    tagged, pinned = _committed_at(work, f"refs/tags/{tag}"), _committed_at(work, new)
    if tagged is None or pinned is None or tagged > pinned:
        return None
    day = datetime.datetime.fromtimestamp(tagged, datetime.UTC).date()
    new_day = datetime.datetime.fromtimestamp(pinned, datetime.UTC).date()
    return (f"in {tag} (its Applied-Upstream), tagged {day}, not after the new pin's commit of {new_day}; "
            "the repository holds no history to check ancestry")


#: The context a backport's lines must keep at the new pin to count as upstream's.
_BACKPORT_CONTEXT = 2


def backport_in_content(work: pathlib.Path, patch: pathlib.Path, parsed: patchfile.PatchFile, new: str) -> str | None:
    """Why a backport counts as upstream at `new` from the content alone, else
    None: every line it adds stands at the new pin with the two lines around
    it (it reverse-applies with two lines of context). A backport is fitted to
    the pin's surroundings, and upstream's own commit was written against a
    later main whose surroundings differ (9a17c3714's functions follow
    63d07632's `_zero_safe_reciprocal` there), so at a snapshot without
    history it neither reverse-applies with full context nor merges. Only a
    backport: its lines are upstream's by construction, so finding them is
    finding upstream's commit; a patch of ours stays to the full check."""
    if not patchfile.backport_commit(parsed):
        return None
    proc = git("apply", "--check", "-R", f"-C{_BACKPORT_CONTEXT}", str(patch), cwd=work, check=False)
    if proc.returncode != 0:
        return None
    return (f"{new[:12]}: its lines stand there with {_BACKPORT_CONTEXT} lines of context each "
            "(fitted to the pin, upstream's own commit has other surroundings); the repository holds no history to check ancestry")


def _committed_at(work: pathlib.Path, rev: str) -> int | None:
    """The committer time of `rev`'s commit, read from the commit object
    alone: git log and git show parse its parents, which a shallow
    repository's commit names but does not hold."""
    proc = git("cat-file", "commit", f"{rev}^{{commit}}", cwd=work, check=False)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("committer ")), "") if proc.returncode == 0 else ""
    stamp = line.rsplit(" ", 2)[-2] if line.count(" ") >= 2 else ""
    return int(stamp) if stamp.isdigit() else None


def _dropped(entry: PatchEntry, where: str) -> None:
    entry.outcome, entry.detail = Outcome.DROPPED, where


def unmerged_files(work: pathlib.Path) -> list[str]:
    return sorted(set(out("diff", "--name-only", "--diff-filter=U", cwd=work).splitlines()))


def _staged(work: pathlib.Path) -> bool:
    return git("diff", "--cached", "--quiet", "HEAD", cwd=work, check=False).returncode != 0


def _in_am(work: pathlib.Path) -> bool:
    return (work / ".git" / "rebase-apply").exists()
