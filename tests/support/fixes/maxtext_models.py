"""Tiny real MaxText 0.2.4 models for the weight-sync tests, built by MaxText's own code.

* The actor: `model_creation_utils.from_pretrained(config, devices=...,
  wrap_with_tunix_adapter=True)`, as `create_models_and_meshes` builds it for
  train_rl (`scan_layers=True`, fsdp over the 8 devices).
* The rollout target: the model `MaxTextForCausalLM.load_weights` builds (its
  own method, called on an instance whose `maxtext_config` is what
  `generate_maxtext_config` makes of `inference/vllm.yml`: unrolled
  `layers_0..N-1`, kv heads raised to the tensor parallelism), split as
  tpu-inference's model loader splits it (`nnx.split`), on a data=2 x model=4
  mesh. `generate_maxtext_config` itself needs a vLLM config and a TPU
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

AVAILABLE = importlib.util.find_spec("maxtext") is not None

# MaxText's config for a model built here, outside a training run: one
# process, no checkpointing, synthetic data, no goodput recording.
_OFFLINE = dict(
    per_device_batch_size=1, override_model_config=True, skip_jax_distributed_system=True,
    enable_checkpointing=False, dataset_type="synthetic", enable_goodput_recording=False, monitor_goodput=False,
)

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


def _configs_dir() -> str:
    import maxtext

    return os.path.join(os.path.dirname(maxtext.__file__), "configs")


def actor(family: Family):
    """The train_rl actor (TunixMaxTextAdapter around the scanned model) and its mesh."""
    import jax
    from maxtext.configs import pyconfig
    from maxtext.utils import model_creation_utils

    config = pyconfig.initialize(
        ["", os.path.join(_configs_dir(), "base.yml")],
        **_TINY, **family.overrides, model_name=family.model_name, base_num_decoder_layers=family.layers,
        scan_layers=True, attention="dot_product", ici_fsdp_parallelism=8, init_weights_seed=0,
    )
    return model_creation_utils.from_pretrained(config, devices=jax.devices(), wrap_with_tunix_adapter=True)


def target(family: Family):
    """The rollout model (a MaxTextForCausalLM after load_weights) and its state, as the runner holds it."""
    import jax
    import numpy as np
    from flax import nnx
    from jax.sharding import Mesh
    from maxtext.common.common_types import MODEL_MODE_AUTOREGRESSIVE
    from maxtext.configs import pyconfig
    from maxtext.integration.vllm.maxtext_vllm_adapter.adapter import MaxTextForCausalLM

    config = pyconfig.initialize(
        ["", os.path.join(_configs_dir(), "inference", "vllm.yml")],
        **_TINY, **family.overrides, model_name=family.model_name, base_num_decoder_layers=family.layers,
        ici_data_parallelism=2, ici_tensor_parallelism=4,
        # generate_maxtext_config's: prefused MoE gate/up at TP > 1 (what
        # prepare_direct_sync_additional_config asks for) ...
        **({"prefuse_moe_weights": True} if family.overrides.get("num_experts", 1) > 1 else {}),
    )
    mesh = Mesh(np.array(jax.devices()).reshape(2, 1, 4, 1, 1), config.mesh_axes)

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


def maxtext_pre_unroll(weights, family: Family):
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
    k = int(_LAYER.match(target_path[i]).group(1))
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

    unrolled = maxtext_pre_unroll(param_state(actor_model), family)
    unrolled = unrolled.to_pure_dict() if hasattr(unrolled, "to_pure_dict") else unrolled
    model = nnx.to_pure_dict(target_state)["model"]
    fused = model_creation_utils._fuse_moe_weights(unrolled["base"], model)
    return {("model",) + tuple(k): np.asarray(v) for k, v in flatten_dict(fused).items()}


# -- MaxText's model in vLLM's engine ------------------------------------------
#
# A tiny qwen3-0.6b (MaxText's RL test's model) for MaxTextForCausalLM in the
# engine (tests/fixes/tpu-inference/test_series_engine_start.py) and for
# train_rl's rollouts (support/fixes/train_rl_run.py). 8 heads and a
# vocabulary of 1024 split evenly over the 8 devices; heads of 128 as in the
# real models: tpu-inference pads smaller heads to 128, which Tunix's sync
# refuses for MaxText's attention-output kernel ("Padding/repetition only
# supported for attention weights").

ENGINE_MODEL_NAME = "qwen3-0.6b"
#: The tiny model's dimensions, in MaxText's words and in Hugging Face's.
ENGINE_DIMS = {"base_emb_dim": 128, "base_num_query_heads": 8, "base_num_kv_heads": 8, "head_dim": 128,
               "base_mlp_dim": 256, "base_num_decoder_layers": 2, "vocab_size": 1024}
ENGINE_HF_DIMS = {"hidden_size": 128, "num_attention_heads": 8, "num_key_value_heads": 8, "head_dim": 128,
                  "intermediate_size": 256, "num_hidden_layers": 2, "vocab_size": 1024, "max_position_embeddings": 512,
                  "hidden_act": "silu", "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}
#: The config.json vLLM reads for it (the KV cache's layout; the model is MaxText's).
ENGINE_HF_CONFIG = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "rms_norm_eps": 1e-6,
                    "rope_theta": 1000000.0, "tie_word_embeddings": True, "attention_bias": False, **ENGINE_HF_DIMS}
#: Where write_engine_checkpoint puts MaxText's checkpoint, under the engine's model folder.
ENGINE_PARAMS = "maxtext-params"
#: MaxText initialises the embedding with a standard deviation of 1 and
#: qwen3's logits are tied to it: the tiny model's residual stream is then
#: the last token's embedding, and its greedy token that token again (a
#: margin of about 60 nats), which any model that copies its input would
#: reproduce. Scaled down, the layers' outputs dominate and the logits spread.
ENGINE_EMBEDDING_SCALE = 0.25
#: float32 on both sides: the comparison is of two implementations, not of roundings.
_ENGINE_PRECISION = {"weight_dtype": "float32", "dtype": "float32"}


def engine_additional_config(checkpoint) -> dict:
    """vLLM's `additional_config` for MaxTextForCausalLM on `checkpoint`, as
    train_rl passes it (`maxtext_config`), with the checkpoint to load
    (`load_parameters_path`: MaxTextForCausalLM.load_weights restores it)."""
    return {"maxtext_config": {"model_name": ENGINE_MODEL_NAME, "log_config": "false", "override_model_config": True,
                               **ENGINE_DIMS, **_ENGINE_PRECISION, "load_parameters_path": str(checkpoint / ENGINE_PARAMS)}}


def write_engine_checkpoint(path):
    """The tiny qwen3, initialised at random by MaxText (`from_pretrained`
    without a checkpoint, seeded; the embedding scaled by ENGINE_EMBEDDING_SCALE), unrolled as vLLM's MaxText model has it
    (`scan_layers=False`); its parameters written to path/ENGINE_PARAMS as the
    NNX checkpoint `from_pretrained` restores (each nnx.Param as {"value": array},
    Orbax), and the config.json vLLM reads to path. Returns the model: MaxText's
    own forward of it is the engine's reference (reference_greedy), with its mesh and config."""
    import json

    import jax
    import orbax.checkpoint as ocp
    from flax import nnx
    from maxtext.configs import pyconfig
    from maxtext.utils import model_creation_utils

    config = pyconfig.initialize(
        ["", os.path.join(_configs_dir(), "base.yml")],
        model_name=ENGINE_MODEL_NAME, **ENGINE_DIMS, **_ENGINE_PRECISION, **_OFFLINE,
        scan_layers=False, attention="dot_product", init_weights_seed=0, max_target_length=64,
        max_prefill_predict_length=32, run_name="engine-reference",
    )
    model, mesh = model_creation_utils.from_pretrained(config, devices=jax.devices())
    embedding = model.token_embedder.embedding
    embedding.value = embedding.value * ENGINE_EMBEDDING_SCALE
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    ocp.PyTreeCheckpointer().save(path / ENGINE_PARAMS, jax.tree.map(lambda x: {"value": x}, params))
    (path / "config.json").write_text(json.dumps(ENGINE_HF_CONFIG))
    return model, mesh, config


