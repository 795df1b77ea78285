"""One family's tiny MaxText actor synced into vLLM's engine as MaxText 0.2.4's
`train_rl` syncs it, and what the engine holds and generates after the sync.

    python -m support.programs.family_sync RESULT.json --family NAME --configuration vllm_native
        [--upstream DIST]... [--shims] [--model-impl IMPL] [--env NAME=VALUE]... [--set NAME=VALUE]...
        [--vllm-model JSON] [--dump REGEX] [--zero REGEX]

(tests/ and, for a worktree's tool, overlay/ on PYTHONPATH; one process a
run: MaxText, vLLM and JAX set process-wide state, and a process that
imported MaxText can hang at exit.)

The family (support/fixes/maxtext_models.py's VLLM_FAMILIES: the MaxText model
name, its tiny overrides, and the Hugging Face config vLLM reads) is built
by MaxText's own code through train_rl's own set-up, as
support/programs/train_rl_run.py calls it: `setup_configs_and_devices` on
rl.yml with the tiny model's argv, `create_models_and_meshes` (the actor:
scanned layers, wrapped in the Tunix adapter), then `create_rl_components`,
which builds the RolloutConfig, starts vLLM through MaxText's
`MaxTextVllmRollout` (Tunix's VllmSampler: `load_format="dummy"`, the
`device_indexes` of the rollout mesh, tensor parallelism over the 8 devices)
and makes the first weight sync (`MaxTextVllmSampler.load_checkpoint` ->
`update_params`). Before that, every parameter of the actor is moved (as
training moves it: + 0.01 N(0, 1), seeded), so that a target weight the
sync writes differs from its start value (a fresh model's norms are ones on
both sides), and, where the family says so, its embedding is scaled (a
random tied model repeats its last token: maxtext_models.ENGINE_EMBEDDING_SCALE).

Configurations (CONFIGURATIONS; train_rl's two):
- `vllm_native`: vLLM runs its own model for the family (tpu-inference's JAX
  model where it has one and MODEL_IMPL_TYPE resolves to it, else vLLM's
  torch model through torchax); MaxText picks its converter
  (`_create_model_converter`) or, without one, Tunix's
  `transfer_state_with_mappings` with MaxText's mapping for the family.
- `maxtext_on_vllm` (not here yet; the Configuration record says what it
  changes): MaxTextForCausalLM in the engine (`vllm_hf_overrides`, the
  `maxtext_config` of `vllm_additional_config`, NEW_MODEL_DESIGN=1),
  MaxText's pre-unroll, then Tunix's `transfer_state_directly`.

RESULT.json, written at each step's start and end (a killed run says which
step it was in: the last one without "done"):
- "steps": each step with its seconds; "stopped": the exception that ended
  the run, with the frames of installed packages it went through;
- "seconds": engine_start (vLLM's `LLM` inside Tunix's VllmSampler), sync
  (the first `update_params`), generate, reference;
- "engine": the vLLM model class the runner holds (and the torch model
  inside tpu-inference's wrapper), the runner's mesh and axis types,
  MODEL_IMPL_TYPE;
- "sync": MaxText's choice (its rollout's own `_sync_path_name`, the
  converter it built, whether its sampler syncs directly, the mapping),
  the Tunix transfer functions that ran, Tunix's warnings and errors
  (unmapped target and source keys), the actor's parameters no mapping
  names; "mapping_reach": the engine leaves the mapping reaches by Tunix's
  own matching, and "converter_reach": what MaxText's converter would write
  (both computed beside the sync, so known where the sync stops first);
- "leaves": every leaf of the engine's state (the runner's `state`) before
  and after the sync (after it raised, too): "stale" (equal to its value
  before the sync), "changed", with each leaf's variable type, shape and
  dtype, and counts;
- "generate": the engine's greedy tokens and logprobs for PROMPTS;
  "reference": MaxText's own forward of the actor (smoke's `Forward`) on
  the same prompts, greedily (its tokens, logprobs and margins), and its
  logprob of each token the engine chose, in the engine's context
  ("compare": tokens equal, max |logprob difference|).

`--upstream DIST`: that distribution as pinned (google-tunix, tpu-inference):
the series reverse-applied (support/fixes/unpatched.py), imported under the
modules' own names. `--shims`: MaxText's run-time shims active, as in a
train_rl run (see train_rl_run.py; without it the Tunix adapter's jax.lax
replacements are undone after MaxText is imported). `--model-impl`: sets
MODEL_IMPL_TYPE (train_rl leaves it unset: "auto"; MaxText's gpt-oss script
sets flax_nnx); `--env`: more environment (tpu-inference's USE_DENSE_MOE,
NEW_MODEL_DESIGN); `--set`: a train_rl setting after the run's
(enable_dp_attention=True); `--vllm-model`: the family's VllmModel fields
replaced for this run (a shape tried without editing the data); `--dump`:
the engine's leaves after the sync and the actor's parameters whose path
matches REGEX, as RESULT.engine-after-sync.npz and RESULT.actor.npz;
`--zero`: the actor's parameters whose path matches set to zero before the
sync (which weights carry a difference).

On the CPU simulation, stand-ins, each listed in "stand_ins" (never on a
TPU): train_rl_run's (support/fixes/train_rl_stand_ins.py: the TPU kernels
in Pallas interpret mode), the devices' memory sized for a small KV cache
(memory_stand_in), torchax's weight conversion handed a copy
(torchax_weights_copied) and the heads-of-64 kernel's block sizes looked up
for the simulated chip (hd64_kernel_on_the_simulated_chip).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import pathlib
import sys
import tempfile
import time
from typing import Any

from support.fixes import maxtext_models, train_rl_inputs, unpatched
from support.fixes.matrix import simulate_v6e_8
from support.fixes.train_rl_stand_ins import live_bytes
from support.programs import train_rl_run


@dataclasses.dataclass(frozen=True)
class Configuration:
    """One of train_rl's two rollout configurations, as this program sets it up."""

    name: str
    #: Process environment, set before anything is imported.
    env: dict[str, str]
    #: train_rl argv for the family (after the tiny model's).
    argv: Any  # (family) -> list[str]


