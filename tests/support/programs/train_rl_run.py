"""Run MaxText 0.2.4's `train_rl` GRPO path on the installed stack and write
down how far it got.

Run by tests/fixes/test_train_rl.py in a process of its own (MaxText, vLLM and
JAX set process-wide state, and a process that imported MaxText can hang at
exit), with tests/ on PYTHONPATH:

    python -m support.programs.train_rl_run RESULT.json --config NAME [--upstream] [--shims]
        [--shape tiny|user] [--dims real|tiny] [--steps N] [--trace FIRST-LAST]

It calls what MaxText's own integration test calls
(tests/post_training/integration/single_host_train_rl_test.py at maxtext-v0.2.4,
which names them `train_rl.X`; in the 0.2.4 release the first and third live in
`model_creation_utils`, where `train_rl.rl_train` calls them):
`setup_configs_and_devices`, `prepare_datasets`, `create_models_and_meshes`,
`create_rl_components`, `evaluate`, `rl_trainer.train`, `evaluate`; and makes
the same checks (reference parameters unchanged, actor parameters changed and
different from the reference, evaluation metrics in range), plus:

- the rollout engine got the trained weights: vLLM's prompt logprobs of one
  fixed token sequence, before and after training, differ;
- the engine runs with the logprobs settings Tunix's rollout passes
  (`max_logprobs` 1, `logprobs_mode` from Tunix's RolloutConfig);
- nothing in google-tunix, tpu-inference or vLLM was replaced at run time:
  every function of their imported modules is the one its installed file
  defines, and the jax.lax functions they call are jax's own
  (support/fixes/replaced.py). The stand-ins this run itself installs on the
  CPU (below) are listed, not hidden.

Everything the run needs that MaxText's test downloads is made here
(support/fixes/train_rl_inputs.py): a tiny byte-level BPE tokenizer trained
on the prompts, a GSM8K-format dataset in local parquet files
(`hf_train_files`, `hf_eval_files`), a tiny Qwen3 (MaxText's `qwen3-0.6b`
with 2 layers, width 128; its HF config.json beside the tokenizer for vLLM),
randomly initialised by MaxText (no checkpoint; its tied embedding scaled,
`embedding_scale`), and a reward file (`reward_functions_path`) whose reward
varies between the generations of a group, so that GRPO's advantages, hence
the gradient, are not all zero for a random model.

Configurations (MaxText's test's two):
- `vllm_native`: vLLM runs its own Qwen3 (tpu-inference's JAX model), Tunix's
  `device_indexes` give the runner the 2D ("data", "model") mesh;
  weights sync through Tunix's `transfer_state_with_mappings`.
- `maxtext_on_vllm`: vLLM runs `MaxTextForCausalLM` (MaxText's vLLM adapter)
  with `NEW_MODEL_DESIGN=1`, as MaxText's test sets; weights sync through
  Tunix's `transfer_state_directly`.

`--shims`: MaxText's run-time shims active, as in a `train_rl` run (the Tunix
adapter's jax.lax replacements from import on, `_tpu_inference_compat_patches`
around the run). Without it, the adapter's replacements are undone right
after MaxText is imported and the run is not wrapped.

`--upstream`: google-tunix and tpu-inference as pinned, without the series:
every installed file a patch touches is imported as upstream ships it
(support/fixes/unpatched.py, `upstream_imports`).

On the CPU simulation, stand-ins for what CPU devices lack (never on a TPU;
support/fixes/train_rl_stand_ins.py): the devices' memory statistics (as
engine_start.py), the TPU kernels in Pallas TPU interpret mode (the tool's
maxtext_rl_overlay/smoke/pallas_interpret.py), and Tunix's weight sync
entered as on a TPU, without the transfer guard it sets on other backends
only (sync_weights_as_on_tpu). Each is recorded in RESULT.json under
"stand_ins".

`--shape user` (issue 61): MaxText's shipped model configs at a user's
lengths (train_rl_inputs.USER_MODELS, USER_LENGTHS; `--dims real` on a chip,
the default there, `--dims tiny` on the CPU simulation, its default), for
`--steps` GRPO steps (default train_rl_inputs.USER_STEPS), each step
explained (support/fixes/step_accounting.py): the programs compiled in each
phase, the devices' memory after each step and what the models hold, the
devices' busy time in each phase of the steps `--trace` names (default: the
third to the last, the steady state; "none" for no trace), the rollout's
tokens/s against the same engine generating alone at the same shape, the
actor update's model FLOP/s against a bf16 matmul's measured in the same
process. The tiny shape's run is unchanged unless --steps or --trace is
given.

RESULT.json: "steps" (each with its seconds, in order; the last one without
"done" is where the run stopped), "stopped" (the exception, with the frames
of installed packages), "checks", and each GRPO step's seconds
("grpo_step_seconds") split into the trainer's phases ("phase_seconds":
rollout, logprobs, actor_update, weight_sync, other), the sync's own parts
("sync_parts", SYNC_RPCS); with the accounting (the user shape):
"compiles", "gc", "memory", "held", "device_time",
"rollout_tokens", "engine_alone", "matmul_rate", "model_flops".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NoReturn

from support.fixes import step_accounting, train_rl_inputs, unpatched
from support.fixes.matrix import PLATFORM, simulate_v6e_8
from support.fixes.replaced import SNAPSHOTS, replaced_functions
from support.fixes.train_rl_stand_ins import TRANSFER_GUARD_STAND_IN, cpu_stand_ins, sync_weights_as_on_tpu

#: The run's process environment, set by main() before anything heavy is
#: imported; never at import (a module's constants imported by the test
#: process would leak it to its engine tests' children: a SKIP_JAX_PRECOMPILE
#: there skips the precompilation they check).
PROCESS_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine core in this process
    "VLLM_DISABLE_COMPILE_CACHE": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # As MaxText's integration test sets them (NEW_MODEL_DESIGN only where its
    # configuration needs it: see train_rl_inputs.CONFIGS).
    "TPU_BACKEND_TYPE": "jax",
    "SKIP_JAX_PRECOMPILE": "1",
    "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python",
}

PROBE = [1, 17, 33, 49, 65, 81, 97, 113, 129, 145, 161, 177]  # token ids, any fixed sequence


class Run:
    """RESULT.json, written again (whole: a reader never sees half of it) at
    each step's start and end, so that a run killed past its bound still
    says which step it was in."""

    def __init__(self, out: pathlib.Path, args: argparse.Namespace):
        self.out = out
        self.result: dict = {"config": args.config, "upstream": args.upstream, "shims": args.shims,
                             "platform": PLATFORM, "shape": args.shape, "dims": args.dims, "steps": [], "checks": {},
                             "stand_ins": []}
        #: What the CPU stand-ins replace: the replaced-functions check reports them apart.
        self.stood_in: set[str] = set()

    def write(self) -> None:
        part = self.out.with_name(self.out.name + ".part")
        part.write_text(json.dumps(self.result, indent=1, default=str))
        os.replace(part, self.out)

    @contextlib.contextmanager
    def step(self, name: str):
        began = time.monotonic()
        entry: dict = {"step": name}
        self.result["steps"].append(entry)
        self.write()
        print(f"[train_rl_run] step {name}", file=sys.stderr, flush=True)
        done = False
        try:
            yield entry
            done = True
        finally:
            entry["seconds"] = round(time.monotonic() - began, 1)
            if done:
                entry["done"] = True
            self.write()

    def replaced(self) -> dict[str, list[str]]:
        return replaced_functions(self.stood_in)


@dataclass
class Trainer:
    """What train_rl's set-up made, as the later steps use it."""

    config: Any  # the trainer's MaxText config
    train_dataset: Any
    test_dataset: Any
    actor: Any
    reference: Any
    cluster: Any  # Tunix's RLCluster
    trainer: Any
    reward_fns: Any

    def evaluate(self) -> list:
        from maxtext.trainers.post_train.rl import evaluate_rl

        c = self.config
        return list(evaluate_rl.evaluate(c, self.test_dataset, rl_cluster=self.cluster, num_passes=c.num_eval_passes,
                                         corr_lst=c.eval_corr_lst, make_lst=c.eval_make_lst, reward_fns=self.reward_fns)[0])

    def host_params(self, model) -> Any:
        """Host copies: the sync may hand these very buffers to the engine,
        which deletes them when the next sync replaces them (maxtext_on_vllm)."""
        import jax
        import numpy as np
        from flax import nnx

        return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model.base, nnx.Param)))


