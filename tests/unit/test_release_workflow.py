"""The release workflow cannot run here: check that it is a thin wrapper over
the same scripts (build from the pins, the CPU matrix on those wheels,
publish only after the matrix passed), and run its publish script against a
local git remote and small fake wheels."""

from __future__ import annotations

import os
import pathlib
import shlex
import subprocess

import pytest
import yaml

from maxtext_rl_overlay.stages import indexpages
from support import ROOT
from unit.unit_support import assert_refuses_an_unpinned_base, assert_uploads_every_junit, fake_wheel

WORKFLOW = ROOT / ".github" / "workflows" / "release.yml"
PUBLISH = ROOT / "scripts" / "publish-pages.sh"


def _doc() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _runs(job: dict) -> list[str]:
    return [step["run"] for step in job["steps"] if "run" in step]


def _command(job: dict, script: str) -> list[str]:
    """The step running `script`: one plain command, so its exit status is
    the step's (no `|| true`, no second command)."""
    (cmd,) = [shlex.split(r) for r in _runs(job) if shlex.split(r)[:1] == [script]]
    assert not {"||", "&&", ";", "|", "&"} & set(cmd) and not any(a.endswith(";") for a in cmd), cmd
    return cmd


def _jobs_running(script: str) -> list[str]:
    return [name for name, job in _doc()["jobs"].items() if any(script in r for r in _runs(job))]


def _uses(job: dict) -> list[str]:
    return [step["uses"].split("@")[0] for step in job["steps"] if "uses" in step]


def _needs(job: dict) -> list[str]:
    needs = job.get("needs", [])
    return [needs] if isinstance(needs, str) else list(needs)


def test_runs_on_a_v_tag_on_hosted_runners_but_the_smoke_on_the_tpu_runner():
    doc = _doc()
    on = doc["on"] if "on" in doc else doc[True]  # YAML 1.1 reads the key `on` as true
    assert on["push"]["tags"] == ["v*"] and set(on) == {"push"}
    for name, job in doc["jobs"].items():
        runs_on = job["runs-on"]
        if name == "smoke-tpu":
            assert runs_on == ["self-hosted", "tpu-v6e-8"], runs_on
            continue
        assert "self-hosted" not in (runs_on if isinstance(runs_on, list) else [runs_on]), name
        assert str(runs_on).startswith("ubuntu-"), name


def test_publishes_only_after_smoke_passed_on_the_tpu_runner_for_the_same_wheels():
    """The hardware gate: smoke, without --cpu-simulation, on the build's own
    artifact, on the v6e-8; publish needs it. With no TPU runner declared the
    gate job fails, saying so, and nothing after it runs."""
    jobs = _doc()["jobs"]
    (build_job,) = _jobs_running("scripts/build-wheels.sh")
    (name,) = _jobs_running("scripts/smoke-wheels.sh")
    assert name == "smoke-tpu" and name in _needs(jobs["publish"])
    smoke = _command(jobs[name], "scripts/smoke-wheels.sh")
    assert "--cpu-simulation" not in smoke, "on the TPU the smoke is a hardware qualification"
    assert "--maxtext" in smoke, "MaxText's configuration too: train_rl's maxtext_on_vllm"
    build = _command(jobs[build_job], "scripts/build-wheels.sh")
    assert smoke[smoke.index("--wheels") + 1] == build[build.index("--out") + 1]
    (up,) = [s["with"] for s in jobs[build_job]["steps"] if s.get("uses", "").startswith("actions/upload-artifact")]
    (down,) = [s["with"] for s in jobs[name]["steps"] if s.get("uses", "").startswith("actions/download-artifact")]
    assert down == {"name": up["name"], "path": up["path"]}, "the same wheels the matrix tests and publish serves"
    (kept,) = [s for s in jobs[name]["steps"] if s.get("uses", "").startswith("actions/upload-artifact")
               and s["with"]["name"] == "smoke-release-tpu-v6e-8"]
    assert kept["with"]["path"] == smoke[smoke.index("--json") + 1] and kept["if"] == "always()"
    assert {build_job, "tpu-runner"} <= set(_needs(jobs[name])) and not jobs[name].get("if")
    (gate,) = _runs(jobs["tpu-runner"])
    assert "vars.MRL_TPU_RUNNER" in str(jobs["tpu-runner"]["steps"]) and "not published" in gate and "exit 1" in gate


