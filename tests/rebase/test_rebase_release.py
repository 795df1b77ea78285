"""`rebase --maxtext VERSION`: the pins a MaxText release names in its wheel
(dependencies/extra_deps/post_train_github_deps.txt), read from a package
index served here (a release wheel made in the test: no network). Each runs
the real command on a git-tracked copy of the project."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tomllib

import pytest
from packaging.version import Version

from maxtext_rl_overlay.config.pins import load_project
from maxtext_rl_overlay.core.errors import OverlayError
from maxtext_rl_overlay.rebase.release import parse_deps
from maxtext_rl_overlay.rebase.state import QueuedMove, ReleaseState
from support import ROOT
from unit.unit_support import PackageIndex, commit_files, git, maxtext_release, maxtext_version, small_patch, small_project
from unit.unit_support import small_upstream as make_small_upstream

TPU = pathlib.Path("patches/tpu-inference")
ROOT_PINS = {name: pin.commit for name, pin in load_project(ROOT).pins.items() if pin.release is None}  # what a release names
#: What MaxText 0.2.4's wheel names: the overlay's pins of today.
PINS_024 = {"google-tunix": "c4ec573d29e4c3a3955b348256d464b119c8a6d1", "tpu-inference": "7ecc401e6faefe3f793f3e4a8e6e2dbc49eca868",
            "vllm": "0ba2aa35a81dcc3246b26291368b53fa2389c7d7"}
#: What MaxText 0.2.5's wheel names (none of them in a source here).
PINS_025 = {"google-tunix": "a8d70582f1e2f1fb65973210989e0e148b5ef7ad", "tpu-inference": "b67ae5f8f234fd559cf4b376840e7bb9ae6d3275",
            "vllm": "d626108b1841888ec90aced33367149a6bbc7e4b"}
#: MaxText 0.2.4's deps file, byte for byte.
DEPS_024 = """google-tunix @ https://github.com/google/tunix/archive/c4ec573d29e4c3a3955b348256d464b119c8a6d1.zip
tpu-inference @ https://github.com/vllm-project/tpu-inference/archive/7ecc401e6faefe3f793f3e4a8e6e2dbc49eca868.zip
vllm @ git+https://github.com/vllm-project/vllm@0ba2aa35a81dcc3246b26291368b53fa2389c7d7
"""


def test_the_deps_file_of_a_release_names_its_three_commits():
    assert parse_deps(DEPS_024, "deps") == PINS_024
    with pytest.raises(OverlayError, match=r"deps: 'vllm @ git\+https://github.com/vllm-project/vllm@main' names no upstream commit"):
        parse_deps("vllm @ git+https://github.com/vllm-project/vllm@main\n", "deps")


#: A release.json as the tool has always written it: a move stopped by an
#: earlier version of the tool is resumed by this one.
STOPPED_RELEASE = """{
 "version": "0.2.5",
 "extra": [
  "maxtext[tpu-post-train]==0.2.4",
  "maxtext[tpu-post-train]==0.2.5"
 ],
 "queue": [
  {
   "name": "tpu-inference",
   "commit": "b67ae5f8f234fd559cf4b376840e7bb9ae6d3275",
   "source": "/src/tpu-inference"
  },
  {
   "name": "vllm",
   "commit": "d626108b1841888ec90aced33367149a6bbc7e4b",
   "source": null
  }
 ],
 "plan": [
  "rebase --maxtext 0.2.5: ..."
 ],
 "tables": [],
 "touched": [
  "patches/tpu-inference",
  "pyproject.toml"
 ],
 "sources": {
  "tpu-inference": "/src/tpu-inference"
 },
 "build": false,
 "standins": false,
 "run_tests": true,
 "cache": "/cache",
 "seconds": 1.5,
 "clones": [
  "tpu-inference",
  "vllm"
 ],
 "aborting": false,
 "cutoff": [
  "2026-11-30T20:00:00Z",
  "2026-12-06T02:00:00Z"
 ],
 "before": {
  "wcwidth": "0.9.4"
 }
}"""


def test_a_stopped_release_s_record_reads_as_typed_moves_and_is_written_back_the_same():
    run = ReleaseState.from_json(STOPPED_RELEASE)
    assert run.queue == [QueuedMove("tpu-inference", PINS_025["tpu-inference"], "/src/tpu-inference"),
                         QueuedMove("vllm", PINS_025["vllm"], None)]
    assert run.to_json() == STOPPED_RELEASE


def _tool(project, index, *args):
    env = dict(os.environ, MRL_CACHE_DIR=str(project.parent / "cache"), UV_DEFAULT_INDEX=index.url)
    return subprocess.run([sys.executable, "-m", "maxtext_rl_overlay", "rebase", *args, "--project", str(project)],
                          capture_output=True, text=True, env=env, timeout=300)


def _changed(project) -> str:
    return git(project, "status", "--porcelain", "--untracked-files=all", "--ignored")


@pytest.fixture
def small_upstream(tmp_path):
    """As test_rebase_stops's: the pin (A = 1), and a branch `moved` changing the line the patch changes."""
    return tmp_path / "upstream", make_small_upstream(tmp_path / "upstream")