class TimedSync:
    """RLCluster.sync_weights, timed: each GRPO step ends with it (the trained
    weights into the rollout engine), so the time from the training's start,
    then from the last sync, is each step's (read on this one object: the
    class is left as it is)."""

    def __init__(self, run: Run, sync_weights, seconds: list[float]):
        self.run, self.sync_weights, self.seconds = run, sync_weights, seconds
        self.began = time.monotonic()

    def start(self) -> None:
        self.began = time.monotonic()

    def __call__(self) -> None:
        self.sync_weights()
        self.seconds.append(round(time.monotonic() - self.began, 1))
        self.began = time.monotonic()
        self.run.write()


#: The trainer's phases, timed where RLCluster runs them (its own methods,
#: wrapped on the one instance, each called as it was): phase -> the methods.
PHASES = {"rollout": ("generate",), "logprobs": ("get_ref_per_token_logps", "get_old_per_token_logps"),
          "actor_update": ("update_actor",), "weight_sync": ("sync_weights",)}

#: The weight sync's parts, timed inside it (RESULT.json's "sync_parts", one
#: dict a step): the rollout's update_params (MaxText's unroll where it has
#: one, Tunix's transfer into the engine, and the engine's KV cache freed
#: before and allocated again after), and within it those two engine calls
#: (vLLM's collective_rpc, by method), and Python's collections that ran
#: within update_params ("update_params_gc", with an accounting). The rest of
#: the sync is RLCluster's own: the actor's state walked, its gc.collect()
#: (RESULT.json's "gc" has every collection in the sync) and the anchor
#: policy's snapshot where one is taken.
SYNC_RPCS = ("delete_kv_cache", "reinitialize_kv_cache")


