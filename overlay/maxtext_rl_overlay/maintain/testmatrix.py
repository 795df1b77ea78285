"""The wheel test matrix: for each environment cell, a fresh venv holding
only the built wheels and their dependencies (installed through the index's
constraints.txt, as a user would), then `maxtext-rl-overlay verify`, then the
patched-behaviour suite (tests/fixes) with JUnit XML, then a summary table.

The matrix is data: [tool.maxtext-rl-overlay.matrix] in pyproject.toml, read
here for the cells and by the tests for their parametrization."""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import re
import shlex
import shutil
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from typing import Any, Literal, get_args

from ..cache.cachekeys import python_version
from ..checks import reports
from ..checks.verdict import Command, Said, write_report
from ..config import reader
from ..config.pins import load_project
from ..config.reader import refuse_unknown
from ..core import output, proc, tables
from ..core.errors import OverlayError
from ..core.output import step
from ..smoke.cpu_simulation import DEVICES as DEVICES  # the devices every mesh of the matrix spans (a v6e-8)
from ..stages import indexpages
from ..stages.constraintsfile import recorded_cutoff
from ..stages.indexpages import STANDIN_OVERRIDES

#: Where the suite runs: "cpu" simulates the 8 chips of a TPU v6e-8, "tpu" is one.
Platform = Literal["cpu", "tpu"]
PLATFORMS: tuple[Platform, ...] = get_args(Platform)
AXIS_TYPES = ("explicit", "auto")

_MATRIX_KEYS = {"cells", "meshes", "axis-types", "k", "dtypes", "quick"}
#: Keys only the `quick` table has.
_QUICK_ONLY_KEYS = {"tests"}
#: The suite each run takes unless the quick matrix names its own part of it.
SUITE = "tests/fixes"
#: The JUnit property by which a test names what stood in for the hardware
#: while it ran (e.g. "pallas-interpret": the TPU kernels interpreted on the
#: CPU); the table lists them per cell, so no result reads as a TPU's.
STAND_IN_PROPERTY = "stand-in"
#: The JUnit dialect that keeps each test's properties (xunit2 drops record_property's).
JUNIT_OPTIONS = ("-o", "junit_family=xunit1")
_CELL_KEYS = {"name", "python", "install", "env", "runs"}
#: The plugin that bounds each test of tests/fixes (a hang fails with its stack),
#: pinned like the tool's own test extra.
TIMEOUT_PLUGIN = "pytest-timeout==2.4.0"
#: The property tests' library (tests/fixes/tpu-inference/test_0006_against_the_pin.py),
#: pinned like the tool's test extra (whose mypy reads the tests with it); the
#: closure holds the same pin (tpu-inference's requirements), so the constraints
#: file agrees.
HYPOTHESIS = "hypothesis==6.151.9"


@dataclasses.dataclass(frozen=True)
class Cell:
    name: str
    python: str  # "3.12"
    install: str  # the README marker of the command that makes the venv: <!-- install -->
    env: dict[str, str]
    runs: dict[str, dict[str, str]]  # run name -> extra environment; one pytest process each


@dataclasses.dataclass(frozen=True)
class Matrix:
    """[tool.maxtext-rl-overlay.matrix], checked: what the matrix runs, and
    what tests/fixes is parametrized over."""

    cells: tuple[Cell, ...]
    meshes: tuple[tuple[int, int], ...]
    axis_types: tuple[str, ...]
    k: tuple[int, ...]
    dtypes: tuple[str, ...]
    #: run label (`cell` or `cell/run`) -> the parts of tests/fixes it runs
    #: (paths or node ids, from the project root); a run not named runs them all.
    tests: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    def tests_of(self, label: str) -> tuple[str, ...]:
        return self.tests.get(label, (SUITE,))


def run_label(cell: str, run: str) -> str:
    """A run's name in the matrix's output, its table and the quick `tests`: the cell's, or `cell/run`."""
    return f"{cell}/{run}" if run else cell


@dataclasses.dataclass
class CellResult:
    cell: str
    verify: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    errors: int = 0
    seconds: float = 0.0
    junit: pathlib.Path | None = None
    stand_ins: dict[str, int] = dataclasses.field(default_factory=dict)  # stand-in -> how many tests ran on it

    @property
    def ok(self) -> bool:
        return self.verify == "yes" and self.failed == 0 and self.errors == 0 and self.passed > 0


