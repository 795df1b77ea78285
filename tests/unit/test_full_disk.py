"""A full disk is an error, not a bug: `--out`, `--constraints` or the cache
on a filesystem without room gives status 3, "no space left on device",
naming the path, with no traceback; what was there stays whole, nothing
half-written is left, and with room again the same write succeeds.

The filesystems are real: small tmpfs mounts (root, or passwordless sudo,
as on CI's runners), filled until the kernel says ENOSPC (unit_support.SmallFs)."""

from __future__ import annotations

import errno
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from maxtext_rl_overlay import __main__ as cli
from maxtext_rl_overlay.cache import buildcache
from maxtext_rl_overlay.core import staging
from maxtext_rl_overlay.core.errors import ExitCode, OverlayError
from maxtext_rl_overlay.stages import buildenv, constraintsfile, indexpages, wheels
from support.project import project_copy
from unit.unit_support import SmallFs

MARKER = indexpages.INDEX_MARKER


@pytest.fixture
def small_fs(tmp_path):
    mounted: list[SmallFs] = []

    def make(size: int = 1 << 20, inodes: int = 64) -> SmallFs:
        fs = SmallFs(tmp_path / f"small-{len(mounted)}", size, inodes)
        mounted.append(fs)
        return fs

    yield make
    for fs in mounted:
        fs.unmount()


