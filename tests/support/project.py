"""Copies of this project for the tests that change it, and the real tool
run on one, as a user runs it (tool venv: tests/unit, tests/pipeline,
tests/rebase)."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

from maxtext_rl_overlay.config.pins import set_pin_values
from support import ROOT

#: What every project copy holds: enough for the tool to read the project,
#: lint it and begin a build.
TOOL_INPUTS = ("pyproject.toml", "README.md", "patches")
#: Left out of a copied folder: caches, build leftovers, the manifest a build writes.
_LEFT_OUT = shutil.ignore_patterns("__pycache__", "*.egg-info", "manifest.json")


def project_copy(dest: pathlib.Path, *more: str, licence: bool = False) -> pathlib.Path:
    """A copy of the project's TOOL_INPUTS in `dest` (made here), LICENSE
    with `licence` (a build packs it), and `more` (paths from the project's
    root; one it lacks is left out)."""
    dest.mkdir()
    for name in (*TOOL_INPUTS, *(("LICENSE",) if licence else ()), *more):
        src, to = ROOT / name, dest / name
        if src.is_dir():
            shutil.copytree(src, to, ignore=_LEFT_OUT)
        elif src.exists():
            to.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, to)
    return dest


def set_pin(project: pathlib.Path, dist: str, **values: str) -> None:
    """Set `values` (commit, tree, date, repository, ...) in the pin of `dist` of `project`."""
    set_pin_values(project / "patches" / dist / "pin.toml", values)


def run_tool(project: pathlib.Path, *args: str, cache: pathlib.Path | None = None, check: bool | None = None,
             env: dict[str, str] | None = None, own_code: bool = False, **kw) -> subprocess.CompletedProcess:
    """`python -m maxtext_rl_overlay ARGS --project PROJECT`, as a user runs
    it: its cache `cache` (by default `cache` beside the project), `env`
    added to this process's; `own_code`: the code of the copy's overlay/
    rather than this checkout's."""
    env = dict(os.environ, MRL_CACHE_DIR=str(cache or project.parent / "cache"), UV_PYTHON_DOWNLOADS="never", **(env or {}))
    if own_code:
        env["PYTHONPATH"] = str(project / "overlay")
    proc = subprocess.run(
        [sys.executable, "-m", "maxtext_rl_overlay", *args, "--project", str(project)],
        capture_output=True, text=True, env=env, **kw,
    )
    if check is True:
        assert proc.returncode == 0, proc.stderr
    return proc