def load_matrix(matrix: Mapping[str, Any], *, where: str, quick: bool) -> Matrix:
    """The project's [tool.maxtext-rl-overlay.matrix] table (its options'
    `matrix`), validated; with `quick`, its `quick` entries replace the full ones."""
    table = dict(matrix)
    where = f"{where} [tool.maxtext-rl-overlay.matrix]"
    if not table:
        raise OverlayError(f"{where} is missing: the matrix's cells and parameters are declared there.")
    refuse_unknown(set(table), _MATRIX_KEYS, where)
    subset = dict(reader.table(table.pop("quick", {}), f"{where[:-1]}.quick]"))
    refuse_unknown(set(subset), _MATRIX_KEYS - {"quick"} | _QUICK_ONLY_KEYS, f"{where[:-1]}.quick]")
    quick_tests = reader.table(subset.pop("tests", {}), f"{where[:-1]}.quick.tests]")
    missing = sorted(_MATRIX_KEYS - {"quick"} - set(table))
    if missing:
        raise OverlayError(f"{where} lacks {', '.join(missing)}.")
    cells = [_cell(c, where) for c in _list(table, "cells", where, dict)]
    names = [c.name for c in cells]
    if len(set(names)) != len(names):
        raise OverlayError(f"{where}: two cells are named alike ({', '.join(names)}).")
    if quick:
        chosen = _list(subset, "cells", f"{where} quick", str) if "cells" in subset else names
        unknown = sorted(set(chosen) - set(names))
        if unknown:
            raise OverlayError(f"{where} quick: unknown cell(s) {', '.join(unknown)}; the cells are {', '.join(names)}.")
        cells = [c for c in cells if c.name in chosen]
        table.update({k: v for k, v in subset.items() if k != "cells"})
    tests = _quick_tests(quick_tests, cells, f"{where[:-1]}.quick.tests]") if quick else {}
    meshes = []
    for mesh in _list(table, "meshes", where, list):
        if len(mesh) != 2 or not all(isinstance(n, int) and n > 0 for n in mesh) or mesh[0] * mesh[1] != DEVICES:
            raise OverlayError(f"{where}: mesh {mesh} must be two positive sizes whose product is {DEVICES} (a v6e-8).")
        meshes.append((mesh[0], mesh[1]))
    axis_types = _list(table, "axis-types", where, str)
    if set(axis_types) - set(AXIS_TYPES):
        raise OverlayError(f"{where}: axis-types must be among {', '.join(AXIS_TYPES)}, not {axis_types}.")
    k = _list(table, "k", where, int)
    if any(n <= 0 for n in k):
        raise OverlayError(f"{where}: every k must be positive, not {k}.")
    return Matrix(tuple(cells), tuple(meshes), tuple(axis_types), tuple(k), tuple(_list(table, "dtypes", where, str)), tests)


def _quick_tests(table: Mapping[str, Any], cells: list[Cell], where: str) -> dict[str, tuple[str, ...]]:
    """The quick matrix's `tests`: run label -> the parts of the suite it runs."""
    labels = [run_label(c.name, r) for c in cells for r in c.runs]
    refuse_unknown(set(table), set(labels), where)
    tests = {}
    for label in table:
        paths = _list(table, label, where, str)
        outside = [p for p in paths if p.split("::")[0] != SUITE and not p.startswith(SUITE + "/")]
        if outside:
            raise OverlayError(f"{where} {label}: {', '.join(outside)} is not a part of {SUITE} (the suite the runs take).")
        tests[label] = tuple(paths)
    return tests


def _list(table: Mapping[str, Any], key: str, where: str, kind: type) -> list[Any]:
    value = table.get(key)
    if not isinstance(value, list) or not value or not all(isinstance(v, kind) and not isinstance(v, bool) for v in value):
        raise OverlayError(f"{where}: {key} must be a non-empty list of {kind.__name__}, not {value!r}.")
    return value


def _cell(c: dict[str, Any], where: str) -> Cell:
    where = f"{where} cell {c.get('name', '?')!r}"
    refuse_unknown(set(c), _CELL_KEYS, where)
    name, install = reader.string(c, "name", where), reader.string(c, "install", where)
    python = c.get("python")
    if isinstance(python, float):  # TOML reads 3.10 as the number 3.1
        raise OverlayError(f"{where}: python = {python!r} is a number (TOML reads 3.10 as 3.1): write the version as a string, "
                           "such as \"3.12\".")
    python = reader.string(c, "python", where)
    if not re.fullmatch(r"3\.\d+", python):
        raise OverlayError(f"{where}: python = {python!r} must be a Python version such as \"3.12\".")
    runs = c.get("runs", {"": {}})
    if not isinstance(runs, dict) or not runs:
        raise OverlayError(f"{where}: runs must be a table of run name -> environment.")
    return Cell(name, python, install, reader.string_table(c, "env", where, {}),
                {r: reader.string_table(runs, r, f"{where} runs") for r in runs})


