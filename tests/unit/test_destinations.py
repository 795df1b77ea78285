"""What a build writes, and nothing else: `--out` is replaced only when it is
absent, empty or an index the tool made, never a folder or file a user
needs; every destination is checked before any work, and one that cannot be
written is status 3 naming it; two builds to one destination take turns;
what is written is readable by others (the umask's mode).

Each build here is the real command on a copy of the project, run as a user
runs it. None gets far: a refused one stops before any work (it makes no
cache), and one that is let through stops at its first network step, since
the package index is a folder that does not exist (nothing leaves the machine)."""

from __future__ import annotations

import fcntl
import os
import pathlib
import subprocess
import sys

import pytest

from maxtext_rl_overlay.core import staging
from maxtext_rl_overlay.core.errors import ExitCode, OverlayError
from maxtext_rl_overlay.stages import constraintsfile, indexpages
from support import ROOT
from support.project import project_copy

#: Where the build's first network step (MaxText's file list) fails at once.
THE_INDEX_FAILS = "cannot read the file list of maxtext"
#: The file in every index the tool makes (indexpages.INDEX_MARKER), as a user sees it.
MARKER = ".maxtext-rl-overlay-index"


@pytest.fixture
def project(tmp_path) -> pathlib.Path:
    return project_copy(tmp_path / "project")


def _env(tmp_path: pathlib.Path, **extra: str) -> dict[str, str]:
    return dict(os.environ, MRL_CACHE_DIR=str(tmp_path / "cache"), UV_DEFAULT_INDEX=(tmp_path / "no-index").as_uri(), **extra)


def _build(project: pathlib.Path, *args: str, env: dict[str, str], cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "maxtext_rl_overlay", "build", "--only", "google-tunix", "--project", str(project), *args],
                          capture_output=True, text=True, env=env, cwd=cwd or project, timeout=120)


def _error(done: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in done.stderr, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if "error:" in line]
    return line