class PhaseTimes:
    """The seconds each GRPO step spent in each of the trainer's phases
    (RESULT.json's "phase_seconds", one dict a step: rollout, logprobs (the
    reference's and the old policy's), actor_update, weight_sync, and the
    rest of the step as "other"); a step ends with its weight sync. With an
    `accounting`, also each phase's compiles, the devices' memory after each
    step, the rollout's tokens, and the trace's annotations."""

    def __init__(self, run: Run, cluster, accounting: Accounting | None = None) -> None:
        self.run, self.steps = run, run.result.setdefault("phase_seconds", [])
        self.sync_parts: list[dict[str, float]] = run.result.setdefault("sync_parts", [])
        self.accounting = accounting
        self.current: dict[str, float] = {}
        self.current_parts: dict[str, float] = {}
        self.syncing: int | None = None  # the thread in the weight sync: its parts are timed only there
        for phase, names in PHASES.items():
            for name in names:
                if hasattr(cluster, name):
                    setattr(cluster, name, self.timed(phase, getattr(cluster, name)))
        rollout = cluster.rollout  # RLCluster's property: the one rollout object
        rollout.update_params = self.part(lambda *a, **k: "update_params", rollout.update_params, with_gc=True)
        llm = getattr(getattr(rollout, "_sampler", None), "llm", None)  # vLLM's LLM (the vllm rollouts)
        if llm is not None:
            llm.collective_rpc = self.part(lambda method, *a, **k: method if method in SYNC_RPCS else None,
                                           llm.collective_rpc)

    def part(self, name_of, method, with_gc: bool = False):
        """`method`, timed as the sync's part that `name_of` its arguments
        names (None: not a part); `with_gc`: also the seconds of Python's
        collections within it (NAME_gc), where the accounting times them."""
        def call(*args, **kwargs):
            ident = threading.get_ident()
            name = name_of(*args, **kwargs) if self.syncing == ident else None
            collected = self.accounting.compiles.collected if with_gc and self.accounting else None
            began, gc_began = time.monotonic(), collected.get(ident, 0.0) if collected is not None else 0.0
            try:
                return method(*args, **kwargs)
            finally:
                if name is not None:
                    self.add_part(name, time.monotonic() - began)
                    if collected is not None:
                        self.add_part(f"{name}_gc", collected.get(ident, 0.0) - gc_began)

        return call

    def add_part(self, name: str, seconds: float) -> None:
        self.current_parts[name] = round(self.current_parts.get(name, 0.0) + seconds, 3)

    def timed(self, phase: str, method):
        def call(*args, **kwargs):
            step = len(self.steps)  # 0-based: the steps closed so far
            a = self.accounting
            if a is not None and a.trace is not None and a.trace.wanted(step + 1):
                a.trace.start()
            began = time.monotonic()
            if phase == "weight_sync":
                self.syncing = threading.get_ident()
            try:
                with (a.compiles.phase(step, phase) if a else contextlib.nullcontext()), \
                        (a.trace.annotate(step + 1, phase) if a and a.trace else contextlib.nullcontext()):
                    out = method(*args, **kwargs)
                if a is not None and phase == "rollout":
                    a.rollout_tokens(step, out)
                return out
            finally:
                self.current[phase] = round(self.current.get(phase, 0.0) + time.monotonic() - began, 2)
                if phase == "weight_sync":
                    self.syncing = None
                    self.close()

        return call

    def close(self) -> None:
        """The step that ended with the sync just made: its phases, and the rest of its seconds."""
        steps = self.run.result.get("grpo_step_seconds") or []
        step = dict(self.current)
        if len(steps) > len(self.steps):  # TimedSync read the step's whole seconds
            step["other"] = round(steps[len(self.steps)] - sum(step.values()), 2)
        self.steps.append(step)
        self.sync_parts.append(self.current_parts)
        self.current = {}
        self.current_parts = {}
        if self.accounting is not None:
            self.accounting.step_closed(len(self.steps))