def _native_argv(_family: maxtext_models.Family) -> list[str]:
    # train_rl's default: no vllm_hf_overrides, no maxtext_config: vLLM's own
    # model for config.json's architecture, MaxText's mapping or converter.
    return []


def _maxtext_argv(family: maxtext_models.Family) -> list[str]:
    # MaxText's model in vLLM, as MaxText's integration test asks for it
    # (train_rl_inputs.CONFIGS["maxtext_on_vllm"]): the adapter's architecture
    # and its maxtext_config, the family's tiny model; MaxTextVllmRollout then
    # syncs directly (its pre-unroll, then Tunix's transfer_state_directly).
    assert family.vllm is not None
    config = {"model_name": family.model_name, "log_config": "false", "override_model_config": True, **maxtext_dims(family),
              "weight_dtype": family.vllm.dtype, "dtype": family.vllm.dtype}
    return ["vllm_hf_overrides={architectures: ['MaxTextForCausalLM']}", "vllm_additional_config=" + json.dumps({"maxtext_config": config})]


CONFIGURATIONS = {
    "vllm_native": Configuration("vllm_native", {}, _native_argv),
    "maxtext_on_vllm": Configuration("maxtext_on_vllm", {"NEW_MODEL_DESIGN": "1"}, _maxtext_argv),
}

#: The prompts (token ids below the test tokenizer's 960) and how many tokens to generate.
PROMPTS = [[1, 5, 7, 9, 11, 13], [1, 600, 31, 415, 77, 260, 8, 512, 900, 3, 64]]
TOKENS = 8
#: train_rl's hbm_utilization_vllm here (train_rl_run's).
HBM_UTILIZATION = train_rl_inputs.HBM_UTILIZATION
#: The actor's parameters are moved by this times N(0, 1) before the sync (see the docstring).
MOVE = 0.01
#: The run's process environment: train_rl_run's (as MaxText's integration test sets it).
PROCESS_ENV = train_rl_run.PROCESS_ENV


class Run(train_rl_run.Run):
    """train_rl_run's RESULT.json (its `step`, its whole writes), headed by this run's arguments."""

    def __init__(self, out: pathlib.Path, **head: Any):  # noqa: D107 - the parent's reads train_rl_run's arguments
        self.out = out
        self.result: dict[str, Any] = {**head, "steps": [], "seconds": {}, "stand_ins": []}
        self.stood_in: set[str] = set()  # what the CPU stand-ins replace (train_rl_run.import_maxtext adds to it)


# -- the family's inputs ---------------------------------------------------------


