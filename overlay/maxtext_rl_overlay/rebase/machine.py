"""The rebase as a resumable run: start (checks, backup, work clone), the
series patch by patch (a conflict saves the state and stops), --continue
from the stopped patch, then writing, the optional build and the fast tests;
--abort puts every touched file back from the backup.

The state record is the commit point of each step (see state.py): a rebase
killed at any instant is taken up by --continue from the last step the
record names (the work clone rewound to it, the series written again), or
undone by --abort; a run killed before its start was recorded, or after
its end was, left only a folder that the next start clears, saying so."""

from __future__ import annotations

import dataclasses
import pathlib
import shlex
import shutil
import time

from ..cache import buildcache
from ..config.pins import DISTRIBUTIONS, Pin, load_project
from ..config.reader import cache_dir
from ..core.errors import OverlayError
from ..core.git import git, out
from ..core.output import step
from ..stages import patchfile
from . import apply, export, state, upstream
from .fasttests import run_fast_tests
from .options import RebaseOptions
from .rebuild import rebuild
from .report import Report
from .state import Outcome, PatchEntry, Paths, PinValues, RebaseState


def start(opts: RebaseOptions) -> Report:
    began = time.monotonic()
    root = opts.project_root.resolve()
    if opts.name not in DISTRIBUTIONS:
        raise OverlayError(f"unknown distribution {opts.name!r}; choose from {', '.join(DISTRIBUTIONS)}.")
    paths = Paths(root, opts.name)
    if paths.run.in_progress():
        other = paths.run.load()
        raise paths.run.in_progress_error(other.aborting, f"a rebase of {other.name}")
    if opts.check_clean:
        refuse_dirty(root)
    pin = load_project(root).pins[opts.name]
    if pin.release is not None:
        raise OverlayError(f"{opts.name} is carried on its release wheel ({pin.pin_file} [release]), not on a commit: it moves with "
                           "its release (rebase --maxtext VERSION names the release).")
    patches = [patchfile.parse(p) for p in pin.series]
    cache = cache_dir(opts.cache)
    # A rebase holds the cache as a build does: `clean` waits until it is
    # done, and a stopped one stands alone (see _run).
    with buildcache.using(cache):
        return _start(opts, root, paths, pin, patches, cache, began)


def _start(opts: RebaseOptions, root: pathlib.Path, paths: Paths, pin: Pin, patches: list[patchfile.PatchFile], cache: pathlib.Path,
           began: float) -> Report:
    git_dir, new_commit = upstream.resolve(pin, opts.new_ref, opts.source, cache)
    notes = []
    if not upstream.has_commit(git_dir, pin.commit):
        notes.append(f"the upstream repository lacks the old pin {pin.commit[:12]}: no 3-way merge base for changed context, no Applied-Upstream search")
    touched = list(pin.rebase.touched(opts.name))
    # The backup comes before any change to the project, and the record
    # after the backup and the work clone: it is what makes them the run's.
    paths.run.clear_stale()
    paths.run.folder.mkdir(parents=True)
    try:
        state.backup(root, paths.run.folder, touched)
        with step(opts.name, f"checking out {opts.new_ref} ({new_commit[:12]}) in {paths.work}"):
            notes += upstream.work_clone(pin, git_dir, new_commit, paths.work, pin.commit, [p.path for p in patches])
        run = RebaseState(
            name=opts.name, new_ref=opts.new_ref, new_commit=new_commit, git_dir=str(git_dir), source=opts.source,
            build=opts.build, build_sources=dict(opts.build_sources), standins=opts.standins, apply_vllm_lkg=opts.apply_vllm_lkg,
            run_tests=opts.run_tests, cache=str(cache), touched=touched,
            old=PinValues(pin.commit, pin.tree, pin.date, pin.version),
            patches=[PatchEntry(p.name, p.subject) for p in patches], notes=notes, base=out("rev-parse", "HEAD", cwd=paths.work),
        )
        paths.run.save(run)
    except BaseException:
        shutil.rmtree(paths.run.folder, ignore_errors=True)  # nothing was changed yet
        raise
    for note in notes:
        step.note(opts.name, note)
    return _run(root, run, began)


def resume(root: pathlib.Path) -> Report:
    """--continue: take the person's resolution of the stopped patch, go on."""
    began = time.monotonic()
    root = root.resolve()
    run = state.distribution_run(root).load()
    paths = Paths(root, run.name)
    if run.aborting:
        raise paths.run.in_progress_error(aborting=True)
    with buildcache.using(pathlib.Path(run.cache)):
        if run.phase == "applying":
            entry = run.conflicted()
            if entry is None:  # a run killed while applying: undo what it did after its last record, and go on
                apply.rewind(paths.work, run.head())
            else:
                apply.take_resolution(paths.work, entry, run.new_commit, _backed_up_patch(paths, entry),
                                      record=lambda: paths.run.save(run))
                paths.run.save(run)
        return _run(root, run, began)


def abort(root: pathlib.Path) -> str:
    root = root.resolve()
    run = state.distribution_run(root).load()
    paths = Paths(root, run.name)
    if not run.aborting:
        run.aborting = True  # first: an abort cut short is finished by --abort, not built on by --continue
        paths.run.save(run)
    state.restore(root, paths.run.folder, run.touched)
    for folder in (paths.work, paths.find):
        shutil.rmtree(folder, ignore_errors=True)
    paths.run.finish()
    shown = [f"{t}/" if (root / t).is_dir() else t for t in run.touched]
    return (
        f"rebase of {run.name} onto {run.new_ref} aborted: {', '.join(shown[:-1])} and {shown[-1]} "
        "restored from the backup; work clone removed."
    )