def load_cells(project_root: pathlib.Path, quick: bool) -> list[Cell]:
    return list(load(project_root, quick).cells)


def load(project_root: pathlib.Path, quick: bool) -> Matrix:
    """The project's matrix, to run: each part of the suite the quick matrix
    names must exist (lint, which may read a project without its tests,
    checks the rest)."""
    project = load_project(project_root)
    matrix = load_matrix(project.options.matrix, where=str(project.root / "pyproject.toml"), quick=quick)
    for label, paths in matrix.tests.items():
        missing = [p for p in paths if not (project.root / p.split("::")[0]).exists()]
        if missing:
            raise OverlayError(f"{project.root / 'pyproject.toml'} [tool.maxtext-rl-overlay.matrix.quick.tests] {label}: "
                               f"{', '.join(missing)} does not exist in the project.")
    return matrix


def readme_command(project_root: pathlib.Path, marker: str) -> list[str]:
    """The command the README shows under `<!-- marker -->` (the first line
    of the fenced block that follows it): what a user runs, run as it is."""
    readme = project_root / "README.md"
    lines = readme.read_text().splitlines()
    tag = f"<!-- {marker} -->"
    try:
        at = lines.index(tag)
    except ValueError:
        raise OverlayError(f"{readme} has no {tag} line marking the command of that matrix cell.") from None
    block = lines[at + 1 :]
    if not block or not block[0].startswith("```"):
        raise OverlayError(f"{readme}: {tag} must be followed by a fenced code block holding the command.")
    return shlex.split(block[1])


#: The README marks the stand-in form of a cell's command `<!-- MARKER-standin -->`.
STANDIN_SUFFIX = "-standin"


def cell_command(project_root: pathlib.Path, marker: str, index: pathlib.Path) -> tuple[list[str], str]:
    """The README command a cell installs with, for the index in `index`, and
    a note: an index whose torch is a stand-in (PyPI's build for MaxText's
    +cpu one: it holds the overrides file) takes the README's stand-in form
    of the command where it shows one (`<!-- MARKER-standin -->`)."""
    if (index / STANDIN_OVERRIDES).is_file():
        try:
            return readme_command(project_root, marker + STANDIN_SUFFIX), f"the README's stand-in form (<!-- {marker}{STANDIN_SUFFIX} -->)"
        except OverlayError:
            pass  # none: the plain form serves (no MaxText torch pin to override)
    return readme_command(project_root, marker), ""


def install_commands(command: list[str], constraints: pathlib.Path, venv_python: str) -> list[list[str]]:
    """The README's `uv pip install -c constraints.txt [--override
    .../torch-standin-overrides.txt] ...` for this index and venv: its files
    are this index's, everything else is run as the README says (it pins
    the whole closure); then the tests' own tools, whose requirements the
    closure need not pin, against the registry as of the index's
    resolution cutoff (its constraints header names it)."""
    if command[:3] != ["uv", "pip", "install"] or "-c" not in command:
        raise OverlayError(f"the README's matrix command must be `uv pip install -c constraints.txt ...`, not {' '.join(command)!r}.")
    cmd = ["uv", "pip", "install", "--quiet", "-p", venv_python, *command[3:]]
    cmd[cmd.index("-c") + 1] = str(constraints)
    if "--override" in cmd:
        at = cmd.index("--override") + 1
        if pathlib.PurePath(cmd[at]).name != STANDIN_OVERRIDES:
            raise OverlayError(f"the README's matrix command overrides with {cmd[at]!r}; the index's file is {STANDIN_OVERRIDES}.")
        cmd[at] = str(constraints.parent / STANDIN_OVERRIDES)
    needs = (constraints.parent / STANDIN_OVERRIDES).is_file() and any("[" in arg for arg in command[3:])
    if needs and "--override" not in cmd:
        raise OverlayError(f"this index's torch is a stand-in: the README must show the MaxText command with --override {STANDIN_OVERRIDES} "
                           f"(a <!-- ...{STANDIN_SUFFIX} --> block), as a user of this index needs it.")
    # pytest-timeout: the suite's bounds (pyproject's `timeout`, the tests' own marks) hold in the cells too;
    # hypothesis: the property tests'.
    cutoff = recorded_cutoff(constraints.read_text()) if constraints.is_file() else ""
    return [cmd, ["uv", "pip", "install", "--quiet", "-p", venv_python, "-c", str(constraints), *(["--exclude-newer", cutoff] if cutoff else []),
                  "pytest", HYPOTHESIS, TIMEOUT_PLUGIN]]