def hf_config(family: maxtext_models.Family) -> dict[str, Any]:
    """config.json for vLLM: MaxText's own HF config of the model, the family's keys over it."""
    from maxtext.checkpoint_conversion.utils.hf_model_configs import HF_MODEL_CONFIGS

    assert family.vllm is not None
    config = HF_MODEL_CONFIGS[family.model_name].to_dict()
    if family.vllm.text_config:
        config = dict(config["text_config"])
    for key in ("transformers_version", "_name_or_path", "architectures", "auto_map", "dtype", "torch_dtype"):
        config.pop(key, None)
    config.update(family.vllm.hf)
    config["num_hidden_layers"] = family.layers
    if isinstance(config.get("layer_types"), list):
        config["layer_types"] = config["layer_types"][: family.layers]
    return config


def maxtext_dims(family: maxtext_models.Family) -> dict[str, Any]:
    """The actor's MaxText overrides: the family's, the engine run's dims over them."""
    assert family.vllm is not None
    return {**family.overrides, **family.vllm.dims, "base_num_decoder_layers": family.layers}


def argv_for(family: maxtext_models.Family, configuration: Configuration, work: pathlib.Path, inputs: dict) -> list[str]:
    """train_rl's argv (train_rl_run's, train_rl_inputs.argv_for) for the family's tiny model."""
    assert family.vllm is not None
    dims = [f"{k}={v}" for k, v in maxtext_dims(family).items()]
    return [
        *train_rl_inputs.base_argv(family.model_name, work, inputs, batches=1),
        "override_model_config=True", *dims,
        # the family's dtype (VllmModel.dtype: float32 but where the engine's model cannot)
        f"weight_dtype={family.vllm.dtype}", f"dtype={family.vllm.dtype}",
        *([] if family.scan_layers else ["scan_layers=False"]),  # the actor as the family builds it
        *train_rl_inputs.data_argv(inputs),
        "max_prefill_predict_length=32", "max_target_length=48", "kv_cache_buffer=16",
        "use_pathways=False", "enable_checkpointing=False",
        f"run_name=family_sync_{family.name}",
        *configuration.argv(family),
    ]


# -- recorders around MaxText's and Tunix's sync (nothing replaced) ----------------


def flat_leaves(state: Any) -> dict[str, tuple[str, Any]]:
    """path -> (variable type, host copy) of every leaf of the runner's state
    (an nnx.State for tpu-inference's JAX models, a dict of arrays for vLLM's
    torch models through torchax)."""
    import jax
    import numpy as np

    def host(value: Any) -> Any:
        if hasattr(value, "dtype") and jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
            value = jax.random.key_data(value)
        return np.array(value)

    out = {}
    if hasattr(state, "flat_state"):
        from flax import nnx

        for path, variable in nnx.to_flat_state(state):
            value = variable.get_value() if hasattr(variable, "get_value") else getattr(variable, "value", variable)
            out[".".join(str(p) for p in path)] = (type(variable).__name__, host(value))
    else:
        for path, value in jax.tree_util.tree_flatten_with_path(state)[0]:
            out[jax.tree_util.keystr(path, simple=True, separator=".")] = (type(value).__name__, host(value))
    return out


def compare_leaves(before: dict, after: dict) -> dict[str, Any]:
    import numpy as np

    leaves: dict[str, dict[str, Any]] = {}
    stale: list[str] = []
    changed: list[str] = []
    for path, (kind, old) in before.items():
        entry: dict[str, Any] = {"type": kind, "shape": list(old.shape), "dtype": str(old.dtype)}
        if path not in after:
            entry["state"] = "gone"
        else:
            new = after[path][1]
            same = old.shape == new.shape and old.dtype == new.dtype and bool(np.array_equal(old, new, equal_nan=True))
            entry["state"] = "stale" if same else "changed"
            (stale if same else changed).append(path)
        leaves[path] = entry
    params = [p for p, e in leaves.items() if e["type"] in ("Param", "Parameter", "ArrayImpl", "Array")]
    return {
        "count": len(leaves), "stale_count": len(stale), "changed_count": len(changed),
        "stale": stale, "changed": changed, "new_after_sync": sorted(set(after) - set(before)),
        "param_like_count": len(params), "stale_param_like": [p for p in stale if p in params],
        "by_leaf": leaves,
    }


