"""The TPU workflow cannot run here; check that it runs what CI runs."""

import pathlib
import shlex

import yaml

from unit.unit_support import assert_uploads_every_junit

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKFLOW = ROOT / ".github" / "workflows" / "tpu-matrix.yml"


def _job() -> dict:
    (job,) = yaml.safe_load(WORKFLOW.read_text())["jobs"].values()
    return job


def _commands() -> list[list[str]]:
    job = _job()
    assert "tpu-v6e-8" in job["runs-on"] and "self-hosted" in job["runs-on"]
    return [shlex.split(step["run"]) for step in job["steps"] if "run" in step]


def test_workflow_builds_then_runs_the_same_matrix_script_on_the_tpu():
    commands = _commands()
    names = [c[0] for c in commands]
    assert names.index("scripts/build-wheels.sh") < names.index("scripts/test-matrix.sh")
    matrix = commands[names.index("scripts/test-matrix.sh")]
    assert matrix[matrix.index("--platform") + 1] == "tpu"
    wheels = matrix[matrix.index("--wheels") + 1]
    build = commands[names.index("scripts/build-wheels.sh")]
    assert build[build.index("--out") + 1] == wheels, "the matrix must test the wheels the workflow built"
    assert (ROOT / "scripts" / "test-matrix.sh").is_file()
    assert "--platform cpu|tpu" in (ROOT / "scripts" / "test-matrix.sh").read_text()


def test_workflow_uploads_every_junit_report_of_the_matrix():
    assert_uploads_every_junit(_job(), ROOT)


def test_workflow_reads_only_and_runs_when_what_the_matrix_runs_changes():
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert doc["permissions"] == {"contents": "read"}
    paths = doc.get("on", doc.get(True))["push"]["paths"]
    # The matrix installs each cell with the README's commands, and reads the rest from these.
    for path in ("README.md", "pyproject.toml", "constraints.txt", "patches/**", "overlay/**", "tests/**", "scripts/**"):
        assert path in paths, path


def test_workflow_smokes_the_built_wheels_on_the_tpu_and_keeps_the_json():
    commands = _commands()
    names = [c[0] for c in commands]
    build = commands[names.index("scripts/build-wheels.sh")]
    smoke = commands[names.index("scripts/smoke-wheels.sh")]
    assert smoke[smoke.index("--wheels") + 1] == build[build.index("--out") + 1], "the wheels the workflow built"
    assert "--cpu-simulation" not in smoke, "on the TPU the smoke is a hardware qualification"
    assert "--maxtext" in smoke, "MaxText's configuration too: train_rl's maxtext_on_vllm"
    assert names.index("scripts/smoke-wheels.sh") < names.index("scripts/test-matrix.sh"), "the gate first: minutes, not the suite's hour"
    (kept,) = [s for s in _job()["steps"] if s.get("uses", "").startswith("actions/upload-artifact") and "smoke" in s["with"]["name"]]
    assert kept["with"]["path"] == smoke[smoke.index("--json") + 1] and kept["if"] == "always()"
    assert (ROOT / "scripts" / "smoke-wheels.sh").is_file()


def test_smoke_wheels_script_refuses_what_it_cannot_use(tmp_path):
    """The gate's script: a wrong command line is status 2, a folder that is
    no index 3, each said; no venv is made for either."""
    import subprocess

    script = ROOT / "scripts" / "smoke-wheels.sh"
    usage = subprocess.run([str(script), "--wheels", str(tmp_path)], capture_output=True, text=True)
    assert usage.returncode == 2 and "--wheels and --json are required" in usage.stderr, usage.stderr
    empty = subprocess.run([str(script), "--wheels", str(tmp_path), "--json", str(tmp_path / "s.json")], capture_output=True, text=True)
    assert empty.returncode == 3 and "has no constraints.txt" in empty.stderr, empty.stderr
    assert not (tmp_path / "s.json").exists()
