"""One engine configuration of `smoke`, in a process of its own (an engine
start sets process-wide state: jax's devices, vLLM's distributed groups):

    python -m maxtext_rl_overlay.smoke.engine REQUEST.json RESULT.json

REQUEST.json (a `Request`, written by run.py) names the configuration
(configurations.py), the checkpoint, whether this is the CPU simulation,
the generates to run, and the second model to sync into the engine with the
generates to run after it. RESULT.json (a `Result`) gets the seconds of the
engine start, of each generate and of the sync, each generate's tokens and
logprobs, the programs compiled in each step (count and seconds), the mesh
the runner built, or the exception that stopped the engine and the step it
was in. While it runs, the step it is in is kept beside RESULT.json
(progress_file): a run stopped at its timeout is reported with that step.

vLLM's `LLM` starts in this process (no engine-core subprocess), on all of
the machine's chips, as train_rl's rollout configures it (llm_kwargs):
tensor parallelism over the chips, `max_logprobs=1` and
`logprobs_mode="processed_logprobs"`.

`Engine` is that process's engine, in hooks another program can run with
its own recorders around them (the tests' engine start does): `prepare`
(the environment, before jax), `load` (jax, the stand-ins, the recorders of
the compiles and the mesh), `start`, `generate`, `sync`, and `at`, the step.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time
import traceback
from typing import Any

from ..config.reader import host_stand_ins
from . import configurations
from .configurations import EngineConfiguration
from .protocol import DONE, Generate, Request, Result, SecondModel, progress_file

#: The engine process's environment, set before jax is imported.
PROCESS_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine core in this process
    "VLLM_DISABLE_COMPILE_CACHE": "1",  # no persistent JAX cache
    "HF_HUB_OFFLINE": "1",  # the models are made here, nothing is downloaded
}
#: How a TPU cell host's stand-in is labelled among the result's stand-ins.
HOST_STAND_IN = "host stand-in"


def host_stand_in_labels() -> list[str]:
    """The TPU cell's host stand-ins active in this process, as the result
    lists them: "host stand-in: NAME: what it replaces" (report.py reads the
    NAME back); none on a TPU VM."""
    return [f"{HOST_STAND_IN}: {name}: {what}" for name, what in host_stand_ins().items()]


#: jax's event for one XLA compilation, with its seconds.
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
#: The engine's sampling seed (the TPU runner samples from one key, seeded by it).
SEED = 1234


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


class Engine:
    """vLLM's engine in this process, in one configuration, and its Result."""

    def __init__(self, configuration: EngineConfiguration, checkpoint: pathlib.Path, cpu_simulation: bool, result_path: pathlib.Path,
                 precision: str | None = None) -> None:
        self.configuration, self.checkpoint, self.cpu_simulation = configuration, checkpoint, cpu_simulation
        self.precision = precision  # jax_default_matmul_precision for the run; None: jax's default
        self.result = Result(configuration.name)
        self.result_path, self.progress = result_path, progress_file(result_path)
        self.additional_config: dict[str, Any] = {}
        self.llm: Any = None

    def at(self, step: str, **detail: Any) -> None:
        """The step hook: the run is in `step` now (kept on disk with `detail`)."""
        self.result.step = step
        self.progress.write_text(json.dumps({"step": step, **detail}))

    def prepare(self) -> None:
        """The process's environment: set before jax is imported."""
        if self.cpu_simulation:
            from .cpu_simulation import simulate_v6e_8

            simulate_v6e_8()
        os.environ.update(PROCESS_ENV)

    def load(self) -> None:
        """jax, with a recorder of the programs compiled in each step; the
        configuration's environment, the CPU simulation's stand-ins, and a
        recorder of the runner's mesh, before tpu_inference is imported."""
        self.at("importing jax, vLLM and tpu-inference")
        import jax

        # What an engine start costs on a chip is mostly these (a TPU compiles
        # what the CPU simulation interprets).
        compiles = self.result.compiles

        def compiled(event: str, seconds: float, **_: Any) -> None:
            if event == COMPILE_EVENT:
                count, total = compiles.get(self.result.step, (0, 0.0))
                compiles[self.result.step] = (count + 1, round(total + seconds, 3))

        jax.monitoring.register_event_duration_secs_listener(compiled)
        self.result.chips, self.result.platform = jax.device_count(), jax.default_backend()
        if self.precision is not None:
            # Set before anything is traced: every program the engine compiles
            # (the model's steps, the sampler) takes it.
            jax.config.update("jax_default_matmul_precision", self.precision)
        self.result.precision = self.precision or "default"
        self.additional_config = self.configuration.additional_config(self.checkpoint, self.result.chips, self.precision)
        os.environ.update(self.configuration.environment)
        if self.cpu_simulation:
            from . import pallas_interpret

            self.result.stand_ins = [f"{pallas_interpret.LABEL}: {name}" for name in pallas_interpret.activate()]
            count_live_arrays_as_memory()
            self.result.stand_ins.append("memory statistics: live arrays' bytes against 1 GiB a device")
        self.result.stand_ins += host_stand_in_labels()
        from tpu_inference.runner.tpu_runner import TPUModelRunner

        init_mesh = TPUModelRunner._init_mesh

        def recording_init_mesh(runner: Any) -> None:
            init_mesh(runner)
            self.result.mesh = {name: int(size) for name, size in runner.mesh.shape.items()}

        TPUModelRunner._init_mesh = recording_init_mesh
        import vllm  # noqa: F401 - imported here: a stack that fails to import is the process's death, not a stopped engine

    def start(self) -> None:
        from vllm import LLM

        self.at("engine start")
        began = time.monotonic()
        kwargs = llm_kwargs(self.checkpoint, self.result.chips, self.additional_config, dict(self.configuration.overrides))
        self.llm = LLM(**(kwargs | dict(self.configuration.llm_args)))
        self.result.seconds["engine_start"] = round(time.monotonic() - began, 2)

    def generate(self, generate: Generate) -> None:
        from vllm import SamplingParams

        self.at(f"generate {generate.name}")
        began = time.monotonic()
        params = generate.params
        sampling = [SamplingParams(**p, logprobs=1, detokenize=False) for p in params] if isinstance(params, list) \
            else SamplingParams(**params, logprobs=1, detokenize=False)
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in generate.prompts], sampling, use_tqdm=False)
        self.result.seconds[generate.name] = round(time.monotonic() - began, 2)
        self.result.generates[generate.name] = [
            {
                "tokens": list(o.outputs[0].token_ids),
                "logprobs": [lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs, strict=True)],
            }
            for o in outputs
        ]

    def sync(self, checkpoint: pathlib.Path) -> None:
        """The second model at `checkpoint` into the running engine, by the configuration's sync."""
        sync = self.configuration.sync
        if sync is None:
            raise ValueError(f"{self.configuration.name} syncs no second model")
        self.at("weight sync")
        began = time.monotonic()
        shown = sync.run(self.llm, checkpoint, self.result.chips, self.additional_config)
        self.result.sync_path = sync.path + (f"; {shown}" if shown else "")
        self.result.seconds["sync"] = round(time.monotonic() - began, 2)

    def at_default_precision(self, generates: list[Generate]) -> None:
        """`generates` after switching the process back to jax's default
        matmul precision: jax keys its compiled programs by that setting, so
        the engine's jitted steps compile anew (counted in Result.compiles
        under each generate's step) and run as train_rl runs them."""
        import jax

        jax.config.update("jax_default_matmul_precision", None)
        for generate in generates:
            self.generate(generate)

    def serve(self, generates: list[Generate], second: SecondModel | None = None, at_default_precision: list[Generate] | None = None) -> Exception | None:
        """Starts the engine, runs the generates, then syncs the second model
        and runs its generates, then those to run at jax's default precision;
        returns the exception that stopped it (in Result.stopped too, the step
        it was in in Result.step), if one did."""
        try:
            self.start()
            for generate in generates:
                self.generate(generate)
            if second is not None:
                self.sync(pathlib.Path(second.checkpoint))
                for generate in second.generates:
                    self.generate(generate)
            if at_default_precision:
                self.at_default_precision(at_default_precision)
            self.result.step = DONE
            return None
        except Exception as error:  # noqa: BLE001 - reported by the parent, with the step it stopped in
            frames = traceback.extract_tb(error.__traceback__)
            # Where it was raised: the innermost frame's file, line and statement.
            at = f" (raised at {pathlib.Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name}: {frames[-1].line})" if frames else ""
            self.result.stopped = f"{type(error).__name__}: {str(error)[:1000]}{at}"
            traceback.print_exc()
            return error

    def write(self, **more: Any) -> None:
        """RESULT.json: the Result, and what `more` adds beside it."""
        self.result_path.write_text(json.dumps({**self.result.as_json(), **more}, indent=1))


def main(request_path: pathlib.Path, result_path: pathlib.Path) -> int:
    request = Request.from_json(request_path.read_text())
    engine = Engine(configurations.named(request.config), pathlib.Path(request.checkpoint), request.cpu_simulation, result_path,
                    request.precision)
    engine.prepare()
    engine.load()
    engine.serve(request.generates, request.sync, request.at_default_precision)
    engine.write()
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
