"""`maxtext-rl-overlay smoke` on the installed stack, as a user runs it: the
command in a fresh process, its table, its JSON and its exit status.

On the CPU platform it runs with --cpu-simulation (8 CPU devices, the TPU
kernels interpreted) and every line says it is no hardware qualification; on
a TPU it runs as it would on the user's TPU VM. One smoke run is shared by
the module's tests (an engine start costs a minute or two here).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from maxtext_rl_overlay.smoke.cpu_simulation import NOTICE
from support.fixes import maxtext_models, maxtext_shims
from support.fixes.matrix import PLATFORM

CPU = PLATFORM == "cpu"
#: One smoke: the checkpoint, the reference, the engine start and its generates.
SMOKE_TIMEOUT = 1500
pytestmark = pytest.mark.timeout(SMOKE_TIMEOUT + 300)
#: The configurations smoke runs here, and each one's checks: where maxtext is
#: installed, MaxText's model too (whose sampled draws it cannot rank: MaxText's
#: forward would need the chips the engine holds).
SYNCED = ["synced greedy tokens", "synced greedy logprobs"]
CONFIGURATIONS = {
    "llama-device-indexes": ["engine ran", "greedy tokens", "greedy logprobs", "sampled draws differ", "sampled within top-k", *SYNCED],
    **({"maxtext-new-model-design": ["engine ran", "greedy tokens", "greedy logprobs", "sampled draws differ", *SYNCED]}
       if maxtext_models.AVAILABLE else {}),
}
#: The code each configuration's sync runs: train_rl's rollout's, by configuration.
SYNC_PATHS = {"llama-device-indexes": "Tunix's VllmSampler.update_params: transfer_state_with_mappings",
              "maxtext-new-model-design": "MaxText's MaxTextVllmSampler.update_params: transfer_state_directly"}
ROWS = sum(len(c) for c in CONFIGURATIONS.values())


def _smoke(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # The command decides where jax runs, not this test process's simulation.
    clean = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    return subprocess.run([sys.executable, "-m", "maxtext_rl_overlay", "smoke", *args], capture_output=True, text=True,
                          env=dict(clean, **(env or {})), timeout=SMOKE_TIMEOUT)


def _flags(json_path: pathlib.Path) -> list[str]:
    return ["--json", str(json_path)] + (["--cpu-simulation"] if CPU else [])


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    if maxtext_shims.GLOBAL:
        pytest.skip("the maxtext-shims run's engines are the plain run's: MRL_MAXTEXT_SHIMS reaches no engine process "
                    "(smoke starts the engine in a child process), so this would start the plain run's engine again")
    out = tmp_path_factory.mktemp("smoke") / "smoke.json"
    proc = _smoke(*_flags(out))
    return proc, (json.loads(out.read_text()) if out.is_file() else None)


def _table_rows(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("configuration"))
    return [line for line in lines[start + 1 :] if line.strip() and not line.startswith(NOTICE)][:ROWS]


def test_smoke_passes_every_check_on_the_installed_stack(smoke):
    proc, doc = smoke
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert doc is not None and doc["ok"] and doc["failed"] == [], doc
    configs = {c["name"]: c for c in doc["configurations"]}
    assert list(configs) == list(CONFIGURATIONS)
    for name, checks in CONFIGURATIONS.items():
        config = configs[name]
        assert config["chips"] == 8
        assert [c["name"] for c in config["checks"]] == checks and all(c["ok"] for c in config["checks"]), config["checks"]
        assert config["seconds"]["engine_start"] > 0 and {"greedy", "sampled", "sync", "synced"} <= set(config["seconds"])
        assert config["sync_path"].startswith(SYNC_PATHS[name]), config["sync_path"]
        assert config["compiles"]["engine start"][0] > 0, config["compiles"]  # the engine's programs, counted
    assert configs["llama-device-indexes"]["mesh"] == {"data": 1, "model": 8}, "Tunix's device_indexes: ('data', 'model'), all on model"
    if "maxtext-new-model-design" in configs:
        mesh = configs["maxtext-new-model-design"]["mesh"]
        assert len(mesh) == 7 and mesh["model"] == 8, f"NEW_MODEL_DESIGN's 7-axis mesh: {mesh}"
    rows = _table_rows(proc.stdout)
    assert [re.split(r"\s{2,}", row)[5] for row in rows] == [c for checks in CONFIGURATIONS.values() for c in checks], proc.stdout
    assert "smoke: yes" in proc.stdout


def test_smoke_says_on_every_line_whether_it_is_a_simulation(smoke):
    proc, doc = smoke
    rows = _table_rows(proc.stdout)
    assert len(rows) == ROWS, proc.stdout
    assert all((NOTICE in row) == CPU for row in rows), proc.stdout
    assert doc["cpu_simulation"] == CPU and (doc["notice"] == NOTICE) == CPU
    for config in doc["configurations"]:
        stand_ins = config["stand_ins"]
        assert bool(stand_ins) == CPU and all("pallas-interpret" in s or "memory" in s for s in stand_ins), stand_ins


@pytest.mark.skipif(not CPU, reason="on a TPU smoke runs without --cpu-simulation (the other tests); this would have "
                    "checked that a machine without a TPU gets status 3 and the flag to pass")
def test_smoke_without_a_tpu_and_without_the_flag_cannot_run():
    proc = _smoke(env={"JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "no TPU here (jax's backend is cpu)" in proc.stderr and "--cpu-simulation" in proc.stderr, proc.stderr
    assert proc.stdout == ""


def test_an_engine_past_its_timeout_fails_naming_the_step_it_was_in(tmp_path):
    """--timeout bounds each engine process: past it the process is stopped
    and the check names the step it was in (at 5 s: importing, or starting)."""
    if maxtext_shims.GLOBAL:
        pytest.skip("the maxtext-shims run's engines are the plain run's (see the smoke fixture)")
    out = tmp_path / "smoke.json"
    proc = _smoke(*_flags(out), "--timeout", "5")
    assert proc.returncode == 1, proc.stdout + proc.stderr[-4000:]
    [check] = json.loads(out.read_text())["configurations"][0]["checks"]  # the first configuration's engine
    assert check["name"] == "engine ran" and not check["ok"], check
    step = check["detail"].removeprefix("no result within 5 s; it was in: ")
    assert step in ("importing jax, vLLM and tpu-inference", "engine start") or step.startswith("generate "), check
    assert "llama-device-indexes: engine ran" in proc.stderr


@pytest.mark.skipif(os.environ.get("MRL_QUICK") == "1", reason="the full matrix's (an engine start more): would have run "
                    "smoke on a copy of the installed tpu-inference whose greedy sampler takes the least likely token, "
                    "and checked that it exits 1 naming the greedy check")
def test_smoke_names_a_broken_greedy_sampler(tmp_path):
    """The installed sampler, broken: greedy takes the argmin (a copy of the
    installed tpu_inference first on the path, its vocab-sharded greedy
    negated). smoke says no, naming the check."""
    import tpu_inference

    if maxtext_shims.GLOBAL:
        pytest.skip("the maxtext-shims run's engines are the plain run's (see the smoke fixture)")
    shadow = tmp_path / "shadow"
    shutil.copytree(pathlib.Path(tpu_inference.__file__).parent, shadow / "tpu_inference")
    sampler = shadow / "tpu_inference" / "layers" / "jax" / "sample" / "vocab_sharded.py"
    text = sampler.read_text()
    right = "        return _argmax(logits, _shard_offset(logits, layout), layout)\n"
    assert text.count(right) == 1, "patch 0006's greedy body moved: update this test"
    sampler.write_text(text.replace(right, right.replace("_argmax(logits,", "_argmax(-logits,")))
    out = tmp_path / "smoke.json"
    proc = _smoke(*_flags(out), env={"PYTHONPATH": os.pathsep.join(filter(None, [str(shadow), os.environ.get("PYTHONPATH")]))})
    assert proc.returncode == 1, proc.stdout + proc.stderr[-4000:]
    assert "smoke: NO" in proc.stderr and "llama-device-indexes: greedy tokens" in proc.stderr, proc.stderr[-2000:]
    checks = {c["name"]: c["ok"] for c in json.loads(out.read_text())["configurations"][0]["checks"]}
    assert checks["engine ran"] and not checks["greedy tokens"], checks
