"""Run MaxText 0.2.4's `train_rl` GRPO path on the installed stack and write
down how far it got.

Run by tests/fixes/test_train_rl.py in a process of its own (MaxText, vLLM and
JAX set process-wide state, and a process that imported MaxText can hang at
exit), with tests/ on PYTHONPATH:

    python -m support.fixes.train_rl_run RESULT.json --config NAME [--upstream] [--shims]

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
  defines, and the jax.lax functions they call are jax's own. The stand-ins
  this script itself installs on the CPU (below) are listed, not hidden.

Everything the run needs that MaxText's test downloads is made here: a tiny
byte-level BPE tokenizer trained on the prompts (saved with `transformers`),
a GSM8K-format dataset in local parquet files (`hf_train_files`,
`hf_eval_files`), a tiny Qwen3 (MaxText's `qwen3-0.6b` with 2 layers, width
128; its HF config.json beside the tokenizer for vLLM), randomly initialised
by MaxText (no checkpoint; its tied embedding scaled, `embedding_scale`), and a reward file (`reward_functions_path`)
whose reward varies between the generations of a group, so that GRPO's
advantages, hence the gradient, are not all zero for a random model.

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

On the CPU simulation, stand-ins for what CPU devices lack (never on a TPU):
the devices' memory statistics (as engine_start.py), the TPU kernels in
Pallas TPU interpret mode (the tool's maxtext_rl_overlay/smoke/pallas_interpret.py), and Tunix's
weight sync entered as on a TPU, without the transfer guard it sets on other
backends only (sync_weights_as_on_tpu). Each is recorded in RESULT.json
under "stand_ins".

RESULT.json: "steps" (each with its seconds, in order; the last one without
"done" is where the run stopped), "stopped" (the exception, with the frames
of installed packages), and "checks".
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.util
import json
import os
import pathlib
import sys
import tempfile
import time
import traceback

from support.fixes import maxtext_models, unpatched
from support.fixes.matrix import DEVICES, PLATFORM, simulate_v6e_8

#: The run's process environment, set by main() before anything heavy is
#: imported; never at import: the test process imports this module for its
#: constants, and its engine tests' children inherit its environment (a
#: SKIP_JAX_PRECOMPILE leaked there skips the precompilation they check).
PROCESS_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine core in this process
    "VLLM_DISABLE_COMPILE_CACHE": "1",
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # As MaxText's integration test sets them (NEW_MODEL_DESIGN only where its
    # configuration needs it: see CONFIGS).
    "TPU_BACKEND_TYPE": "jax",
    "SKIP_JAX_PRECOMPILE": "1",
    "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION": "python",
}

UPSTREAMS = ("tunix", "tpu_inference", "vllm")

#: The tiny model's dimensions, in MaxText's words and in Hugging Face's
#: (support/fixes/maxtext_models.py says why these).
TINY = maxtext_models.ENGINE_DIMS
HF_TINY = maxtext_models.ENGINE_HF_DIMS

CONFIGS = {
    # MaxText's test's argv for each configuration, with the tiny model's
    # overrides (in the adapter's maxtext_config too).
    "maxtext_on_vllm": {
        # MaxText's test's model, qwen3-0.6b.
        "model_name": maxtext_models.ENGINE_MODEL_NAME,
        "hf_config": maxtext_models.ENGINE_HF_CONFIG,
        "argv": [
            "run_name=tiny_rl_maxtext",
            "vllm_hf_overrides={architectures: ['MaxTextForCausalLM']}",
            "vllm_additional_config=" + json.dumps({"maxtext_config": {
                "model_name": maxtext_models.ENGINE_MODEL_NAME, "log_config": "false", "override_model_config": True, **TINY}}),
        ],
        "env": {"NEW_MODEL_DESIGN": "1"},
        # Its logits are tied to the embedding: without the scaling (see
        # maxtext_models.ENGINE_EMBEDDING_SCALE) the random model repeats
        # its last token with near certainty, every generation of a group is
        # the same, GRPO's advantages are zero and the step trains nothing
        # but the weight decay (the engine's logprobs did not move).
        "embedding_scale": maxtext_models.ENGINE_EMBEDDING_SCALE,
    },
    "vllm_native": {
        # Not MaxText's test's qwen3-0.6b: MaxText 0.2.4 cannot sync it into
        # vLLM's own model (maxtext_vllm_rollout._create_model_converter
        # raises NotImplementedError: its rule table is None, "only supported
        # on the direct MaxText-to-MaxText sync path"). Llama 3.1 syncs
        # through Tunix's transfer_state_with_mappings with MaxText's
        # LLAMA3_VLLM_MAPPING.
        "model_name": "llama3.1-8b",
        "hf_config": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "rms_norm_eps": 1e-5,
                      "rope_theta": 500000.0, "tie_word_embeddings": False, **HF_TINY},
        "argv": ["run_name=tiny_rl_native"],
        "env": {},
    },
}
MAXTEXT_TINY_ARGS = ["override_model_config=True"] + [f"{k}={v}" for k, v in TINY.items()]

QUESTIONS = [
    ("Tom has 3 apples and buys 4 more. How many apples does he have?", "3 + 4 = 7\n#### 7"),
    ("A box holds 6 pens. How many pens are in 2 boxes?", "6 * 2 = 12\n#### 12"),
    ("Sara reads 5 pages a day for 3 days. How many pages does she read?", "5 * 3 = 15\n#### 15"),
    ("There are 10 birds and 4 fly away. How many birds are left?", "10 - 4 = 6\n#### 6"),
]

#: A reward that differs between a group's generations (GRPO's advantages of
#: a random model are otherwise all zero): the share of digits in the text.
REWARD_FILE = '''
def digit_share(prompts, completions, tmvp_config=None, **kwargs):
    return [sum(c.isdigit() for c in text) / max(1, len(text)) + 0.01 * len(text) for text in completions]
'''

PROBE = [1, 17, 33, 49, 65, 81, 97, 113, 129, 145, 161, 177]  # token ids, any fixed sequence


class Run:
    def __init__(self, out: pathlib.Path, args: argparse.Namespace):
        self.out = out
        self.result: dict = {"config": args.config, "upstream": args.upstream, "shims": args.shims,
                             "platform": PLATFORM, "steps": [], "checks": {}, "stand_ins": []}

    def write(self) -> None:
        self.out.write_text(json.dumps(self.result, indent=1, default=str))

    def step(self, name: str):
        run = self

        class Step:
            def __enter__(self):
                self.began = time.monotonic()
                self.entry = {"step": name}
                run.result["steps"].append(self.entry)
                run.write()
                print(f"[train_rl_run] step {name}", file=sys.stderr, flush=True)
                return self.entry

            def __exit__(self, kind, error, tb):
                self.entry["seconds"] = round(time.monotonic() - self.began, 1)
                if kind is None:
                    self.entry["done"] = True
                run.write()
                return False

        return Step()




def make_inputs(work: pathlib.Path, config: str) -> dict:
    """The tokenizer, the dataset files, the reward file."""
    import pandas as pd
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    template = json.loads((pathlib.Path(importlib.util.find_spec("maxtext").origin).parent
                           / "examples" / "chat_templates" / "gsm8k_rl.json").read_text())
    corpus = [template["SYSTEM_PROMPT"], template["TEMPLATE"]] + [q + " " + a for q, a in QUESTIONS]
    specials = ["<pad>", "<bos>", "<eos>", "<start_of_turn>", "<end_of_turn>"]
    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(corpus * 4, trainers.BpeTrainer(
        vocab_size=TINY["vocab_size"] - 64, special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    tokenizer_dir = work / "tokenizer"
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}\n{% endif %}"
    fast.save_pretrained(tokenizer_dir)
    assert (fast.pad_token_id, fast.bos_token_id, fast.eos_token_id) == (0, 1, 2)
    (tokenizer_dir / "config.json").write_text(json.dumps(CONFIGS[config]["hf_config"]))
    train = work / "train.parquet"
    test = work / "test.parquet"
    pd.DataFrame({"question": [q for q, _ in QUESTIONS], "answer": [a for _, a in QUESTIONS]}).to_parquet(train)
    pd.DataFrame({"question": [q for q, _ in QUESTIONS[:2]], "answer": [a for _, a in QUESTIONS[:2]]}).to_parquet(test)
    rewards = work / "rewards.py"
    rewards.write_text(REWARD_FILE)
    return {"tokenizer": tokenizer_dir, "train": train, "test": test, "rewards": rewards, "vocab": len(fast)}


def argv_for(config: str, work: pathlib.Path, inputs: dict) -> list[str]:
    rl_yml = pathlib.Path(importlib.util.find_spec("maxtext").origin).parent / "configs" / "post_train" / "rl.yml"
    return [
        "train_rl.py", str(rl_yml),
        # MaxText's test's base argv ...
        f"model_name={CONFIGS[config]['model_name']}",
        f"tokenizer_path={inputs['tokenizer']}",
        f"base_output_directory={work / 'out'}",
        "batch_size=1",
        "num_batches=2",  # two GRPO steps (MaxText's test: batch_size=4, num_batches=1)
        "num_test_batches=1",
        f"chips_per_vm={DEVICES}",
        "scan_layers=True",
        "hbm_utilization_vllm=0.4",
        "rollout_data_parallelism=1",
        "rollout_tensor_parallelism=-1",
        "rl.num_generations=2",
        # ... with what replaces its downloads: a tiny randomly initialised
        # model (no checkpoint, no conversion), local data files, ...
        *MAXTEXT_TINY_ARGS,
        "convert_checkpoint_if_possible=False",
        "dataset_name=openai/gsm8k",
        "eval_dataset_name=openai/gsm8k",
        f"hf_train_files={inputs['train']}",
        f"hf_eval_files={inputs['test']}",
        f"reward_functions_path={inputs['rewards']}",
        "reward_functions=digit_share",
        # ... and lengths that fit the tiny model and the CPU.
        "max_prefill_predict_length=128",
        "max_target_length=144",
        "kv_cache_buffer=16",
        "learning_rate=1e-3",
        "use_pathways=False",
        "enable_checkpointing=False",
        "remat_policy=full",
        *CONFIGS[config]["argv"],
    ]


class ImportSnapshots(importlib.abc.MetaPathFinder):
    """Remembers what each module of the upstreams holds when its import
    ends (its functions and classes, and its classes' functions), so that
    `replaced_functions` can tell what was rebound after that. Delegates the
    finding to the rest of sys.meta_path (installed first in it)."""

    def __init__(self):
        self.snapshots: dict[str, dict] = {}

    def find_spec(self, fullname, path=None, target=None):
        if fullname.split(".")[0] not in UPSTREAMS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        exec_module = loader.exec_module

        def exec_and_snapshot(module):
            exec_module(module)
            self.snapshots[fullname] = _snapshot(module)

        loader.exec_module = exec_and_snapshot
        return spec


def _snapshot(module) -> dict:
    out = {}
    for attr, value in vars(module).items():
        if callable(value):
            out[attr] = value
            if isinstance(value, type) and value.__module__ == module.__name__:
                out[(attr,)] = {k: v for k, v in vars(value).items() if callable(v) or isinstance(v, (staticmethod, classmethod))}
    return out


SNAPSHOTS = ImportSnapshots()


def _origin(value) -> str:
    """The file whose code `value` (a function, method or class) is."""
    value = getattr(value, "__func__", value)
    code = getattr(value, "__code__", None)
    if code is not None:
        return code.co_filename
    module = sys.modules.get(getattr(value, "__module__", "") or "")
    return getattr(module, "__file__", None) or repr(value)[:80]


def replaced_functions() -> dict[str, list[str]]:
    """What was rebound in the upstreams' modules after their import ended: a
    function or class of a module, or a function of one of its classes, that
    is no longer the object the import left there (ImportSnapshots); and
    jax.lax functions (which the upstreams call) that are not jax's. Each with
    the file of the code now there. The CPU stand-ins (STAND_INS) apart."""
    import jax

    found = []
    for name, snapshot in sorted(SNAPSHOTS.snapshots.items()):
        module = sys.modules.get(name)
        if module is None:
            continue
        now = vars(module)
        for key, value in snapshot.items():
            if isinstance(key, tuple):
                cls = now.get(key[0])
                if not isinstance(cls, type):
                    continue
                for attr, method in value.items():
                    current = vars(cls).get(attr)
                    if current is not None and current is not method:
                        found.append((f"{name}.{key[0]}.{attr}", _origin(current)))
            elif key in now and now[key] is not value:
                found.append((f"{name}.{key}", _origin(now[key])))
    for attr in ("with_sharding_constraint", "top_k"):
        fn = getattr(jax.lax, attr)
        if not getattr(fn, "__module__", "").startswith("jax"):
            found.append((f"jax.lax.{attr}", _origin(fn)))
    return {"replaced": sorted(f"{n}: {where}" for n, where in found if n not in STAND_INS),
            "stand_ins": sorted(f"{n}: {where}" for n, where in found if n in STAND_INS)}


#: The names the CPU stand-ins replace (cpu_stand_ins), which replaced_functions
#: reports apart.
STAND_INS: set[str] = set()


#: The memory a CPU device says it has. Small: vLLM sizes its KV cache from
#: it (hbm_utilization_vllm of it, less the live arrays), and the interpreted
#: attention kernel's cost grows with the cache (1 GiB gave 26059 blocks).
HBM_STAND_IN = 16 << 20


def cpu_stand_ins(run: Run) -> None:
    """What the CPU lacks, stood in for (never on a TPU)."""
    if PLATFORM != "cpu":
        return
    import jax
    import tpu_inference.utils as tpu_utils

    def hbm_usage_bytes(devices):
        used: dict = {}
        for array in jax.live_arrays():
            for shard in array.addressable_shards:
                used[shard.data.device] = used.get(shard.data.device, 0) + shard.data.nbytes
        return [(used.get(d, 0), HBM_STAND_IN) for d in devices]

    tpu_utils.hbm_usage_bytes = hbm_usage_bytes
    STAND_INS.add("tpu_inference.utils.hbm_usage_bytes")
    run.result["stand_ins"].append(f"tpu_inference.utils.hbm_usage_bytes: live arrays against {HBM_STAND_IN >> 20} MiB a device")
    from maxtext_rl_overlay.smoke import pallas_interpret  # the TPU kernels in Pallas interpret mode

    run.result["stand_ins"] += [f"{pallas_interpret.LABEL}: {name}" for name in pallas_interpret.activate()]
    STAND_INS.update(f"{m}.get_tpu_version" for m in pallas_interpret._TPU_VERSION_USERS)
    STAND_INS.update(f"{m}.get_step_fn_compiler_options" for m in pallas_interpret._STEP_JITTERS)
    STAND_INS.add(f"{pallas_interpret._DEVICE_PUT_MODULE}.general_device_put")  # the runner's inputs, copied


#: Tunix's RLCluster.sync_weights, on a backend that is neither TPU nor GPU
#: (so on the CPU simulation), syncs under
#: `jax.transfer_guard_{host_to_device,device_to_host}("disallow_explicit")`
#: (rl_cluster.py, since 94b00481), and the sync puts scalars on the devices
#: (MaxText's unroll_qwen_scanned_weights' jnp.take with a Python int for
#: maxtext_on_vllm, Tunix's transfer_state_with_mappings for vllm_native),
#: which the guard refuses: no GRPO step would end on the CPU. On a TPU the
#: same code enters no guard. TRANSFER_GUARD_LEVEL is the level this stand-in
#: turns into TPU's branch (no guard), and only inside sync_weights.
TRANSFER_GUARD_LEVEL = "disallow_explicit"
TRANSFER_GUARD_STAND_IN = ("transfer-guard-as-on-tpu: RLCluster.sync_weights' CPU-only "
                           f"jax.transfer_guard_*({TRANSFER_GUARD_LEVEL!r}) entered as on a TPU (no guard)")


def sync_weights_as_on_tpu(sync_weights, entered: list[str]):
    """`sync_weights` (the RLCluster's bound method) run as on a TPU: the
    jax.transfer_guard_* context managers it enters at TRANSFER_GUARD_LEVEL
    are no-ops for the call (each such call is appended to `entered`, so the
    result shows the stand-in engaged). jax's functions are put back after
    each call; nothing of the upstreams is replaced."""
    import contextlib

    import jax

    if PLATFORM != "cpu":
        return sync_weights
    names = ("transfer_guard_host_to_device", "transfer_guard_device_to_host")

    def as_on_tpu(name, original):
        def guard(level):
            if level == TRANSFER_GUARD_LEVEL:
                entered.append(name)
                return contextlib.nullcontext()
            return original(level)

        return guard

    def call():
        originals = {name: getattr(jax, name) for name in names}
        for name, original in originals.items():
            setattr(jax, name, as_on_tpu(name, original))
        try:
            return sync_weights()
        finally:
            for name, original in originals.items():
                setattr(jax, name, original)

    return call


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
    parser.add_argument("--config", choices=sorted(CONFIGS), required=True)
    parser.add_argument("--upstream", action="store_true")
    parser.add_argument("--shims", action="store_true")
    args = parser.parse_args()
    simulate_v6e_8()  # before jax is imported
    os.environ.update(PROCESS_ENV)
    run = Run(args.result, args)
    os.environ.update(CONFIGS[args.config]["env"])
    if args.upstream:
        from support.fixes.unpatched import upstream_imports

        run.result["upstream_modules"] = upstream_imports(("google-tunix", "tpu-inference"))
    sys.meta_path.insert(0, SNAPSHOTS)  # before any upstream module is imported (it delegates to the finders after it)
    work = pathlib.Path(tempfile.mkdtemp(prefix="train-rl-"))
    try:
        drive(run, args, work)
    except Exception as error:  # noqa: BLE001 - reported to the test
        run.result["stopped"] = {"type": f"{type(error).__module__}.{type(error).__qualname__}",
                                 "message": str(error)[:3000], "frames": unpatched.traceback_frames(error, "upstream")}
        traceback.print_exc()
    run.write()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # a process that imported MaxText can hang in its atexit hooks


def drive(run: Run, args: argparse.Namespace, work: pathlib.Path) -> None:
    checks = run.result["checks"]
    with run.step("import"):
        import jax

        original_lax = (jax.lax.with_sharding_constraint, jax.lax.top_k)
        import numpy as np
        from flax import nnx
        from maxtext.configs import types
        from maxtext.trainers.post_train.rl import evaluate_rl, train_rl
        from maxtext.utils import model_creation_utils
        from transformers import AutoTokenizer

        run.result["adapter_replaced_jax_lax"] = (jax.lax.with_sharding_constraint, jax.lax.top_k) != original_lax
        if not args.shims:  # undo what importing MaxText's Tunix adapter did
            jax.lax.with_sharding_constraint, jax.lax.top_k = original_lax
        cpu_stand_ins(run)
    with run.step("inputs"):
        inputs = make_inputs(work, args.config)
    argv = argv_for(args.config, work, inputs)
    run.result["argv"] = argv[2:]
    import contextlib

    shims = train_rl._tpu_inference_compat_patches() if args.shims else contextlib.nullcontext()
    with shims:
        with run.step("setup_configs_and_devices"):
            trainer_config, sampler_config, trainer_devices, sampler_devices = model_creation_utils.setup_configs_and_devices(
                argv, config_class=types.RLConfig)
            model_tokenizer = AutoTokenizer.from_pretrained(trainer_config.tokenizer_path)
        with run.step("prepare_datasets"):
            train_dataset, test_dataset = train_rl.prepare_datasets(trainer_config, model_tokenizer)
        with run.step("create_models_and_meshes"):
            reference_model, reference_mesh, actor_model, actor_mesh, rollout_mesh = model_creation_utils.create_models_and_meshes(
                trainer_config, sampler_config, trainer_devices, sampler_devices, tokenizer_pad_id=model_tokenizer.pad_token_id)
        scale = CONFIGS[args.config].get("embedding_scale")
        if scale:  # both models: the reference stays the actor's initial state
            for model in (reference_model, actor_model):
                embedding = model.base.token_embedder.embedding
                embedding.value = embedding.value * scale
            run.result["embedding_scale"] = scale
        with run.step("create_rl_components"):  # starts vLLM and syncs the actor's weights into it
            rl_cluster, rl_trainer, _, reward_fns = train_rl.create_rl_components(
                trainer_config, sampler_config, sampler_devices, actor_model, actor_mesh,
                reference_model, reference_mesh, rollout_mesh, model_tokenizer)
        rollout = rl_cluster.rollout
        runner = rollout._sampler._model_runner
        model_config = rollout._sampler.llm.llm_engine.model_config
        run.result["rollout"] = {
            "mesh": {"shape": dict(runner.mesh.shape), "axis_types": [str(t) for t in runner.mesh.axis_types]},
            "requested_logprobs_mode": getattr(rl_cluster.cluster_config.rollout_config, "rollout_vllm_logprobs_mode", None),
            "max_logprobs": model_config.max_logprobs,
            "logprobs_mode": str(model_config.logprobs_mode),
            "architecture": type(runner.model).__name__ if hasattr(runner, "model") else None,
        }
        checks["replaced_after_engine_start"] = replaced_functions()

        def evaluate():
            return evaluate_rl.evaluate(trainer_config, test_dataset, rl_cluster=rl_cluster,
                                        num_passes=trainer_config.num_eval_passes, corr_lst=trainer_config.eval_corr_lst,
                                        make_lst=trainer_config.eval_make_lst, reward_fns=reward_fns)[0]

        with run.step("evaluate_before"):
            rollout.update_params(nnx.state(actor_model, nnx.Param))  # as rl_train does before its first evaluation
            checks["metrics_before"] = list(evaluate())
        with run.step("probe_before"):
            checks["probe_before"] = prompt_logprobs(rollout)
        # Host copies: the sync may hand these very buffers to the engine,
        # which deletes them when the next sync replaces them (maxtext_on_vllm).
        def host_params(model):
            return jax.tree.map(np.asarray, nnx.to_pure_dict(nnx.state(model.base, nnx.Param)))

        actor_initial, ref_initial = host_params(actor_model), host_params(reference_model)
        # Each GRPO step ends with RLCluster.sync_weights (the trained weights
        # into the rollout engine): its times, read on this one object (the
        # class is left as it is), give each step's seconds.
        grpo_steps: list[float] = run.result.setdefault("grpo_step_seconds", [])
        guards: list[str] = run.result.setdefault("transfer_guards_as_on_tpu", [])
        sync_weights = sync_weights_as_on_tpu(rl_cluster.sync_weights, guards)
        if PLATFORM == "cpu":
            run.result["stand_ins"].append(TRANSFER_GUARD_STAND_IN)

        def timed_sync_weights():
            sync_weights()
            grpo_steps.append(round(time.monotonic() - began[0], 1))
            began[0] = time.monotonic()
            run.write()

        rl_cluster.sync_weights = timed_sync_weights

        def compare_parameters():
            # MaxText's test's checks; made even where training stops (after
            # the actor's update, in the weight sync), to show how far it got.
            actor_final, ref_final = host_params(actor_model), host_params(reference_model)
            same = lambda a, b: bool(jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, a, b)))  # noqa: E731
            checks["reference_unchanged"] = same(ref_initial, ref_final)
            checks["actor_changed"] = not same(actor_initial, actor_final)
            checks["actor_differs_from_reference"] = not same(ref_final, actor_final)
            checks["replaced_after_train"] = replaced_functions()
            run.result["global_steps"] = rl_cluster.global_steps

        try:
            with run.step("train"):
                began = [time.monotonic()]
                rl_trainer.train(train_dataset)
        finally:
            with contextlib.suppress(Exception):
                with jax.transfer_guard("allow"):
                    compare_parameters()
        with run.step("probe_after"):
            checks["probe_after"] = prompt_logprobs(rollout)
        with run.step("evaluate_after"):
            checks["metrics_after"] = list(evaluate())
    run.result["finished"] = True


if __name__ == "__main__":
    sys.exit(main())