class Accounting:
    """The user shape's account of each GRPO step (step_accounting.py): the
    compiles and Python's garbage collections by phase, the memory after each step, the rollout's tokens and
    the profiler trace of the steps asked for."""

    def __init__(self, run: Run, trace: tuple[int, int] | None) -> None:
        self.run = run
        self.compiles = step_accounting.Compiles()
        self.compiles.install()
        self.trace = step_accounting.Trace(*trace) if trace else None
        self.memory: list[dict] = run.result.setdefault("memory", [])
        self.tokens: list[int] = run.result.setdefault("rollout_tokens", [])
        self.prompt_lengths: list[list[int]] = run.result.setdefault("prompt_lengths", [])
        self.pad_id: int | None = None  # the rollout's, once it exists
        self.last_prompts: list[list[int]] = []  # the last rollout's prompts (their token ids): engine_alone replays them

    def snapshot(self, label: str) -> None:
        self.memory.append({"at": label, **step_accounting.memory()})
        self.run.result["compiles"] = self.compiles.result()
        self.run.result["gc"] = self.compiles.collections
        self.run.write()

    def rollout_tokens(self, step: int, output: Any) -> None:
        while len(self.tokens) <= step:
            self.tokens.append(0)
            self.prompt_lengths.append([])
        self.tokens[step] += sum(len(t) for t in getattr(output, "tokens", None) or [])
        padded = getattr(output, "left_padded_prompt_tokens", None)
        if padded is not None:
            prompts = [[int(x) for x in row if int(x) != self.pad_id] for row in padded]
            self.prompt_lengths[step] += [len(p) for p in prompts]
            self.last_prompts = prompts

    def step_closed(self, done: int) -> None:
        self.compiles.step = done  # compiles between steps: the next step's "other"
        if self.trace is not None and self.trace.running and done >= self.trace.last:
            self.trace.stop()
        self.snapshot(f"after GRPO step {done}")