class TunixMessages(logging.Handler):
    """Tunix's warnings and errors during the sync (absl logging), e.g.
    'No mapping for flat states' (target leaves no mapping reaches) and 'No
    mapping for source key' (actor parameters skipped)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []
        self.active = False

    def emit(self, record: logging.LogRecord) -> None:
        if self.active:
            self.messages.append(f"{record.levelname}: {record.getMessage()[:4000]}")


class SyncRecorder:
    """Wraps MaxTextVllmSampler's __init__ (the engine start) and update_params
    (the sync) on the class, and Tunix's two transfer functions in their
    module, to time them and to snapshot the engine's state around the first
    sync. Each wrapper calls the original as it was called."""

    def __init__(self, run: Run, dump: str | None = None) -> None:
        self.run, self.dump = run, dump
        self.sync: dict[str, Any] = run.result.setdefault("sync", {})
        self.engine: dict[str, Any] = run.result.setdefault("engine", {})
        self.messages = TunixMessages()
        self.transfers: list[str] = self.sync.setdefault("tunix_transfers", [])

    def install(self) -> None:
        from maxtext.integration.vllm import maxtext_vllm_rollout as mvr
        from tunix.generate import utils as tunix_utils

        logging.getLogger("absl").addHandler(self.messages)
        recorder = self
        sampler_init, update_params = mvr.MaxTextVllmSampler.__init__, mvr.MaxTextVllmSampler.update_params

        def timed_init(sampler: Any, *args: Any, **kwargs: Any) -> None:
            began = time.monotonic()
            recorder.run.result["at"] = "engine start (MaxTextVllmSampler.__init__: Tunix's VllmSampler, vLLM's LLM)"
            recorder.run.write()
            try:
                sampler_init(sampler, *args, **kwargs)
            finally:
                recorder.run.result["seconds"]["engine_start"] = round(time.monotonic() - began, 2)
                recorder.run.write()

        def recorded_update(sampler: Any, *args: Any, **kwargs: Any) -> Any:
            if "leaves" in recorder.run.result:  # a later sync: timed only
                return update_params(sampler, *args, **kwargs)
            recorder.before_sync(sampler, args[0] if args else kwargs.get("updated_weights"))
            began = time.monotonic()
            recorder.messages.active = True
            try:
                return update_params(sampler, *args, **kwargs)
            finally:  # the leaves even where the sync raised: what it wrote before
                recorder.messages.active = False
                recorder.run.result["seconds"]["sync"] = round(time.monotonic() - began, 2)
                recorder.sync["tunix_messages"] = recorder.messages.messages
                recorder.after_sync(sampler)

        mvr.MaxTextVllmSampler.__init__ = timed_init
        mvr.MaxTextVllmSampler.update_params = recorded_update
        for name in ("transfer_state_with_mappings", "transfer_state_directly"):
            setattr(tunix_utils, name, self.counted(name, getattr(tunix_utils, name)))

    def counted(self, name: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.transfers.append(name)
            return fn(*args, **kwargs)

        return call

    def before_sync(self, sampler: Any, weights: Any) -> None:
        """The engine as it started (its model, mesh) and MaxText's choice of
        sync, then the state's leaves before the sync."""
        import numpy as np

        self.run.result["at"] = "first sync (MaxTextVllmSampler.update_params)"
        runner = sampler._model_runner
        model = getattr(runner, "model", None)
        inner = getattr(getattr(model, "model", None), "vllm_model", None)
        self.engine.update({
            "runner_model": type(model).__name__ if model is not None else None,
            "vllm_torch_model": type(inner).__name__ if inner is not None else None,
            "architectures": list(getattr(runner.model_config.hf_config, "architectures", None) or []),
            "model_impl_type": os.environ.get("MODEL_IMPL_TYPE", "auto (unset)"),
            "mesh": {str(k): int(v) for k, v in runner.mesh.shape.items()},
            "mesh_axis_types": [str(t) for t in runner.mesh.axis_types],
            "mesh_devices": [int(d.id) for d in np.asarray(runner.mesh.devices).flat],
            "state_type": type(runner.state).__name__,
            "tpu_backend_type": os.environ.get("TPU_BACKEND_TYPE"),
        })
        mappings = dict(getattr(sampler, "to_hf_key_mappings", None) or {})
        self.sync.update({
            "maxtext_converter": type(sampler._converter).__name__ if getattr(sampler, "_converter", None) is not None else None,
            "maxtext_direct_sync": bool(getattr(sampler, "_direct_maxtext_sync", False)),
            "mapping_entries": len(mappings),
            "mapping": {k: list(v[0:1]) + [list(v[1]) if v[1] is not None else None] for k, v in mappings.items()},
            "hook_fns": sorted((getattr(sampler, "to_hf_hook_fns", None) or {}).keys()),
        })
        self.before = flat_leaves(sampler.transformer_state)
        if mappings:
            self.sync["mapping_reach"] = mapping_reach(mappings, self.before)
        if getattr(sampler, "_converter", None) is not None and getattr(sampler._converter, "rules", None):
            self.sync["converter_reach"] = converter_reach(sampler._converter, weights, self.before)
        self.run.write()

    def after_sync(self, sampler: Any) -> None:
        after = flat_leaves(sampler.transformer_state)
        self.run.result["leaves"] = compare_leaves(self.before, after)
        if self.dump:
            dump(self.run, "engine-after-sync", {k: v for k, (_, v) in after.items()}, self.dump)
        self.run.write()


