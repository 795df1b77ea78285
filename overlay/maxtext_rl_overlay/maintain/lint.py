"""`lint`: the project's own inputs checked without building anything:
pyproject's options and [project] table, the pin files, what refers across
them (the maxtext extra names one of [project]'s extras), the matrix table,
and every patch of every series (patchfile.lint_file)."""

from __future__ import annotations

import pathlib

from ..config.pins import load_project
from ..core.errors import ExitCode
from ..stages import patchfile
from . import testmatrix


def problems(root: pathlib.Path) -> tuple[int, list[str]]:
    """How many patches the series hold, and each problem found in them.
    A wrong pyproject table, pin file or matrix table raises OverlayError."""
    project = load_project(root)
    for quick in (False, True):  # and the matrix table, the one part used only by test-matrix
        testmatrix.load_matrix(project.options.matrix, where=str(project.root / "pyproject.toml"), quick=quick)
    found = [problem for pin in project.pins.values() for path in pin.series for problem in patchfile.lint_file(path)]
    return sum(len(p.series) for p in project.pins.values()), found


def command(root: pathlib.Path) -> int:
    """Each problem printed, then the count; CHECK_FAILED where there is one."""
    count, found = problems(root)
    for problem in found:
        print(problem)
    print(f"lint: {count} patch(es), {len(found)} problem(s)")
    return ExitCode.CHECK_FAILED if found else ExitCode.OK