def prompt_logprobs(rollout) -> list[float]:
    """vLLM's logprob of each token of PROBE after the first, as the engine
    computes it with its current weights."""
    from vllm import SamplingParams

    llm = rollout._sampler.llm
    out = llm.generate([{"prompt_token_ids": PROBE}],
                       SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1, detokenize=False), use_tqdm=False)
    values = []
    for token, entry in zip(PROBE[1:], out[0].prompt_logprobs[1:], strict=True):
        values.append(float(entry[token].logprob))
    return values


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("result", type=pathlib.Path)
    parser.add_argument("--config", choices=sorted(train_rl_inputs.CONFIGS), required=True)
    parser.add_argument("--upstream", action="store_true")
    parser.add_argument("--shims", action="store_true")
    parser.add_argument("--shape", choices=train_rl_inputs.SHAPES, default="tiny")
    parser.add_argument("--dims", choices=("real", "tiny"), help="the user shape's: real on a chip, tiny on the CPU (the defaults)")
    parser.add_argument("--steps", type=int, help="GRPO steps (tiny shape: 2; user shape: train_rl_inputs.USER_STEPS)")
    parser.add_argument("--trace", help="FIRST-LAST: the GRPO steps (1-based) a profiler trace covers, or none "
                        "(user shape default: 3 to the last)")
    args = parser.parse_args()
    args.dims = args.dims or ("real" if PLATFORM == "tpu" else "tiny")
    if args.shape == "tiny":
        args.dims = None
    simulate_v6e_8()  # before jax is imported
    os.environ.update(PROCESS_ENV)
    run = Run(args.result, args)
    os.environ.update(train_rl_inputs.CONFIGS[args.config]["env"])
    if args.upstream:
        from support.fixes.unpatched import upstream_imports

        run.result["upstream_modules"] = upstream_imports(("google-tunix", "tpu-inference"))
    sys.meta_path.insert(0, SNAPSHOTS)  # before any upstream module is imported (it delegates to the finders after it)
    work = pathlib.Path(tempfile.mkdtemp(prefix="train-rl-"))
    run_and_exit(run, lambda: drive(run, args, work))


def run_and_exit(run: Run, steps: Callable[[], None]) -> NoReturn:
    """`steps`, then RESULT.json written and the process ended. Where the
    steps stopped is written down for the test (a finding: the error's type,
    message and the upstream frames it passed), not raised; the process ends
    with os._exit, as a process that imported MaxText can hang in its atexit
    hooks."""
    try:
        steps()
    except Exception as error:  # noqa: BLE001 - reported to the test
        run.result["stopped"] = {"type": f"{type(error).__module__}.{type(error).__qualname__}",
                                 "message": str(error)[:3000], "frames": unpatched.traceback_frames(error, "upstream")}
        traceback.print_exc()
    run.write()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def drive(run: Run, args: argparse.Namespace, work: pathlib.Path) -> None:
    """MaxText's test's calls, each a step of RESULT.json, and the checks."""
    checks = run.result["checks"]
    with run.step("import"):
        import_maxtext(run, args.shims)
    user = args.shape == "user"
    steps: int = args.steps or (train_rl_inputs.USER_STEPS if user else 0)
    with run.step("inputs"):
        hf_config = train_rl_inputs.user_dims(args.config, args.dims)[2] if user else None
        # The user shape: enough questions for every step (a train_rl epoch ends with its data), two for the evaluation.
        count = steps * train_rl_inputs.USER_LENGTHS[args.dims]["batch_size"] + 2 if user else 0
        inputs = train_rl_inputs.make_inputs(
            work, args.config, hf_config, train_rl_inputs.user_questions(count, args.dims) if user else None,
            train_rl_inputs.USER_TOKENIZER_VOCAB if user and args.dims == "real" else None)
        run.result["prompt_tokens_formatted"] = inputs.get("prompt_tokens")
    if user:
        argv = train_rl_inputs.user_argv(args.config, work, inputs, args.dims, steps)
    else:
        argv = train_rl_inputs.argv_for(args.config, work, inputs)
        if steps:
            argv = [a if not a.startswith("num_batches=") else f"num_batches={steps}" for a in argv]
    run.result["argv"] = argv[2:]
    trace = parse_trace(args.trace, steps or 2) if (user or args.trace) else None
    accounting = Accounting(run, trace) if (user or args.trace) else None

    # MaxText 0.2.4's train_rl shims (the overlay's MaxText deletes them: support/fixes/maxtext_shims.py has 0.2.4's)
    shim_context = _train_rl_shims() if args.shims else contextlib.nullcontext()
    with shim_context:
        t = set_up(run, args.config, argv, accounting)
        checks["replaced_after_engine_start"] = run.replaced()
        rollout = t.cluster.rollout
        with run.step("evaluate_before"):
            from flax import nnx

            rollout.update_params(nnx.state(t.actor, nnx.Param))  # as rl_train does before its first evaluation
            checks["metrics_before"] = t.evaluate()
        with run.step("probe_before"):
            checks["probe_before"] = prompt_logprobs(rollout)
        train(run, t, accounting)
        with run.step("probe_after"):
            checks["probe_after"] = prompt_logprobs(rollout)
        if accounting is not None:
            explain(run, t, accounting)
        with run.step("evaluate_after"):
            checks["metrics_after"] = t.evaluate()
    run.result["finished"] = True


