"""`rebase --maxtext VERSION`: move the overlay to a MaxText release's own pins.

Each MaxText release names the upstream commits it was tested with in its
wheel, in dependencies/extra_deps/post_train_github_deps.txt, one
requirement a line:

    google-tunix @ https://github.com/google/tunix/archive/<commit>.zip
    vllm @ git+https://github.com/vllm-project/vllm@<commit>

The release wheel is read from the package index as the build reads it
(registry.release_wheel). First a plan, changing nothing: per distribution
the old and the new commit and the --source holding the new one; a named
commit in none of the sources given stops it here (status 3). Then each pin
that moves is carried by the per-distribution rebase (machine.start, one
after the other, in build order), and the `maxtext` extra of pyproject.toml
moves to `<name>[<extra>]==VERSION`; the build then reads that release's
overrides, torch and vLLM plugin (environment.resolve). The fast tests run
once, at the end.

A conflict stops as the per-distribution rebase does. The release's own
state (build/rebase/release/release.json) is what is left to do:

    {"version": ..., "extra": [old, new], "queue": [{"name", "commit", "source"}],
     "tables": [the finished distributions' reports], "build": ..., ...}

the head of `queue` is the distribution whose own rebase stopped (its state is
build/rebase/state/, as ever). `--continue` resumes that one and carries on
with the rest; `--abort` aborts it and restores every file of the whole move,
pyproject.toml included, from the backup taken before the first change
(build/rebase/release/backup/), and removes the work clones of the move. A
failed --build leaves the state too: --continue builds again. The --source
paths come absolute (the command line resolves them), so --continue runs
from anywhere in the checkout, the work clone included. A later field is added with a default in
ReleaseState, so an older state still loads.

A kill at any instant (SIGKILL, the OOM killer, a lost machine) is taken up
as the distribution's rebase's is (state.py): release.json is written whole,
after the backup and after each finished move; it is removed first at the
end; --abort marks it first and is finished by --abort again. A move whose
distribution's rebase ended but was killed before release.json recorded it
is found by its pin, already at the release's commit, and not made again
(its report is lost: the move's line says so).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import shutil
import time
import zipfile

from packaging.requirements import Requirement
from packaging.utils import parse_wheel_filename

from ..cache import buildcache
from ..config import registry
from ..config.pins import DISTRIBUTIONS, load_project
from ..config.reader import cache_dir, cutoff_now, maxtext_requirement
from ..core import tomledit
from ..core.errors import OverlayError
from ..core.git import git
from ..core.staging import recover, remove_tree, write_atomically
from ..stages import closures
from . import machine, state
from .fasttests import run_fast_tests
from .options import RebaseOptions, ReleaseOptions
from .rebuild import rebuild
from .render import render
from .state import QueuedMove, ReleaseState

#: Where a MaxText release names its upstream commits, inside its wheel.
DEPS_FILE = "dependencies/extra_deps/post_train_github_deps.txt"
_COMMIT = re.compile(r"(?:/archive/|@)([0-9a-f]{40})(?:\.zip|\.tar\.gz)?$")


def parse_deps(text: str, where: str) -> dict[str, str]:
    """{distribution: commit} from a post_train_github_deps.txt."""
    named: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, at, url = (part.strip() for part in line.partition(" @ "))
        m = _COMMIT.search(url)
        if not at or not m:
            raise OverlayError(f"{where}: {line!r} names no upstream commit (expected `name @ <url ending in a 40-hex commit>`).")
        named[Requirement(name).name] = m.group(1)
    return named


def release_commits(wheel: pathlib.Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as zf:
        try:
            text = zf.read(DEPS_FILE).decode()
        except KeyError:
            raise OverlayError(f"{wheel.name} has no {DEPS_FILE}: it names no upstream commits to move the pins to.") from None
    return parse_deps(text, f"{wheel.name}:{DEPS_FILE}")


@dataclasses.dataclass(frozen=True)
class Move:
    name: str
    old: str
    new: str
    source: str | None  # the --source holding `new`; None where the pin stays


@dataclasses.dataclass(frozen=True)
class Plan:
    version: str
    extra: tuple[str, str]  # pyproject's `maxtext` extra: now, and as the release's
    moves: tuple[Move, ...]  # every distribution the release names, in build order
    notes: tuple[str, ...]
    cutoff: tuple[str, str] = ("", "")  # pyproject's resolution-cutoff: now, and moved to the rebase's time

    @property
    def moving(self) -> list[Move]:
        return [m for m in self.moves if m.old != m.new]

    @property
    def unchanged(self) -> bool:
        return not self.moving and self.extra[0] == self.extra[1]

    def lines(self) -> list[str]:
        old, new = self.extra
        head = [f"rebase --maxtext {self.version}: the `maxtext` extra {old}" + (" (unchanged)" if old == new else f" -> {new}")]
        if self.cutoff[0] != self.cutoff[1]:
            head.append(f"  resolution-cutoff  {self.cutoff[0]} -> {self.cutoff[1]}  (the registry as of the move; the build lists the pins "
                        "that moved with it)")
        width = max(len(m.name) for m in self.moves) if self.moves else 0
        for m in self.moves:
            where = "already the release's" if m.old == m.new else f"from {m.source}"
            head.append(f"  {m.name:<{width}}  {m.old[:12]} -> {m.new[:12]}  ({where})")
        return head + [f"  note: {n}" for n in self.notes]


#: The overlay's own distributions: their versions move with the pins and the revision, not the cutoff.
DISTRIBUTIONS_AND_OURS = ("maxtext-rl-overlay", "google-tunix", "tpu-inference", "vllm", "maxtext", "maxtext-vllm-adapter")


def _closure_pins(root: pathlib.Path) -> dict[str, str]:
    """The pins of the checkout's constraints.txt ({} without one): what the cutoff's move is measured from."""
    try:
        return closures.pins((root / "constraints.txt").read_text())
    except FileNotFoundError:
        return {}


def plan(root: pathlib.Path, version: str, given: dict[str, str], cache: pathlib.Path) -> Plan:
    """What `--maxtext VERSION` would do; refuses (status 3) before any change
    when a commit to move to is in none of the sources given."""
    project = load_project(root)
    options = project.options.maxtext
    requirement = maxtext_requirement(project.metadata.get("optional-dependencies", {}), options, str(root / "pyproject.toml"))
    (extra,) = requirement.extras
    wheel = registry.release_wheel(requirement.name, version, cache / "releases")
    version = str(parse_wheel_filename(wheel.name)[1])  # v0.2.4, 0.2.4.0: the release's own 0.2.4
    wanted = f"{requirement.name}[{extra}]=={version}"
    named = release_commits(wheel)
    unknown = sorted(set(given) - set(DISTRIBUTIONS))
    if unknown:
        raise OverlayError(f"--source: unknown distribution(s) {', '.join(unknown)}; choose from {', '.join(DISTRIBUTIONS)}.")
    notes = [f"{wheel.name} names {n} {c[:12]}, which the overlay does not build: left alone" for n, c in named.items() if n not in DISTRIBUTIONS]
    moves, missing = [], []
    for name in DISTRIBUTIONS:
        pin = project.pins[name]
        if pin.release is not None:
            # MaxText's own series, carried on a release wheel: not a commit the release names.
            if pin.release.version != version:
                notes.append(f"{name}: its series stays on {pin.release.wheel} ({pin.pin_file.relative_to(root.resolve())} [release]); "
                             f"carry it onto {wheel.name} by hand (the build refuses the mix until then)")
            continue
        if name not in named:
            notes.append(f"{wheel.name} names no commit of {name}: its pin {pin.commit[:12]} stays")
            continue
        new = named[name]
        source = given.get(name)
        if new != pin.commit and not (source and _holds(pathlib.Path(source).expanduser(), new)):
            missing.append((name, new, source))
        moves.append(Move(name, pin.commit, new, source if new != pin.commit else None))
    if missing:
        raise OverlayError(
            f"MaxText {version} names {len(missing)} commit(s) that none of the sources given holds; nothing was changed:\n"
            + "".join(f"  {n} {c}" + (f" (not in --source {n}={s})" if s else " (no --source given for it)")
                      + f": a clone or mirror of {project.pins[n].repository} holds it\n" for n, c, s in missing)
            + "Pass --source NAME=PATH for each, PATH a git repository holding that commit."
        )
    # The release's own environment is resolved against the registry as of the move, not of the old pins.
    return Plan(version, (str(requirement), wanted), tuple(moves), tuple(notes), (project.resolution_cutoff, cutoff_now()))


def _holds(path: pathlib.Path, commit: str) -> bool:
    if not path.is_dir():
        return False
    return git("cat-file", "-e", f"{commit}^{{commit}}", cwd=path, check=False).returncode == 0


@dataclasses.dataclass
class ReleaseReport:
    text: str
    stopped: bool = False
    tests_ok: bool = True

    @property
    def needs_action(self) -> bool:
        return self.stopped or not self.tests_ok


#: What this run is called where one is in progress (state.RunFolder.in_progress_error's one phrase).
WHAT = "a rebase --maxtext"


def in_progress(root: pathlib.Path) -> bool:
    """Whether a `rebase --maxtext` is in progress (the command line asks)."""
    return state.release_run(root.resolve()).in_progress()


def in_progress_error(root: pathlib.Path) -> OverlayError:
    """What a distribution's rebase says while a `rebase --maxtext` is in
    progress (or its --abort was cut short): the one phrase of every run."""
    own = state.release_run(root.resolve())
    return own.in_progress_error(own.load().aborting, WHAT)


def start(opts: ReleaseOptions) -> ReleaseReport:
    began = time.monotonic()
    root = opts.project_root.resolve()
    own = state.release_run(root)
    if own.in_progress():
        raise own.in_progress_error(own.load().aborting, WHAT)
    distribution = state.distribution_run(root)
    if distribution.in_progress():
        raise distribution.in_progress_error(distribution.load().aborting)
    machine.refuse_dirty(root)
    cache = cache_dir(opts.cache)
    with buildcache.using(cache):  # the release wheel goes into it; `clean` waits
        the_plan = plan(root, opts.version, opts.sources, cache)
    if the_plan.unchanged:
        return ReleaseReport("\n".join(the_plan.lines()) + f"\n\nThe pins and the `maxtext` extra are already MaxText {the_plan.version}'s: nothing changed.")
    pins = load_project(root).pins
    touched = sorted({t for m in the_plan.moving for t in pins[m.name].rebase.touched(m.name)} | {"pyproject.toml"})
    own.clear_stale()
    own.folder.mkdir(parents=True)
    state.backup(root, own.folder, touched)  # before the first change: --abort restores the whole move from it
    run = ReleaseState(the_plan.version, list(the_plan.extra), [QueuedMove(m.name, m.new, m.source) for m in the_plan.moving],
                       the_plan.lines(), cutoff=list(the_plan.cutoff), before=_closure_pins(root),
                       touched=touched, sources=dict(opts.sources), build=opts.build, standins=opts.standins,
                       run_tests=opts.run_tests, cache=str(cache), clones=[m.name for m in the_plan.moving])
    own.save(run)  # the commit point of the start: the backup is whole
    return _advance(root, run, began)


def resume(root: pathlib.Path) -> ReleaseReport:
    root = root.resolve()
    own = state.release_run(root)
    run = own.load()
    if run.aborting:
        raise own.in_progress_error(aborting=True, what=WHAT)
    return _advance(root, run, time.monotonic())


def abort(root: pathlib.Path) -> str:
    root = root.resolve()
    own = state.release_run(root)
    run = own.load()
    if not run.aborting:
        run.aborting = True  # first: an abort cut short is finished by --abort, not built on by --continue
        own.save(run)
    distribution = state.distribution_run(root)
    if distribution.in_progress():
        machine.abort(root)  # the stopped distribution's work clone and state
    elif distribution.folder.exists():
        remove_tree(distribution.folder)  # a distribution's rebase killed before its start was recorded, or after its end was
    state.restore(root, own.folder, run.touched)
    removed = []
    for name in run.clones:  # the finished moves' work clones too
        paths = state.Paths(root, name)
        for folder in (paths.work, paths.find):
            if folder.exists():
                shutil.rmtree(folder)
                removed.append(str(folder.relative_to(root)))
    own.finish()
    return (f"rebase --maxtext {run.version} aborted: {', '.join(run.touched)} restored from the backup taken before the first change"
            + (f"; work clones removed: {', '.join(removed)}." if removed else "."))


def _advance(root: pathlib.Path, run: ReleaseState, began: float) -> ReleaseReport:
    own = state.release_run(root)
    while run.queue:
        move = run.queue[0]
        if state.distribution_run(root).in_progress():
            report = machine.resume(root)  # the move that stopped, resolved by the person
        elif load_project(root).pins[move.name].commit == move.commit:
            # Its rebase ended (its record is gone) and this run was killed before recording that: done, not made again.
            run.tables.append(f"{move.name}: moved to {move.commit[:12]} by a run that was stopped before it recorded "
                              "the move (its table was lost with it)")
            run.queue.pop(0)
            own.save(run)
            continue
        else:
            others = {n: p for n, p in run.sources.items() if n != move.name}
            report = machine.start(RebaseOptions(root, move.name, move.commit, source=move.source, build_sources=others,
                                                 run_tests=False, cache=pathlib.Path(run.cache), check_clean=False))
        if report.stopped:
            run.seconds += time.monotonic() - began
            own.save(run)
            text = "\n\n".join(["\n".join(run.plan), *run.tables, render(report)])
            return ReleaseReport(text + f"\n(--continue goes on with {', '.join(m.name for m in run.queue[1:]) or 'the extra'} "
                                 "after this one; --abort restores the whole move, pyproject.toml included.)", stopped=True)
        report.message = ""  # one next step, for the whole move, below
        run.tables.append(render(report))
        run.queue.pop(0)
        own.save(run)
    return _end(root, run, began)


def _end(root: pathlib.Path, run: ReleaseState, began: float) -> ReleaseReport:
    """Every move made: the `maxtext` extra, the build, the end of the run's record, the fast tests."""
    pyproject = root / "pyproject.toml"
    extra = load_project(root).options.maxtext.extra
    text = pyproject.read_text()
    edited = text
    if run.extra[0] != run.extra[1]:
        edited = tomledit.set_value(edited, ("project", "optional-dependencies"), extra, [run.extra[1]], where=str(pyproject))
    if run.cutoff and run.cutoff[0] != run.cutoff[1]:
        edited = tomledit.set_value(edited, ("tool", "maxtext-rl-overlay"), "resolution-cutoff", run.cutoff[1], where=str(pyproject))
    if edited != text:
        recover(pyproject)  # the staged file of a run killed in this write
        write_atomically(pyproject, edited)
    if run.build:
        rebuild(root, "maxtext", f"building the wheels and constraints.txt for MaxText {run.version}", run.sources, run.cache,
                run.standins, written=f"The rebased series, the pins and pyproject.toml's `maxtext` extra are written (MaxText {run.version})",
                undo=" (restores the whole move)")
    state.release_run(root).finish()
    lines = ["\n".join(run.plan), *run.tables]
    if run.build and run.cutoff:
        moved = closures.moved_pins("".join(f"{n}=={v}\n" for n, v in run.before.items()), (root / "constraints.txt").read_text(),
                                    ours=DISTRIBUTIONS_AND_OURS)
        lines.append(f"resolution-cutoff {run.cutoff[0]} -> {run.cutoff[1]}: " + (f"{len(moved)} pins moved:\n" + "\n".join(f"  {m}" for m in moved)
                                                                               if moved else "no pin moved"))
    ok = True
    if run.run_tests:
        tests = run_fast_tests(root, rebuilt=run.build)
        ok = tests.ok
        lines.append(f"fast tests (tests/unit): {'passed' if ok else 'FAILED'}: {tests.summary}"
                     + "".join(f"\n  {t} left out: constraints.txt is stale until rebuilt" for t in tests.deselected))
    lines.append(f"time: {run.seconds + time.monotonic() - began:.1f}s")
    given = " ".join(f"--source {n}={p}" for n, p in sorted(run.sources.items()))
    # pyproject.toml is one of the overlay wheel's files, and the wheel
    # records the commit that last changed them: constraints.txt pins the
    # committed tree's wheel only when built after that commit.
    lines.append(f"Review with `git diff -- patches pyproject.toml` in {root} and commit it; then rebuild constraints.txt from "
                 f"that commit (scripts/build-wheels.sh {given}".rstrip() + ") and commit it: the overlay's wheel records the commit "
                 "that last changed pyproject.toml" + (", so the one --build made pins the uncommitted tree's." if run.build else "."))
    return ReleaseReport("\n\n".join(lines), tests_ok=ok)