def torchax_weights_copied(run: Run) -> None:
    """On the CPU simulation, tpu-inference's unquantized weight loading for
    vLLM's torch models (layers/vllm/quantization/unquantized.py) hands each
    weight to the devices with torchax's `t2j(tensor, use_dlpack=False)`
    (`jnp.asarray(tensor.numpy())`), then frees the torch tensor
    (`untyped_storage().resize_(0)`). On a TPU that is a copy into HBM; on
    CPU devices jax keeps the numpy view of the torch storage (no copy), and
    torch refuses the resize ("Trying to resize storage that is not
    resizable"): every torch model stops at engine start. The stand-in hands
    t2j a copy of the tensor, as the transfer to a TPU copies it."""
    if not run.result["stand_ins"]:
        return  # not the CPU simulation
    import tpu_inference.layers.vllm.quantization.unquantized as unquantized

    t2j = unquantized.t2j

    def t2j_of_a_copy(tensor: Any, use_dlpack: bool = True) -> Any:
        return t2j(tensor.clone() if hasattr(tensor, "clone") else tensor, use_dlpack=use_dlpack)

    unquantized.t2j = t2j_of_a_copy
    name = f"{unquantized.__name__}.t2j"
    run.stood_in.add(name)
    run.result["stand_ins"].append(f"torchax-weights-copied: {name} converts a copy of each torch weight (CPU devices "
                                   "alias the numpy view, which pins the torch storage the loader frees)")


def hd64_kernel_on_the_simulated_chip(run: Run) -> None:
    """On the CPU simulation, the attention kernel for heads of 64
    (ragged_paged_attention v3's kernel_hd64, gpt-oss's) looks its block sizes
    up by `tpu_inference.utils.get_device_name()`, which raises on CPU
    devices ("Expected TPU devices"): the lookup is told the simulated chip
    (as pallas_interpret tells the main kernel its TPU version); the kernel
    then runs interpreted like the main one."""
    if not run.result["stand_ins"]:
        return
    import tpu_inference.kernels.ragged_paged_attention.v3.tuned_block_sizes_hd64 as tuned

    tuned.get_device_name = lambda num_devices=None: "TPU v6e" + (f"-{num_devices}" if num_devices else "")
    name = f"{tuned.__name__}.get_device_name"
    run.stood_in.add(name)
    run.result["stand_ins"].append(f"hd64-block-sizes-for-the-simulated-chip: {name} answers TPU v6e")


def dump(run: Run, what: str, arrays: dict[str, Any], pattern: str) -> None:
    """The arrays whose path matches `pattern` (a regular expression), beside
    RESULT.json as RESULT.WHAT.npz (--dump: to check a leaf's value by hand)."""
    import re

    import numpy as np

    path = run.out.with_name(f"{run.out.stem}.{what}.npz")
    np.savez(path, **{k: np.asarray(v) for k, v in arrays.items() if re.search(pattern, k)})
    run.result.setdefault("dumps", []).append(path.name)