def reference_greedy(model, mesh, config, prompts: list[list[int]], max_tokens: int) -> list[dict]:
    """MaxText's own forward (the model's `__call__`, training mode, dot-product
    attention, the whole sequence each step) decoding greedily: per prompt
    the tokens, each token's logprob (log_softmax of the logits) and the
    margin between the best and second-best logprob."""
    import flax.linen as nn
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    length = config.max_target_length
    graphdef, state = nnx.split(model)

    @jax.jit
    def logprobs(state, tokens, segments):
        positions = jnp.arange(length, dtype=jnp.int32)[None]
        logits = nnx.merge(graphdef, state)(tokens, positions, decoder_segment_ids=segments, enable_dropout=False)
        return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)

    out = []
    with mesh, nn.logical_axis_rules(config.logical_axis_rules):
        for prompt in prompts:
            sequence, values, margins = list(prompt), [], []
            for _ in range(max_tokens):
                # Padded to one length (one compilation); causal attention: the
                # padding after the last token does not reach it.
                tokens = np.zeros((1, length), np.int32)
                tokens[0, : len(sequence)] = sequence
                segments = (np.arange(length) < len(sequence)).astype(np.int32)[None]
                lp = np.asarray(logprobs(state, tokens, segments))[0, len(sequence) - 1]
                second, best = np.sort(lp)[-2:]
                token = int(np.argmax(lp))
                sequence.append(token)
                values.append(float(lp[token]))
                margins.append(float(best - second))
            out.append({"prompt": prompt, "tokens": sequence[len(prompt):], "logprobs": values, "margins": margins})
    return out
