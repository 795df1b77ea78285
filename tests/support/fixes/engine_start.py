"""Start vLLM's engine on the installed stack, generate, and write down how far it got.

Run by tests/fixes/tpu-inference/test_series_engine_start.py in a process of
its own per configuration (an engine start sets process-wide state: JAX
devices, vLLM's distributed groups; and costs 20-60 s here, so each process
does every generate its test checks), with tests/ on PYTHONPATH as pytest's
`pythonpath` has it in the test process:

    python -m support.fixes.engine_start RESULT.json --checkpoint DIR --config NAME [--upstream]

It starts `vllm.LLM` in the engine process itself (no engine-core
subprocess) on DIR, a Hugging Face checkpoint (the tool's maxtext_rl_overlay/smoke/tiny_llama.py
writes a tiny Llama; for `maxtext`, MaxText's, see below), loaded by the engine's real weight loader, with
tensor parallelism over the 8 devices, float32, and the logprobs settings of
MaxText's RL rollout (`max_logprobs=1`, `logprobs_mode="processed_logprobs"`).
The configurations (CONFIGS):

- `device-indexes`: as Tunix's vLLM rollout configures it, with the sharding
  strategy's `device_indexes`: the runner builds its ("data", "model") mesh
  from them (the reported configuration).
- `new-model-design`: `NEW_MODEL_DESIGN=1`, as MaxText's RL scripts set it:
  the runner builds its 7-axis mesh with the `Mesh` constructor (Auto axes
  even at the pin). (Without either, the runner's `make_optimized_mesh`
  sorts the devices by `coords`, which CPU devices lack: not run here.)
- `maxtext`: MaxText's own model in the engine, as train_rl's
  `maxtext_on_vllm` runs it: `MaxTextForCausalLM` (MaxText's vLLM adapter,
  `hf_overrides` architectures), `NEW_MODEL_DESIGN=1`, the tiny qwen3 of
  support/fixes/maxtext_models.py, whose MaxText checkpoint in DIR the
  adapter's own `load_weights` restores (`additional_config`'s
  `maxtext_config.load_parameters_path`). Needs maxtext.

If the engine starts, it generates (GENERATES, in order): the reference
prompts greedily (compared with transformers by the test), then a batch as
the RL rollout sends it (prompts of several lengths) greedily, sampled, and
greedily again.

`--upstream` binds the pin's sampler (sampling.py, binary_search.py with the
series reverse-applied, see unpatched.py) where the compilation manager and
the runner look it up, and the pin's `TPUModelRunner._create_2d_mesh` where
the series changes it, as tests/fixes/tpu-inference/test_series_precompile.py
does.

RESULT.json holds: the runner's mesh; every compilation the compilation
manager ran (`_run_compilation`) and each `_flush_compilations` that completed,
in order, with the engine-start step (`initialize_from_config`, the KV caches,
`capture_model`) they belong to, and the failures to lower that the compilation
manager logs and leaves to the warmup call; the seconds the engine start and
each generate took; each generate's tokens and logprobs; the request
distributions the runner gave the attention kernel; the collectives of the
compiled HLO of each sampling and logprobs program (`programs`, those whose
result has the vocab as a dimension apart); or the exception that
stopped the engine, with the innermost frames of the installed packages it
went through; and `stand_ins`, what stood in for the TPU.

On the CPU simulation, two stand-ins (on a TPU nothing is replaced):
- CPU devices report no memory statistics (`Device.memory_stats()` is None),
  so `tpu_inference.utils.hbm_usage_bytes` counts the live arrays' bytes
  against a 1 GiB limit a device, instead of failing in `TPUWorker.init_device`;
- the TPU Pallas kernels (the attention) run in Pallas TPU interpret mode
  (the tool's maxtext_rl_overlay/smoke/pallas_interpret.py): their code, interpreted on the host.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import sys
import time
import traceback
from collections.abc import Callable

from maxtext_rl_overlay.smoke import engine as smoke_engine
from support.fixes import maxtext_models, unpatched
from support.fixes.logprobs import collective_results
from support.fixes.matrix import DEVICES, PLATFORM, simulate_v6e_8

#: The engine process's environment (the tool's smoke engine's), set by
#: main() before jax is imported; never at import (the test imports this
#: module for progress_file, and its other children inherit its environment).
PROCESS_ENV = smoke_engine.PROCESS_ENV

#: The tiny MoE's configuration (TP=1, EP=8, data-parallel attention).
MOE = "moe-tp1-ep8-dp-attention"
#: Configuration name -> (environment, vLLM's additional_config for the
#: checkpoint folder, hf_overrides).
CONFIGS: dict[str, tuple[dict[str, str], Callable[[pathlib.Path], dict], dict]] = {
    "device-indexes": ({}, lambda _: smoke_engine.device_indexes_config(DEVICES), {}),
    "new-model-design": ({"NEW_MODEL_DESIGN": "1"}, lambda _: {}, {}),
    "maxtext": ({"NEW_MODEL_DESIGN": "1"}, maxtext_models.engine_additional_config, {"architectures": ["MaxTextForCausalLM"]}),
    # The configuration whose warm-up hung upstream's vocab-sharded sampler
    # (#3490, reverted in #3584): a MoE model (tiny_moe.py) with TP=1, EP=8
    # and data-parallel attention, on NEW_MODEL_DESIGN's 7-axis mesh.
    MOE: ({"NEW_MODEL_DESIGN": "1"},
          lambda _: {"sharding": {"sharding_strategy": {"tensor_parallelism": 1, "expert_parallelism": 8, "enable_dp_attention": True}}},
          {}),
}
#: vLLM's arguments that differ from the smoke engine's, by configuration:
#: tpu-inference's Llama 4 holds its parameters and KV cache in bfloat16.
LLM_ARGS = {MOE: {"dtype": "bfloat16"}}
#: The compilation manager's sampling and logprobs programs, by name: each is
#: compiled once more and its collectives recorded (RESULT.json's `programs`).
SAMPLER_PROGRAMS = ("sample", "gather_logprobs", "gather_logprobs_spec", "compute_and_gather_prompt_logprobs")
#: The RL rollout's batch: prompts of different lengths (token ids).
ROLLOUT_PROMPTS = [[1, *range(40, 40 + n)] for n in (2, 7, 12, 20)]
ROLLOUT_TOKENS = 6
#: The rollout's sampling (MaxText's rl.yml samples at temperature 0.9 with top-k and top-p).
ROLLOUT_SAMPLING = {"temperature": 0.9, "top_k": 50, "top_p": 0.95}


#: The generates of a configuration that runs fewer than all of them (each
#: costs an engine on the CPU simulation 10-25 s).
GENERATES = {MOE: ("reference", "rollout_sampled")}


def generates(config: str):
    """(name, prompts, SamplingParams kwargs) the configuration runs, in this order."""
    from maxtext_rl_overlay.smoke.tiny_llama import REFERENCE_PROMPTS, REFERENCE_TOKENS

    greedy = {"temperature": 0.0}
    every = [
        ("reference", REFERENCE_PROMPTS, dict(greedy, max_tokens=REFERENCE_TOKENS)),
        ("rollout_greedy", ROLLOUT_PROMPTS, dict(greedy, max_tokens=ROLLOUT_TOKENS)),
        ("rollout_sampled", ROLLOUT_PROMPTS, dict(ROLLOUT_SAMPLING, max_tokens=ROLLOUT_TOKENS)),
        ("rollout_greedy_again", ROLLOUT_PROMPTS, dict(greedy, max_tokens=ROLLOUT_TOKENS)),
    ]
    return [g for g in every if g[0] in GENERATES.get(config, [name for name, _, _ in every])]




def bind_upstream() -> list[str]:
    """The pin's sampler where the engine looks it up, and the pin's mesh
    construction where the series changes it; returns what was bound."""
    import tpu_inference.runner.compilation_manager as cmm
    import tpu_inference.runner.tpu_runner as tpu_runner

    from support.fixes.unpatched import load_unpatched, series_touches

    bound = []
    bsearch = load_unpatched("tpu-inference", "tpu_inference.layers.common.binary_search")
    sampling = load_unpatched("tpu-inference", "tpu_inference.layers.jax.sample.sampling")
    sampling.topk_mask, sampling.topp_mask = bsearch.topk_mask, bsearch.topp_mask
    from support.fixes.runner import takes_the_runners_mesh

    for module in (cmm, tpu_runner):
        for name in ("sample", "compute_and_gather_logprobs", "compute_and_gather_prompt_logprobs"):
            if hasattr(module, name):
                fn = getattr(sampling, name)
                # The overlay's runner passes its mesh (patch 0006); the pin's functions take none.
                setattr(module, name, fn if name == "sample" else takes_the_runners_mesh(fn))
                bound.append(f"{module.__name__}.{name}")
    if series_touches("tpu-inference", "tpu_inference/runner/tpu_runner.py"):  # the backports of 984b29c49 (the mesh) and e27319786
        from support.fixes.runner import pin_runner

        tpu_runner.TPUModelRunner._create_2d_mesh = pin_runner()._create_2d_mesh
        bound.append("TPUModelRunner._create_2d_mesh")
    return bound


#: Where a run keeps the step it is in, beside its result (as smoke's engine does).
progress_file = smoke_engine.progress_file


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("result", type=pathlib.Path)
    parser.add_argument("--checkpoint", type=pathlib.Path, required=True)
    parser.add_argument("--config", choices=sorted(CONFIGS), required=True)
    parser.add_argument("--upstream", action="store_true")
    args = parser.parse_args()
    env, config_for, hf_overrides = CONFIGS[args.config]
    additional_config = config_for(args.checkpoint)
    simulate_v6e_8()  # before jax is imported, as tests/fixes/conftest.py does
    os.environ.update(PROCESS_ENV)
    os.environ.update(env)  # before tpu_inference is imported
    result: dict = {"upstream": args.upstream, "config": args.config, "platform": PLATFORM, "events": [],
                    "stand_ins": {}, "seconds": {}, "generates": {}, "distributions": [], "programs": []}
    events = result["events"]
    step = ["engine"]
    # Where the engine is, kept on disk as it goes: a run stopped at its
    # timeout is reported with the step (and the compilation) it was in.
    progress = progress_file(args.result)

    def note_progress():
        progress.write_text(json.dumps({"step": step[0], "last_event": events[-1] if events else None}))

    note_progress()

    import jax
    import numpy as np

    if PLATFORM == "cpu":
        from maxtext_rl_overlay.smoke import pallas_interpret

        smoke_engine.count_live_arrays_as_memory()
        result["stand_ins"]["memory_stats"] = "live arrays' bytes against 1 GiB a device (CPU devices have no memory statistics)"
        result["stand_ins"]["tpu_kernels"] = {"label": pallas_interpret.LABEL, "what": pallas_interpret.DESCRIPTION,
                                              "interventions": pallas_interpret.activate()}

    import tpu_inference.runner.compilation_manager as cmm
    import tpu_inference.runner.tpu_runner as tpu_runner
    from tpu_inference.runner.tpu_runner import TPUModelRunner
    from tpu_inference.worker.tpu_worker import TPUWorker

    if args.upstream:
        result["upstream_bound"] = bind_upstream()

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
            note_progress()

        return before

    def leave(label):
        return lambda self, args, kwargs: events.append({"step": label, "event": "done"})

    def mesh_done(self, args, kwargs):
        devices = [d.id for d in self.mesh.devices.flat]
        result["mesh"] = {"shape": dict(self.mesh.shape), "axis_types": [str(t) for t in self.mesh.axis_types], "devices": devices}

    def compilation(self, args, kwargs):
        shapes = {k: v for k, v in kwargs.items() if k not in ("call_kwargs", "warmup_handler", "aot", "compile_only")}
        name = args[0].split(" ", 1)[-1]
        events.append({"step": step[0], "event": "compile", "name": name, "shapes": {k: str(v) for k, v in shapes.items()}})
        note_progress()
        if name in SAMPLER_PROGRAMS:
            inspect_program(self, name, shapes, args[1], args[2:], kwargs.get("call_kwargs") or {})

    def inspect_program(self, name, shapes, fn, fn_args, call_kwargs):
        # The compiled HLO of each sampling and logprobs program, as the
        # compilation manager lowers it (inside the runner's mesh): the
        # collectives it holds, and those yielding a tensor with the vocab as
        # a dimension. Compiled again here (the manager keeps no handle).
        events.append({"step": step[0], "event": "inspect", "name": name, "shapes": {k: str(v) for k, v in shapes.items()}})
        note_progress()
        program = {"name": name, "shapes": {k: str(v) for k, v in shapes.items()}}
        result["programs"].append(program)
        try:
            with jax.set_mesh(self.runner.mesh):
                text = fn.lower(*fn_args, **call_kwargs).compile().as_text()
        except Exception as error:  # noqa: BLE001 - the manager's own call reports it as it does
            program["failed"] = f"{type(error).__name__}: {str(error)[:300]}"
            return
        collectives = collective_results(text)
        vocab = self.runner.vocab_size
        program.update({
            "vocab_size": vocab,
            "collectives": [f"{c} {d}{list(dims)}" for c, d, dims in collectives],
            "vocab_collectives": [f"{c} {d}{list(dims)}" for c, d, dims in collectives if vocab in dims],
        })

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

    # The request distribution (decode-only, prefill-only, total) and query
    # lengths of every step the runner prepares for the attention kernel.
    attention_metadata = tpu_runner.AttentionMetadata

    def recording_attention_metadata(**kwargs):
        distribution = np.asarray(kwargs["request_distribution"]).tolist()
        starts = np.asarray(kwargs["query_start_loc"])
        result["distributions"].append({"distribution": distribution, "q_lens": np.diff(starts[: distribution[-1] + 1]).tolist()})
        return attention_metadata(**kwargs)

    tpu_runner.AttentionMetadata = recording_attention_metadata

    from vllm import LLM, SamplingParams

    try:
        began = time.monotonic()
        llm = LLM(**(smoke_engine.llm_kwargs(args.checkpoint, DEVICES, additional_config, hf_overrides) | LLM_ARGS.get(args.config, {})))
        result["seconds"]["engine_start"] = round(time.monotonic() - began, 2)
        result["started"] = True
        step[0] = "generate"
        note_progress()
        for name, prompts, params in generates(args.config):
            began = time.monotonic()
            outputs = llm.generate(
                [{"prompt_token_ids": p} for p in prompts],
                SamplingParams(**params, logprobs=1, detokenize=False),
                use_tqdm=False,
            )
            result["seconds"][name] = round(time.monotonic() - began, 2)
            result["generates"][name] = [
                {"tokens": list(o.outputs[0].token_ids),
                 "logprobs": [lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs, strict=True)]}
                for o in outputs
            ]
    except Exception as error:  # noqa: BLE001 - reported to the test
        result["stopped"] = {
            "type": f"{type(error).__module__}.{type(error).__qualname__}",
            "message": str(error)[:2000],
            "step": step[0],
            "frames": unpatched.traceback_frames(error, "unpatched"),
        }
        traceback.print_exc()
    # Were MaxText's module-level shims active in the engine? Where maxtext is
    # installed, vLLM's general plugin (maxtext_vllm_adapter) imports MaxText,
    # whose Tunix adapter replaces jax.lax functions, in every vLLM process.
    result["maxtext_shims"] = getattr(jax.lax.with_sharding_constraint, "__module__", "").startswith("maxtext.")
    args.result.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
