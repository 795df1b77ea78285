"""The pull-request workflow (.github/workflows/checks.yml) cannot run here:
check that it runs the same lint, types and fast tests as scripts/test.sh."""

import pathlib
import re
import shlex

import yaml

from support import ROOT

WORKFLOW = ROOT / ".github" / "workflows" / "checks.yml"


def test_pull_requests_run_ruff_mypy_and_the_unit_tests_as_test_sh_does():
    doc = yaml.safe_load(WORKFLOW.read_text())
    on = doc.get("on", doc.get(True))  # YAML 1.1 reads the key `on` as true
    assert "pull_request" in on
    assert doc["permissions"] == {"contents": "read"}
    (job,) = doc["jobs"].values()
    runs = [shlex.split(step["run"]) for step in job["steps"] if "run" in step]
    assert runs[0] == ["bash", "scripts/setup.sh"], "the tool venv, as CI and a developer make it"
    tools = {tuple(cmd[1:]): pathlib.Path(cmd[0]).name for cmd in runs[1:]}
    test_sh = (ROOT / "scripts" / "test.sh").read_text()
    for args, tool in ((("check", "overlay", "tests", "scripts"), "ruff"), ((), "mypy"), (("tests/fixes/tpu-inference/conftest.py",), "mypy")):
        assert tools.get(args) == tool, runs
        assert re.search(rf"(?m)^{re.escape(' '.join((tool, *args)))}( +#.*)?$", test_sh), "the same command as scripts/test.sh"
    (pytest_run,) = [cmd for cmd in runs if cmd[1:3] == ["-m", "pytest"]]
    assert pytest_run[3] == "tests/unit" and all(not a.startswith("tests/") for a in pytest_run[4:])
    assert all(cmd[0].startswith(".venv/bin/") for cmd in runs[1:]), "the tool venv's tools"
