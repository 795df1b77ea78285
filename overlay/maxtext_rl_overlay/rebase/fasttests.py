"""The project's fast tests (tests/unit), run on the rebased checkout."""

from __future__ import annotations

import os
import pathlib
import sys
from dataclasses import dataclass

from ..proc import run
from ..progress import step

@dataclass(frozen=True)
class FastTests:
    ok: bool
    summary: str  # pytest's summary line, and the failed tests


def run_fast_tests(root: pathlib.Path) -> FastTests:
    venv = root / ".venv" / "bin" / "python"
    python = str(venv) if venv.exists() else sys.executable
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(root / "overlay"), os.environ.get("PYTHONPATH")]))}
    cmd = [python, "-m", "pytest", "tests/unit", "-q", "-p", "no:cacheprovider"]
    with step("tests", "tests/unit (fast)"):
        proc = run(cmd, cwd=root, env=env, check=False, log=True, what="the fast tests")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    summary = lines[-1] if lines else proc.stderr.strip()[-300:]
    if proc.returncode != 0:
        failed = [line for line in lines if line.startswith("FAILED")]
        summary += "\n    " + "\n    ".join(failed[:10])
    return FastTests(proc.returncode == 0, summary)