def _python(version: str) -> str:
    """An interpreter of `version` (uv may not download one: that needs
    GitHub). Each candidate is run, since a pyenv shim exists for versions
    it will not start."""
    pyenv_root = pathlib.Path(os.environ.get("PYENV_ROOT", pathlib.Path.home() / ".pyenv"))
    candidates = [reader.settings().python, shutil.which(f"python{version}")]
    candidates += [str(p) for p in sorted(pyenv_root.glob(f"versions/{version}*/bin/python3"), reverse=True)]
    for candidate in filter(None, candidates):
        said = python_version(candidate, what=f"probing {candidate}", check=False)
        if said is not None and ".".join(said.split()[0].split(".")[:2]) == version:
            return candidate
    raise OverlayError(f"no Python {version} found: install one (pyenv install {version}) or set MRL_PYTHON.")


def run(project_root: pathlib.Path, wheels: pathlib.Path, work: pathlib.Path, *, platform: str, quick: bool, keep: bool = False) -> list[CellResult]:
    if platform not in PLATFORMS:
        raise OverlayError(f"--platform must be one of {', '.join(PLATFORMS)}.")
    matrix = load(project_root, quick)  # a wrong matrix table is said before anything else
    constraints = wheels / "constraints.txt"
    if not constraints.is_file():
        raise OverlayError(f"{wheels} has no constraints.txt: give --wheels the index folder scripts/build-wheels.sh made.")
    constraints = indexpages.local_view(wheels, work / "index")  # these wheels, even if built for a --base-url
    results: list[CellResult] = []
    for cell in matrix.cells:
        results += _run_cell(project_root, constraints, work / cell.name, cell, matrix, platform=platform, quick=quick, keep=keep)
    return results


def junit_name(run_name: str) -> str:
    """The JUnit XML of one run of a cell, in the cell's folder (the workflows upload them)."""
    return f"junit{'-' + run_name if run_name else ''}.xml"


def _run_cell(root: pathlib.Path, constraints: pathlib.Path, work: pathlib.Path, cell: Cell, matrix: Matrix, *, platform: str, quick: bool,
              keep: bool) -> list[CellResult]:
    start = time.monotonic()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    venv = work / "venv"
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", MRL_PLATFORM=platform, MRL_QUICK="1" if quick else "0", **cell.env)
    env.pop("PYTHONPATH", None)  # nothing but the venv's site-packages
    python = _python(cell.python)
    vpy = str(venv / "bin" / "python")
    results = []
    try:
        readme, note = cell_command(root, cell.install, constraints.parent)
        with step(cell.name, f"fresh venv (Python {cell.python}): {' '.join(readme)}"):
            commands = install_commands(readme, constraints, vpy)
            if note:
                step.note(cell.name, note)
            for cmd in [["uv", "venv", "--quiet", "-p", python, str(venv)], *commands]:
                proc.run(cmd, env=env, inherit_env=False, who=cell.name, log=True,
                         what=f"{' '.join(cmd[:3])} (the cell cannot run without its venv)")
        with step(cell.name, "maxtext-rl-overlay verify"):
            verified = proc.run([str(venv / "bin" / "maxtext-rl-overlay"), "verify"], env=env, inherit_env=False, cwd=work,
                                check=False, who=cell.name, what="maxtext-rl-overlay verify")
        output.relay(verified.stdout + verified.stderr, who=cell.name)
        for run_name, run_env in cell.runs.items():
            label = run_label(cell.name, run_name)
            result = CellResult(label, "yes" if verified.returncode == 0 else "NO")
            junit = work / junit_name(run_name)
            began = time.monotonic()
            tests = matrix.tests_of(label)
            part = "" if tests == (SUITE,) else f": the quick matrix's part of it for this run, {' '.join(tests)}"
            with step(label, f"patched-behaviour suite ({SUITE}{part})" + (f" with {run_env}" if run_env else "")):
                # Its output is the user's to read as it comes; its outcome is the JUnit report's.
                proc.run([vpy, "-m", "pytest", *(str(root / t) for t in tests), "-p", "no:cacheprovider",
                          f"--junitxml={junit}", *JUNIT_OPTIONS, f"--rootdir={root}", "-q"],
                         env=dict(env, **run_env), inherit_env=False, cwd=work, capture=False, check=False, who=label,
                         what="the patched-behaviour suite")
            _count(result, junit)
            result.seconds = time.monotonic() - began
            results.append(result)
    finally:
        if not keep:
            shutil.rmtree(venv, ignore_errors=True)  # a venv is ~6-10 GB of links and copies
    if results:
        results[0].seconds += time.monotonic() - start - sum(r.seconds for r in results)  # the install and verify
    return results


