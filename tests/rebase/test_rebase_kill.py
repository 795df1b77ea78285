"""A real rebase killed at an instant (SIGKILL to its whole process group:
no cleanup runs, as with the OOM killer or a preempted machine), then taken
up by the command that applies (--continue, --abort, or the same rebase
started again): each says what it found, a refusal is a clear error (status
3, no traceback) naming what to do, and the end is what the same commands
unkilled give, byte for byte: every file of patches/ (each patch, series,
pin.toml), constraints.txt and pyproject.toml.

The rebase runs in a child (CHILD) that wraps a few calls of the real code
and SIGKILLs its process group the Nth time one is reached: a rename (the
staged write of a patch file, the series, a pin file or the state record),
a copy of the backup or its restore, the removal of the state folder, or
git am itself, killed in its pre-applypatch hook (the patch applied to the
index and the work tree, not committed). The upstream is made here: onto
`clean` the series applies (one patch dropped: upstream has it), onto
`moved` it stops at a conflict that the test resolves as a person would.

CI runs the points of CI_POINTS; MRL_KILL_POINTS=all runs every one of POINTS."""

from __future__ import annotations

import dataclasses
import functools
import os
import pathlib
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator

import pytest

from maxtext_rl_overlay.config.pins import load_project
from support import ROOT
from unit.unit_support import SMALL_CODE, PackageIndex, commit_files, default_signals, git, maxtext_release, patch_of, series_project

TPU = pathlib.Path("patches/tpu-inference")
B, C, D = "tpu_inference/b.py", "tpu_inference/c.py", "tpu_inference/d.py"
B_TEXT = "".join(f"B{i} = {i}\n" for i in range(10))
PATCHES = ("0001-Set-B8-to-80.patch", "0002-Set-A-to-3.patch", "0003-Set-D-to-4.patch", "0004-Set-C-to-5.patch")

#: The child: the tool, killed (its process group, SIGKILL) the Nth time it
#: reaches an instant: argv[1] is "INSTANT:N", argv[2] a hooks folder whose
#: pre-applypatch hook kills the git am it runs in, the rest the tool's argv.
CHILD = textwrap.dedent('''
    import os, pathlib, shutil, signal, sys
    from maxtext_rl_overlay import __main__ as tool
    from maxtext_rl_overlay.rebase import apply, state
    instant, _, nth = sys.argv[1].rpartition(":")
    hooks, seen = sys.argv[2], [0]
    def reached(name):
        if name == instant:
            seen[0] += 1
            return seen[0] == int(nth)
        return False
    def die():
        os.killpg(os.getpgrp(), signal.SIGKILL)
    def at(name):
        if reached(name):
            die()
    def wrap(module, name, label, arg):
        real = getattr(module, name)
        def call(*args, **kw):
            what = pathlib.Path(args[arg]).name
            at(f"{label} {what}")
            done = real(*args, **kw)
            at(f"after {label} {what}")
            return done
        setattr(module, name, call)
    wrap(os, "replace", "rename", 1)
    wrap(os, "unlink", "unlink", 0)
    wrap(shutil, "copytree", "copy", 1)
    wrap(shutil, "copy2", "copy", 1)
    wrap(state, "remove_tree", "remove", 0)
    real_git = apply.git
    def git(*args, **kw):
        if args[:1] != ("am",) or "-3" not in args:
            return real_git(*args, **kw)
        if reached("git am"):  # its hook kills git am's own group; then the tool's
            try:
                real_git(*args, **dict(kw, env={**(kw.get("env") or {}), "GIT_CONFIG_VALUE_0": hooks}))
            finally:
                die()
        done = real_git(*args, **kw)
        at("after git am")
        return done
    apply.git = git
    sys.exit(tool.main(sys.argv[3:]))
''')


@dataclasses.dataclass(frozen=True)
class Point:
    killed: str  # the command killed (see _args)
    at: str  # "INSTANT:N" (see CHILD)
    then: tuple[tuple[str, int, str], ...]  # the commands after the kill: (command, status, what its output says)
    ends: str  # what the project must then equal: a reference (see references)
    stop: str = ""  # for a killed --continue or --abort, the command that stopped at the conflict first
    resolve: str = "keep"  # how the person resolves that conflict: "keep" the patch's line, or "drop" the patch