def mapping_reach(mappings: dict[str, Any], leaves: dict[str, Any]) -> dict[str, Any]:
    """Which of the engine's leaves MaxText's mapping reaches, by Tunix's own
    matching (`build_flat_dict`, which transfer_state_with_mappings runs on
    the target's flat state) on the leaf names: computed here, beside the
    sync, so that it is known where the sync itself stops first."""
    from tunix.generate import utils as tunix_utils

    flat = [(tuple(path.split(".")), None) for path in leaves]
    matched = tunix_utils.build_flat_dict(flat, mappings)
    reached: dict[str, str] = {}
    for source, (_, paths, _) in matched.items():
        for path in paths if isinstance(paths, list) else [paths]:
            reached[path] = source
    return {
        "targets": len(leaves), "reached": len(reached),
        "unreached_targets": sorted(set(leaves) - set(reached)),
        # (MaxText's sources name scanned stacks, without wildcards: build_flat_dict keys them as they are)
        "sources_reaching_nothing": sorted(k for k in mappings if k not in matched),
    }


def converter_reach(converter: Any, weights: Any, leaves: dict[str, Any]) -> dict[str, Any]:
    """What MaxText's converter (a WeightConverter with a rule table) makes of
    the sync's source, had the sync called it: its output names and shapes
    against the engine's leaves. Computed here, beside the sync (the pinned
    Tunix's update_params never calls a converter)."""
    import jax
    from flax.traverse_util import flatten_dict

    try:
        out = flatten_dict(converter.convert(weights, target_state=None), sep=".")
    except Exception as error:  # noqa: BLE001 - what it raised is the finding
        return {"raised": f"{type(error).__name__}: {str(error)[:1000]}"}
    shapes = {k: tuple(jax.numpy.shape(v)) for k, v in out.items()}
    reached = [k for k in shapes if k in leaves and shapes[k] == leaves[k][1].shape]
    return {
        "outputs": len(shapes), "targets": len(leaves), "reached_same_shape": len(reached),
        "shape_mismatches": {k: [list(shapes[k]), list(leaves[k][1].shape)] for k in shapes
                             if k in leaves and shapes[k] != leaves[k][1].shape},
        "outputs_without_target": sorted(k for k in shapes if k not in leaves),
        "targets_not_produced": sorted(k for k in leaves if k not in shapes),
    }


def actor_params(actor: Any) -> list[str]:
    from flax import nnx

    return [".".join(str(p) for p in path) for path, _ in nnx.to_flat_state(nnx.state(actor, nnx.Param))]