def test_the_image_is_built_over_maxtexts_image_by_digest_from_the_artifact_and_smoked_inside_before_publishing():
    """The image users deploy: build-image.sh over MRL_MAXTEXT_IMAGE (checked
    to be pinned by digest first, failing in words) from the same artifact
    the wheel smoke used, on the TPU runner; then smoke inside that image (by
    the digest the build printed), on the chips; publish needs the job. The
    workflow never pushes an image."""
    jobs = _doc()["jobs"]
    (name,) = _jobs_running("scripts/build-image.sh")
    assert name == "smoke-tpu" and name in _needs(jobs["publish"])
    steps = jobs[name]["steps"]
    image = _command(jobs[name], "scripts/build-image.sh")
    assert image[image.index("--base") + 1] == "$MAXTEXT_IMAGE"
    (down,) = [s["with"] for s in steps if s.get("uses", "").startswith("actions/download-artifact")]
    assert image[image.index("--release") + 1] == down["path"], "the release's own artifact"
    assert image[-2] == ">", "its stdout, the digest, kept for the run"
    digest_file = image[-1]
    assert_refuses_an_unpinned_base(steps, "not published")
    runs = [s.get("run", "") for s in steps]
    order = [next(i for i, r in enumerate(runs) if r.startswith(k)) for k in ("scripts/smoke-wheels.sh", "scripts/build-image.sh", "docker run")]
    assert order == sorted(order), "the wheels' smoke first, then the image's"
    run = shlex.split(runs[order[2]])
    assert f"$(cat {digest_file})" in run and run[run.index("$(cat " + digest_file + ")") + 1:][:2] == ["maxtext-rl-overlay", "smoke"]
    assert "--cpu-simulation" not in run and "--privileged" in run
    (kept,) = [s for s in steps if s.get("uses", "").startswith("actions/upload-artifact") and "image" in s["with"]["name"]]
    assert kept["if"] == "always()" and digest_file in kept["with"]["path"] and "smoke-image.json" in kept["with"]["path"]
    text = WORKFLOW.read_text()
    assert not any(push in text for push in ("docker push", "podman push", "docker/login-action")), "pushing is never a side effect"


def test_the_tpu_gate_fails_saying_so_without_a_declared_runner(tmp_path):
    """The gate job's own script, run as the runner runs it (bash -e)."""
    (gate,) = _runs(_doc()["jobs"]["tpu-runner"])
    for value, status in (("", 1), ("tpu-v5e", 1), ("tpu-v6e-8", 0)):
        done = subprocess.run(["bash", "-e", "-c", gate], env=dict(os.environ, TPU_RUNNER=value), capture_output=True, text=True)
        assert done.returncode == status, (value, done.stdout, done.stderr)
        assert ("no TPU runner" in done.stdout) == bool(status), done.stdout


def test_builds_every_pin_from_its_commit_with_the_published_base_url():
    (name,) = _jobs_running("scripts/build-wheels.sh")
    build = _command(_doc()["jobs"][name], "scripts/build-wheels.sh")
    assert "--unpinned" not in build, "a release is built from the pins"
    assert "--source" not in build and "--only" not in build, "every pin (vLLM included), fetched at its pinned commit with git"
    assert build[build.index("--base-url") + 1] == "$BASE_URL"
    base = _doc()["env"]["BASE_URL"]
    assert "format('{0}/{1}/'" in base and base.rstrip("} ").endswith("github.ref_name)"), "the tag's own folder, as a folder URL"
    assert "MRL_PAGES_URL" in base and ".github.io" in base


def test_the_release_build_has_the_history_the_overlay_wheel_records():
    """overlayfiles.overlay_inputs records no commit in a shallow clone (actions/checkout's default)."""
    (name,) = _jobs_running("scripts/build-wheels.sh")
    (checkout,) = [s for s in _doc()["jobs"][name]["steps"] if s.get("uses", "").startswith("actions/checkout@")]
    assert checkout.get("with", {}).get("fetch-depth") == 0


