"""Start vLLM's engine on the installed stack and write down how far it got.

Run by tests/fixes/tpu-inference/test_series_engine_start.py in a process of
its own (an engine start sets process-wide state: JAX devices, vLLM's
distributed groups), with tests/ on PYTHONPATH as pytest's `pythonpath` has
it in the test process:

    python -m support.fixes.engine_start RESULT.json [--upstream]

It starts `vllm.LLM` in the engine process itself (no engine-core
subprocess), as Tunix's vLLM rollout configures it for a ("data", "model")
mesh of the 8 devices: `tensor_parallel_size=8` and the sharding strategy's
`device_indexes`, with which the runner builds its mesh in `_create_2d_mesh`
(the overlay's: Auto axes, the backport of 984b29c49; the pin's: Explicit,
`jax.make_mesh`). The model is a tiny Llama (2 layers, hidden 128, 8 heads,
vocab 1024) described by a config.json alone, with `load_format="dummy"`
(random weights) and no tokenizer. If the engine starts, it generates 4
tokens greedily from a fixed prompt.

`--upstream` runs the pin's code where the series changed it: the pin's
`TPUModelRunner._create_2d_mesh` (tpu_runner.py with the series
reverse-applied, see unpatched.py) in the installed runner class, and the
pin's sampler (sampling.py, binary_search.py) where the compilation manager
looks it up, as tests/fixes/tpu-inference/test_series_precompile.py does.

RESULT.json holds: the runner's mesh; every compilation the compilation
manager ran (`_run_compilation`) and each `_flush_compilations` that completed,
in order, with the engine-start step (`initialize_from_config`, the KV caches,
`capture_model`) they belong to, and the failures to lower that the compilation
manager logs and leaves to the warmup call; and either the generated tokens or the
exception that stopped the engine, with the innermost frames of the installed
packages it went through.

On the CPU simulation, one stand-in: CPU devices report no memory statistics
(`Device.memory_stats()` is None), so `tpu_inference.utils.hbm_usage_bytes`
counts the live arrays' bytes against a 1 GiB limit a device, instead of
failing in `TPUWorker.init_device`. On a TPU nothing is replaced.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import sys
import tempfile
import traceback

from support.fixes.matrix import DEVICES, PLATFORM, simulate_v6e_8

simulate_v6e_8()  # before jax is imported, as tests/fixes/conftest.py does
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process
os.environ["VLLM_DISABLE_COMPILE_CACHE"] = "1"  # no persistent JAX cache
os.environ["HF_HUB_OFFLINE"] = "1"

TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "head_dim": 16,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "bos_token_id": 1,
    "eos_token_id": 2,
}
PROMPT = [1, 5, 7, 9, 11, 13]


def frames(error: BaseException) -> list[dict]:
    """The frames of the traceback in installed packages and the unpatched copies."""
    out = []
    for f in traceback.extract_tb(error.__traceback__):
        path = f.filename.replace(os.sep, "/")
        if "/site-packages/" in path:
            path = path.split("/site-packages/", 1)[1]
        elif "unpatched-modules-" in path:
            path = "unpatched:" + pathlib.Path(path).name
        else:
            continue
        out.append({"file": path, "function": f.name, "line": (f.line or "").strip()})
    return out


def main() -> int:
    out_path = pathlib.Path(sys.argv[1])
    upstream = "--upstream" in sys.argv[2:]
    result: dict = {"upstream": upstream, "platform": PLATFORM, "events": []}
    events = result["events"]
    step = ["engine"]

    import jax

    if PLATFORM == "cpu":
        import tpu_inference.utils as tpu_utils

        def hbm_usage_bytes(devices):
            used: dict = {}
            for array in jax.live_arrays():
                for shard in array.addressable_shards:
                    used[shard.data.device] = used.get(shard.data.device, 0) + shard.data.nbytes
            return [(used.get(d, 0), 1 << 30) for d in devices]

        tpu_utils.hbm_usage_bytes = hbm_usage_bytes

    import tpu_inference.runner.compilation_manager as cmm
    from tpu_inference.runner.tpu_runner import TPUModelRunner
    from tpu_inference.worker.tpu_worker import TPUWorker

    if upstream:
        from support.fixes.runner import pin_runner
        from support.fixes.unpatched import load_unpatched

        TPUModelRunner._create_2d_mesh = pin_runner()._create_2d_mesh

        bsearch = load_unpatched("tpu-inference", "tpu_inference.layers.common.binary_search")
        sampling = load_unpatched("tpu-inference", "tpu_inference.layers.jax.sample.sampling")
        sampling.topk_mask, sampling.topp_mask = bsearch.topk_mask, bsearch.topp_mask
        for name in ("sample", "compute_and_gather_logprobs", "compute_and_gather_prompt_logprobs"):
            setattr(cmm, name, getattr(sampling, name))

    # Record what the engine did, without changing it.
    def record(cls, name, before=None, after=None):
        original = getattr(cls, name)

        def wrapper(self, *args, **kwargs):
            if before:
                before(self, args, kwargs)
            value = original(self, *args, **kwargs)
            if after:
                after(self, args, kwargs)
            return value

        setattr(cls, name, wrapper)

    def enter(label):
        def before(self, args, kwargs):
            step[0] = label
            events.append({"step": label, "event": "start"})

        return before

    def leave(label):
        return lambda self, args, kwargs: events.append({"step": label, "event": "done"})

    def mesh_done(self, args, kwargs):
        result["mesh"] = {"shape": dict(self.mesh.shape), "axis_types": [str(t) for t in self.mesh.axis_types]}

    def compilation(self, args, kwargs):
        shapes = {k: v for k, v in kwargs.items() if k not in ("call_kwargs", "warmup_handler", "aot", "compile_only")}
        name = args[0].split(" ", 1)[-1]
        events.append({"step": step[0], "event": "compile", "name": name, "shapes": {k: str(v) for k, v in shapes.items()}})

    class LowerSkipped(logging.Handler):
        # _run_compilation logs a failure to lower a compile_only=False
        # function and leaves it to the warmup call (_flush_compilations).
        def emit(self, record):
            message = record.getMessage()
            if message.startswith("AOT lower skipped"):
                events.append({"step": step[0], "event": "lower_skipped", "message": message[:600]})

    logging.getLogger("vllm." + cmm.__name__).addHandler(LowerSkipped())

    record(TPUModelRunner, "_init_mesh", after=mesh_done)
    record(TPUWorker, "initialize_from_config", before=enter("initialize_from_config"), after=leave("initialize_from_config"))
    record(TPUModelRunner, "initialize_kv_cache", before=enter("initialize_kv_cache"), after=leave("initialize_kv_cache"))
    record(TPUModelRunner, "capture_model", before=enter("capture_model"), after=leave("capture_model"))
    record(cmm.CompilationManager, "_run_compilation", before=compilation)
    record(cmm.CompilationManager, "_flush_compilations",
           after=lambda self, args, kwargs: events.append({"step": step[0], "event": "flushed"}))

    from vllm import LLM, SamplingParams

    with tempfile.TemporaryDirectory(prefix="tiny-llama-") as model:
        (pathlib.Path(model) / "config.json").write_text(json.dumps(TINY_LLAMA))
        try:
            llm = LLM(
                model=model,
                load_format="dummy",
                skip_tokenizer_init=True,
                dtype="float32",
                max_model_len=128,
                max_num_seqs=8,
                max_num_batched_tokens=128,
                tensor_parallel_size=DEVICES,
                num_gpu_blocks_override=64,
                additional_config={"sharding": {"sharding_strategy": {"device_indexes": list(range(DEVICES))}}},
            )
            result["started"] = True
            outputs = llm.generate(
                [{"prompt_token_ids": PROMPT}], SamplingParams(max_tokens=4, temperature=0.0, detokenize=False)
            )
            result["tokens"] = list(outputs[0].outputs[0].token_ids)
        except Exception as error:  # noqa: BLE001 - reported to the test
            result["stopped"] = {
                "type": f"{type(error).__module__}.{type(error).__qualname__}",
                "message": str(error)[:2000],
                "step": step[0],
                "frames": frames(error),
            }
            traceback.print_exc()
    # Were MaxText's module-level shims active in the engine? Where maxtext is
    # installed, vLLM's general plugin (maxtext_vllm_adapter) imports MaxText,
    # whose Tunix adapter replaces jax.lax functions, in every vLLM process.
    result["maxtext_shims"] = getattr(jax.lax.with_sharding_constraint, "__module__", "").startswith("maxtext.")
    out_path.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