# -- main ----------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("result", type=pathlib.Path)
    parser.add_argument("--family", choices=sorted(n for n, f in maxtext_models.VLLM_FAMILIES.items() if f.vllm), required=True)
    parser.add_argument("--configuration", choices=sorted(CONFIGURATIONS), required=True)
    parser.add_argument("--upstream", action="append", default=[], choices=["google-tunix", "tpu-inference"])
    parser.add_argument("--shims", action="store_true")
    parser.add_argument("--model-impl", choices=["auto", "flax_nnx", "vllm"])
    parser.add_argument("--dump", metavar="REGEX",
                        help="write the engine's leaves after the sync and the actor's parameters whose path matches")
    parser.add_argument("--vllm-model", type=json.loads, default={}, metavar="JSON",
                        help="fields of the family's VllmModel replaced, e.g. "
                             "'{\"dims\": {\"base_num_kv_heads\": 8}, \"hf\": {\"num_key_value_heads\": 8}}' "
                             "(dicts merged over the family's)")
    parser.add_argument("--zero", metavar="REGEX", help="the actor's parameters whose path matches set to zero before "
                        "the sync (a diagnosis: which weights carry a difference)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                        help="a train_rl setting after the run's own (e.g. enable_dp_attention=True)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="more of the process's environment (e.g. tpu-inference's USE_DENSE_MOE=1)")
    args = parser.parse_args()
    family, configuration = maxtext_models.VLLM_FAMILIES[args.family], CONFIGURATIONS[args.configuration]
    if args.vllm_model:
        assert family.vllm is not None
        fields: dict[str, Any] = {k: ({**getattr(family.vllm, k), **v} if isinstance(v, dict) else v)
                                  for k, v in args.vllm_model.items()}
        family = dataclasses.replace(family, vllm=dataclasses.replace(family.vllm, **fields))
    simulate_v6e_8()  # before jax is imported
    os.environ.update(PROCESS_ENV)
    os.environ.update(configuration.env)
    if args.model_impl:
        os.environ["MODEL_IMPL_TYPE"] = args.model_impl
    os.environ.update(dict(item.split("=", 1) for item in args.env))
    run = Run(args.result, family=family.name, model_name=family.model_name, layers=family.layers,
              configuration=configuration.name, upstream=args.upstream, shims=args.shims, model_impl=args.model_impl,
              env=args.env, settings=args.set, vllm_model=args.vllm_model, zero=args.zero)
    if args.upstream:
        run.result["upstream_modules"] = unpatched.upstream_imports(tuple(args.upstream))
    work = pathlib.Path(tempfile.mkdtemp(prefix="family-sync-"))

    def steps() -> None:
        drive(run, family, configuration, args.shims, work, args.dump, args.set, args.zero)
        run.result["finished"] = True

    train_rl_run.run_and_exit(run, steps)


def drive(run: Run, family: maxtext_models.Family, configuration: Configuration, shims: bool, work: pathlib.Path,
          dump_pattern: str | None = None, settings: list[str] | None = None, zero: str | None = None) -> None:
    with run.step("import"):
        train_rl_run.import_maxtext(run, shims)
        memory_stand_in(run)
        torchax_weights_copied(run)
        hd64_kernel_on_the_simulated_chip(run)
    with run.step("inputs"):
        inputs = train_rl_inputs.make_inputs(work, "vllm_native")  # the tokenizer, data and reward files
        config = hf_config(family)
        (inputs["tokenizer"] / "config.json").write_text(json.dumps(config, indent=1))
        run.result["hf_config"] = config
    argv = argv_for(family, configuration, work, inputs) + list(settings or [])
    run.result["argv"] = argv[2:]

    recorder = SyncRecorder(run, dump_pattern)
    recorder.install()
    # MaxText 0.2.4's train_rl shims (the overlay's MaxText deletes them: support/fixes/maxtext_shims.py has 0.2.4's)
    shim_context = _train_rl_shims() if shims else contextlib.nullcontext()
    with shim_context:
        rollout, actor, actor_mesh, trainer_config = set_up(run, family, argv, zero)
        if dump_pattern:
            from flax import nnx

            flat = nnx.to_flat_state(nnx.state(actor, nnx.Param))
            dump(run, "actor", {".".join(str(p) for p in k): v[...] for k, v in flat}, dump_pattern)
        generate(run, rollout)
        reference(run, actor, actor_mesh, trainer_config)


def set_up(run: Run, family: maxtext_models.Family, argv: list[str], zero: str | None = None) -> tuple[Any, Any, Any, Any]:
    """train_rl's set-up (train_rl_run's calls): the configs, the models and
    meshes, the actor moved, then the RL components (the engine start and the
    first sync)."""
    import jax
    from flax import nnx
    from maxtext.configs import types
    from maxtext.trainers.post_train.rl import train_rl
    from maxtext.utils import model_creation_utils
    from transformers import AutoTokenizer

    with run.step("setup_configs_and_devices"):
        trainer_config, sampler_config, trainer_devices, sampler_devices = model_creation_utils.setup_configs_and_devices(
            argv, config_class=types.RLConfig)
        tokenizer = AutoTokenizer.from_pretrained(trainer_config.tokenizer_path)
    with run.step("create_models_and_meshes"):
        reference_model, reference_mesh, actor, actor_mesh, rollout_mesh = model_creation_utils.create_models_and_meshes(
            trainer_config, sampler_config, trainer_devices, sampler_devices, tokenizer_pad_id=tokenizer.pad_token_id)
        run.result["actor_params"] = actor_params(actor)
    with run.step("move_actor"):
        assert family.vllm is not None
        if family.vllm.embedding_scale:
            embedding = actor.base.token_embedder.embedding
            embedding.value = embedding.value * family.vllm.embedding_scale
            run.result["embedding_scale"] = family.vllm.embedding_scale
        params = nnx.state(actor, nnx.Param)
        keys = iter(jax.random.split(jax.random.key(7), len(jax.tree.leaves(params))))
        nnx.update(actor, jax.tree.map(lambda p: p + MOVE * jax.random.normal(next(keys), p.shape, p.dtype), params))
        if zero:  # a diagnosis: which weights carry a difference
            import re

            zeroed = []
            for path, variable in nnx.to_flat_state(nnx.state(actor, nnx.Param)):
                name = ".".join(str(p) for p in path)
                if re.search(zero, name):
                    variable.value = jax.numpy.zeros_like(variable.value)
                    zeroed.append(name)
            run.result["zeroed"] = zeroed
    with run.step("create_rl_components"):  # starts vLLM and syncs the actor's weights into it
        cluster, _, _, _ = train_rl.create_rl_components(
            trainer_config, sampler_config, sampler_devices, actor, actor_mesh, reference_model, reference_mesh,
            rollout_mesh, tokenizer)
    rollout = cluster.rollout
    sync = run.result["sync"]
    sync["maxtext_sync_path_name"] = rollout._sync_path_name() if hasattr(rollout, "_sync_path_name") else None
    mappings = set((getattr(rollout._sampler, "to_hf_key_mappings", None) or {}).keys())
    sync["actor_params_without_mapping"] = [p for p in run.result["actor_params"] if mappings and p not in mappings]
    run.write()
    return rollout, actor, actor_mesh, trainer_config


#: The engine's KV cache on the CPU simulation, a device (see memory_stand_in).
KV_CACHE_STAND_IN = 8 << 20


def memory_stand_in(run: Run) -> None:
    """On the CPU simulation, the memory each device says it has
    (tpu_inference.utils.hbm_usage_bytes, which the engine sizes its KV
    cache from: hbm_utilization_vllm of it, less the live arrays): at each
    call, what the device's live arrays hold plus KV_CACHE_STAND_IN, over
    hbm_utilization_vllm. So a family of any size (the trainer's models and
    the engine's on the same 8 devices, vLLM's torch models' rotary tables
    replicated on each) gets the same small cache: the interpreted attention
    kernel's cost grows with it. Replaces train_rl_stand_ins' fixed 16 MiB."""
    import tpu_inference.utils as tpu_utils

    if not run.result["stand_ins"]:
        return  # not the CPU simulation

    def hbm_usage_bytes(devices: Any) -> list[tuple[int, int]]:
        return [(used, int((used + KV_CACHE_STAND_IN) / HBM_UTILIZATION)) for used in live_bytes(devices)]

    tpu_utils.hbm_usage_bytes = hbm_usage_bytes
    run.result["stand_ins"].append(f"tpu_inference.utils.hbm_usage_bytes: live arrays, against the live arrays plus "
                                   f"{KV_CACHE_STAND_IN >> 20} MiB over {HBM_UTILIZATION} (this run's replacement)")


def generate(run: Run, rollout: Any) -> None:
    from vllm import SamplingParams

    with run.step("generate"):
        began = time.monotonic()
        params = SamplingParams(temperature=0.0, max_tokens=TOKENS, logprobs=1, ignore_eos=True, detokenize=False)
        outputs = rollout._sampler.llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
        run.result["seconds"]["generate"] = round(time.monotonic() - began, 2)
        run.result["generate"] = [
            {"prompt": p, "tokens": list(o.outputs[0].token_ids),
             "logprobs": [lp[t].logprob for t, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs, strict=True)]}
            for p, o in zip(PROMPTS, outputs, strict=True)]


def reference(run: Run, actor: Any, mesh: Any, config: Any) -> None:
    """MaxText's own forward of the actor (smoke's Forward): its greedy
    decoding, and its logprob of each token the engine chose."""
    from maxtext_rl_overlay.smoke.maxtext_model import Forward, reference_greedy

    with run.step("reference"):
        began = time.monotonic()
        forward = Forward(actor.base, mesh, config)
        greedy = reference_greedy(forward, PROMPTS, TOKENS)
        engine = run.result.get("generate") or []
        compare = []
        for ref, gen in zip(greedy, engine, strict=True):
            prompt = gen["prompt"]
            lp = forward(prompt + gen["tokens"])
            forced = [float(lp[len(prompt) - 1 + i][t]) for i, t in enumerate(gen["tokens"])]
            ref["logprobs_of_engine_tokens"] = forced
            compare.append({"tokens_equal": ref["tokens"] == gen["tokens"],
                            "max_logprob_difference": max(abs(a - b) for a, b in zip(forced, gen["logprobs"], strict=True)),
                            "min_margin": min(ref["margins"])})
        run.result["seconds"]["reference"] = round(time.monotonic() - began, 2)
        run.result["reference"] = greedy
        run.result["compare"] = {
            "tokens_equal": all(c["tokens_equal"] for c in compare),
            "max_logprob_difference": max(c["max_logprob_difference"] for c in compare),
            "min_margin": min(c["min_margin"] for c in compare),
            "per_prompt": compare,
        }


def _train_rl_shims():
    """What MaxText 0.2.4's rl_train ran inside (its _tpu_inference_compat_patches)."""
    from support.fixes import maxtext_shims

    return maxtext_shims.train_rl_patches()


if __name__ == "__main__":
    sys.exit(main())
