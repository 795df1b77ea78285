"""Start vLLM's engine on the installed stack, generate, and write down how far it got.

Run by tests/fixes/tpu-inference/test_series_engine_start.py in a process of
its own per configuration (an engine start sets process-wide state: JAX
devices, vLLM's distributed groups; and costs 20-60 s here, so each process
does every generate its test checks), with tests/ on PYTHONPATH as pytest's
`pythonpath` has it in the test process:

    python -m support.programs.engine_start RESULT.json --checkpoint DIR --config NAME [--upstream]

It runs the tool's own engine (maxtext_rl_overlay/smoke/engine.py's
`Engine`, as `smoke` does: `vllm.LLM` in the engine process itself, no
engine-core subprocess) on DIR, a Hugging Face checkpoint (the tool's maxtext_rl_overlay/smoke/tiny_llama.py
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

RESULT.json holds the tool's engine `Result` (the runner's mesh, the seconds
the engine start and each generate took, each generate's tokens and
logprobs, the step it stopped in, the stand-ins) and, recorded here beside
it: the mesh's axis types and devices (`mesh_layout`); every compilation the compilation
manager ran (`_run_compilation`) and each `_flush_compilations` that completed,
in order, with the engine-start step (`initialize_from_config`, the KV caches,
`capture_model`) they belong to, and the failures to lower that the compilation
manager logs and leaves to the warmup call; the request distributions the
runner gave the attention kernel; the collectives of the compiled HLO of each
sampling and logprobs program (`programs`, those whose result has the vocab
as a dimension apart); the exception that stopped the engine (`error`), with
the innermost frames of the installed packages it went through; and whether
MaxText's shims were active in the engine.

On the CPU simulation, the tool's engine's two stand-ins (on a TPU nothing is replaced):
- CPU devices report no memory statistics (`Device.memory_stats()` is None),
  so `tpu_inference.utils.hbm_usage_bytes` counts the live arrays' bytes
  against a 1 GiB limit a device, instead of failing in `TPUWorker.init_device`;
- the TPU Pallas kernels (the attention) run in Pallas TPU interpret mode
  (the tool's maxtext_rl_overlay/smoke/pallas_interpret.py): their code, interpreted on the host.
- the TPU Pallas kernels (the attention) run in Pallas TPU interpret mode
  (the tool's maxtext_rl_overlay/smoke/pallas_interpret.py): their code, interpreted on the host.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import pathlib
import sys
from typing import Any

from maxtext_rl_overlay.smoke import configurations
from maxtext_rl_overlay.smoke.configurations import EngineConfiguration
from maxtext_rl_overlay.smoke.engine import Engine
from maxtext_rl_overlay.smoke.protocol import Generate
from support.fixes import unpatched
from support.fixes.logprobs import collective_results
from support.fixes.matrix import PLATFORM

#: The tiny MoE's configuration (TP=1, EP=8, data-parallel attention).
MOE = "moe-tp1-ep8-dp-attention"
#: The configurations, in the tool's terms (smoke's own two, renamed, and two more).
CONFIGS = {
    "device-indexes": dataclasses.replace(configurations.LLAMA, name="device-indexes", sync=None),
    "new-model-design": EngineConfiguration("new-model-design", "vLLM's Llama on NEW_MODEL_DESIGN's 7-axis mesh",
                                            {"NEW_MODEL_DESIGN": "1"}, lambda _checkpoint, _chips, _precision: {}),
    "maxtext": dataclasses.replace(configurations.MAXTEXT, name="maxtext", sync=None),
    # The configuration whose warm-up hung upstream's vocab-sharded sampler
    # (#3490, reverted in #3584): a MoE model (tiny_moe.py) with TP=1, EP=8
    # and data-parallel attention, on NEW_MODEL_DESIGN's 7-axis mesh.
    # tpu-inference's Llama 4 holds its parameters and KV cache in bfloat16.
    MOE: EngineConfiguration(
        MOE, "a tiny MoE with TP=1, EP=8 and data-parallel attention", {"NEW_MODEL_DESIGN": "1"},
        lambda _checkpoint, _chips, _precision: {"sharding": {"sharding_strategy": {"tensor_parallelism": 1, "expert_parallelism": 8,
                                                                         "enable_dp_attention": True}}},
        llm_args={"dtype": "bfloat16"}),
}
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


def generates(config: str) -> list[Generate]:
    """What the configuration generates, in this order."""
    from maxtext_rl_overlay.smoke.tiny_llama import REFERENCE_PROMPTS, REFERENCE_TOKENS

    greedy = {"temperature": 0.0}
    every = [
        Generate("reference", REFERENCE_PROMPTS, dict(greedy, max_tokens=REFERENCE_TOKENS)),
        Generate("rollout_greedy", ROLLOUT_PROMPTS, dict(greedy, max_tokens=ROLLOUT_TOKENS)),
        Generate("rollout_sampled", ROLLOUT_PROMPTS, dict(ROLLOUT_SAMPLING, max_tokens=ROLLOUT_TOKENS)),
        Generate("rollout_greedy_again", ROLLOUT_PROMPTS, dict(greedy, max_tokens=ROLLOUT_TOKENS)),
    ]
    return [g for g in every if g.name in GENERATES.get(config, [g.name for g in every])]


def bind_upstream() -> list[str]:
    """The pin's sampler where the engine looks it up, and the pin's mesh
    construction where the series changes it; returns what was bound."""
    import tpu_inference.runner.compilation_manager as cmm
    import tpu_inference.runner.tpu_runner as tpu_runner

    from support.fixes.runner import takes_the_runners_mesh
    from support.fixes.unpatched import load_unpatched, series_touches

    bound = []
    bsearch = load_unpatched("tpu-inference", "tpu_inference.layers.common.binary_search")
    sampling = load_unpatched("tpu-inference", "tpu_inference.layers.jax.sample.sampling")
    sampling.topk_mask, sampling.topp_mask = bsearch.topk_mask, bsearch.topp_mask
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


class Recorders:
    """What this program records beside the tool's engine, without changing
    what the engine does: the engine-start steps and the compilation
    manager's compilations (`events`), the HLO of each sampling and logprobs
    program (`programs`), the attention kernel's request distributions, and
    the mesh's axis types and devices."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.events: list[dict[str, Any]] = []
        self.programs: list[dict[str, Any]] = []
        self.distributions: list[dict[str, Any]] = []
        self.mesh_layout: dict[str, Any] = {}

    def install(self) -> None:
        import tpu_inference.runner.compilation_manager as cmm
        import tpu_inference.runner.tpu_runner as tpu_runner
        from tpu_inference.runner.tpu_runner import TPUModelRunner
        from tpu_inference.worker.tpu_worker import TPUWorker

        wrap(TPUModelRunner, "_init_mesh", after=self.mesh_done)
        for cls, step in ((TPUWorker, "initialize_from_config"), (TPUModelRunner, "initialize_kv_cache"), (TPUModelRunner, "capture_model")):
            wrap(cls, step, before=self.entering(step), after=self.leaving(step))
        wrap(cmm.CompilationManager, "_run_compilation", before=self.compilation)
        wrap(cmm.CompilationManager, "_flush_compilations", after=lambda *_: self.event("flushed"))
        logging.getLogger("vllm." + cmm.__name__).addHandler(LowerSkipped(self))
        attention_metadata = tpu_runner.AttentionMetadata

        def recording_attention_metadata(**kwargs: Any) -> Any:
            # The request distribution (decode-only, prefill-only, total) and
            # query lengths of every step the runner prepares for the kernel.
            import numpy as np

            distribution = np.asarray(kwargs["request_distribution"]).tolist()
            starts = np.asarray(kwargs["query_start_loc"])
            self.distributions.append({"distribution": distribution, "q_lens": np.diff(starts[: distribution[-1] + 1]).tolist()})
            return attention_metadata(**kwargs)

        tpu_runner.AttentionMetadata = recording_attention_metadata

    def event(self, event: str, **detail: Any) -> None:
        """An event of the step the engine is in, kept on disk too: a run
        stopped at its timeout is reported with the event it was at."""
        self.events.append({"step": self.engine.result.step, "event": event, **detail})
        self.engine.at(self.engine.result.step, last_event=self.events[-1])

    def entering(self, step: str) -> Any:
        def before(_self: Any, _args: tuple[Any, ...], _kwargs: dict[str, Any]) -> None:
            self.engine.at(step)
            self.event("start")

        return before

    def leaving(self, step: str) -> Any:
        return lambda *_: self.events.append({"step": step, "event": "done"})

    def mesh_done(self, runner: Any, _args: tuple[Any, ...], _kwargs: dict[str, Any]) -> None:
        self.mesh_layout = {"axis_types": [str(t) for t in runner.mesh.axis_types], "devices": [d.id for d in runner.mesh.devices.flat]}

    def compilation(self, manager: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        shapes = {k: str(v) for k, v in kwargs.items() if k not in ("call_kwargs", "warmup_handler", "aot", "compile_only")}
        name = args[0].split(" ", 1)[-1]
        self.event("compile", name=name, shapes=shapes)
        if name in SAMPLER_PROGRAMS:
            self.inspect(manager, name, shapes, args[1], args[2:], kwargs.get("call_kwargs") or {})

    def inspect(self, manager: Any, name: str, shapes: dict[str, str], fn: Any, fn_args: tuple[Any, ...], call_kwargs: dict[str, Any]) -> None:
        """The compiled HLO of a sampling or logprobs program, as the
        compilation manager lowers it (inside the runner's mesh): the
        collectives it holds, and those yielding a tensor with the vocab as a
        dimension. Compiled again here (the manager keeps no handle)."""
        import jax

        self.event("inspect", name=name, shapes=shapes)
        program: dict[str, Any] = {"name": name, "shapes": shapes}
        self.programs.append(program)
        try:
            with jax.set_mesh(manager.runner.mesh):
                text = fn.lower(*fn_args, **call_kwargs).compile().as_text()
        except Exception as error:  # noqa: BLE001 - the manager's own call reports it as it does
            program["failed"] = f"{type(error).__name__}: {str(error)[:300]}"
            return
        collectives = collective_results(text)
        vocab = manager.runner.vocab_size
        program.update({
            "vocab_size": vocab,
            "collectives": [f"{c} {d}{list(dims)}" for c, d, dims in collectives],
            "vocab_collectives": [f"{c} {d}{list(dims)}" for c, d, dims in collectives if vocab in dims],
        })

    def as_json(self) -> dict[str, Any]:
        return {"events": self.events, "programs": self.programs, "distributions": self.distributions, "mesh_layout": self.mesh_layout}


class LowerSkipped(logging.Handler):
    """_run_compilation logs a failure to lower a compile_only=False function
    and leaves it to the warmup call (_flush_compilations): an event."""

    def __init__(self, recorders: Recorders) -> None:
        super().__init__()
        self.recorders = recorders

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("AOT lower skipped"):
            self.recorders.events.append({"step": self.recorders.engine.result.step, "event": "lower_skipped", "message": message[:600]})


def wrap(cls: Any, name: str, before: Any = None, after: Any = None) -> None:
    """`cls.name` calls `before(self, args, kwargs)` and `after(...)` around itself."""
    original = getattr(cls, name)

    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if before:
            before(self, args, kwargs)
        value = original(self, *args, **kwargs)
        if after:
            after(self, args, kwargs)
        return value

    setattr(cls, name, wrapper)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("result", type=pathlib.Path)
    parser.add_argument("--checkpoint", type=pathlib.Path, required=True)
    parser.add_argument("--config", choices=sorted(CONFIGS), required=True)
    parser.add_argument("--upstream", action="store_true")
    args = parser.parse_args()
    engine = Engine(CONFIGS[args.config], args.checkpoint, cpu_simulation=PLATFORM == "cpu", result_path=args.result)
    engine.prepare()  # before jax is imported, as tests/fixes/conftest.py does
    engine.load()
    bound = bind_upstream() if args.upstream else None
    recorders = Recorders(engine)
    recorders.install()
    error = engine.serve(generates(args.config))
    import jax

    # Were MaxText's module-level shims active in the engine? Where maxtext is
    # installed, vLLM's general plugin (maxtext_vllm_adapter) imports MaxText,
    # whose Tunix adapter replaces jax.lax functions, in every vLLM process.
    shims = getattr(jax.lax.with_sharding_constraint, "__module__", "").startswith("maxtext.")
    stopped = None if error is None else {"type": f"{type(error).__module__}.{type(error).__qualname__}", "message": str(error)[:2000],
                                          "frames": unpatched.traceback_frames(error, "unpatched")}
    engine.write(upstream=args.upstream, upstream_bound=bound, error=stopped, maxtext_shims=shims, **recorders.as_json())
    return 0


if __name__ == "__main__":
    sys.exit(main())
