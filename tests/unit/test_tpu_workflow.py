"""The TPU workflow cannot run here; check that it runs what CI runs."""

import shlex

import yaml

from support import ROOT
from unit.unit_support import assert_refuses_an_unpinned_base, assert_uploads_every_junit

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
    (kept,) = [s for s in _job()["steps"] if s.get("uses", "").startswith("actions/upload-artifact")
               and "smoke" in s["with"]["name"] and "image" not in s["with"]["name"]]  # the image's smoke: its own test
    assert kept["with"]["path"] == smoke[smoke.index("--json") + 1] and kept["if"] == "always()"
    assert (ROOT / "scripts" / "smoke-wheels.sh").is_file()


def test_workflow_builds_the_image_over_maxtexts_image_by_digest_from_its_wheels_and_smokes_inside():
    """The image users deploy, as release.yml builds it: build-image.sh over
    MRL_MAXTEXT_IMAGE (checked to be pinned by digest first, failing in
    words) from the wheels this job built, after their own smoke; then smoke
    inside that image (by the digest the build printed) on the chips, its
    JSON kept. The workflow never pushes an image."""

    steps = _job()["steps"]
    commands = _commands()
    names = [c[0] for c in commands]
    build = commands[names.index("scripts/build-wheels.sh")]
    image = commands[names.index("scripts/build-image.sh")]
    assert image[image.index("--base") + 1] == "$MAXTEXT_IMAGE"
    assert image[image.index("--release") + 1] == build[build.index("--out") + 1], "the wheels the workflow built"
    assert image[-2] == ">", "its stdout, the digest, kept for the run"
    digest_file = image[-1]
    assert_refuses_an_unpinned_base(steps, "MRL_MAXTEXT_IMAGE")
    runs = [s.get("run", "") for s in steps]
    order = [next(i for i, r in enumerate(runs) if r.startswith(k))
             for k in ("scripts/smoke-wheels.sh", "scripts/build-image.sh", "docker run", "scripts/test-matrix.sh")]
    assert order == sorted(order), "the wheels' smoke first, then the image's, then the suite"
    run = shlex.split(runs[order[2]])
    assert f"$(cat {digest_file})" in run and run[run.index("$(cat " + digest_file + ")") + 1:][:2] == ["maxtext-rl-overlay", "smoke"]
    assert "--cpu-simulation" not in run and "--privileged" in run
    json_out = run[run.index("--json") + 1]
    (kept,) = [s for s in steps if s.get("uses", "").startswith("actions/upload-artifact") and "image" in s["with"]["name"]]
    assert kept["if"] == "always()" and digest_file in kept["with"]["path"] and json_out.replace("/out/", "") in kept["with"]["path"]
    doc = yaml.safe_load(WORKFLOW.read_text())
    assert "image/**" in doc.get("on", doc.get(True))["push"]["paths"], "a change of the Containerfile runs it"
    text = WORKFLOW.read_text()
    assert not any(push in text for push in ("docker push", "podman push", "docker/login-action")), "pushing is never a side effect"


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


def test_smoke_wheels_script_says_an_install_that_failed_and_exits_3(tmp_path):
    """uv's status 1 would read as "a check failed": an install that fails
    is status 3 (cannot run), said so. The index here names a distribution
    it does not hold, and uv is offline."""
    import os
    import shutil
    import subprocess
    import sys

    # The script in a checkout whose tool venv is the one running this test (the rebase's fast tests run
    # tests/unit in a project copy that has no .venv of its own).
    checkout = tmp_path / "checkout"
    (checkout / "scripts").mkdir(parents=True)
    for name in ("smoke-wheels.sh", "lib.sh"):
        shutil.copy2(ROOT / "scripts" / name, checkout / "scripts" / name)
    (checkout / ".venv").symlink_to(sys.prefix)
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / "constraints.txt").write_text("--find-links .\nmaxtext-rl-overlay==0.0.1\n")
    (tmp_path / "tmp").mkdir()
    env = dict(os.environ, UV_OFFLINE="1", UV_NO_CONFIG="1", UV_CACHE_DIR=str(tmp_path / "uv-cache"), TMPDIR=str(tmp_path / "tmp"))
    done = subprocess.run([str(checkout / "scripts" / "smoke-wheels.sh"), "--wheels", str(tmp_path / "dist"), "--json", str(tmp_path / "s.json")],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 3, done.stderr
    assert "scripts/smoke-wheels.sh: installing -c" in done.stderr and "failed (uv exited 1), so the smoke did not run" in done.stderr
    assert not (tmp_path / "s.json").exists()
    assert list((tmp_path / "tmp").iterdir()) == [], "its scratch folder removed"


def test_every_job_that_runs_setup_sh_sets_up_python_3_12_before_it():
    """setup.sh needs a Python 3.12 on the runner (a self-hosted TPU VM's
    included): actions/setup-python first, in every workflow."""
    seen = 0
    for workflow in sorted((ROOT / ".github" / "workflows").glob("*.yml")):
        for name, job in yaml.safe_load(workflow.read_text())["jobs"].items():
            steps = job.get("steps", [])
            setup = [i for i, s in enumerate(steps) if "scripts/setup.sh" in s.get("run", "")]
            if not setup:
                continue
            seen += 1
            python = [i for i, s in enumerate(steps) if s.get("uses", "").startswith("actions/setup-python")
                      and str(s["with"]["python-version"]) == "3.12"]
            assert python and python[0] < setup[0], f"{workflow.name}: job {name} runs setup.sh without setup-python 3.12 before it"
    assert seen >= 5, "the workflows' jobs that run setup.sh were found"