NO_RUN = "no rebase is in progress"
CLEARED = "cleared "
CONT, ABORT = "--continue", "--abort"
RESOLVE = "resolve"  # not a command: the person resolves the conflict the rebase stopped at (keeping the patch's line)
ONTO, STOPS = "clean", "moved"  # the rebase onto `clean` (carries the series), and onto `moved` (stops at a conflict)
RELEASE, RELEASE_STOPS = "--maxtext clean", "--maxtext moved"  # the same moves made as a MaxText release's
POINTS = {
    "start: mid backup": Point(ONTO, "copy constraints.txt:1", ((CONT, 3, NO_RUN), (ONTO, 0, CLEARED)), ONTO),
    "start: before its record": Point(ONTO, "rename state.json:1", ((ONTO, 0, CLEARED),), ONTO),
    "start: mid git am": Point(ONTO, "git am:2", ((ONTO, 3, "--continue"), (CONT, 0, "")), ONTO),
    "start: after git am, before the patch's record": Point(ONTO, "after git am:1", ((CONT, 0, ""),), ONTO),
    "start: mid git am, then --abort": Point(ONTO, "git am:2", ((ABORT, 0, "aborted"),), "original"),
    "start: between two patch files": Point(ONTO, f"rename {PATCHES[1]}:1", ((CONT, 0, "cleared what a stopped run left"),), ONTO),
    "start: the series": Point(ONTO, "rename series:1", ((CONT, 0, ""),), ONTO),
    "start: before removing the dropped patch": Point(ONTO, f"unlink {PATCHES[2]}:1", ((CONT, 0, ""),), ONTO),
    "start: the pin": Point(ONTO, "rename pin.toml:1", ((CONT, 0, ""),), ONTO),
    "start: before its end is recorded": Point(ONTO, "unlink state.json:1", ((CONT, 0, ""),), ONTO),
    "start: after its end was recorded": Point(ONTO, "remove state:1", ((CONT, 3, NO_RUN), (ABORT, 3, NO_RUN)), ONTO),
    "start: a stop at a conflict, before its record": Point(STOPS, "rename state.json:3", ((CONT, 1, f"STOPPED at {PATCHES[1]}"),
                                                                                      (RESOLVE, 0, ""), (CONT, 0, "")), STOPS),
    "--continue: before its first record": Point(CONT, "rename state.json:1", ((CONT, 0, ""),), STOPS, stop=STOPS),
    "--continue: mid git am": Point(CONT, "git am:1", ((CONT, 0, ""),), STOPS, stop=STOPS),
    "--continue: between two patch files": Point(CONT, f"rename {PATCHES[1]}:1", ((CONT, 0, ""),), STOPS, stop=STOPS),
    "--continue: after its end was recorded": Point(CONT, "remove state:1", ((CONT, 3, NO_RUN),), STOPS, stop=STOPS),
    "--continue: a drop by hand, between its record and git am --skip": Point(CONT, "after rename state.json:1", ((CONT, 0, ""),),
                                                                              "dropped", stop=STOPS, resolve="drop"),
    "--abort: before its mark": Point(ABORT, "rename state.json:1", ((ABORT, 0, "aborted"),), "original", stop=STOPS),
    "--abort: mid restore": Point(ABORT, "copy tpu-inference:1", ((CONT, 3, "--abort"), (ONTO, 3, "--abort"), (ABORT, 0, "aborted")),
                                  "original", stop=STOPS),
    "--abort: after its end was recorded": Point(ABORT, "remove state:1", ((ABORT, 3, NO_RUN), (ONTO, 0, CLEARED)), ONTO, stop=STOPS),
    "--maxtext: mid backup": Point(RELEASE, "copy pyproject.toml:1", ((CONT, 3, "build/rebase/release"), (RELEASE, 0, CLEARED)), RELEASE),
    "--maxtext: mid git am": Point(RELEASE, "git am:2", ((RELEASE, 3, "--continue"), (ONTO, 3, "--maxtext is in progress"), (CONT, 0, "")),
                                   RELEASE),
    "--maxtext: a move ended, not yet recorded": Point(RELEASE, "rename release.json:2", ((CONT, 0, "by a run that was stopped"),), RELEASE),
    "--maxtext: pyproject.toml": Point(RELEASE, "rename pyproject.toml:1", ((CONT, 0, ""),), RELEASE),
    "--maxtext: after its end was recorded": Point(RELEASE, "remove release:1", ((CONT, 3, NO_RUN),), RELEASE),
    "--maxtext --continue: mid git am": Point(CONT, "git am:1", ((CONT, 0, ""),), RELEASE_STOPS, stop=RELEASE_STOPS),
    "--maxtext --abort: mid restore": Point(ABORT, "copy pyproject.toml:1", ((CONT, 3, "--abort"), (ABORT, 0, "aborted")), "original",
                                            stop=RELEASE_STOPS),
}
CI_POINTS = ("start: before its record", "start: mid git am", "start: between two patch files", "--continue: before its first record",
             "--abort: mid restore", "--maxtext: a move ended, not yet recorded")
