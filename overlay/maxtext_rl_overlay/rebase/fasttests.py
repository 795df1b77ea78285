"""The project's fast tests (tests/unit), run on the rebased checkout."""

from __future__ import annotations

import os
import pathlib
import sys
from dataclasses import dataclass

from ..core.output import step
from ..core.proc import run

#: constraints.txt pins the wheels the pins build, with their versions: a
#: moved pin makes it stale until it is rebuilt (--build does), so without a
#: rebuild this test fails by construction and says nothing of the rebase.
STALE_UNTIL_REBUILT = "tests/unit/test_pins_and_patches.py::test_constraints_pin_exactly_what_the_pins_and_revision_build"


@dataclass(frozen=True)
class FastTests:
    ok: bool
    summary: str  # pytest's summary line, and the failed tests
    deselected: tuple[str, ...] = ()


def run_fast_tests(root: pathlib.Path, rebuilt: bool) -> FastTests:
    venv = root / ".venv" / "bin" / "python"
    python = str(venv) if venv.exists() else sys.executable
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(root / "overlay"), os.environ.get("PYTHONPATH")]))}
    deselected = () if rebuilt else (STALE_UNTIL_REBUILT,)
    cmd = [python, "-m", "pytest", "tests/unit", "-q", "-p", "no:cacheprovider", *(f"--deselect={t}" for t in deselected)]
    with step("tests", "tests/unit (fast)"):
        proc = run(cmd, cwd=root, env=env, check=False, log=True, what="the fast tests")
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    summary = lines[-1] if lines else proc.stderr.strip()[-300:]
    if proc.returncode != 0:
        failed = [line for line in lines if line.startswith("FAILED")]
        summary += "\n    " + "\n    ".join(failed[:10])
    return FastTests(proc.returncode == 0, summary, deselected)