def test_matrix_tests_the_built_wheels_after_the_build():
    jobs = _doc()["jobs"]
    (build_job,) = _jobs_running("scripts/build-wheels.sh")
    (name,) = _jobs_running("scripts/test-matrix.sh")
    matrix = _command(jobs[name], "scripts/test-matrix.sh")
    assert matrix[matrix.index("--platform") + 1] == "cpu"
    assert "--quick" not in matrix and "--standins" not in matrix
    build = _command(jobs[build_job], "scripts/build-wheels.sh")
    out = build[build.index("--out") + 1]
    assert matrix[matrix.index("--wheels") + 1] == out
    assert build_job in _needs(jobs[name])
    # The artifact the build uploads is what the matrix and the publication download, at the same path.
    (up,) = [s["with"] for s in jobs[build_job]["steps"] if s.get("uses", "").startswith("actions/upload-artifact")]
    assert up["path"] == out
    for job in (name, *_jobs_running("scripts/publish-pages.sh")):
        (down,) = [s["with"] for s in jobs[job]["steps"] if s.get("uses", "").startswith("actions/download-artifact")]
        assert down == {"name": up["name"], "path": out}, job
    assert not any(s.get("continue-on-error") for s in jobs[name]["steps"])


def test_publishes_only_after_the_matrix_succeeded():
    jobs = _doc()["jobs"]
    (matrix,) = _jobs_running("scripts/test-matrix.sh")
    publishing = {n for n, j in jobs.items() if any(u.startswith("actions/deploy-pages") or u.startswith("actions/upload-pages") for u in _uses(j))}
    publishing |= set(_jobs_running("scripts/publish-pages.sh"))
    publishing |= {n for n, j in jobs.items() if j.get("permissions", {}).get("contents") == "write" or "pages" in j.get("permissions", {})}
    assert publishing == {"publish"}
    job = jobs["publish"]
    assert matrix in _needs(job), "publish needs: the matrix job"
    # A job-level if: that runs after a failed or cancelled need would defeat needs:.
    assert not any(w in str(job.get("if", "")) for w in ("always()", "failure()", "cancelled()"))
    assert not any(s.get("continue-on-error") for s in job["steps"])
    assert _doc()["permissions"] == {"contents": "read"}, "only the publish job may write"
    cmd = _command(job, "scripts/publish-pages.sh")
    assert cmd[cmd.index("--tag") + 1] == "$GITHUB_REF_NAME" and "--push" in cmd
    steps = [s.get("uses", s.get("run", "")).split("@")[0] for s in job["steps"]]
    order = [next(i for i, s in enumerate(steps) if s.startswith(k))
             for k in ("scripts/publish-pages.sh", "actions/upload-pages-artifact", "actions/deploy-pages")]
    assert order == sorted(order)
    site = cmd[cmd.index("--site") + 1]
    (upload,) = [s["with"] for s in job["steps"] if s.get("uses", "").startswith("actions/upload-pages-artifact")]
    assert upload["path"] == site
    # After the deployment, the user's command is tried against the published URL.
    assert any("uv pip install" in r and '-c "${BASE_URL}constraints.txt" maxtext-rl-overlay' in r for r in _runs(job))


def test_scripts_it_calls_exist():
    for script in ("build-wheels.sh", "test-matrix.sh", "publish-pages.sh", "setup.sh", "build-image.sh"):
        assert (ROOT / "scripts" / script).is_file()
        assert f"scripts/{script}" in WORKFLOW.read_text()
    assert "--platform cpu|tpu" in (ROOT / "scripts" / "test-matrix.sh").read_text()


# The publish script ---------------------------------------------------------------------------

GIT_ENV = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")


def _git(cwd: pathlib.Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def checkout(tmp_path) -> pathlib.Path:
    """A clone whose origin is a local bare repository (GitHub's stand-in)."""
    origin = tmp_path / "origin.git"
    _git(tmp_path, "init", "-q", "--bare", str(origin))
    work = tmp_path / "work"
    _git(tmp_path, "clone", "-q", str(origin), str(work))
    (work / "README.md").write_text("x\n")
    _git(work, "add", "README.md")
    _git(work, "commit", "-q", "-m", "x")
    _git(work, "push", "-q", "origin", "HEAD:refs/heads/main")
    return work


def _release(folder: pathlib.Path, tag: str, content: str = "") -> pathlib.Path:
    folder.mkdir(parents=True)
    fake_wheel(folder, "maxtext-rl-overlay", "0.1.0", extra=content)
    fake_wheel(folder, "tpu-inference", "0.25.0+mrl.1")
    indexpages.write_simple(folder, indexpages.write_index(folder))
    (folder / "constraints.txt").write_text(f"--find-links https://o.github.io/r/{tag}/\n")
    return folder


def _publish(checkout: pathlib.Path, dist: pathlib.Path, tag: str, site: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(PUBLISH), "--dist", str(dist), "--tag", tag, "--site", str(checkout.parent / site), "--push"],
                          cwd=checkout, env=GIT_ENV, capture_output=True, text=True)