SELECTED = tuple(POINTS) if os.environ.get("MRL_KILL_POINTS") == "all" else CI_POINTS
#: The MaxText releases served here: each names the pins of today but tpu-inference's, `clean` or `moved`.
VERSIONS = {RELEASE: "0.2.5.dev1", RELEASE_STOPS: "0.2.5.dev2"}


@dataclasses.dataclass(frozen=True)
class World:
    repo: pathlib.Path  # the upstream: the pin, and the branches `clean` and `moved`
    pin: str
    patches: list[pathlib.Path]  # the series, made on the pin
    hooks: pathlib.Path  # the hooks folder of the kill mid git am
    index: str  # the package index serving the MaxText releases of VERSIONS


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Iterator[World]:
    top = tmp_path_factory.mktemp("rebase-kill")
    repo = top / "upstream"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    files = {SMALL_CODE: "A = 1\n", B: B_TEXT, C: "C = 1\n", D: "D = 1\n", "README.md": "upstream\n"}
    pin = commit_files(repo, files, "the pin", "2026-07-27T09:44:06+00:00")
    moved_down = "# moved down\n" * 3 + B_TEXT  # the series' first patch is exported again with other line numbers
    git(repo, "checkout", "-q", "-b", "clean")
    commit_files(repo, {B: moved_down, D: "D = 4\n"}, "B moves down; D is 4 upstream", "2026-08-01T00:00:00+00:00")
    git(repo, "checkout", "-q", "-b", "moved", pin)
    commit_files(repo, {B: moved_down, SMALL_CODE: "A = 2\n"}, "B moves down; A is 2 upstream", "2026-08-01T00:00:00+00:00")
    series = top / "series"
    series.mkdir()
    changes = ({B: B_TEXT.replace("B8 = 8", "B8 = 80")}, {SMALL_CODE: "A = 3\n"}, {D: "D = 4\n"}, {C: "C = 5\n"})
    patches = [patch_of(repo, pin, change, name[5:-6].replace("-", " "), series / name) for name, change in zip(PATCHES, changes, strict=True)]
    git(repo, "checkout", "-q", "main")
    hooks = top / "hooks"
    hooks.mkdir()
    (hooks / "pre-applypatch").write_text("#!/bin/sh\nkill -KILL 0\n")  # git am's own process group: git am and this hook
    (hooks / "pre-applypatch").chmod(0o755)
    releases = top / "index"
    releases.mkdir()
    pins = {name: pin.commit for name, pin in load_project(ROOT).pins.items() if pin.release is None}  # what a release names
    for move, version in VERSIONS.items():
        maxtext_release(releases, version, {**pins, "tpu-inference": git(repo, "rev-parse", move.split()[-1])})
    with PackageIndex(releases) as index:
        yield World(repo, pin, patches, hooks, index.url)


def _project(dest: pathlib.Path, world: World) -> pathlib.Path:
    return series_project(dest / "project", world.repo, world.pin, world.patches)


def _args(command: str, world: World) -> list[str]:
    """The rebase's arguments: --continue, --abort, a rebase of tpu-inference
    onto `clean` or `moved`, or the same move as a MaxText release's."""
    if command in (CONT, ABORT):
        return [command]
    if command in VERSIONS:
        return ["--maxtext", VERSIONS[command], "--source", f"tpu-inference={world.repo}", "--no-tests"]
    return ["tpu-inference", command, "--no-tests"]


def _tool(project: pathlib.Path, world: World, command: str, kill: str = "") -> subprocess.CompletedProcess:
    args = ["rebase", *_args(command, world), "--project", str(project)]
    head = [sys.executable, "-c", CHILD, kill, str(world.hooks)] if kill else [sys.executable, "-m", "maxtext_rl_overlay"]
    # One "now" for every run (a --maxtext move sets the cutoff to it): the killed run replayed and the unkilled one compare equal.
    env = dict(os.environ, MRL_CACHE_DIR=str(project.parent / "cache"), UV_DEFAULT_INDEX=world.index, SOURCE_DATE_EPOCH="1796100000")
    return subprocess.run([*head, *args], capture_output=True, text=True, env=env, timeout=300, start_new_session=True,
                          preexec_fn=default_signals)


