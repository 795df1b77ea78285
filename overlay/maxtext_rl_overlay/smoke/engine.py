"""One engine configuration of `smoke`, in a process of its own (an engine
start sets process-wide state: jax's devices, vLLM's distributed groups):

    python -m maxtext_rl_overlay.smoke.engine REQUEST.json RESULT.json

REQUEST.json (written by run.py) names the configuration, the checkpoint,
whether this is the CPU simulation, the generates to run, and the second
model to sync into the engine (sync.py) with the generates to run after it;
RESULT.json gets the seconds of the engine start, of each generate and of
the sync, each generate's tokens and logprobs, the programs compiled in
each step (count and seconds), the mesh the runner built,
or the exception that stopped the engine and the step it was in. While it runs, the step it is in
is kept beside RESULT.json (progress_file): a run stopped at its timeout is
reported with that step.

vLLM's `LLM` starts in this process (no engine-core subprocess), on all of
the machine's chips, as train_rl's rollout configures it (llm_kwargs):
tensor parallelism over the chips, `max_logprobs=1` and
`logprobs_mode="processed_logprobs"`, in one of the configurations of
`configuration`.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time
import traceback
from typing import Any

#: The engine process's environment, set before jax is imported.
PROCESS_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine core in this process
    "VLLM_DISABLE_COMPILE_CACHE": "1",  # no persistent JAX cache
    "HF_HUB_OFFLINE": "1",  # the models are made here, nothing is downloaded
}
#: jax's event for one XLA compilation, with its seconds.
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
#: The engine's sampling seed (the TPU runner samples from one key, seeded by it).
SEED = 1234
#: The configurations' names (`configuration`): vLLM's Llama on Tunix's mesh,
#: and MaxText's model as train_rl's maxtext_on_vllm runs it.
LLAMA = "llama-device-indexes"
MAXTEXT = "maxtext-new-model-design"


def llm_kwargs(checkpoint: pathlib.Path, devices: int, additional_config: dict[str, Any], hf_overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """`vllm.LLM`'s arguments for a tiny checkpoint, with the rollout's logprobs
    settings (MaxText's RL rollout: `max_logprobs=1`, processed logprobs)."""
    return dict(
        model=str(checkpoint),
        skip_tokenizer_init=True,
        dtype="float32",
        seed=SEED,
        generation_config="vllm",  # vLLM's defaults, not the checkpoint's generation_config.json
        max_model_len=128,
        max_num_seqs=8,
        max_num_batched_tokens=32,  # a batch's prefill is chunked: mixed steps
        tensor_parallel_size=devices,
        num_gpu_blocks_override=64,
        max_logprobs=1,
        logprobs_mode="processed_logprobs",
        additional_config=additional_config,
        hf_overrides=hf_overrides or None,
    )


def device_indexes_config(devices: int) -> dict[str, Any]:
    """Tunix's rollout sharding: every chip named by `device_indexes`."""
    return {"sharding": {"sharding_strategy": {"device_indexes": list(range(devices))}}}


def configuration(name: str, checkpoint: pathlib.Path, devices: int) -> tuple[dict[str, str], dict[str, Any], dict[str, Any]]:
    """(environment, additional_config, hf_overrides) of a smoke configuration:
    - llama-device-indexes: vLLM's Llama on Tunix's device_indexes 2D mesh;
    - maxtext-new-model-design: MaxText's model, as train_rl's
      maxtext_on_vllm runs it (MaxTextForCausalLM, NEW_MODEL_DESIGN=1: the
      7-axis mesh; its weights restored by the adapter's own load_weights)."""
    if name == LLAMA:
        return {}, device_indexes_config(devices), {}
    if name == MAXTEXT:
        from .maxtext_model import engine_additional_config

        return {"NEW_MODEL_DESIGN": "1"}, engine_additional_config(checkpoint), {"architectures": ["MaxTextForCausalLM"]}
    raise ValueError(f"unknown smoke configuration {name!r}")


def progress_file(result: pathlib.Path) -> pathlib.Path:
    """Where a run keeps the step it is in, beside its result."""
    return result.with_name(result.stem + ".progress.json")


def main(request_path: pathlib.Path, result_path: pathlib.Path) -> int:
    request = json.loads(request_path.read_text())
    if request["cpu_simulation"]:
        from .cpu_simulation import simulate_v6e_8

        simulate_v6e_8()  # before jax is imported
    os.environ.update(PROCESS_ENV)
    checkpoint = pathlib.Path(request["checkpoint"])
    result: dict[str, Any] = {"config": request["config"], "seconds": {}, "generates": {}, "stand_ins": []}
    progress = progress_file(result_path)

    def at(step: str) -> None:
        result["step"] = step
        progress.write_text(json.dumps({"step": step}))

    at("importing jax, vLLM and tpu-inference")
    import jax

    # The programs XLA compiles in each step and their seconds: what an engine
    # start costs on a chip is mostly these (a TPU compiles what the CPU
    # simulation interprets).
    result["compiles"] = {}

    def compiled(event: str, seconds: float, **_: Any) -> None:
        if event == COMPILE_EVENT:
            count, total = result["compiles"].get(result["step"], (0, 0.0))
            result["compiles"][result["step"]] = (count + 1, round(total + seconds, 3))

    jax.monitoring.register_event_duration_secs_listener(compiled)
    result["chips"] = jax.device_count()
    result["platform"] = jax.default_backend()
    env, additional_config, hf_overrides = configuration(request["config"], checkpoint, result["chips"])
    os.environ.update(env)  # before tpu_inference is imported
    if request["cpu_simulation"]:
        from . import pallas_interpret

        result["stand_ins"] = [f"{pallas_interpret.LABEL}: {name}" for name in pallas_interpret.activate()]
        count_live_arrays_as_memory()
        result["stand_ins"].append("memory statistics: live arrays' bytes against 1 GiB a device")
    from tpu_inference.runner.tpu_runner import TPUModelRunner
    from vllm import LLM, SamplingParams

    init_mesh = TPUModelRunner._init_mesh

    def recording_init_mesh(self: Any) -> None:
        init_mesh(self)
        result["mesh"] = {name: int(size) for name, size in self.mesh.shape.items()}

    TPUModelRunner._init_mesh = recording_init_mesh
    try:
        at("engine start")
        began = time.monotonic()
        llm = LLM(**llm_kwargs(checkpoint, result["chips"], additional_config, hf_overrides))
        result["seconds"]["engine_start"] = round(time.monotonic() - began, 2)

        def generate(name: str, prompts: list[list[int]], params: dict[str, Any] | list[dict[str, Any]]) -> None:
            at(f"generate {name}")
            began = time.monotonic()
            # One batch: a list gives each prompt its own settings (greedy rows beside sampled ones).
            sampling = [SamplingParams(**p, logprobs=1, detokenize=False) for p in params] if isinstance(params, list) \
                else SamplingParams(**params, logprobs=1, detokenize=False)
            outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], sampling, use_tqdm=False)
            result["seconds"][name] = round(time.monotonic() - began, 2)
            result["generates"][name] = [
                {
                    "tokens": list(o.outputs[0].token_ids),
                    "logprobs": [lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs, strict=True)],
                }
                for o in outputs
            ]

        for name, prompts, params in request["generates"]:
            generate(name, prompts, params)
        if request.get("sync"):
            from .sync import sync_second_model

            at("weight sync")
            began = time.monotonic()
            result["sync_path"] = sync_second_model(llm, request["config"], pathlib.Path(request["sync"]["checkpoint"]), result["chips"], additional_config)
            result["seconds"]["sync"] = round(time.monotonic() - began, 2)
            for name, prompts, params in request["sync"]["generates"]:
                generate(name, prompts, params)
        result["step"] = "done"
    except Exception as error:  # noqa: BLE001 - reported by run.py, with the step it stopped in
        result["stopped"] = f"{type(error).__name__}: {str(error)[:1000]}"
        traceback.print_exc()
    result_path.write_text(json.dumps(result, indent=1))
    return 0


def count_live_arrays_as_memory() -> None:
    """CPU devices report no memory statistics (`memory_stats()` is None),
    which the TPU worker reads as it starts: count the live arrays' bytes
    against 1 GiB a device instead."""
    import jax
    import tpu_inference.utils as tpu_utils

    def hbm_usage_bytes(devices: Any) -> list[tuple[int, int]]:
        used: dict[Any, int] = {}
        for array in jax.live_arrays():
            for shard in array.addressable_shards:
                used[shard.data.device] = used.get(shard.data.device, 0) + shard.data.nbytes
        return [(used.get(d, 0), 1 << 30) for d in devices]

    tpu_utils.hbm_usage_bytes = hbm_usage_bytes


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])))