def parse_trace(value: str | None, steps: int) -> tuple[int, int] | None:
    """--trace FIRST-LAST (1-based), "none", or the default: the third step
    to the last (the first compiles; the second, at the pins' Tunix,
    compiles the update again: see the run's compiles), or the last alone
    where there are fewer."""
    if value == "none":
        return None
    if value:
        first, _, last = value.partition("-")
        return int(first), int(last or first)
    return (min(3, steps), steps)


def explain(run: Run, t: Trainer, a: Accounting) -> None:
    """After the GRPO steps: the trace read back (device time by phase), the
    rollout's engine generating alone at the same shape, a bf16 matmul's
    rate, the actor update's model FLOPs, and what the models hold."""
    with run.step("explain"):
        if a.trace is not None:
            a.trace.stop()
            run.result["device_time"] = a.trace.read()
            run.write()
        c = t.config
        completion = c.max_target_length - c.max_prefill_predict_length
        sequences = c.batch_size * c.rl.num_generations
        if not a.last_prompts:
            raise RuntimeError("no rollout's prompts were seen: nothing to replay for the engine alone")
        run.result["engine_alone"] = engine_alone(t.cluster.rollout, a.last_prompts, completion,
                                                  repeats=3 if PLATFORM == "tpu" else 1)
        run.write()
        run.result["matmul_rate"] = step_accounting.matmul_rate(8192 if PLATFORM == "tpu" else 512)
        run.result["model_flops"] = step_accounting.model_flops(c, sequences * c.max_target_length)
        run.result["held"] = held_bytes(t)
        a.snapshot("after the explanation")


def engine_alone(rollout, prompts: list[list[int]], completion: int, repeats: int) -> dict:
    """The rollout's own engine generating alone at the run's shape: the last
    GRPO step's prompts (their token ids, one a generation, as the rollout
    gave them to it), `completion` tokens each (ignore_eos: a random model
    seldom stops early), the rollout's sampling settings (rl.yml's: 0.9,
    top-k 50); after a warm-up, the median of `repeats` (3 on a chip; 1 on
    the CPU, where the kernels are interpreted).
    Decode tokens/s as bench_decode.py's: from the difference of the
    full-length and 1-token generates (the prefill cancels out)."""
    import statistics

    from vllm import SamplingParams

    llm = rollout._sampler.llm
    requests = [{"prompt_token_ids": p} for p in prompts]

    def generate(n: int) -> float:
        params = SamplingParams(temperature=0.9, top_k=50, max_tokens=n, ignore_eos=True, logprobs=1, detokenize=False)
        began = time.perf_counter()
        llm.generate(requests, params, use_tqdm=False)
        return time.perf_counter() - began

    generate(completion)
    generate(1)
    full = [generate(completion) for _ in range(repeats)]
    one = [generate(1) for _ in range(repeats)]
    decode = statistics.median(full) - statistics.median(one)
    sequences = len(prompts)
    return {"sequences": sequences, "prompt_lengths": [len(p) for p in prompts], "completion": completion,
            "seconds_full": full, "seconds_1": one, "tokens_per_s": sequences * completion / statistics.median(full),
            "decode_tokens_per_s": sequences * (completion - 1) / decode if decode > 0 else None}


