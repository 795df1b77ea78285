"""A rebase that stops (a conflict, a patch that does not apply at all, an
upstream that cannot be fetched), on a small upstream made here: what it
says, and that a stopped one survives `clean`. Each runs the real command,
`python -m maxtext_rl_overlay rebase`, on a git-tracked copy of the project
whose tpu-inference pin names that upstream (no --source: fetched with git
into the cache, as from GitHub)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from maxtext_rl_overlay.cache import buildcache
from maxtext_rl_overlay.config.pins import set_pin_values
from maxtext_rl_overlay.core.errors import OverlayError
from unit.unit_support import SMALL_CODE, commit_files, git, small_patch, small_project, small_upstream

TPU = pathlib.Path("patches/tpu-inference")
CODE = SMALL_CODE


@pytest.fixture
def upstream(tmp_path) -> tuple[pathlib.Path, str]:
    """An upstream with the pin (A = 1) and a branch `moved` that changes the line the patch changes."""
    return tmp_path / "upstream", small_upstream(tmp_path / "upstream")


def _tool(project: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, MRL_CACHE_DIR=str(project.parent / "cache"))
    return subprocess.run([sys.executable, "-m", "maxtext_rl_overlay", *args], capture_output=True, text=True, env=env, cwd=project, timeout=300)


def test_a_stopped_rebase_survives_clean(upstream, tmp_path):
    """The work clone of a stopped rebase borrowed the objects of the
    repository fetched into the cache; `clean` removed that repository and
    --continue failed ("not a git repository"). Stopped, it stands alone."""
    repo, pin = upstream
    patch = small_patch(repo, pin, "A = 3\n", tmp_path / "0001-Set-A-to-3.patch")
    project = small_project(tmp_path, repo, pin, patch)
    stopped = _tool(project, "rebase", "tpu-inference", "moved", "--no-tests")
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    assert "STOPPED at 0001-Set-A-to-3.patch" in stopped.stdout and "<<<<<<<" in stopped.stdout
    work = project / "build" / "rebase" / "tpu-inference"
    assert "<<<<<<<" in (work / CODE).read_text()

    cleaned = _tool(project, "clean")
    assert cleaned.returncode == 0, cleaned.stderr
    assert "git" in cleaned.stdout and not (tmp_path / "cache" / "git").exists(), "clean removed the fetched repository"

    (work / CODE).write_text("A = 3\n")
    git(work, "add", CODE)
    done = _tool(project, "rebase", "--continue")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "conflict resolved by hand" in done.stdout
    moved = git(repo, "rev-parse", "moved")
    assert f'commit = "{moved}"' in (project / TPU / "pin.toml").read_text()
    assert "+A = 3" in (project / TPU / "0001-Set-A-to-3.patch").read_text()


def test_clean_is_refused_while_a_rebase_runs(upstream, tmp_path, monkeypatch):
    """A rebase holds the cache as a build does."""
    from maxtext_rl_overlay import rebase
    from maxtext_rl_overlay.rebase import apply

    repo, pin = upstream
    patch = small_patch(repo, pin, "A = 3\n", tmp_path / "0001-Set-A-to-3.patch")
    project = small_project(tmp_path, repo, pin, patch)
    cache = tmp_path / "cache"
    refused: list[str] = []
    real = apply.apply_one

    def clean_meanwhile(*args, **kw):
        try:
            buildcache.clean(cache)
        except OverlayError as exc:
            refused.append(str(exc))
        return real(*args, **kw)

    monkeypatch.setattr(apply, "apply_one", clean_meanwhile)
    report = rebase.start(rebase.RebaseOptions(project, "tpu-inference", "moved", run_tests=False, cache=cache))
    assert report.stopped
    assert refused and "in use by a running build" in refused[0]
    assert (cache / "git" / "tpu-inference-rebase.git").is_dir()


def test_a_patch_that_does_not_apply_at_all_is_not_called_a_conflict_with_markers(upstream, tmp_path):
    """A patch whose pre-image is not in the repository and whose context is
    not there: git am makes no 3-way merge and leaves no markers, so the
    STOPPED text must not send the person looking for them."""
    repo, pin = upstream
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    git(elsewhere, "init", "-q", "-b", "main")
    base = commit_files(elsewhere, {CODE: "B = 1\n"}, "another tree", "2026-07-01T00:00:00+00:00")
    patch = small_patch(elsewhere, base, "B = 3\n", tmp_path / "0001-Set-A-to-3.patch")
    project = small_project(tmp_path, repo, pin, patch)
    stopped = _tool(project, "rebase", "tpu-inference", "moved", "--no-tests")
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    text = stopped.stdout
    assert "STOPPED at 0001-Set-A-to-3.patch" in text, text
    assert "<<<<<<<" not in text and "conflict markers" not in text, text
    assert "does not apply" in text and "git apply --reject" in text, text
    said = text.split("STOPPED at", 1)[1].split("\n", 1)[0]
    assert "(git: " in said and CODE in said, "git's own reason is shown, naming the file"


def test_a_fetch_that_fails_says_git_s_words_not_a_python_list(upstream, tmp_path):
    repo, pin = upstream
    patch = small_patch(repo, pin, "A = 3\n", tmp_path / "0001-Set-A-to-3.patch")
    project = small_project(tmp_path, repo, pin, patch)
    set_pin_values(project / TPU / "pin.toml", {"repository": str(tmp_path / "nowhere")})
    commit_files(project, {}, "an upstream that is not there", "2026-11-02T00:00:00+00:00")
    failed = _tool(project, "rebase", "tpu-inference", "moved", "--no-tests")
    assert failed.returncode == 3, failed.stderr
    (line,) = [line for line in failed.stderr.splitlines() if "error:" in line]
    assert "cannot fetch moved from" in line and "['" not in line and "fatal:" in line, line


def test_a_relative_source_is_taken_as_an_absolute_path(upstream, tmp_path):
    """--source as typed, relative to where the command runs, is stored and
    shown as an absolute path: the stop's suggestions and --continue work
    from anywhere, the work clone included."""
    repo, pin = upstream
    patch = small_patch(repo, pin, "A = 3\n", tmp_path / "0001-Set-A-to-3.patch")
    project = small_project(tmp_path, repo, pin, patch)
    env = dict(os.environ, MRL_CACHE_DIR=str(tmp_path / "cache"))
    stopped = subprocess.run([sys.executable, "-m", "maxtext_rl_overlay", "rebase", "tpu-inference", "moved", "--source", "upstream",
                              "--no-tests", "--project", str(project)], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert stopped.returncode == 1, stopped.stdout + stopped.stderr
    assert f"--find-base --source {repo}\n" in stopped.stdout, stopped.stdout
    work = project / "build" / "rebase" / "tpu-inference"
    (work / CODE).write_text("A = 3\n")
    git(work, "add", CODE)
    done = subprocess.run([sys.executable, "-m", "maxtext_rl_overlay", "rebase", "--continue"], cwd=work, capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"scripts/build-wheels.sh --source tpu-inference={repo}\n" in done.stdout, done.stdout