def _stop_and_resolve(project: pathlib.Path, world: World, stop: str, resolve: str) -> None:
    """`stop` (onto `moved`), stopped at the second patch's conflict, which a
    person resolves: keeping the patch's line, or upstream's (a drop)."""
    stopped = _tool(project, world, stop)
    assert stopped.returncode == 1 and f"STOPPED at {PATCHES[1]}" in stopped.stdout, stopped.stdout + stopped.stderr
    _resolve(project, resolve)


def _resolve(project: pathlib.Path, resolve: str) -> None:
    work = project / "build" / "rebase" / "tpu-inference"
    if resolve == "keep":
        (work / SMALL_CODE).write_text("A = 3\n")
        git(work, "add", SMALL_CODE)
    else:
        git(work, "checkout", "HEAD", "--", SMALL_CODE)


def _snapshot(project: pathlib.Path) -> dict[str, bytes]:
    files = {str(p.relative_to(project)): p.read_bytes() for p in (project / "patches").rglob("*") if p.is_file()}
    for name in ("constraints.txt", "pyproject.toml"):
        files[name] = (project / name).read_bytes()
    return files


@pytest.fixture(scope="module")
def references(world, tmp_path_factory) -> Callable[[str], dict[str, bytes]]:
    """What the same commands give unkilled, by name: "original" (the
    project as it was), a move (ONTO, RELEASE: carried at once; STOPS,
    RELEASE_STOPS: stopped, resolved, continued), "dropped" (STOPS with the
    conflicted patch dropped by hand). Each is made when first asked for."""

    @functools.cache
    def reference(name: str) -> dict[str, bytes]:
        project = _project(tmp_path_factory.mktemp("reference"), world)
        if name != "original":
            if name in (ONTO, RELEASE):
                done = _tool(project, world, name)
            else:
                _stop_and_resolve(project, world, STOPS if name == "dropped" else name, "drop" if name == "dropped" else "keep")
                done = _tool(project, world, CONT)
            assert done.returncode == 0, done.stdout + done.stderr
        return _snapshot(project)

    return reference


def test_the_references_differ(references):
    """Each end can be told from the others; the first patch is exported
    again (other line numbers) and the third dropped (upstream has it)."""
    ends = [references(name) for name in ("original", ONTO, STOPS, "dropped")]
    assert len({str(sorted(s.items())) for s in ends}) == len(ends)
    original, onto = ends[:2]
    assert onto[str(TPU / PATCHES[0])] != original[str(TPU / PATCHES[0])]
    assert str(TPU / PATCHES[2]) not in onto and f"# Applied-Upstream: {PATCHES[2]}" in onto[str(TPU / "series")].decode()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", SELECTED)
def test_a_rebase_killed_at_an_instant_is_taken_up_and_ends_as_an_unkilled_one(world, references, tmp_path, name, record_property):
    point = POINTS[name]
    project = _project(tmp_path, world)
    if point.stop:
        _stop_and_resolve(project, world, point.stop, point.resolve)
    killed = _tool(project, world, point.killed, kill=point.at)
    assert killed.returncode == -9, f"{name}: not killed at {point.at} (status {killed.returncode}):\n{killed.stdout}{killed.stderr}"
    said = []
    for command, status, words in point.then:
        if command == RESOLVE:
            _resolve(project, "keep")
            continue
        after = _tool(project, world, command)
        output = after.stdout + after.stderr
        assert after.returncode == status, f"{name}: {command} is status {after.returncode}, not {status}:\n{output}"
        assert "Traceback" not in output, output
        assert words in output, f"{name}: {command} does not say {words!r}:\n{output}"
        if status == 3:
            said.append(next(line for line in after.stderr.splitlines() if "error:" in line))
        elif words:
            said.append(next(line for line in output.splitlines() if words in line))
    record_property("after_the_kill", said)
    print(f"\nkilled at {name}; then: {said}")
    assert _snapshot(project) == references(point.ends), f"{name}: the project is not what the unkilled commands give"
    if point.then[-1][1] == 0:
        left = sorted(p.name for p in (project / "build" / "rebase").iterdir())
        assert "state" not in left and "release" not in left, f"{name}: the finished run left {left}"