def held_bytes(t: Trainer) -> dict:
    """What the models hold on the devices: the actor's and the reference's
    parameters, the actor's optimizer state (by dtype), the engine's weights
    and its KV cache (each the arrays' global bytes)."""
    import jax
    from flax import nnx

    def arrays(tree) -> list:
        return [x for x in jax.tree_util.tree_leaves(tree) if isinstance(x, jax.Array)]

    def total(tree) -> int:
        return sum(int(x.nbytes) for x in arrays(tree))

    held: dict = {"actor_params": total(nnx.state(t.actor, nnx.Param)),
                  "reference_params": total(nnx.state(t.reference, nnx.Param))}
    with contextlib.suppress(Exception):
        optimizer = t.cluster.actor_trainer.optimizer
        state = nnx.state(optimizer, nnx.optimizer.OptState)
        by_dtype: dict = {}
        for x in arrays(state):
            by_dtype[str(x.dtype)] = by_dtype.get(str(x.dtype), 0) + int(x.nbytes)
        held["optimizer_state"] = total(state)
        held["optimizer_state_by_dtype"] = by_dtype
    runner = t.cluster.rollout._sampler._model_runner
    with contextlib.suppress(Exception):
        held["engine_weights"] = total(runner.state)
    with contextlib.suppress(Exception):
        held["engine_kv_cache"] = total(runner.kv_caches)
    held["parameters"] = sum(int(x.size) for x in arrays(nnx.state(t.actor, nnx.Param)))
    return held


def import_maxtext(run: Run, shims: bool) -> None:
    """MaxText and what the run calls; without `shims`, what importing
    MaxText's Tunix adapter replaced in jax.lax put back. Then the CPU stand-ins."""
    import jax

    original_lax = (jax.lax.with_sharding_constraint, jax.lax.top_k)
    import numpy as np  # noqa: F401 - all imported in this step: its seconds are the imports'
    from flax import nnx  # noqa: F401
    from maxtext.configs import types  # noqa: F401
    from maxtext.trainers.post_train.rl import evaluate_rl, train_rl  # noqa: F401
    from maxtext.utils import model_creation_utils  # noqa: F401
    from transformers import AutoTokenizer  # noqa: F401

    run.result["adapter_replaced_jax_lax"] = (jax.lax.with_sharding_constraint, jax.lax.top_k) != original_lax
    if not shims:  # undo what importing MaxText's Tunix adapter did
        jax.lax.with_sharding_constraint, jax.lax.top_k = original_lax
    cpu_stand_ins(run.result["stand_ins"], run.stood_in)


def set_up(run: Run, config: str, argv: list[str], accounting: Accounting | None = None) -> Trainer:
    """train_rl's set-up, as MaxText's test calls it: the configs, the
    datasets, the models and meshes, then the RL components (which start
    vLLM and sync the actor's weights into it). Records the rollout engine's
    mesh and logprobs settings."""
    from maxtext.configs import types
    from maxtext.trainers.post_train.rl import train_rl
    from maxtext.utils import model_creation_utils
    from transformers import AutoTokenizer

    with run.step("setup_configs_and_devices"):
        trainer_config, sampler_config, trainer_devices, sampler_devices = model_creation_utils.setup_configs_and_devices(
            argv, config_class=types.RLConfig)
        model_tokenizer = AutoTokenizer.from_pretrained(trainer_config.tokenizer_path)
    with run.step("prepare_datasets"):
        train_dataset, test_dataset = train_rl.prepare_datasets(trainer_config, model_tokenizer)
    with run.step("create_models_and_meshes"):
        reference_model, reference_mesh, actor_model, actor_mesh, rollout_mesh = model_creation_utils.create_models_and_meshes(
            trainer_config, sampler_config, trainer_devices, sampler_devices, tokenizer_pad_id=model_tokenizer.pad_token_id)
    scale = train_rl_inputs.CONFIGS[config].get("embedding_scale")
    if run.result["shape"] == "user":  # both user models tie their logits to the embedding
        scale = train_rl_inputs.embedding_scale(trainer_config.emb_dim)
    if accounting is not None:
        accounting.snapshot("after create_models_and_meshes")
    if scale:  # both models: the reference stays the actor's initial state
        for model in (reference_model, actor_model):
            embedding = model.base.token_embedder.embedding
            embedding.value = embedding.value * scale
        run.result["embedding_scale"] = scale
    with run.step("create_rl_components"):  # starts vLLM and syncs the actor's weights into it
        rl_cluster, rl_trainer, _, reward_fns = train_rl.create_rl_components(
            trainer_config, sampler_config, sampler_devices, actor_model, actor_mesh,
            reference_model, reference_mesh, rollout_mesh, model_tokenizer)
    if accounting is not None:
        accounting.pad_id = rl_cluster.rollout.pad_id()
        accounting.snapshot("after create_rl_components (the engine started)")
    runner = rl_cluster.rollout._sampler._model_runner
    model_config = rl_cluster.rollout._sampler.llm.llm_engine.model_config
    run.result["rollout"] = {
        "mesh": {"shape": dict(runner.mesh.shape), "axis_types": [str(t) for t in runner.mesh.axis_types]},
        "requested_logprobs_mode": getattr(rl_cluster.cluster_config.rollout_config, "rollout_vllm_logprobs_mode", None),
        "max_logprobs": model_config.max_logprobs,
        "logprobs_mode": str(model_config.logprobs_mode),
        "architecture": type(runner.model).__name__ if hasattr(runner, "model") else None,
    }
    return Trainer(trainer_config, train_dataset, test_dataset, actor_model, reference_model, rl_cluster, rl_trainer, reward_fns)