def _tree(folder: pathlib.Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _index(dest: pathlib.Path, wheel_bytes: int) -> None:
    with staging.staged_dir(dest, replace=MARKER, mode=0o755) as new:
        (new / "x-1.0-py3-none-any.whl").write_bytes(os.urandom(wheel_bytes))
        indexpages.write_index(new)


def test_an_index_that_does_not_fit_is_no_space_and_the_previous_one_stays_whole(small_fs):
    fs = small_fs(size=1 << 20)
    dest = fs.path / "dist"
    _index(dest, 300_000)
    before = _tree(dest)
    with pytest.raises(staging.NoSpace) as caught:
        _index(dest, 900_000)  # the new index is staged beside the old one: no room for both
    assert str(caught.value).startswith(f"no space left on device: cannot write {dest}. Free space on its filesystem (df {fs.path})")
    assert _tree(dest) == before
    assert sorted(p.name for p in fs.path.iterdir()) == ["dist"], "the staging folder is removed"
    fs.resize(4 << 20, 64)  # with room, the same write goes through
    _index(dest, 900_000)
    assert len((dest / "x-1.0-py3-none-any.whl").read_bytes()) == 900_000
    assert sorted(p.name for p in fs.path.iterdir()) == ["dist"], "the old index is removed"


def test_a_file_that_does_not_fit_is_no_space_and_the_previous_one_stays_whole(small_fs):
    fs = small_fs(size=256 << 10)
    constraints = fs.path / "constraints.txt"
    old = constraintsfile.CONSTRAINTS_HEADER + "\nold==1\n"
    constraints.write_text(old)
    with pytest.raises(staging.NoSpace, match=f"^no space left on device: cannot write {constraints}\\. "):
        staging.write_atomically(constraints, constraintsfile.CONSTRAINTS_HEADER + "\n" + "x" * (512 << 10), owner=constraintsfile.CONSTRAINTS_FILE)
    assert constraints.read_text() == old
    assert sorted(p.name for p in fs.path.iterdir()) == ["constraints.txt"]


def test_a_kept_wheel_that_does_not_fit_leaves_no_half_written_entry(small_fs, tmp_path, capsys):
    """The cache is where builds look first: an entry is whole or absent.
    (A wheel not kept costs only its reuse: the build itself stands.)"""
    fs = small_fs(size=256 << 10)
    wheel = tmp_path / "x-1.0-py3-none-any.whl"
    wheel.write_bytes(os.urandom(512 << 10))
    wheels.keep_wheel(fs.path, {"inputs": "of the build"}, wheel, "x")
    assert "the wheel was not kept for reuse (no space left on device: cannot write" in capsys.readouterr().err
    assert [p.name for p in (fs.path / "wheels").iterdir()] == [], "no entry, and no staging folder, in the cache"
    assert wheels.kept_wheel(fs.path, {"inputs": "of the build"}, tmp_path / "out", "x") is None


def test_a_build_environment_with_a_damaged_record_is_made_again(tmp_path):
    """Its record is written last, whole; one cut short (a full disk before
    records were renamed into place, a crash) reads as no environment."""
    entry = buildcache.Entry(tmp_path / "buildenv" / ("k" * 64), "k" * 64, who="vllm", kind="buildenv")
    entry.path.mkdir(parents=True)
    marker = entry.record_path
    assert buildenv.kept_environment(entry) is None
    assert entry.path.is_dir(), "no record: a build stopped in it; the make removes it"
    marker.write_text('{"version": "2.11.0", "cu')
    assert buildenv.kept_environment(entry) is None
    assert not entry.path.exists(), "a damaged one is removed"
    entry.path.mkdir(parents=True)
    marker.write_text(f'{{"version": "2.11.0", "cuda": "", "key": "{entry.key}"}}')
    assert buildenv.kept_environment(entry) == {"version": "2.11.0", "cuda": "", "key": entry.key}


# -- the command: status 3, the path named, no traceback, before any work -----

def _build(project: pathlib.Path, tmp_path: pathlib.Path, *, out: pathlib.Path, constraints: pathlib.Path, cache: pathlib.Path):
    env = dict(os.environ, MRL_CACHE_DIR=str(cache), UV_DEFAULT_INDEX=(tmp_path / "no-index").as_uri())
    return subprocess.run([sys.executable, "-m", "maxtext_rl_overlay", "build", "--only", "google-tunix", "--project", str(project),
                           "--out", str(out), "--constraints", str(constraints)], capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("full", ["--out", "--constraints", "the cache"])
def test_a_build_onto_a_full_filesystem_is_status_3_naming_the_path(small_fs, tmp_path, full):
    project = project_copy(tmp_path / "project")
    fs = small_fs(size=256 << 10, inodes=32)
    out, constraints, cache = tmp_path / "dist", tmp_path / "constraints.txt", tmp_path / "cache"
    path = {"--out": out, "--constraints": constraints, "the cache": cache}
    path[full] = fs.path / path[full].name
    # What an earlier build left there: an index and a constraints file, the tool's.
    _index(fs.path / "dist", 1000)
    (fs.path / "constraints.txt").write_text(constraintsfile.CONSTRAINTS_HEADER + "\nold==1\n")
    before = _tree(fs.path)
    fs.fill()
    done = _build(project, tmp_path, out=path["--out"], constraints=path["--constraints"], cache=path["the cache"])
    assert done.returncode == ExitCode.ERROR, done.stderr
    assert "Traceback" not in done.stderr and "unexpected error" not in done.stderr, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if "error:" in line]
    assert line.startswith(f"maxtext-rl-overlay: error: no space left on device: cannot write {path[full]}. "), line
    assert {k: v for k, v in _tree(fs.path).items() if not k.startswith("ballast")} == before
    assert not [p for p in fs.path.iterdir() if not p.name.startswith("ballast") and p.name not in ("dist", "constraints.txt")]
    assert not (tmp_path / "cache").exists() or full == "the cache", "refused before any work"
    shutil.rmtree(project)


def test_no_space_anywhere_else_is_status_3_too(monkeypatch, capsys):
    """A write no stage names (a lock file, a temporary folder): still the
    user's to fix, said in one line, the path named."""
    def full(args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/some/where/file")
    monkeypatch.setattr(buildcache, "command", full)  # the parser is made in main: it takes this one
    assert cli.main(["clean"]) == ExitCode.ERROR
    err = capsys.readouterr().err
    assert err == "maxtext-rl-overlay: error: no space left on device: cannot write /some/where/file. Free space on its filesystem, or name another place.\n"


def test_other_write_errors_keep_their_words(tmp_path):
    (tmp_path / "a-file").write_text("")
    with pytest.raises(OverlayError, match="cannot write .*: Not a directory") as caught:
        staging.write_atomically(tmp_path / "a-file" / "x.txt", "text")
    assert not isinstance(caught.value, staging.NoSpace)
