"""The overlay's own wheel is made of the project's tracked files, and its
manifest records the project commit they are: the newest commit that
changed one of them (a commit that changes none, such as the one committing
a regenerated constraints.txt, leaves the wheel as it was), and the files
that differ from it. A copy without git still builds, recording no commit."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
from typing import Any

import pytest

from maxtext_rl_overlay.config.pins import load_project
from maxtext_rl_overlay.core import manifest
from maxtext_rl_overlay.stages import overlayfiles, wheels
from maxtext_rl_overlay.stages import run as build
from support import ROOT

STRAY = "overlay/maxtext_rl_overlay/stray.py"
GIT_ENV = {"GIT_AUTHOR_NAME": "u", "GIT_AUTHOR_EMAIL": "u@u", "GIT_COMMITTER_NAME": "u", "GIT_COMMITTER_EMAIL": "u@u",
           "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}


def _git(repo: pathlib.Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env=dict(os.environ, **GIT_ENV), check=True, capture_output=True, text=True).stdout.strip()


def _commit_all(repo: pathlib.Path, message: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", message)
    return _git(repo, "rev-parse", "HEAD")


def _copy_tracked(dest: pathlib.Path) -> pathlib.Path:
    """The checkout's tracked files the build reads, as they are in the work tree."""
    listed = _git(ROOT, "ls-files", "-z", "--", *overlayfiles.OVERLAY_INPUTS, "patches", "constraints.txt").split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, dest / name)
    return dest


@pytest.fixture
def checkout(tmp_path) -> tuple[pathlib.Path, str]:
    """A git checkout of the project; then a commit that changes no input of
    the overlay's wheel. Returns it and the commit that last changed one."""
    root = _copy_tracked(tmp_path / "project")
    _git(root, "init", "-q", "-b", "main")
    inputs = _commit_all(root, "the project")
    (root / "constraints.txt").write_text((root / "constraints.txt").read_text() + "# regenerated\n")
    _commit_all(root, "regenerate constraints.txt")
    return root, inputs


def test_only_tracked_files_and_the_inputs_commit(checkout, capsys):
    root, inputs = checkout
    (root / STRAY).write_text("SHIPPED = True\n")
    found = overlayfiles.overlay_inputs(root)
    assert STRAY not in found.files and "overlay/maxtext_rl_overlay/stages/run.py" in found.files
    assert {"README.md", "LICENSE", "pyproject.toml"} <= set(found.files)
    assert found.project == manifest.ProjectRecord(inputs, ()), "the newest commit that changed an input, not HEAD"
    err = capsys.readouterr().err
    assert f"as git does not track them: {STRAY}" in err and f"made from the project's commit {inputs[:12]}" in err

    (root / "README.md").write_text((root / "README.md").read_text() + "\nAn edit.\n")
    _git(root, "add", STRAY)  # tracked from now on, not yet committed
    found = overlayfiles.overlay_inputs(root)
    assert STRAY in found.files
    assert found.project == manifest.ProjectRecord(inputs, ("README.md", STRAY))
    assert "with uncommitted changes to README.md, " in capsys.readouterr().err


def test_a_copy_without_git_takes_every_file_and_records_no_commit(checkout):
    root, _ = checkout
    shutil.rmtree(root / ".git")
    (root / STRAY).write_text("")
    (root / "overlay" / "maxtext_rl_overlay" / "__pycache__").mkdir()
    (root / "overlay" / "maxtext_rl_overlay" / "__pycache__" / "x.cpython-312.pyc").write_bytes(b"")
    found = overlayfiles.overlay_inputs(root)
    assert STRAY in found.files and found.project is None
    assert not [f for f in found.files if "__pycache__" in f]


def test_a_shallow_clone_does_not_guess_the_commit(checkout, tmp_path, capsys):
    """Cut at depth 1, the history that tells which commit last changed an
    input is not there: the clone's cut would be a wrong answer."""
    root, _ = checkout
    shallow = tmp_path / "shallow"
    _git(tmp_path, "clone", "-q", "--depth", "1", root.as_uri(), str(shallow))
    assert overlayfiles.overlay_inputs(shallow).project is None
    assert "the checkout is shallow" in capsys.readouterr().err


def test_the_wheel_holds_the_tracked_files_and_the_commit(checkout, tmp_path, monkeypatch):
    """What _build_overlay gives the wheel build: the stray file left out,
    the manifest recording the commit."""
    root, inputs = checkout
    (root / STRAY).write_text("SHIPPED = True\n")
    project = load_project(root)
    found = overlayfiles.overlay_inputs(root)
    env = manifest.EnvironmentRecord("maxtext[tpu-post-train]==0.2.4", "maxtext", manifest.TorchRecord("2.11.0", "2.11.0+cpu", True, "0.26.0"), None)
    record = manifest.Manifest("0.1.0", project.revision, {}, ("google-tunix", "tpu-inference", "vllm"), env, project=found.project)
    seen: dict[str, Any] = {}

    def capture(tree, out_dir, **kw):
        seen["files"] = sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if p.is_file())
        seen["manifest"] = json.loads((tree / "overlay" / "maxtext_rl_overlay" / manifest.RESOURCE).read_text())
        return out_dir / "maxtext_rl_overlay-0.1.0-py3-none-any.whl"

    monkeypatch.setattr(wheels, "build_wheel", capture)  # the module build calls
    build._build_overlay(project, found.files, record, None, tmp_path / "staging", "python3", tmp_path / "cache")
    assert STRAY not in seen["files"] and "overlay/maxtext_rl_overlay/stages/run.py" in seen["files"]
    assert seen["manifest"]["project"] == {"commit": inputs, "dirty": []}