def train(run: Run, t: Trainer, accounting: Accounting | None = None) -> None:
    """The GRPO steps (rl_trainer.train), each step's seconds read at its
    weight sync, the sync entered as on a TPU; then MaxText's test's
    parameter checks, made even where training stops (after the actor's
    update, in the weight sync), to show how far it got."""
    import jax
    import numpy as np

    actor_initial, ref_initial = t.host_params(t.actor), t.host_params(t.reference)
    grpo_steps: list[float] = run.result.setdefault("grpo_step_seconds", [])
    guards: list[str] = run.result.setdefault("transfer_guards_as_on_tpu", [])
    timed = TimedSync(run, sync_weights_as_on_tpu(t.cluster.sync_weights, guards), grpo_steps)
    if PLATFORM == "cpu":
        run.result["stand_ins"].append(TRANSFER_GUARD_STAND_IN)
    t.cluster.sync_weights = timed
    PhaseTimes(run, t.cluster, accounting)  # wraps the timed sync too: it closes a step after TimedSync has read its seconds

    def compare_parameters():
        checks = run.result["checks"]
        actor_final, ref_final = t.host_params(t.actor), t.host_params(t.reference)
        same = lambda a, b: bool(jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, a, b)))  # noqa: E731
        checks["reference_unchanged"] = same(ref_initial, ref_final)
        checks["actor_changed"] = not same(actor_initial, actor_final)
        checks["actor_differs_from_reference"] = not same(ref_final, actor_final)
        checks["replaced_after_train"] = run.replaced()
        run.result["global_steps"] = t.cluster.global_steps
        checks["actor_loss"] = actor_losses(t.cluster)

    try:
        with run.step("train"):
            timed.start()
            if accounting is not None:
                accounting.compiles.step = 0  # from here on, a compile outside every phase is a step's "other"
            t.trainer.train(t.train_dataset)
    finally:
        if accounting is not None:
            accounting.compiles.finished = True
        with contextlib.suppress(Exception):
            with jax.transfer_guard("allow"):
                compare_parameters()


def actor_losses(cluster) -> list[float]:
    """The actor's training loss at each of its steps, as Tunix's own
    trainer logged it (its metrics logger's history, train mode)."""
    import numpy as np
    from tunix.sft.metrics_logger import Mode

    trainer = cluster.actor_trainer
    history = trainer.metrics_logger.get_metric_history(trainer.metrics_prefix, "loss", Mode.TRAIN)
    return [float(v) for v in np.ravel(history)]


def _train_rl_shims():
    """What MaxText 0.2.4's rl_train ran inside (its _tpu_inference_compat_patches)."""
    from support.fixes import maxtext_shims

    return maxtext_shims.train_rl_patches()


if __name__ == "__main__":
    sys.exit(main())