@pytest.fixture
def served(tmp_path):
    folder = tmp_path / "index"
    folder.mkdir()
    with PackageIndex(folder) as index:
        yield folder, index


def _real_pins_project(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "constraints.txt"):
        shutil.copy2(ROOT / name, project / name)
    shutil.copytree(ROOT / "patches", project / "patches")
    git(project, "init", "-q", "-b", "main")
    commit_files(project, {}, "project copy", "2026-11-01T00:00:00+00:00")
    return project


def test_the_release_of_the_pins_changes_nothing(served, tmp_path):
    """`--maxtext 0.2.4` on today's tree (its release, after a move)."""
    folder, index = served
    version = maxtext_version(ROOT)
    maxtext_release(folder, version, ROOT_PINS)
    project = _real_pins_project(tmp_path)
    proc = _tool(project, index, "--maxtext", version)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"already MaxText {version}'s: nothing changed" in proc.stdout
    for name, commit in ROOT_PINS.items():
        assert f"{commit[:12]} -> {commit[:12]}  (already the release's)" in proc.stdout and name in proc.stdout
    assert _changed(project) == ""


def test_commits_in_no_source_are_refused_before_any_change(served, tmp_path):
    """MaxText 0.2.5 here: every commit it names is in none of the sources."""
    folder, index = served
    maxtext_release(folder, "0.2.5", PINS_025)
    project = _real_pins_project(tmp_path)
    proc = _tool(project, index, "--maxtext", "0.2.5", "--source", f"tpu-inference={tmp_path}")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "MaxText 0.2.5 names 3 commit(s) that none of the sources given holds; nothing was changed" in proc.stderr
    assert f"tpu-inference {PINS_025['tpu-inference']} (not in --source tpu-inference={tmp_path})" in proc.stderr
    assert f"vllm {PINS_025['vllm']} (no --source given for it): a clone or mirror of https://github.com/vllm-project/vllm" in proc.stderr
    assert f"google-tunix {PINS_025['google-tunix']}" in proc.stderr
    assert "Pass --source NAME=PATH" in proc.stderr
    assert _changed(project) == ""


def _extra(project) -> list[str]:
    return tomllib.loads((project / "pyproject.toml").read_text())["project"]["optional-dependencies"]["maxtext"]


def _cutoff(project) -> str:
    return tomllib.loads((project / "pyproject.toml").read_text())["tool"]["maxtext-rl-overlay"]["resolution-cutoff"]


def _pin(project) -> str:
    return tomllib.loads((project / TPU / "pin.toml").read_text())["commit"]


def test_a_release_moves_its_pins_and_the_extra(small_upstream, served, tmp_path):
    repo, pin = small_upstream
    patch = small_patch(repo, pin, "A = 3\n", tmp_path / "0001-Set-A-to-3.patch")
    git(repo, "checkout", "-q", "-b", "later", pin)
    later = commit_files(repo, {"README.md": "upstream, later\n"}, "a later commit", "2026-08-02T00:00:00+00:00")
    project = small_project(tmp_path, repo, pin, patch)
    folder, index = served
    maxtext_release(folder, "0.2.5.dev1", {**ROOT_PINS, "tpu-inference": later})
    old_cutoff = _cutoff(project)
    proc = _tool(project, index, "--maxtext", "0.2.5.dev1", "--source", f"tpu-inference={repo}", "--no-tests")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _cutoff(project) > old_cutoff, "the move takes the registry as of its own time"
    assert f"  resolution-cutoff  {old_cutoff} -> {_cutoff(project)}  (the registry as of the move; " in proc.stdout, proc.stdout
    assert f"tpu-inference  {pin[:12]} -> {later[:12]}  (from {repo})" in proc.stdout
    assert f"rebase tpu-inference: {pin[:12]} -> {later[:12]}" in proc.stdout
    assert "0001-Set-A-to-3.patch  applied cleanly" in proc.stdout
    assert _pin(project) == later
    assert _extra(project) == ["maxtext[tpu-post-train]==0.2.5.dev1"]
    assert not (project / "build" / "rebase" / "release").exists()


@pytest.fixture
def conflicting_move(small_upstream, served, tmp_path):
    """A project whose patch conflicts with the tpu-inference commit that a
    release (0.2.5.dev1, served) names: (project, index URL, repository, that commit)."""
    repo, pin = small_upstream
    patch = small_patch(repo, pin, "A = 3\n", tmp_path / "0001-Set-A-to-3.patch")
    moved = git(repo, "rev-parse", "moved")
    project = small_project(tmp_path, repo, pin, patch)
    folder, index = served
    maxtext_release(folder, "0.2.5.dev1", {**ROOT_PINS, "tpu-inference": moved})
    return project, index, repo, moved


