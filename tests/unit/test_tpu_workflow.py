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