def _count(result: CellResult, junit: pathlib.Path) -> None:
    if not junit.is_file():
        result.errors += 1  # pytest did not get as far as writing its report
        return
    result.junit = junit
    for suite in ET.parse(junit).getroot().iter("testsuite"):
        tests, failures, errors, skipped = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
        result.failed += failures
        result.errors += errors
        result.skipped += skipped
        result.passed += tests - failures - errors - skipped
    for case in ET.parse(junit).getroot().iter("testcase"):
        for prop in case.iter("property"):
            if prop.get("name") == STAND_IN_PROPERTY and prop.get("value"):
                value = str(prop.get("value"))
                result.stand_ins[value] = result.stand_ins.get(value, 0) + 1


def render(results: list[CellResult]) -> str:
    rows = [("cell", "verify", "passed", "failed", "errors", "skipped", "time", "stand-ins (tests)")]
    for r in results:
        stand_ins = ", ".join(f"{name} ({n})" for name, n in sorted(r.stand_ins.items())) or "-"
        rows.append((r.cell, r.verify, str(r.passed), str(r.failed), str(r.errors), str(r.skipped), f"{r.seconds:.0f}s", stand_ins))
    lines = [tables.render(rows)]
    passed = sum(r.passed for r in results)
    failed = sum(r.failed + r.errors for r in results)
    skipped = sum(r.skipped for r in results)
    lines.append(f"matrix: {passed} passed, {failed} failed, {skipped} skipped")
    return "\n".join(lines)


# -- the command: test-matrix [--json FILE] -------------------------------------


@dataclasses.dataclass(frozen=True)
class MatrixOptions:
    project_root: pathlib.Path
    wheels: pathlib.Path  # the index folder, with its constraints.txt
    work: pathlib.Path  # the cells' venvs and JUnit XML
    platform: str = "cpu"
    quick: bool = False
    keep: bool = False
    json: pathlib.Path | None = None  # where the report goes (docs/reports.md)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> MatrixOptions:
        return cls(project_root=reader.project_root(args.project), wheels=args.wheels.resolve(), work=args.work.resolve(),
                   platform=args.platform, quick=args.quick, keep=args.keep, json=args.json)


def command(opts: MatrixOptions) -> int:
    """`test-matrix`: every cell run, the table printed (its answer: no
    verdict line), the report written (opts.json: until the end it says the
    matrix did not finish); the exit status."""
    def run_cells() -> list[CellResult]:
        return run(opts.project_root, opts.wheels, opts.work, platform=opts.platform, quick=opts.quick, keep=opts.keep)

    return Command("test-matrix", opts.json, run_cells, render, lambda results: Said(bool(results) and all(r.ok for r in results), None),
                   lambda results: json_document(results, opts))()


def json_document(results: list[CellResult] | None, opts: MatrixOptions) -> reports.MatrixDocument:
    """The matrix's report (docs/reports.md); None: it has not finished."""
    runs: list[reports.MatrixRunDocument] = [
        {"cell": r.cell, "ok": r.ok, "verify": r.verify, "passed": r.passed, "failed": r.failed, "errors": r.errors, "skipped": r.skipped,
         "seconds": round(r.seconds, 1), "junit": str(r.junit) if r.junit else None, "stand_ins": r.stand_ins} for r in results or []]
    return {"report_version": reports.VERSIONS["test-matrix"], "kind": "test-matrix", "finished": results is not None,
            "ok": bool(results) and all(r.ok for r in results or []), "platform": opts.platform, "quick": opts.quick, "runs": runs}


def write_json(path: pathlib.Path, results: list[CellResult] | None, opts: MatrixOptions) -> None:
    """test-matrix --json FILE (verdict.write_report: whole or not at all; an
    existing FILE only where it is empty or a matrix report)."""
    write_report("test-matrix", path, json_document(results, opts))
