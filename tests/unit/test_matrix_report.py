"""The matrix's summary table says which tests ran on a stand-in for the hardware."""

from __future__ import annotations

import subprocess
import sys

from maxtext_rl_overlay.maintain import testmatrix
from maxtext_rl_overlay.smoke import cpu_simulation


def test_the_table_names_the_stand_ins_the_tests_recorded(tmp_path):
    # A real pytest run writes the JUnit file, as the matrix's cells do.
    (tmp_path / "test_x.py").write_text(
        "def test_on_the_stand_in(record_property):\n"
        f"    record_property({testmatrix.STAND_IN_PROPERTY!r}, 'pallas-interpret')\n"
        "def test_without():\n"
        "    pass\n"
    )
    junit = tmp_path / "junit.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *testmatrix.JUNIT_OPTIONS, "test_x.py"]
    subprocess.run(command, cwd=tmp_path, check=True, capture_output=True, text=True)
    result = testmatrix.CellResult("py312", "yes")
    testmatrix._count(result, junit)
    assert (result.passed, result.stand_ins) == (2, {"pallas-interpret": 1})
    table = testmatrix.render([result, testmatrix.CellResult("other", "yes", passed=1)])
    header, row, other = table.splitlines()[:3]
    assert "stand-ins" in header and "pallas-interpret (1)" in row and other.rstrip().endswith("-"), table


def test_the_matrix_spans_the_devices_the_cpu_simulation_makes():
    """One chip count (testmatrix reads cpu_simulation's): the simulation makes that many devices."""
    env: dict[str, str] = {}
    cpu_simulation.simulate_v6e_8(env)
    assert f"--xla_force_host_platform_device_count={testmatrix.DEVICES}" in env["XLA_FLAGS"]
