"""MaxText 0.2.4's `train_rl` on the installed stack: GRPO steps with a real
(tiny) MaxText model, a real vLLM rollout and a real weight sync.

support/fixes/train_rl_run.py (one process a run: see its docstring) calls
what MaxText's own integration test calls, in both of its configurations
(`vllm_native`, `maxtext_on_vllm`), and writes down how far it got and the
checks. This file runs it on the overlay (MaxText's shims off; in the
matrix's maxtext-shims run, on) and on the pins (the series reverse-applied,
shims off), and asserts what the run showed.

Only in the matrix's MaxText cell (MRL_MAXTEXT=1). Each run costs minutes on
the CPU simulation (one process: MaxText, vLLM and the models).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys

import pytest

from support import TESTS
from support.fixes import maxtext_shims
from support.fixes.matrix import PLATFORM

pytestmark = pytest.mark.skipif(
    os.environ.get("MRL_MAXTEXT") != "1",
    reason="needs MaxText 0.2.4 installed (the matrix's maxtext-0.2.4 cell, MRL_MAXTEXT=1): would have run train_rl's "
    "GRPO steps (vllm_native, maxtext_on_vllm) on the overlay and on the pins, and checked the weight sync, "
    "the rollout's logprobs settings and that nothing in the upstreams was replaced at run time",
)

CONFIGS = ("vllm_native", "maxtext_on_vllm")
SHIMS = maxtext_shims.GLOBAL  # the maxtext-shims run of the cell: MaxText's shims on
TIMEOUT = 1800


def tunix_is_the_standin() -> bool:
    """The index's google-tunix is the PyPI stand-in (0.1.7, `+mrl.N.unpinned.`),
    not the pin: where GitHub is out of reach (CI)."""
    return ".unpinned." in importlib.metadata.version("google-tunix")


def run_trainer(tmp_path, config: str, *flags: str) -> dict:
    out = tmp_path / "result.json"
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, MRL_PLATFORM=PLATFORM, PYTHONPATH=path)
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "support.fixes.train_rl_run", str(out), "--config", config, *flags],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT,
        )
        log = proc.stderr
    except subprocess.TimeoutExpired as error:
        log = (error.stderr or b"").decode(errors="replace") if isinstance(error.stderr, bytes) else (error.stderr or "")
    assert out.is_file(), f"train_rl_run.py wrote no result:\n{log[-8000:]}"
    result = json.loads(out.read_text())
    result["log"] = log
    print(summary(result))  # the steps and their seconds, in the test's output (-rA / junit)
    return result


def summary(result) -> str:
    steps = ", ".join(f"{s['step']} {s.get('seconds', '?')} s{'' if s.get('done') else ' (stopped)'}" for s in result["steps"])
    return f"{result['config']} upstream={result['upstream']} shims={result['shims']}: {steps}"


def describe(result) -> str:
    stopped = result.get("stopped") or {}
    frames = "\n".join(f"    {f['file']} {f['function']}: {f['line']}" for f in stopped.get("frames", [])[-10:])
    return f"{summary(result)}\nstopped: {stopped.get('type')}: {stopped.get('message', '')[:600]}\n{frames}\n{result['log'][-3000:]}"


def stopped_in(result) -> str | None:
    """The step the run stopped in, None if it finished."""
    return None if result.get("finished") else next(s["step"] for s in result["steps"] if not s.get("done"))


STANDIN_SKIP = ("the index's google-tunix is the PyPI stand-in (0.1.7): train_rl stops at the same point in every "
                "configuration, before they differ and before any patched code runs (shown once, on vllm_native); "
                "with the pinned Tunix (MRL_SOURCES naming the mirrors) this would have run {what}")


@pytest.fixture(scope="module", params=CONFIGS)
def overlay_run(request, tmp_path_factory):
    if tunix_is_the_standin() and request.param != CONFIGS[0]:
        pytest.skip(STANDIN_SKIP.format(what=f"the GRPO steps in {request.param}"))
    flags = ("--shims",) if SHIMS else ()
    return run_trainer(tmp_path_factory.mktemp(f"overlay-{request.param}"), request.param, *flags)


@pytest.fixture(scope="module", params=CONFIGS)
def upstream_run(request, tmp_path_factory):
    if tunix_is_the_standin():
        pytest.skip(STANDIN_SKIP.format(what=f"the pins' train_rl in {request.param} and checked where it stops"))
    if SHIMS:
        pytest.skip("the pins run with MaxText's shims off (the plain run of the MaxText cell); "
                    "with them on, train_rl on the pins is what MaxText users run today, outside this overlay's claims")
    return run_trainer(tmp_path_factory.mktemp(f"upstream-{request.param}"), request.param, "--upstream")


STANDIN_STOP = "rollout_vllm_server_mode_submission_threshold"


def check_standin_stop(result):
    """With the stand-in Tunix (0.1.7), MaxText 0.2.4's rollout cannot be made:
    MaxTextVllmRollout reads a RolloutConfig field that only the pinned Tunix
    has (c4ec573; 0.1.7 predates it). That is the stand-in's, not the overlay's:
    the pinned Tunix (MRL_SOURCES) runs past it."""
    assert stopped_in(result) == "create_rl_components", describe(result)
    stopped = result["stopped"]
    assert stopped["type"] == "builtins.AttributeError" and STANDIN_STOP in stopped["message"], describe(result)
    assert stopped["frames"][-1]["file"] == "maxtext/integration/vllm/maxtext_vllm_rollout.py", describe(result)


def check_metrics(metrics):
    corr, total, acc, partial_acc, format_acc, _ = metrics
    assert total >= 1 and corr >= 0, metrics
    assert 0.0 <= acc <= 100.0 and 0.0 <= partial_acc <= 100.0 and 0.0 <= format_acc <= 100.0, metrics


def test_train_rl_on_the_overlay(overlay_run):
    """The GRPO steps run; MaxText's test's checks and ours hold."""
    result = overlay_run
    if tunix_is_the_standin():
        check_standin_stop(result)
        return
    assert result.get("finished"), describe(result)
    checks = result["checks"]
    # MaxText's own test's checks.
    check_metrics(checks["metrics_before"])
    check_metrics(checks["metrics_after"])
    assert checks["reference_unchanged"], describe(result)
    assert checks["actor_changed"], describe(result)
    assert checks["actor_differs_from_reference"], describe(result)
    # Two GRPO steps, each ending with a weight sync into the rollout engine.
    assert result["global_steps"] == 2 and len(result["grpo_step_seconds"]) == 2, describe(result)
    # The engine got the trained weights: its logprobs of the same tokens moved.
    before, after = checks["probe_before"], checks["probe_after"]
    assert len(before) == len(after) > 0 and all(abs(v) < 1e4 for v in before + after), (before, after)
    assert max(abs(a - b) for a, b in zip(before, after, strict=True)) > 0, (before, after)


def test_the_rollout_uses_tunix_logprobs_settings(overlay_run):
    """vLLM runs with what Tunix's rollout asks for: one logprob (the sampled
    token's), processed (after temperature and top-k/top-p)."""
    if tunix_is_the_standin():
        check_standin_stop(overlay_run)
        return
    rollout = overlay_run.get("rollout")
    assert rollout, describe(overlay_run)
    assert rollout["requested_logprobs_mode"] == "processed_logprobs", rollout
    assert rollout["max_logprobs"] == 1, rollout
    assert rollout["logprobs_mode"].rsplit(".", 1)[-1].lower() in ("processed_logprobs", "processed-logprobs"), rollout


def test_nothing_in_the_upstreams_is_replaced(overlay_run):
    """No function of google-tunix, tpu-inference or vLLM (nor the jax.lax
    functions they call) is replaced while train_rl runs on the overlay, apart
    from the CPU stand-ins, which the run lists. With MaxText's shims on, the
    same check names the shims: it can see a replacement."""
    if tunix_is_the_standin():
        check_standin_stop(overlay_run)
        return
    checks = overlay_run["checks"]
    assert "replaced_after_train" in checks, describe(overlay_run)
    for when in ("replaced_after_engine_start", "replaced_after_train"):
        replaced = checks[when]["replaced"]
        if SHIMS:
            names = {r.split(":", 1)[0] for r in replaced}
            assert {"jax.lax.with_sharding_constraint", "jax.lax.top_k", "tunix.generate.utils._apply_dtype_cast",
                    "tunix.generate.utils._bulk_align_and_unstack", "tunix.generate.utils._unstack_scanned_param"} <= names, replaced
        else:
            assert replaced == [], replaced
    if PLATFORM == "cpu":
        stand_ins = {r.split(":", 1)[0] for r in checks["replaced_after_train"]["stand_ins"]}
        assert "tpu_inference.utils.hbm_usage_bytes" in stand_ins, stand_ins