def _published(checkout: pathlib.Path) -> str:
    return _git(checkout.parent / "origin.git", "rev-parse", "refs/heads/gh-pages")


def test_publish_adds_the_release_once_and_a_rerun_must_reproduce_it(checkout, tmp_path):
    dist = _release(tmp_path / "b1" / "dist", "v0.1.0")
    first = _publish(checkout, dist, "v0.1.0", "site1")
    assert first.returncode == 0, first.stderr
    head = _published(checkout)
    files = _git(checkout.parent / "origin.git", "ls-tree", "-r", "--name-only", head).splitlines()
    assert sorted(f for f in files if f.startswith("v0.1.0/")) == sorted(f"v0.1.0/{p.relative_to(dist)}" for p in dist.rglob("*") if p.is_file())
    for p in dist.rglob("*"):
        if p.is_file():
            blob = subprocess.run(["git", "cat-file", "blob", f"{head}:v0.1.0/{p.relative_to(dist)}"], cwd=checkout.parent / "origin.git",
                                  capture_output=True, check=True).stdout
            assert blob == p.read_bytes(), p.name  # byte for byte
    assert '<a href="v0.1.0/constraints.txt">v0.1.0</a>' in _git(checkout.parent / "origin.git", "show", f"{head}:index.html")

    # A re-run that built the same wheels (constraints resolved anew may differ): nothing changes.
    same = _release(tmp_path / "b2" / "dist", "v0.1.0")
    (same / "constraints.txt").write_text("--find-links https://o.github.io/r/v0.1.0/\nnewer==2\n")
    rerun = _publish(checkout, same, "v0.1.0", "site2")
    assert rerun.returncode == 0, rerun.stderr
    assert "already published with these wheels" in rerun.stderr and "the published one stays" in rerun.stderr
    assert _published(checkout) == head

    # A re-run that built other bytes fails loudly and publishes nothing.
    other = _release(tmp_path / "b3" / "dist", "v0.1.0", content="# not reproducible\n")
    bad = _publish(checkout, other, "v0.1.0", "site3")
    assert bad.returncode == 1
    assert "OTHER wheels" in bad.stderr and "maxtext_rl_overlay-0.1.0-py3-none-any.whl" in bad.stderr and "refusing" in bad.stderr
    assert _published(checkout) == head

    # The next tag is added beside it.
    nxt = _release(tmp_path / "b4" / "dist", "v0.2.0", content="# 0.2\n")
    ok = _publish(checkout, nxt, "v0.2.0", "site4")
    assert ok.returncode == 0, ok.stderr
    tree = _git(checkout.parent / "origin.git", "ls-tree", "--name-only", "refs/heads/gh-pages").splitlines()
    assert {"v0.1.0", "v0.2.0", "index.html", ".nojekyll"} <= set(tree)
    assert _git(checkout.parent / "origin.git", "rev-parse", "refs/heads/gh-pages~1") == head


def test_publish_refuses_an_incomplete_or_unpublishable_release(checkout, tmp_path):
    dist = _release(tmp_path / "dist", "v0.1.0")
    wheel = next(dist.glob("tpu_inference-*.whl"))
    good = wheel.read_bytes()
    wheel.write_bytes(good + b"x")
    proc = _publish(checkout, dist, "v0.1.0", "s1")
    assert proc.returncode == 1 and "differs from its SHA256SUMS" in proc.stderr
    wheel.write_bytes(good)
    (dist / "constraints.txt").write_text("--find-links .\n")
    proc = _publish(checkout, dist, "v0.1.0", "s2")
    assert proc.returncode == 1 and "--base-url" in proc.stderr
    (dist / "constraints.txt").write_text("--find-links https://o.github.io/r/v0.1.0/\n")
    proc = _publish(checkout, dist, "main", "s3")
    assert proc.returncode == 1 and "not a release tag" in proc.stderr
    (dist / "simple" / "index.html").unlink()
    proc = _publish(checkout, dist, "v0.1.0", "s4")
    assert proc.returncode == 1 and "simple/index.html" in proc.stderr
    assert subprocess.run(["git", "rev-parse", "--verify", "-q", "refs/heads/gh-pages"], cwd=checkout.parent / "origin.git").returncode != 0


def test_the_matrix_job_uploads_every_junit_report():
    (name,) = _jobs_running("scripts/test-matrix.sh")
    assert_uploads_every_junit(_doc()["jobs"][name], ROOT)