def _tree(folder: pathlib.Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# -- 1: --out is the tool's to replace, or refused --------------------------

@pytest.mark.parametrize("case", ["a user's folder", "a file", "the current folder", "the project", "$HOME", "the cache",
                                  "a folder holding the project"])
def test_an_out_that_is_not_the_tools_is_refused_and_left_whole(project, tmp_path, case):
    home, work = tmp_path / "home", tmp_path / "work"
    for folder in (home, work):
        folder.mkdir()
        (folder / "notes.txt").write_text("mine")
    (project / ".git").mkdir()  # a checkout's own folder, which a replaced project would lose
    (project / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    env = _env(tmp_path, HOME=str(home))
    cache = tmp_path / "cache"
    if case == "the cache":
        cache.mkdir()
    out, says = {
        "a user's folder": (work, f"{work} is a folder the tool did not make (it has files and no {MARKER})"),
        "a file": (work / "notes.txt", f"{work / 'notes.txt'} is a file, not a folder"),
        "the current folder": (pathlib.Path("."), f"--out {work} is the current folder"),
        "the project": (project, f"--out {project} is the project"),
        "$HOME": (home, f"--out {home} is $HOME"),
        "the cache": (cache, f"--out {cache} is the cache (MRL_CACHE_DIR)"),
        "a folder holding the project": (tmp_path, f"--out {tmp_path} holds the project ({project})"),
    }[case]
    before = {folder: _tree(folder) for folder in (home, work, project)}
    cwd = work if case == "the current folder" else project
    done = _build(project, "--out", str(out), "--constraints", str(tmp_path / "constraints.txt"), env=env, cwd=cwd)
    assert done.returncode == ExitCode.ERROR, done.stderr
    assert says in _error(done)
    assert {folder: _tree(folder) for folder in (home, work, project)} == before
    assert not (tmp_path / "constraints.txt").exists()
    assert not (cache / "CACHEDIR.TAG").exists(), "refused before any work"


@pytest.mark.parametrize("case", ["absent", "empty", "an earlier index"])
def test_an_out_that_is_the_tools_is_let_through(project, tmp_path, case):
    out = tmp_path / "dist"
    if case != "absent":
        out.mkdir()
    if case == "an earlier index":
        (out / MARKER).write_text("")
        (out / "old.whl").write_text("")
    done = _build(project, "--out", str(out), "--constraints", str(tmp_path / "constraints.txt"), env=_env(tmp_path))
    assert done.returncode == ExitCode.ERROR and THE_INDEX_FAILS in _error(done), done.stderr
    assert not [p.name for p in tmp_path.iterdir() if ".partial-" in p.name], "the checks leave nothing behind"


def test_every_index_carries_the_marker_and_only_a_marked_folder_is_replaced(tmp_path):
    dest = tmp_path / "dist"
    with staging.staged_dir(dest, replace=MARKER) as new:
        indexpages.write_index(new)
    assert (dest / MARKER).is_file()
    with staging.staged_dir(dest, replace=MARKER) as new:  # the tool's own: replaced
        (new / "new").write_text("")
    assert sorted(p.name for p in dest.iterdir()) == ["new"]
    (dest / "notes.txt").write_text("mine")  # a user's folder now (no marker): refused at the rename too
    with pytest.raises(OverlayError, match="is a folder the tool did not make"):
        with staging.staged_dir(dest, replace=MARKER) as new:
            (new / "newer").write_text("")
    assert sorted(p.name for p in dest.iterdir()) == ["new", "notes.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["dist"], "the staging folder is removed"
    assert indexpages.INDEX_MARKER == MARKER


def test_constraints_inside_out_is_refused(project, tmp_path):
    out = tmp_path / "dist"
    done = _build(project, "--out", str(out), "--constraints", str(out / "constraints.txt"), env=_env(tmp_path))
    assert done.returncode == ExitCode.ERROR
    assert f"--constraints {out / 'constraints.txt'} is inside --out {out}" in _error(done)
    assert not out.exists() and not (tmp_path / "cache").exists()


# -- 4: every destination checked before any work ---------------------------

@pytest.mark.parametrize("case", ["constraints under a file", "out under a file", "constraints name too long", "out name too long",
                                  "constraints is a folder"])
def test_a_destination_that_cannot_be_written_is_refused_before_any_work(project, tmp_path, case):
    """Each holds for root too: a parent that is a file, a name longer than NAME_MAX."""
    (tmp_path / "a-file").write_text("")
    (tmp_path / "a-folder").mkdir()
    long = "x" * (os.pathconf(tmp_path, "PC_NAME_MAX") + 1)
    out, constraints = tmp_path / "dist", tmp_path / "constraints.txt"
    bad, says = {
        "constraints under a file": ("constraints", f"{tmp_path / 'a-file'} is not a folder"),
        "out under a file": ("out", f"{tmp_path / 'a-file'} is not a folder"),
        "constraints name too long": ("constraints", "File name too long"),
        "out name too long": ("out", "File name too long"),
        "constraints is a folder": ("constraints", "it is a folder; name a file"),
    }[case]
    target = tmp_path / ("a-folder" if "folder" in case else "a-file/x" if "file" in case else long)
    if bad == "out":
        out = target
    else:
        constraints = target
    done = _build(project, "--out", str(out), "--constraints", str(constraints), env=_env(tmp_path))
    assert done.returncode == ExitCode.ERROR, done.stderr
    assert _error(done).endswith(f"error: cannot write {target}: {says}.")
    assert not (tmp_path / "cache").exists(), "refused before any work"


def test_a_write_that_fails_is_status_3_naming_the_file(tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(OverlayError, match=f"cannot write {tmp_path / 'a-file' / 'x.txt'}: Not a directory"):
        staging.write_atomically(tmp_path / "a-file" / "x.txt", "text")
    # A file staged to be written after another (the index) is removed when that one fails.
    with pytest.raises(RuntimeError), staging.staged_file(tmp_path / "constraints.txt", "new"):
        raise RuntimeError("the index could not be put in place")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


# -- 3: two builds to one destination take turns ----------------------------

@pytest.mark.parametrize("held", ["the index", "constraints.txt"])
def test_a_second_build_to_one_destination_waits_for_the_first(project, tmp_path, held):
    out, constraints = tmp_path / "dist", tmp_path / "constraints.txt"
    lock = tmp_path / (".dist.lock" if held == "the index" else ".constraints.txt.lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)  # what the first build holds from staging to its last write
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        args = [sys.executable, "-m", "maxtext_rl_overlay", "build", "--only", "google-tunix", "--project", str(project),
                "--out", str(out), "--constraints", str(constraints)]
        second = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=_env(tmp_path))
        assert second.stderr is not None
        line = second.stderr.readline()
        assert line == f"[build] waiting for another build to finish with {out if held == 'the index' else constraints}\n", line
        assert second.poll() is None, "it waits"
        assert not (tmp_path / "cache").exists(), "while it waits it holds nothing of the cache (clean may run)"
    finally:
        os.close(fd)
    rest = second.stderr.read()
    assert second.wait(timeout=120) == ExitCode.ERROR and THE_INDEX_FAILS in rest, rest


# -- 9: modes ----------------------------------------------------------------

@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_written_file_has_the_mode_the_umask_gives(tmp_path, umask, mode):
    """A static server running as another user must read the index's
    constraints.txt, the repository's, the pinned build toolchain."""
    old = os.umask(umask)
    try:
        staging.write_atomically(tmp_path / "constraints.txt", "text")
    finally:
        os.umask(old)
    assert (tmp_path / "constraints.txt").stat().st_mode & 0o777 == mode


# -- --constraints replaces only a file the tool wrote ------------------------

@pytest.mark.parametrize("name", ["README.md", "pyproject.toml"])
def test_a_constraints_that_is_not_the_tools_is_refused_and_left_whole(project, tmp_path, name):
    """A typo away from the default: the project's own files."""
    target = project / name
    before = target.read_bytes()
    done = _build(project, "--out", str(tmp_path / "dist"), "--constraints", str(target), env=_env(tmp_path))
    assert done.returncode == ExitCode.ERROR, done.stderr
    assert _error(done).endswith(f"error: --constraints {target} is not a constraints file the tool wrote (it lacks the first line "
                                 f"{constraintsfile.CONSTRAINTS_HEADER!r}): it is not replaced, since what it holds would be lost. Name an absent "
                                 "or empty file, or a constraints file an earlier run wrote; if this one is, remove it by hand.")
    assert target.read_bytes() == before
    assert not (tmp_path / "cache").exists() and not (tmp_path / "dist").exists(), "refused before any work"
    assert not [p.name for p in project.iterdir() if p.name.startswith(f"{name}.")], "no staging file left beside it"


@pytest.mark.parametrize("case", ["empty", "the tool's", "the committed one"])
def test_a_constraints_that_is_the_tools_is_let_through(project, tmp_path, case):
    target = tmp_path / "constraints.txt"
    target.write_text({"empty": "", "the tool's": constraintsfile.CONSTRAINTS_HEADER + "\n--find-links ./dist\n",
                       "the committed one": (ROOT / "constraints.txt").read_text()}[case])
    done = _build(project, "--out", str(tmp_path / "dist"), "--constraints", str(target), env=_env(tmp_path))
    assert done.returncode == ExitCode.ERROR and THE_INDEX_FAILS in _error(done), done.stderr


#: The first line constraints files had before it named `maxtext-rl-overlay build`: still the tool's.
EARLIER_HEADER = "# maxtext-rl-overlay constraints: generated by scripts/build-wheels.sh; do not edit."


def test_the_header_names_the_command_that_makes_the_file():
    assert constraintsfile.CONSTRAINTS_HEADER == "# maxtext-rl-overlay constraints: made by maxtext-rl-overlay build; do not edit."
    assert constraintsfile.CONSTRAINTS_HEADER != EARLIER_HEADER


@pytest.mark.parametrize("case", ["absent", "empty", "the tool's", "an earlier tool's"])
def test_a_constraints_file_that_is_the_tools_is_replaced(tmp_path, case):
    target = tmp_path / "constraints.txt"
    if case != "absent":
        first = {"empty": None, "the tool's": constraintsfile.CONSTRAINTS_HEADER, "an earlier tool's": EARLIER_HEADER}[case]
        target.write_text("" if first is None else first + "\nold==1\n")
    staging.write_atomically(target, constraintsfile.CONSTRAINTS_HEADER + "\nnew==2\n", owner=constraintsfile.CONSTRAINTS_FILE)
    assert target.read_text() == constraintsfile.CONSTRAINTS_HEADER + "\nnew==2\n"
    assert [p.name for p in tmp_path.iterdir()] == ["constraints.txt"]


@pytest.mark.parametrize("held", ["a user's text", "the header not first", "a fifo"])
def test_a_file_that_is_not_the_tools_is_refused_at_the_write_too(tmp_path, held):
    """The check runs again at the rename: the file may have changed since the build began."""
    target = tmp_path / "constraints.txt"
    if held == "a fifo":
        os.mkfifo(target)
    else:
        target.write_text("mine\n" + (constraintsfile.CONSTRAINTS_HEADER if held == "the header not first" else ""))
    with pytest.raises(OverlayError, match="is not (a constraints file the tool wrote|a regular file)"):
        with staging.staged_file(target, "new", owner=constraintsfile.CONSTRAINTS_FILE):
            pass
    if held != "a fifo":
        assert target.read_text().startswith("mine\n")
    assert [p.name for p in tmp_path.iterdir()] == ["constraints.txt"], "the staging file is removed"
