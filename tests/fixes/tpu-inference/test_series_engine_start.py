"""vLLM's engine start on the installed stack, as Tunix's rollout configures it:
how far it gets, upstream and with the overlay.

support/fixes/engine_start.py (run in a process of its own) starts `vllm.LLM` with a tiny
randomly initialised Llama (`load_format="dummy"`), tensor parallelism over
the 8 devices and the `device_indexes` Tunix always passes, so the runner's
mesh is ("data": 1, "model": 8), built by `TPUModelRunner._create_2d_mesh`.
It records every compilation the compilation manager makes and where the
engine stopped.

- Upstream (the pin's `_create_2d_mesh` and sampler): the mesh has Explicit
  axes (`jax.make_mesh`), and the engine dies where the report says, while
  `TPUWorker.initialize_from_config` precompiles the sampler before allocating
  the KV caches: `_precompile_gather_logprobs` raises the report's
  ShardingTypeError ("The input should be unsharded over the axis along which
  to compute the top_k values. Got input type=float32[8@data,1024@model] and
  axis=1"). Before it, lowering each of the four `sample` variants failed with
  the AssertionError of `with_sharding_constraint` under Explicit axes, which
  the compilation manager logs and leaves to the warm-up call.
- The overlay: the mesh has Auto axes (the backport of upstream's 984b29c49),
  every sampler compilation lowers, compiles and warms up, the KV caches are
  allocated, and `capture_model` warms up the model backbone: past the
  embedding (`nnx.Embed`, which under the pin's Explicit axes raised
  ShardingTypeError, "Use `.at[...].get(out_sharding=)`"), into the first
  decoder layer's attention. On the CPU it stops there: the attention is the
  TPU Pallas kernel ragged_paged_attention, whose `pltpu.get_tpu_info()`
  raises "Unsupported TPU device kind: cpu" (a CPU stand-in for the kernel is
  test-side work of its own). The test pins that point so that a change in how
  far the engine gets is seen.

On the CPU simulation, engine_start.py stands in for the devices' memory
statistics, which CPU devices do not have (see its docstring).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from support import TESTS
from support.fixes import maxtext_shims
from support.fixes.matrix import PLATFORM
from support.fixes.meshes import WSC_ASSERT

REPORT = (
    "The input should be unsharded over the axis along which to compute the top_k values. "
    "Got input type=float32[8@data,1024@model] and axis=1"
)
# Where the CPU stops the overlay's engine: the TPU attention kernel asks for the TPU's VMEM size.
KERNEL_ON_CPU = "Unsupported TPU device kind: cpu"
SAMPLER_COMPILATIONS = [
    ("sample", {"num_reqs": "8", "do_sampling": "True", "logprobs": "True"}),
    ("sample", {"num_reqs": "8", "do_sampling": "True", "logprobs": "False"}),
    ("sample", {"num_reqs": "8", "do_sampling": "False", "logprobs": "True"}),
    ("sample", {"num_reqs": "8", "do_sampling": "False", "logprobs": "False"}),
    ("gather_logprobs", {"num_reqs": "8"}),
] + [("compute_and_gather_prompt_logprobs", {"num_tokens": str(n)}) for n in (16, 32, 64, 128)]


def start_engine(tmp_path, *args) -> dict:
    out = tmp_path / "result.json"
    # tests/ on the child's import path, as pytest's `pythonpath` puts it on this
    # process's: the script imports the support package.
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, MRL_PLATFORM=PLATFORM, PYTHONPATH=path)
    proc = subprocess.run(
        [sys.executable, "-m", "support.fixes.engine_start", str(out), *args],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=1200,
    )
    assert proc.returncode == 0 and out.is_file(), f"engine_start.py failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    result = json.loads(out.read_text())
    result["log"] = proc.stderr
    return result


def check_mesh(result, axis_type: str):
    assert result["mesh"] == {
        "shape": {"data": 1, "model": 8},
        "axis_types": [f"AxisType.{axis_type}"] * 2,
    }, result.get("mesh")


def events_of(result, step):
    return [e for e in result["events"] if e["step"] == step]


def describe(result) -> str:
    stopped = result.get("stopped") or {}
    frames = "\n".join(f"    {f['file']} {f['function']}: {f['line']}" for f in stopped.get("frames", [])[-8:])
    return f"stopped: {stopped.get('type')} in {stopped.get('step')}: {stopped.get('message', '')[:400]}\n{frames}"


def test_unpatched_engine_start_dies_in_the_sampler_precompile(tmp_path):
    result = start_engine(tmp_path, "--upstream")
    check_mesh(result, "Explicit")
    stopped = result.get("stopped")
    assert stopped and not result.get("started"), describe(result)
    assert stopped["type"] == "jax._src.core.ShardingTypeError", describe(result)
    assert REPORT in stopped["message"], describe(result)
    assert stopped["step"] == "initialize_from_config", describe(result)
    functions = [(f["file"], f["function"]) for f in stopped["frames"]]
    assert ("tpu_inference/worker/tpu_worker.py", "initialize_from_config") in functions, describe(result)
    assert ("tpu_inference/runner/compilation_manager.py", "_precompile_gather_logprobs") in functions, describe(result)
    assert ("unpatched:tpu_inference.layers.jax.sample.sampling__unpatched.py", "gather_logprobs") in functions, describe(result)
    # Before it: the four sample() variants did not lower (AssertionError),
    # left to the warm-up call that gather_logprobs never let come. With
    # MaxText's shims active in the engine (maxtext installed: its vLLM plugin
    # imports them), greedy lowers and the two sampling variants fail in the
    # top-k search: the report's own set-up, which dies in the same place.
    events = events_of(result, "initialize_from_config")
    skipped = [e["message"] for e in events if e["event"] == "lower_skipped"]
    if result["maxtext_shims"]:
        assert len(skipped) == 2 and all("worker0 sample" in m and "select cases must have the same shardings" in m for m in skipped), skipped
    else:
        assert len(skipped) == 4 and all("worker0 sample" in m and "AssertionError" in m and WSC_ASSERT in m for m in skipped), skipped
    assert result["maxtext_shims"] == (maxtext_shims.ADAPTER is not None), "the engine runs MaxText's shims exactly where maxtext is installed"
    assert not any(e["event"] == "flushed" for e in events)


def test_engine_start_gets_past_the_sampler_and_the_embedding(tmp_path):
    result = start_engine(tmp_path)
    check_mesh(result, "Auto")
    events = events_of(result, "initialize_from_config")
    compiled = [(e["name"], e["shapes"]) for e in events if e["event"] == "compile"]
    assert compiled == SAMPLER_COMPILATIONS, compiled
    assert not [e for e in events if e["event"] == "lower_skipped"], events
    assert [e["event"] for e in result["events"] if e["event"] in ("start", "done", "flushed")][:6] == [
        "start", "flushed",  # initialize_from_config: the sampler precompiled and warmed up
        "start", "done",  # initialize_kv_cache
        "done", "start",  # initialize_from_config done; capture_model
    ], result["events"]
    if result.get("started"):  # not on the CPU (see below); on a TPU, unverified
        assert len(result["tokens"]) == 4, result["tokens"]
        return
    stopped = result["stopped"]
    # Nothing of the sampler is on the way any more.
    assert not any(re.search(r"sample/|binary_search", f["file"]) for f in stopped["frames"]), describe(result)
    assert stopped["step"] == "capture_model", describe(result)
    functions = [(f["file"], f["function"], f["line"]) for f in stopped["frames"]]
    # Past the embedding: in the first decoder layer, which llama3's model calls after it.
    assert ("tpu_inference/models/jax/llama3.py", "__call__", "kv_cache, x = layer(") in functions, describe(result)
    assert ("tpu_inference/models/jax/llama3.py", "__call__", "new_kv_cache, outputs = attention(") in functions, describe(result)
    assert not any(f["file"].startswith("flax/") for f in stopped["frames"]), describe(result)
    if PLATFORM == "cpu":
        # Where the CPU stops it: the TPU Pallas attention kernel, traced on a CPU device.
        assert stopped["type"] == "builtins.ValueError", describe(result)
        assert stopped["message"] == KERNEL_ON_CPU, describe(result)
        assert functions[-2:] == [
            ("tpu_inference/kernels/ragged_paged_attention/v3/kernel.py", "ragged_paged_attention",
             "vmem_limit_bytes = pltpu.get_tpu_info().vmem_capacity_bytes"),
            ("jax/_src/pallas/mosaic/tpu_info.py", "get_tpu_info", 'raise ValueError(f"Unsupported TPU device kind: {device_kind}")'),
        ], describe(result)
