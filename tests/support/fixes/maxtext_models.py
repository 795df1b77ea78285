"""Tiny real MaxText 0.2.4 models for the weight-sync tests, built by MaxText's own code.

* The actor: `model_creation_utils.from_pretrained(config, devices=...,
  wrap_with_tunix_adapter=True)`, as `create_models_and_meshes` builds it for
  train_rl (`scan_layers=True`, fsdp over all the devices).
* The rollout target: the model `MaxTextForCausalLM.load_weights` builds (its
  own method, called on an instance whose `maxtext_config` is what
  `generate_maxtext_config` makes of `inference/vllm.yml`: unrolled
  `layers_0..N-1`, kv heads raised to the tensor parallelism), split as
  tpu-inference's model loader splits it (`nnx.split`), on a data=2 x model=4
  mesh (on 8 devices; elsewhere every device on model: the TPU cell's chips). `generate_maxtext_config` itself needs a vLLM config and a TPU
  (`pltpu.get_tpu_info()`), so its two overrides are given here.

Also here: the sync sources as MaxText 0.2.4 and Tunix hand them to
`transfer_state_directly`, and the value each target leaf must receive,
derived from the source by MaxText's own unroll where MaxText has one.

Needs maxtext (the matrix's MaxText cell); `AVAILABLE` says whether it is there.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re

# The tiny qwen3 MaxText's model runs in the engine (and its reference) is the
# tool's, for `smoke`; the tests read it there.
from maxtext_rl_overlay.smoke.maxtext_model import (  # noqa: F401 - re-exported for the tests
    ENGINE_DIMS,
    ENGINE_EMBEDDING_SCALE,
    ENGINE_HF_CONFIG,
    ENGINE_HF_DIMS,
    ENGINE_MODEL_NAME,
    ENGINE_PARAMS,
    Forward,
    engine_additional_config,
    reference_greedy,
    write_engine_checkpoint,
)
from maxtext_rl_overlay.smoke.maxtext_model import (
    OFFLINE as _OFFLINE,
)
from maxtext_rl_overlay.smoke.maxtext_model import (
    configs_dir as _configs_dir,
)

AVAILABLE = importlib.util.find_spec("maxtext") is not None

# Tiny dims: the structure (layer pattern, rng state, MoE) is what matters.
# kv heads = the target's tensor parallelism, so no head is replicated and every
# target weight is exactly a source slice.
_TINY = dict(
    base_emb_dim=32, base_num_query_heads=4, base_num_kv_heads=4, head_dim=8, base_mlp_dim=64,
    vocab_size=128, max_target_length=32, max_prefill_predict_length=16, **_OFFLINE,
    run_name="weight-sync", weight_dtype="float32", dtype="float32",
)


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    model_name: str
    layers: int
    overrides: dict = dataclasses.field(default_factory=dict)


FAMILIES = {
    # llama3.1-8b shrunk to 4 layers: the target's layers share the decoder's nnx.Rngs.
    "llama3": Family("llama3", "llama3.1-8b", 4),
    # gemma3-4b's pattern of 6 layers (5 local, 1 global) shrunk to 14 layers:
    # two scanned repeats of the pattern plus 2 remainder layers.
    "gemma3": Family("gemma3", "gemma3-4b", 14),
    # qwen3-30b-a3b (MoE) shrunk to 4 layers of 4 experts, dense matmuls on CPU.
    "qwen3-moe": Family("qwen3-moe", "qwen3-30b-a3b", 4, dict(
        num_experts=4, num_experts_per_tok=2, base_moe_mlp_dim=64, megablox=False, sparse_matmul=False,
        capacity_factor=-1)),
}


def actor(family: Family, **dims):
    """The train_rl actor (TunixMaxTextAdapter around the scanned model) and its mesh;
    `dims` replace the tiny ones (the benchmarks' larger models)."""
    import jax
    from maxtext.configs import pyconfig
    from maxtext.utils import model_creation_utils

    config = pyconfig.initialize(
        ["", os.path.join(_configs_dir(), "base.yml")],
        **(_TINY | dims), **family.overrides, model_name=family.model_name, base_num_decoder_layers=family.layers,
        scan_layers=True, attention="dot_product", ici_fsdp_parallelism=len(jax.devices()), init_weights_seed=0,
    )
    return model_creation_utils.from_pretrained(config, devices=jax.devices(), wrap_with_tunix_adapter=True)


def target_mesh_shape(devices: int) -> tuple[int, int]:
    """The target's (data, model) mesh: 2 x 4 on 8 devices (a v6e-8 or its
    simulation), all on model elsewhere (the TPU cell's chips, one included)."""
    return (2, devices // 2) if devices == 8 else (1, devices)


def target(family: Family, **dims):
    """The rollout model (a MaxTextForCausalLM after load_weights) and its state, as the runner holds it;
    `dims` as actor's."""
    import jax
    import numpy as np
    from flax import nnx
    from jax.sharding import Mesh
    from maxtext.common.common_types import MODEL_MODE_AUTOREGRESSIVE
    from maxtext.configs import pyconfig
    from maxtext.integration.vllm.maxtext_vllm_adapter.adapter import MaxTextForCausalLM

    data, tensor = target_mesh_shape(len(jax.devices()))
    config = pyconfig.initialize(
        ["", os.path.join(_configs_dir(), "inference", "vllm.yml")],
        **(_TINY | dims), **family.overrides, model_name=family.model_name, base_num_decoder_layers=family.layers,
        ici_data_parallelism=data, ici_tensor_parallelism=tensor,
        # generate_maxtext_config's: prefused MoE gate/up at TP > 1 (what
        # prepare_direct_sync_additional_config asks for) ...
        **({"prefuse_moe_weights": True} if family.overrides.get("num_experts", 1) > 1 else {}),
    )
    mesh = Mesh(np.array(jax.devices()).reshape(data, 1, tensor, 1, 1), config.mesh_axes)

    class LoadedMaxTextForCausalLM(MaxTextForCausalLM):
        """MaxTextForCausalLM with the config generate_maxtext_config would give; load_weights is its own."""

        def __init__(self):  # noqa: D107 - the parent's needs a vLLM config
            self.maxtext_config = config
            self.mesh = mesh
            self.model_mode = MODEL_MODE_AUTOREGRESSIVE
            self.model = None
            self.load_weights(jax.random.key(1))  # not the actor's seed: a stale weight differs

    with mesh:
        model = LoadedMaxTextForCausalLM()
    _, state = nnx.split(model)
    return state


# -- the sources, as each sync path hands them over ---------------------------


def param_state(actor_model):
    """What MaxText 0.2.4 syncs (train_rl, MaxTextVllmRollout, RLCluster.sync_weights)."""
    from flax import nnx

    return nnx.state(actor_model, nnx.Param)


def maxtext_pre_unroll(weights):
    """MaxTextVllmSampler.update_params's direct-sync pre-unroll (MaxText's own functions)."""
    from maxtext.integration.vllm import maxtext_vllm_rollout as mvr

    weights = mvr.unroll_qwen_scanned_weights(weights, scan_axis=1, pattern_length=None)
    return mvr.unroll_gemma_scanned_weights(weights)


# -- what each target leaf must receive ----------------------------------------


_LAYER = re.compile(r"^layers_(\d+)$")


def per_layer_rng_source(target_path: tuple, family: Family) -> tuple[tuple, int | None]:
    """(actor state path, layer index or None) of the rng leaf that this target
    layer leaf stands for: the same Variable of the same layer, found by the
    layout MaxText's scan gives it (written here: MaxText's unroll drops rng
    state). Rng state is stacked on axis 0, Flax NNX's axis for non-parameters.
    Gemma3 is scanned in blocks of its attention pattern, then remainder layers."""
    i = next(j for j, part in enumerate(target_path) if isinstance(part, str) and _LAYER.match(part))
    layer = _LAYER.match(target_path[i])
    assert layer is not None  # (found by it above)
    k = int(layer.group(1))
    prefix, suffix = ("base",) + target_path[1:i], target_path[i + 1:]
    if family.name == "gemma3":
        from maxtext.models.gemma3 import GEMMA3_ATTENTION_PATTERN

        slots = len(GEMMA3_ATTENTION_PATTERN)
        repeats = family.layers // slots
        if k < repeats * slots:
            return prefix + ("layers", f"layers_{k % slots}") + suffix, k // slots
        return prefix + ("layers_remainder", f"layers_{k - repeats * slots}") + suffix, None
    return prefix + ("layers",) + suffix, k


def expected_params(actor_model, family: Family, target_state) -> dict:
    """Target path (under the runner's `model`) -> the value its nnx.Param must hold:
    the actor's parameters unrolled by MaxText's own pre-unroll, which train_rl
    relies on, and MoE gate/up fused for the prefused target by MaxText's own
    checkpoint-loading fusion (references no one here wrote)."""
    import numpy as np
    from flax import nnx
    from flax.traverse_util import flatten_dict
    from maxtext.utils import model_creation_utils

    unrolled = maxtext_pre_unroll(param_state(actor_model))
    unrolled = unrolled.to_pure_dict() if hasattr(unrolled, "to_pure_dict") else unrolled
    model = nnx.to_pure_dict(target_state)["model"]
    fused = model_creation_utils._fuse_moe_weights(unrolled["base"], model)
    return {("model",) + tuple(k): np.asarray(v) for k, v in flatten_dict(fused).items()}
