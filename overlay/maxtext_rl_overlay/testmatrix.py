"""The wheel test matrix: for each environment cell, a fresh venv holding
only the built wheels and their dependencies (installed through the index's
constraints.txt, as a user would), then `maxtext-rl-overlay verify`, then the
patched-behaviour suite (tests/fixes) with JUnit XML, then a summary table.

The matrix is data: [tool.maxtext-rl-overlay.matrix] in pyproject.toml, read
here for the cells and by the tests for their parametrization."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import subprocess
import sys
import time
import tomllib
import xml.etree.ElementTree as ET

from . import publish
from .errors import OverlayError
from .progress import step

PLATFORMS = ("cpu", "tpu")


@dataclasses.dataclass(frozen=True)
class Cell:
    name: str
    python: str  # "3.12"
    env: dict[str, str]
    vllm_standin: str | None  # installed --no-deps when the index has no vllm wheel
    vllm_deps: tuple[str, ...]  # what importing that stand-in needs


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

    @property
    def ok(self) -> bool:
        return self.verify == "yes" and self.failed == 0 and self.errors == 0 and self.passed > 0


def load_cells(project_root: pathlib.Path, quick: bool) -> list[Cell]:
    table = tomllib.loads((project_root / "pyproject.toml").read_text())["tool"]["maxtext-rl-overlay"]["matrix"]
    cells = table["cells"]
    if quick:
        cells = [c for c in cells if c["name"] in table["quick"].get("cells", [c["name"] for c in cells])]
    return [
        Cell(c["name"], c["python"], dict(c.get("env", {})), c.get("vllm-standin"), tuple(c.get("vllm-deps", ())))
        for c in cells
    ]


def _python(version: str) -> str:
    """An interpreter of `version` (uv may not download one: that needs
    GitHub). Each candidate is run, since a pyenv shim exists for versions
    it will not start."""
    pyenv_root = pathlib.Path(os.environ.get("PYENV_ROOT", pathlib.Path.home() / ".pyenv"))
    candidates = [os.environ.get("MRL_PYTHON"), shutil.which(f"python{version}")]
    candidates += [str(p) for p in sorted(pyenv_root.glob(f"versions/{version}*/bin/python3"), reverse=True)]
    for candidate in filter(None, candidates):
        probe = subprocess.run([candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], capture_output=True, text=True)
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return candidate
    raise OverlayError(f"no Python {version} found: install one (pyenv install {version}) or set MRL_PYTHON.")


def run(project_root: pathlib.Path, wheels: pathlib.Path, work: pathlib.Path, *, platform: str, quick: bool, keep: bool = False) -> list[CellResult]:
    if platform not in PLATFORMS:
        raise OverlayError(f"--platform must be one of {', '.join(PLATFORMS)}.")
    constraints = wheels / "constraints.txt"
    if not constraints.is_file():
        raise OverlayError(f"{wheels} has no constraints.txt: give --wheels the index folder scripts/build-wheels.sh made.")
    constraints = publish.local_view(wheels, work / "index")  # these wheels, even if built for a --base-url
    results = []
    for cell in load_cells(project_root, quick):
        results.append(_run_cell(project_root, constraints, work / cell.name, cell, platform=platform, quick=quick, keep=keep))
    return results


def _run_cell(root: pathlib.Path, constraints: pathlib.Path, work: pathlib.Path, cell: Cell, *, platform: str, quick: bool, keep: bool) -> CellResult:
    start = time.monotonic()
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    venv = work / "venv"
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", MRL_PLATFORM=platform, MRL_QUICK="1" if quick else "0", **cell.env)
    env.pop("PYTHONPATH", None)  # nothing but the venv's site-packages
    python = _python(cell.python)
    try:
        with step(cell.name, f"fresh venv (Python {cell.python}) from {constraints}"):
            vpy = str(venv / "bin" / "python")
            cmds = [
                ["uv", "venv", "--quiet", "-p", python, str(venv)],
                ["uv", "pip", "install", "--quiet", "-p", vpy, "-c", str(constraints), "maxtext-rl-overlay", "pytest"],
            ]
            if not any(constraints.parent.glob("vllm-*.whl")) and cell.vllm_standin:
                step.note(cell.name, f"NOTE: the index has no vllm wheel (the vLLM pin needs GitHub to build); "
                                     f"installing the stand-in {cell.vllm_standin} --no-deps so that tpu_inference imports")
                cmds += [
                    ["uv", "pip", "install", "--quiet", "-p", vpy, "-c", str(constraints), *cell.vllm_deps],
                    ["uv", "pip", "install", "--quiet", "-p", vpy, "--no-deps", cell.vllm_standin],
                ]
            for cmd in cmds:
                if subprocess.run(cmd, env=env).returncode != 0:
                    raise OverlayError(f"{cell.name}: {' '.join(cmd[:3])} failed (see above); the cell cannot run.")
        with step(cell.name, "maxtext-rl-overlay verify"):
            verified = subprocess.run([str(venv / "bin" / "maxtext-rl-overlay"), "verify"], env=env, cwd=work, capture_output=True, text=True)
        print(verified.stdout + verified.stderr, file=sys.stderr, flush=True)
        result = CellResult(cell.name, "yes" if verified.returncode == 0 else "NO")
        junit = work / "junit.xml"
        with step(cell.name, "patched-behaviour suite (tests/fixes)"):
            subprocess.run(
                [str(venv / "bin" / "python"), "-m", "pytest", str(root / "tests" / "fixes"), "-p", "no:cacheprovider",
                 f"--junitxml={junit}", f"--rootdir={root}", "-q"],
                env=env, cwd=work,
            )
        _count(result, junit)
    finally:
        if not keep:
            shutil.rmtree(venv, ignore_errors=True)  # a venv is ~6 GB of links and copies
    result.seconds = time.monotonic() - start
    return result


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


def render(results: list[CellResult]) -> str:
    rows = [("cell", "verify", "passed", "failed", "errors", "skipped", "time")]
    for r in results:
        rows.append((r.cell, r.verify, str(r.passed), str(r.failed), str(r.errors), str(r.skipped), f"{r.seconds:.0f}s"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    passed = sum(r.passed for r in results)
    failed = sum(r.failed + r.errors for r in results)
    skipped = sum(r.skipped for r in results)
    lines.append(f"matrix: {passed} passed, {failed} failed, {skipped} skipped")
    return "\n".join(lines)
