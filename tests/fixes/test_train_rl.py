"""MaxText 0.2.4's `train_rl` on the installed stack: GRPO steps with a real
(tiny) MaxText model, a real vLLM rollout and a real weight sync.

support/programs/train_rl_run.py (one process a run: see its docstring) calls
what MaxText's own integration test calls, in both of its configurations
(`vllm_native`, `maxtext_on_vllm`), and writes down how far it got and the
checks. This file runs it on the overlay (MaxText's shims off; in the
matrix's maxtext-shims run, on) and on the pins (the series reverse-applied;
shims off, and on in the maxtext-shims run), and asserts what the run showed.

Only in the matrix's MaxText cell (MRL_MAXTEXT=1). Each run costs minutes on
the CPU simulation (one process: MaxText, vLLM and the models); the quick
matrix runs the overlay only, the full one the pins too.

What the runs showed (8 simulated devices, the TPU attention kernel in Pallas
interpret mode, Tunix's CPU-only transfer guard entered as on a TPU, pinned
Tunix and tpu-inference):
- on the overlay, both configurations run train_rl through: MaxText's set-up,
  the model creation, the vLLM engine's start and first weight sync,
  MaxText's evaluation, two GRPO steps (each a rollout, an actor update and a
  weight sync into the engine) and the evaluation again; the engine's
  logprobs of a fixed sequence move with the trained weights. MaxText's
  shims on or off alike.
- vllm_native needs tpu-inference's mesh fix (984b29c49, carried as a
  backport): without it the runner's 2D mesh has Explicit axes and the first
  rollout dies in the model's embedding.
- the pins: vllm_native stops at the engine's model creation
  (with_sharding_constraint under Explicit axes) with MaxText's shims off,
  and at the first rollout (the embedding) with them on; maxtext_on_vllm
  (Auto axes) trains as on the overlay, shims on or off.
- with the stand-in Tunix (PyPI 0.1.7, CI) train_rl stops before the engine
  starts, in MaxText (check_standin_stop).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import json
import math
import os
import pathlib
import subprocess
import sys

import pytest

from support import TESTS
from support.fixes import unpatched
from support.fixes.matrix import MAXTEXT_SHIMS, PLATFORM
from support.fixes.meshes import WSC_ASSERT

#: One train_rl run's bound: 4-6 min on 2 idle cores, 31 min seen at a load
#: of 20. Past it the test fails with the step the run was in (its result
#: file is written at every step).
TIMEOUT = 2400

pytestmark = [pytest.mark.timeout(TIMEOUT + 600), pytest.mark.skipif(
    os.environ.get("MRL_MAXTEXT") != "1",
    reason="needs MaxText 0.2.4 installed (the matrix's maxtext-0.2.4 cell, MRL_MAXTEXT=1): would have run train_rl's "
    "GRPO steps (vllm_native, maxtext_on_vllm) on the overlay and on the pins, and checked the weight sync, "
    "the rollout's logprobs settings and that nothing in the upstreams was replaced at run time",
)]

CONFIGS = ("vllm_native", "maxtext_on_vllm")
#: The TPU cell runs the marked tests on its host's chips (one included): the
#: run's own process opens them, as a user's train_rl does.
cell = pytest.mark.tpu_cell
SHIMS = MAXTEXT_SHIMS  # the maxtext-shims run of the cell: MaxText's shims on
QUICK = os.environ.get("MRL_QUICK") == "1"


def tunix_is_the_standin() -> bool:
    """The index's google-tunix is the PyPI stand-in (0.1.7, `+mrl.N.unpinned.`),
    not the pin: where GitHub is out of reach (CI)."""
    return ".unpinned." in importlib.metadata.version("google-tunix")


#: A folder for each run's RESULT.json and log, where they outlive the test:
#: the TPU cell names one in its report, so that a run its step's bound
#: kills still says which steps it made and what each cost (the record is
#: written at every step, and after every GRPO step). Else tmp_path.
RECORDS = "MRL_RUN_RECORDS"


def run_trainer(tmp_path, config: str, *flags: str) -> dict:
    records = pathlib.Path(os.environ.get(RECORDS) or tmp_path)
    records.mkdir(parents=True, exist_ok=True)
    out, log_file = records / f"{tmp_path.name}.json", records / f"{tmp_path.name}.log"
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, MRL_PLATFORM=PLATFORM, PYTHONPATH=path)
    if PLATFORM == "tpu":  # the run opens the chips itself (the TPU cell keeps this process's jax on the CPU)
        env = {k: v for k, v in env.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    with log_file.open("w") as log_out:
        try:
            subprocess.run([sys.executable, "-m", "support.programs.train_rl_run", str(out), "--config", config, *flags],
                           env=env, cwd=tmp_path, stdout=log_out, stderr=subprocess.STDOUT, timeout=TIMEOUT)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
    log = log_file.read_text(errors="replace")
    assert out.is_file(), f"train_rl_run.py wrote no result{f' in {TIMEOUT} s' if timed_out else ''}:\n{log[-8000:]}"
    result = json.loads(out.read_text())
    result["log"] = log
    if timed_out:
        pytest.fail(f"train_rl_run.py --config {config} {' '.join(flags)} timed out after {TIMEOUT} s in step {stopped_in(result)}:\n"
                    f"{describe(result)}")
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
    return None if result.get("finished") else next((s["step"] for s in result["steps"] if not s.get("done")), "after the steps")


STANDIN_SKIP = ("the index's google-tunix is the PyPI stand-in (0.1.7): train_rl stops at the same point in every "
                "configuration, before they differ and before any patched code runs (shown once, on vllm_native); "
                "with the pinned Tunix (MRL_SOURCES naming the mirrors) this would have run {what}")


#: The configuration the quick matrix's maxtext-shims run trains (MaxText's
#: main RL path); the plain run trains both, the full matrix both in each run.
SHIMS_QUICK_CONFIG = "maxtext_on_vllm"


@pytest.fixture(scope="module", params=CONFIGS)
def overlay_run(request, tmp_path_factory):
    if tunix_is_the_standin() and request.param != CONFIGS[0]:
        pytest.skip(STANDIN_SKIP.format(what=f"the GRPO steps in {request.param}"))
    if QUICK and SHIMS and request.param != SHIMS_QUICK_CONFIG and not tunix_is_the_standin():
        pytest.skip(f"the quick matrix's maxtext-shims run trains {SHIMS_QUICK_CONFIG} only (each run costs minutes; the plain "
                    f"run trains both): the full matrix would have run train_rl's GRPO steps in {request.param} with MaxText's "
                    "shims on, and checked the weight sync, the rollout's logprobs settings and the shims' replacements")
    flags = ("--shims",) if SHIMS else ()
    return run_trainer(tmp_path_factory.mktemp(f"overlay-{request.param}"), request.param, *flags)


@pytest.fixture(scope="module", params=CONFIGS)
def upstream_run(request, tmp_path_factory):
    if tunix_is_the_standin():
        pytest.skip(STANDIN_SKIP.format(what=f"the pins' train_rl in {request.param} and checked where it stops"))
    if QUICK:
        pytest.skip("the quick matrix runs train_rl on the overlay only (each run costs minutes); the full matrix "
                    f"would have run the pins' train_rl in {request.param} and checked where it stops")
    # In the maxtext-shims run, with MaxText's shims on: what MaxText users run today.
    flags = ("--upstream", "--shims") if SHIMS else ("--upstream",)
    return run_trainer(tmp_path_factory.mktemp(f"upstream-{request.param}"), request.param, *flags)


STANDIN_STOP = "rollout_vllm_server_mode_submission_threshold"
PLUGIN_KV_SPEC = "tpu_inference.runner.kv_cache_manager.KVCacheManager.get_kv_cache_spec:"


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


#: Whether the series carries tpu-inference's fix of the runner's mesh
#: (984b29c49: the device_indexes mesh with Auto axes, as before a3fe6eec1).
MESH_BACKPORT = any(p.name.startswith("backport-984b29c49") for p in unpatched.series("tpu-inference"))
EMBED_GATHER = "Use `.at[...].get(out_sharding=)` to provide output PartitionSpec for the gather indexing"


@cell
def test_train_rl_on_the_overlay(overlay_run, record_property):
    """The GRPO steps run; MaxText's test's checks and ours hold."""
    result = overlay_run
    record_property("steps", summary(result))
    record_property("phase_seconds", json.dumps(result.get("phase_seconds")))
    record_property("actor_loss", json.dumps(result.get("checks", {}).get("actor_loss")))
    with contextlib.suppress(KeyError, ValueError):  # a run that stopped before its probes: its failure says where
        record_property("engine_logprobs_moved", f"{probe_moved(result):.3e}")
    if tunix_is_the_standin():
        check_standin_stop(result)
        return
    if result["config"] == "vllm_native" and not MESH_BACKPORT:
        # Without the mesh backport the runner's 2D mesh has Explicit axes
        # (Tunix's device_indexes, jax.make_mesh), and the first rollout dies
        # in the model backbone's embedding (tpu-inference's llama3.py,
        # nnx.Embed's jnp.take), outside the series' fixes.
        assert result["rollout"]["mesh"]["axis_types"] == ["AxisType.Explicit"] * 2, describe(result)
        assert stopped_in(result) == "evaluate_before", describe(result)
        assert result["stopped"]["type"] == "jax._src.core.ShardingTypeError", describe(result)
        assert EMBED_GATHER in result["stopped"]["message"], describe(result)
        assert ("tpu_inference/models/jax/llama3.py", "__call__") in frame_names(result), describe(result)
        return
    check_trained(result)


def check_trained(result):
    """Two GRPO steps ran, each ending with its weight sync into the engine;
    MaxText's test's checks and ours hold."""
    checks = result["checks"]
    assert result.get("finished"), describe(result)
    # Before training: the engine started, was given the actor's weights,
    # rolled out and was evaluated (the TPU attention kernel interpreted).
    check_metrics(checks["metrics_before"])
    assert checks["probe_before"] and all(abs(v) < 1e4 for v in checks["probe_before"]), describe(result)
    if PLATFORM == "cpu":
        check_transfer_guard_stand_in(result)
    else:  # the chips: the kernels compiled, Tunix's sync as it is, no stand-in of the run's own
        assert result["stand_ins"] == [] and result["transfer_guards_as_on_tpu"] == [], describe(result)
    # MaxText's own test's checks.
    check_metrics(checks["metrics_after"])
    assert checks["reference_unchanged"], describe(result)
    assert checks["actor_changed"], describe(result)
    assert checks["actor_differs_from_reference"], describe(result)
    # Two GRPO steps, each ending with a weight sync into the rollout engine.
    assert result["global_steps"] == 2 and len(result["grpo_step_seconds"]) == 2, describe(result)
    # The actor's loss, as Tunix logged it: a value at each of its steps, every one finite.
    losses = checks.get("actor_loss")
    assert losses and all(math.isfinite(v) for v in losses), (losses, describe(result))
    # The engine got the trained weights: its logprobs of the same tokens moved.
    before, after = checks["probe_before"], checks["probe_after"]
    assert len(before) == len(after) > 0 and all(abs(v) < 1e4 for v in before + after), (before, after)
    assert probe_moved(result) > 1e-3, (before, after)
    check_phases(result)


def probe_moved(result) -> float:
    """How far the engine's logprobs of the fixed sequence moved between
    before and after training (the largest change of one)."""
    before, after = result["checks"]["probe_before"], result["checks"]["probe_after"]
    return max(abs(a - b) for a, b in zip(before, after, strict=True))


def check_phases(result):
    """Each GRPO step's seconds split into the trainer's phases: a rollout, an
    actor update and a weight sync each, the rest (logprobs, rewards, the
    data) what is left of the step ("other"; below 0 where the rollout ran
    beside the update, Tunix's async rollout on meshes of their own)."""
    phases = result.get("phase_seconds")
    assert phases and len(phases) == result["global_steps"], describe(result)
    for step in phases:
        assert {"rollout", "actor_update", "weight_sync", "other"} <= set(step), phases
        assert all(step[k] > 0 for k in ("rollout", "actor_update", "weight_sync")), phases


def check_transfer_guard_stand_in(result):
    """On the CPU, Tunix's RLCluster.sync_weights syncs under
    `jax.transfer_guard_*("disallow_explicit")` (on any backend but TPU and
    GPU, since 94b00481), and the sync puts scalars on the devices (MaxText's
    unroll_qwen_scanned_weights' jnp.take with a Python int for
    maxtext_on_vllm, Tunix's transfer_state_with_mappings for vllm_native):
    without a stand-in the first GRPO step stops there, upstream and overlay
    alike. The run enters those guards as a TPU does (not at all: the
    driver's sync_weights_as_on_tpu); here, that it did, for every sync, and
    says so among its stand-ins."""
    from support.fixes.train_rl_stand_ins import TRANSFER_GUARD_STAND_IN

    assert TRANSFER_GUARD_STAND_IN in result["stand_ins"], result["stand_ins"]
    guards = result["transfer_guards_as_on_tpu"]
    assert guards == ["transfer_guard_device_to_host", "transfer_guard_host_to_device"] * result["global_steps"], guards


@cell
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


def by_the_upstreams(replacement: str) -> bool:
    """Whether a replacement's code (after the colon: its file) is one of the
    upstreams' own installed files: under the folder each package is imported
    from here (the run's PYTHONPATH is this process's), wherever the install
    put it (a venv's site-packages, the TPU cell's --target folder)."""
    where = os.path.realpath(replacement.split(": ", 1)[1])
    return any(os.path.commonpath([where, folder]) == folder for folder in upstream_folders())


def upstream_folders() -> list[str]:
    """The installed upstreams' package folders (found, not imported)."""
    folders = []
    for package in ("tunix", "tpu_inference", "vllm"):
        spec = importlib.util.find_spec(package)
        folders += [os.path.realpath(f) for f in (spec.submodule_search_locations or [])] if spec else []
    return folders


@cell
def test_nothing_in_the_upstreams_is_replaced(overlay_run):
    """No function of google-tunix, tpu-inference or vLLM (nor the jax.lax
    functions they call) is replaced while train_rl runs on the overlay, apart
    from the CPU stand-ins, which the run lists. With MaxText's shims on, the
    same check names the shims: it can see a replacement."""
    if tunix_is_the_standin():
        check_standin_stop(overlay_run)
        return
    checks = overlay_run["checks"]
    assert "replaced_after_engine_start" in checks, describe(overlay_run)
    for when in ("replaced_after_engine_start", "replaced_after_train"):
        if when not in checks:
            assert not overlay_run.get("finished")  # it stopped before training (see test_train_rl_on_the_overlay)
            continue
        replaced = checks[when]["replaced"]
        if SHIMS:
            names = {r.split(":", 1)[0] for r in replaced}
            assert {"jax.lax.with_sharding_constraint", "jax.lax.top_k", "tunix.generate.utils._apply_dtype_cast",
                    "tunix.generate.utils._bulk_align_and_unstack", "tunix.generate.utils._unstack_scanned_param"} <= names, replaced
        else:
            # MaxText's vLLM plugin (maxtext_vllm_adapter, in every vLLM
            # process) replaces KVCacheManager.get_kv_cache_spec, for its
            # hybrid GDN models (qwen3_next, qwen3_5); other models pass
            # through to tpu-inference's. A feature, not a compat shim.
            # And the upstreams' own run-time rebinding (code from their own
            # files: tpu-inference's runner rebinds vLLM's LoRA helper
            # is_base_embedding_weights, vLLM its envs.__getattr__) is theirs.
            others = [r for r in replaced if not (r.startswith(PLUGIN_KV_SPEC) and "maxtext_vllm_adapter/adapter.py" in r)
                      and not by_the_upstreams(r)]
            assert others == [], "\n".join(replaced)  # a str: pytest shows it whole
    if PLATFORM == "cpu":
        stand_ins = {r.split(":", 1)[0] for r in checks["replaced_after_engine_start"]["stand_ins"]}
        assert "tpu_inference.utils.hbm_usage_bytes" in stand_ins, stand_ins


def frame_names(result) -> list[tuple[str, str]]:
    return [(f["file"], f["function"]) for f in (result.get("stopped") or {}).get("frames", [])]


def test_train_rl_on_the_pins_stops_where_recorded(upstream_run):
    """The pins (the series reverse-applied; MaxText's shims off in the plain
    run, on in the maxtext-shims run): where train_rl stops, per configuration."""
    result = upstream_run
    assert result["upstream_modules"], describe(result)
    assert result["shims"] == SHIMS, describe(result)
    stopped = result.get("stopped") or {}
    if result["config"] == "vllm_native" and SHIMS:
        # MaxText's shims get the engine's model created and its sampler
        # compiled, and the first rollout dies in the model's embedding on
        # the runner's Explicit mesh (what 984b29c49 fixes), as in the report.
        assert result["rollout"]["mesh"]["axis_types"] == ["AxisType.Explicit"] * 2, describe(result)
        assert stopped_in(result) == "evaluate_before", describe(result)
        assert stopped["type"] == "jax._src.core.ShardingTypeError" and EMBED_GATHER in stopped["message"], describe(result)
        return
    if result["config"] == "vllm_native":
        # The engine's model cannot even be created on the runner's Explicit
        # mesh: tpu-inference's loader constrains the state's sharding
        # (fixed by 0003's constrain_sharding).
        assert stopped_in(result) == "create_rl_components", describe(result)
        assert stopped["type"] == "builtins.AssertionError" and WSC_ASSERT in stopped["message"], describe(result)
        assert ("upstream:tpu_inference.models.common.model_loader.py", "create_sharded_model") in frame_names(result), describe(result)
        return
    # maxtext_on_vllm: the runner's mesh has Auto axes (NEW_MODEL_DESIGN), so
    # none of the series' Explicit-axes fixes is needed: the pins train as
    # the overlay does.
    assert result["rollout"]["mesh"]["axis_types"] == ["AxisType.Auto"] * 7, describe(result)
    check_trained(result)


# -- a user's shape (issue 61) ------------------------------------------------

#: MaxText's shipped configs at a user's lengths, several GRPO steps, each
#: step explained (support/programs/train_rl_run.py --shape user). On a chip:
#: the TPU cell's train-rl-user step (real dims); on the CPU: the full
#: matrix only, with tiny dims (minutes a configuration: not the quick one's).
user_shape = pytest.mark.user_shape


@pytest.fixture(scope="module", params=CONFIGS)
def user_shape_run(request, tmp_path_factory):
    what = (f"train_rl at a user's shape in {request.param} (train_rl_inputs.USER_MODELS, USER_LENGTHS) for "
            "train_rl_inputs.USER_STEPS GRPO steps, the loss finite, the engine's logprobs moved, and each step explained: "
            "its phases' seconds and compiles, the devices' memory and busy time, the rollout against its engine alone, "
            "the update's FLOP/s against a bf16 matmul's")
    if tunix_is_the_standin():
        pytest.skip(STANDIN_SKIP.format(what=what))
    if PLATFORM == "cpu" and QUICK:
        pytest.skip(f"the quick matrix leaves it out (minutes a configuration on the CPU); the full matrix would have run {what}, "
                    "with tiny dims")
    return run_trainer(tmp_path_factory.mktemp(f"user-{request.param}"), request.param, "--shape", "user")


@cell
@user_shape
def test_train_rl_at_a_users_shape(user_shape_run, record_property):
    """The GRPO steps run at the user's shape, every one accounted for: its
    phases' seconds and the programs each compiled, the memory after it; the
    loss finite at every step and the engine's logprobs moved. Times and
    ratios are printed and recorded, never asserted."""
    from support.fixes import train_rl_inputs

    result = user_shape_run
    table = explanation(result)
    print(table)
    record_property("explanation", table)
    record_property("result", json.dumps({k: result.get(k) for k in (
        "argv", "grpo_step_seconds", "phase_seconds", "sync_parts", "compiles", "gc", "memory", "held", "device_time", "rollout_tokens",
        "engine_alone", "matmul_rate", "model_flops")}, default=str)[:60000])
    checks = result["checks"]
    assert result.get("finished"), describe(result)
    assert result["global_steps"] == train_rl_inputs.USER_STEPS >= 5, describe(result)
    losses = checks.get("actor_loss")
    assert losses and len(losses) >= result["global_steps"] - 1 and all(math.isfinite(v) for v in losses), (losses, describe(result))
    assert checks["reference_unchanged"] and checks["actor_changed"] and checks["actor_differs_from_reference"], describe(result)
    assert probe_moved(result) > 1e-3, (checks["probe_before"], checks["probe_after"])
    phases = result["phase_seconds"]
    assert len(phases) == result["global_steps"], describe(result)
    compiles = result["compiles"]["steps"]
    assert len(compiles) >= result["global_steps"] and compiles[0].get("actor_update", {}).get("count", 0) >= 1, compiles
    assert len([m for m in result["memory"] if m["at"].startswith("after GRPO step")]) == result["global_steps"], result["memory"]
    assert result["rollout_tokens"] and all(t > 0 for t in result["rollout_tokens"]), result["rollout_tokens"]
    # Each sync's parts were timed inside it: the engine's update (and the
    # collections within it), its KV cache freed and allocated again.
    assert len(result["sync_parts"]) == len(phases) and all(
        set(p) == {"update_params", "update_params_gc", "delete_kv_cache", "reinitialize_kv_cache"}
        for p in result["sync_parts"]), result["sync_parts"]
    assert result["engine_alone"]["tokens_per_s"] > 0 and result["matmul_rate"]["flop_per_s"] > 0, describe(result)
    assert "error" not in (result.get("device_time") or {}), result.get("device_time")


def sync_parts(result, steady: list[int]) -> list[str]:
    """The weight sync's steady mean split into its measured parts: the
    rollout's update_params (within it: the engine's KV cache freed and
    allocated again, Python's collections, the transfer and the rest),
    Python's collections outside it, and the rest (RLCluster's own: the state
    walked, the anchor's snapshot where one is taken)."""
    phases, parts = result.get("phase_seconds") or [], result.get("sync_parts") or []
    collections = (result.get("gc") or {}).get("steps") or []
    steady = [i for i in steady if i < len(parts) and i < len(phases)]
    if not steady or not any(parts[i] for i in steady):
        return []

    def mean(values) -> float:
        return sum(values) / len(steady)

    sync = mean(phases[i].get("weight_sync", 0.0) for i in steady)
    update = mean(parts[i].get("update_params", 0.0) for i in steady)
    inner = {name: mean(parts[i].get(name, 0.0) for i in steady)
             for name in ("delete_kv_cache", "reinitialize_kv_cache", "update_params_gc")}
    gc_s = mean(((collections[i] if i < len(collections) else {}).get("weight_sync") or {}).get("seconds", 0.0) for i in steady)
    outer_gc = gc_s - inner["update_params_gc"]
    return [f"weight sync (steps {steady[0] + 1}-{steady[-1] + 1}, mean): {sync:.3f} s = the rollout's update_params "
            f"{update:.3f} (of it: " + ", ".join(f"{k} {v:.3f}" for k, v in inner.items())
            + f", the transfer and the rest {update - sum(inner.values()):.3f}) + Python's gc outside it {outer_gc:.3f}"
            f" + the rest of RLCluster's sync {sync - update - outer_gc:.3f}"]


def explanation(result) -> str:
    """The run's account, as a table a person reads: per step and phase the
    wall seconds, the programs compiled (count, seconds), and, for the traced
    steps, the devices' busy seconds; the memory; the ratios measured in the
    run."""
    from support.fixes.step_accounting import gib

    lines = [f"{result['config']} at a user's shape ({result.get('dims')} dims)"]
    phases = result.get("phase_seconds") or []
    compiles = (result.get("compiles") or {}).get("steps") or []
    collections = (result.get("gc") or {}).get("steps") or []
    traced = ((result.get("device_time") or {}).get("steps")) or {}
    names = ("rollout", "logprobs", "actor_update", "weight_sync", "other")
    lines.append("step  " + "  ".join(f"{n:>34}" for n in names)
                 + "   (wall s [compiles: n, s] (Python's gc s, where 0.01 or more) {device busy s})")
    for i, step in enumerate(phases):
        cells = []
        for n in names:
            c = (compiles[i] if i < len(compiles) else {}).get(n)
            g = (collections[i] if i < len(collections) else {}).get(n)
            d = (traced.get(str(i + 1)) or {}).get(n)
            busy = max(d["device_s"].values()) if d and d.get("device_s") else None  # the busiest device
            cells.append(f"{step.get(n, 0):7.2f}" + (f" [{c['count']}, {c['seconds']:.1f}]" if c else " [0]")
                         + (f" ({g['seconds']:.2f})" if g and g["seconds"] >= 0.01 else "")
                         + (f" {{{busy:.3f}}}" if busy is not None else ""))
        lines.append(f"{i + 1:>4}  " + "  ".join(f"{c:>34}" for c in cells))
    for m in result.get("memory") or []:
        devices = m.get("devices") or [{}]
        lines.append(f"memory {m['at']}: in use {gib(sum(d.get('bytes_in_use') or 0 for d in devices))}"
                     + (f", peak {gib(max(d.get('peak_bytes_in_use') or 0 for d in devices))}, limit "
                        f"{gib(devices[0].get('bytes_limit'))}" if devices[0].get("peak_bytes_in_use") is not None else
                        f" ({m['source']})"))
    held = result.get("held") or {}
    if held:
        lines.append("held: " + ", ".join(f"{k} {gib(v)}" for k, v in held.items() if isinstance(v, int) and k != "parameters")
                     + f"; optimizer state by dtype {held.get('optimizer_state_by_dtype')}; {held.get('parameters', 0) / 1e6:.1f} M parameters")
    freed = [(i + 1, (step.get("weight_sync") or {}).get("freed_bytes")) for i, step in enumerate(collections)]
    if any(f is not None for _, f in freed):
        lines.append("device memory the weight sync's full collections freed (MiB): "
                     + ", ".join(f"step {i}: {'-' if f is None else f'{f / 2**20:.1f}'}" for i, f in freed))
    tokens, alone = result.get("rollout_tokens") or [], result.get("engine_alone") or {}
    steady = [i for i in range(2, len(phases))] or list(range(len(phases)))
    lines += sync_parts(result, steady)
    if tokens and alone and steady:
        rate = sum(tokens[i] for i in steady if i < len(tokens)) / max(1e-9, sum(phases[i]["rollout"] for i in steady))
        lines.append(f"rollout: {rate:.1f} tokens/s inside train_rl (steps {steady[0] + 1}-{steady[-1] + 1}) against "
                     f"{alone['tokens_per_s']:.1f} for its engine alone at the same shape: {rate / alone['tokens_per_s']:.3f}")
    flops, mm = result.get("model_flops") or {}, result.get("matmul_rate") or {}
    if flops and mm and steady:
        update = sum(phases[i]["actor_update"] for i in steady) / len(steady)
        achieved = flops["flops"] / update
        lines.append(f"actor update: {flops['flops'] / 1e12:.3f} model TFLOP a step, {update:.3f} s (steady mean): "
                     f"{achieved / 1e12:.2f} TFLOP/s against a bf16 matmul's {mm['flop_per_s'] / 1e12:.2f} measured in the run: "
                     f"{achieved / mm['flop_per_s']:.3f}")
    walls = result.get("grpo_step_seconds") or []
    ratios = []
    for key, step in sorted(traced.items(), key=lambda kv: int(kv[0])):
        busy = sum(max(p.get("device_s", {}).values(), default=0.0) for p in step.values())
        if int(key) <= len(walls) and busy > 0:
            ratios.append(f"step {key}: {walls[int(key) - 1]:.2f} s / {busy:.3f} s busy = {walls[int(key) - 1] / busy:.2f}")
    if ratios:
        lines.append("a traced step's wall seconds against its phases' busy seconds: " + "; ".join(ratios))
    device = result.get("device_time") or {}
    if device.get("source"):
        lines.append(f"device time: {device['source']}; busy in the trace {device.get('device_busy_s_in_trace')}")
    return "\n".join(lines)