def test_a_conflict_stops_the_move_and_abort_restores_all_of_it(conflicting_move):
    project, index, repo, _ = conflicting_move
    before = {p: (project / p).read_bytes() for p in ("pyproject.toml", "patches/tpu-inference/pin.toml")}
    proc = _tool(project, index, "--maxtext", "0.2.5.dev1", "--source", f"tpu-inference={repo}", "--no-tests")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "STOPPED at 0001-Set-A-to-3.patch" in proc.stdout and "--abort restores the whole move, pyproject.toml included" in proc.stdout
    proc = _tool(project, index, "--abort")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rebase --maxtext 0.2.5.dev1 aborted" in proc.stdout
    assert {p: (project / p).read_bytes() for p in before} == before
    assert not (project / "build" / "rebase").exists() or not any((project / "build" / "rebase").iterdir())


def test_continue_finishes_the_stopped_pin_then_moves_the_extra(conflicting_move):
    project, index, repo, moved = conflicting_move
    assert _tool(project, index, "--maxtext", "0.2.5.dev1", "--source", f"tpu-inference={repo}", "--no-tests").returncode == 1
    work = project / "build" / "rebase" / "tpu-inference"
    (work / "tpu_inference" / "__init__.py").write_text("A = 3\n")
    git(work, "add", "-A")
    proc = _tool(project, index, "--continue")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "conflict resolved by hand" in proc.stdout
    assert _pin(project) == moved and _extra(project) == ["maxtext[tpu-post-train]==0.2.5.dev1"]


def _tool_in(cwd, project, index, *args):
    """The command run from `cwd`, naming no --project: the checkout is the one holding `cwd`."""
    env = dict(os.environ, MRL_CACHE_DIR=str(project.parent / "cache"), UV_DEFAULT_INDEX=index.url, UV_OFFLINE="1")
    return subprocess.run([sys.executable, "-m", "maxtext_rl_overlay", "rebase", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=300)


def test_a_relative_source_a_continue_from_the_work_clone_a_failed_build_and_abort(conflicting_move):
    """--source as typed (relative) is stored absolute, so --continue run in
    the work clone the stop sends the person into finds it; a failed --build
    then says how to go on, as the per-distribution rebase does; --abort
    restores every file and removes the work clones the move made."""
    project, index, repo, moved = conflicting_move
    before = {p: (project / p).read_bytes() for p in ("pyproject.toml", "patches/tpu-inference/pin.toml", "constraints.txt")}
    relative = os.path.relpath(repo, project)
    stopped = _tool_in(project, project, index, "--maxtext", "0.2.5.dev1", "--source", f"tpu-inference={relative}", "--build", "--no-tests")
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    assert f"--find-base --source {repo}" in stopped.stdout, "the suggestion names the source by its absolute path"
    work = project / "build" / "rebase" / "tpu-inference"
    (work / "tpu_inference" / "__init__.py").write_text("A = 3\n")
    git(work, "add", "-A")
    failed = _tool_in(work, project, index, "--continue")
    assert failed.returncode == 3, failed.stdout + failed.stderr
    assert "is not a git repository" not in failed.stderr, failed.stderr
    assert _pin(project) == moved, "the stopped pin was carried before the build"
    assert "the build failed, so constraints.txt is unchanged" in failed.stderr, failed.stderr
    assert "run scripts/rebase.sh --continue (builds again), or scripts/rebase.sh --abort" in failed.stderr, failed.stderr
    assert (project / "constraints.txt").read_bytes() == before["constraints.txt"]
    aborted = _tool_in(project, project, index, "--abort")
    assert aborted.returncode == 0, aborted.stdout + aborted.stderr
    assert "work clones removed: build/rebase/tpu-inference" in aborted.stdout
    assert {p: (project / p).read_bytes() for p in before} == before
    assert not (project / "build" / "rebase").exists() or not any((project / "build" / "rebase").iterdir()), \
        list((project / "build" / "rebase").iterdir())


def test_versions_are_compared_in_pep_440_s_normal_form_and_an_unknown_one_lists_the_releases(served, tmp_path):
    folder, index = served
    version = maxtext_version(ROOT)
    maxtext_release(folder, version, ROOT_PINS)
    project = _real_pins_project(tmp_path)
    base = Version(version).base_version  # the release segment: 0.2.4 -> 0.2.4.0, 0.2.5.dev1 -> 0.2.5.0.dev1 (equal under PEP 440)
    for spelled in (f"v{version}", version.replace(base, base + ".0", 1)):
        proc = _tool(project, index, "--maxtext", spelled)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"already MaxText {version}'s: nothing changed" in proc.stdout
    unknown = _tool(project, index, "--maxtext", "9.9.9")
    assert unknown.returncode == 3
    assert f"no pure-Python wheel of maxtext 9.9.9; the releases it has: {version}." in unknown.stderr, unknown.stderr
    assert _changed(project) == ""