def _run(root: pathlib.Path, run: RebaseState, began: float) -> Report:
    paths = Paths(root, run.name)
    if run.phase == "applying":
        for entry in run.patches:
            if entry.outcome != Outcome.PENDING:
                continue
            patch = _backed_up_patch(paths, entry)
            with step(run.name, f"applying {entry.name}"):
                outcome = apply.apply_one(paths.work, patch, entry, run.old.commit, run.new_commit)
            if outcome == Outcome.CONFLICT:
                # The person resolves it in their own time, and `clean` may
                # run meanwhile: from here on the rebase reads the work
                # clone only, which borrows no object from the cache.
                run.git_dir = str(upstream.stand_alone(run.name, paths.work, pathlib.Path(run.git_dir)))
                run.seconds += time.monotonic() - began
                paths.run.save(run)
                return _stopped_report(root, run, patch)
            paths.run.save(run)  # the patch's outcome: a kill after this does not apply it again
        run.phase = "write"
        paths.run.save(run)
    if run.phase == "write":
        export.write(root, run, paths.work)
        run.phase = "written"
        paths.run.save(run)
    if run.build:
        rebuild(root, run.name, "building the wheels and constraints.txt from the new pins", _build_sources(run), run.cache,
                run.standins, written="The rebased series and pin are written")
    paths.run.finish()
    report = _report(run)
    if run.run_tests:
        tests = run_fast_tests(root, rebuilt=run.build)
        report.tests_ok, report.tests = tests.ok, tests.summary
        report.notes += [f"fast tests: {t} left out: constraints.txt is stale until rebuilt" for t in tests.deselected]
    report.seconds = run.seconds + time.monotonic() - began
    report.message = _next_step(root, run)
    return report


def _next_step(root: pathlib.Path, run: RebaseState) -> str:
    undo = "undo with `git checkout -- patches constraints.txt` (the checkout was clean when the rebase began)."
    if run.build:
        return f"Review with `git diff -- patches constraints.txt` in {root} and commit; {undo}"
    given = _build_sources(run)
    command = shlex.join(["scripts/build-wheels.sh", *(a for n, p in sorted(given.items()) for a in ("--source", f"{n}={p}"))])
    return (
        "Next: constraints.txt still pins the wheels of the old pin (no --build). Rebuild it from the new pins:\n"
        f"  {command}\n"
        "(or undo and run the rebase again with --build), then review with "
        f"`git diff -- patches constraints.txt` in {root} and commit the series, the pins and constraints.txt together; "
        + undo
    )


def _build_sources(run: RebaseState) -> dict[str, str]:
    """Where --build takes each upstream from: the rebased one's --source too."""
    return {**run.build_sources, **({run.name: run.source} if run.source else {})}


def _backed_up_patch(paths: Paths, entry: PatchEntry) -> pathlib.Path:
    """The patch as it was before the rebase: the series folder is rewritten."""
    return paths.backup / "patches" / paths.name / entry.name


def _stopped_report(root: pathlib.Path, run: RebaseState, patch: pathlib.Path) -> Report:
    report = _report(run)
    report.stopped = True
    entry = run.conflicted()
    assert entry is not None, "a stopped run has a conflicted patch"
    work = Paths(root, run.name).work
    if apply.unmerged_files(work):
        what = f"it conflicts with {run.new_ref} ({run.new_commit[:12]}) in {entry.detail or 'the files it touches'}.\n"
        steps = [
            f"  1. cd {work}   (git status shows the conflicted files; the patch is {patch})",
            "  2. edit the files to resolve the <<<<<<< ======= >>>>>>> markers, then `git add` each one",
            "     (to drop the patch because upstream now does the same: restore upstream's version and git add it)",
        ]
    else:  # git am made no 3-way merge: no file was changed, there is nothing to resolve in place
        what = (f"it does not apply to {run.new_ref} ({run.new_commit[:12]}) at all, so no file was changed "
                f"(git: {(entry.detail or 'git am failed').rstrip('.')}).\n")
        steps = [
            f"  1. cd {work}   (the patch is {patch})",
            f"  2. make its change by hand: `git apply --reject {patch}` applies the hunks that still fit and writes each",
            "     other one to a .rej file beside its file; edit the files, then `git add` each one (not the .rej files)",
            "     (to drop the patch because upstream now does the same: change nothing)",
        ]
    report.message = (
        f"STOPPED at {entry.name} ({entry.subject}): {what}" + "\n".join(steps) + "\n"
        "  3. scripts/rebase.sh --continue      or, to put everything back:  scripts/rebase.sh --abort\n"
        f"  To find the newest upstream commit the series still applies to: scripts/rebase.sh {run.name} "
        f"{run.new_ref} --find-base" + (f" --source {run.source}" if run.source else "")
    )
    return report


def _report(run: RebaseState) -> Report:
    new = run.new or PinValues(run.new_commit)
    patches = [dataclasses.replace(p) for p in run.patches]
    return Report(run.name, run.old, new, patches, notes=list(run.notes), seconds=run.seconds)


def refuse_dirty(root: pathlib.Path) -> None:
    proc = git("status", "--porcelain", "--untracked-files=all", "--", "patches", "constraints.txt", cwd=root, check=False)
    if proc.returncode != 0:
        raise OverlayError(
            f"{root} is not a git checkout ({proc.stderr.strip()}): the rebase needs one, so that its result "
            "can be reviewed with git diff and the checkout's state checked first."
        )
    if proc.stdout.strip():
        raise OverlayError(
            f"the checkout {root} has uncommitted changes in patches/ or constraints.txt:\n  "
            + "\n  ".join(proc.stdout.rstrip().splitlines())
            + "\nCommit or stash them first: a rebase rewrites these files."
        )
