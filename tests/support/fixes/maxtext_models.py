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
class VllmModel:
    """The family in vLLM's engine running vLLM's own model for it, as
    train_rl's `vllm_native` configuration runs it
    (support/programs/family_sync.py): the actor's dims for that run and the
    Hugging Face config.json vLLM reads (tokenizer_path's)."""

    #: MaxText overrides over _TINY and the family's overrides: a model the
    #: engine shards over 8 devices (heads of 128 unless the family's real
    #: ones differ: tpu-inference pads smaller heads), vocab 1024.
    dims: dict
    #: config.json: MaxText's own HF config of the model
    #: (HF_MODEL_CONFIGS[model_name], its `text_config` where `text_config`),
    #: with these keys over it (the same dims in Hugging Face's words, the
    #: architecture vLLM builds); `layer_types` is cut to the layers.
    hf: dict
    text_config: bool = False
    #: The actor's embedding scaled by this before the sync (see
    #: ENGINE_EMBEDDING_SCALE: a random tied model repeats its last token).
    embedding_scale: float | None = None
    #: weight_dtype and dtype of the run (train_rl gives the engine
    #: weight_dtype): float32 compares two implementations, not roundings,
    #: where the engine's model takes it.
    dtype: str = "float32"


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    model_name: str
    layers: int
    overrides: dict = dataclasses.field(default_factory=dict)
    #: vLLM's own model for the family (train_rl's vllm_native), where family_sync.py runs it.
    vllm: VllmModel | None = None
    #: The actor's scan_layers: MaxText's default (train_rl's actor), or the
    #: unscanned model a recipe picks (Gemma 4's shipped recipe).
    scan_layers: bool = True


# MoE on the CPU: dense matmuls, no capacity limit.
_CPU_MOE = dict(megablox=False, sparse_matmul=False, capacity_factor=-1)
#: The MoE settings of a tiny MoE family: 4 experts, dense matmuls on CPU.
_MOE = dict(num_experts=4, num_experts_per_tok=2, base_moe_mlp_dim=64, **_CPU_MOE)
#: DeepSeek's multi-head latent attention, shrunk.
_MLA = dict(q_lora_rank=16, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8)
#: Gemma 4's global layers' own heads, shrunk (kv heads: the target's tensor parallelism), and its MoE.
_GEMMA4 = dict(global_head_dim=16, global_num_kv_heads=4, **_MOE)

#: Every family MaxText 0.2.4's Tunix integration ships a weight mapping for
#: (maxtext/integration/tunix/weight_mapping: deepseek3, gemma3, gpt_oss,
#: llama3, qwen2, qwen3), each as MaxText scans it for train_rl's actor.
FAMILIES = {
    # llama3.1-8b shrunk to 4 layers: the target's layers share the decoder's nnx.Rngs.
    "llama3": Family("llama3", "llama3.1-8b", 4),
    # gemma3-4b's pattern of 6 layers (5 local, 1 global) shrunk to 14 layers:
    # two scanned repeats of the pattern plus 2 remainder layers.
    "gemma3": Family("gemma3", "gemma3-4b", 14),
    # qwen3-30b-a3b (MoE) shrunk to 4 layers of 4 experts, dense matmuls on CPU.
    "qwen3-moe": Family("qwen3-moe", "qwen3-30b-a3b", 4, _MOE),
    # qwen3-0.6b (dense, MaxText's RL test's model) shrunk to 4 layers.
    "qwen3": Family("qwen3", "qwen3-0.6b", 4),
    # qwen2.5-7b shrunk to 4 layers (qkv biases).
    "qwen2": Family("qwen2", "qwen2.5-7b", 4),
    # deepseek3-671b shrunk to 2 dense and 3 MoE layers: scanned as
    # `dense_layers` and `moe_layers`, unrolled as `dense_layers_K`, `moe_layers_K`.
    "deepseek3": Family("deepseek3", "deepseek3-671b", 5, dict(first_num_dense_layers=2, **_MOE, **_MLA)),
    # deepseek2-16b's shape: 1 dense and 2 MoE layers, no query LoRA.
    "deepseek2": Family("deepseek2", "deepseek2-16b", 3, dict(first_num_dense_layers=1, **_MOE, **(_MLA | {"q_lora_rank": 0}))),
    # gpt-oss-20b shrunk to 4 layers: its pattern of 2 (sliding, full) scanned
    # as blocks `layers.layers_J` over 2 repeats, its MoE `GptOssMlp` prefused
    # (`wi`) in the target.
    "gpt-oss": Family("gpt-oss", "gpt-oss-20b", 4, _MOE),
    # gemma4-26b (MoE with a shared expert) shrunk to 14 layers: its pattern
    # of 6 (5 local, 1 global) scanned as Gemma4ScannableBlocks over 2
    # repeats (`scanned_blocks.local_layers`, the 5 local layers scanned again
    # inside each block, and `scanned_blocks.global_layer`), the last 2
    # layers the block `layers_remainder` (`local_layers` of 2). Not in
    # MaxText 0.2.4's Tunix mappings: its direct sync only.
    "gemma4": Family("gemma4", "gemma4-26b", 14, _GEMMA4),
    # The same model unscanned (scan_layers=False: the shipped recipe's).
    "gemma4-unscanned": Family("gemma4-unscanned", "gemma4-26b", 14, _GEMMA4, scan_layers=False),
}
#: The Gemma 4 families (google-tunix 0005; MaxText 0.2.4's Tunix
#: integration maps no Gemma 4).
GEMMA4 = ("gemma4", "gemma4-unscanned")


# The engine runs' dims (VllmModel), in MaxText's words and Hugging Face's;
# the token ids 0, 1, 2 are the test tokenizer's pad, bos and eos. vLLM's
# torch models cache their rotary tables for max_position_embeddings (times
# a linear scaling's factor), replicated on every device: 512 positions.
_ENGINE = dict(base_emb_dim=128, base_num_query_heads=8, base_num_kv_heads=8, head_dim=128, base_mlp_dim=256,
               vocab_size=1024)
_HF_ENGINE = dict(hidden_size=128, num_attention_heads=8, num_key_value_heads=8, head_dim=128, intermediate_size=256,
                  vocab_size=1024, pad_token_id=0, bos_token_id=1, eos_token_id=2, max_position_embeddings=512)

_GEMMA4_ENGINE = VllmModel(
    _ENGINE | {"global_head_dim": 128, "global_num_kv_heads": 8, "base_moe_mlp_dim": 128},
    _HF_ENGINE | {"architectures": ["Gemma4ForCausalLM"], "global_head_dim": 128, "num_global_key_value_heads": 8,
                  "num_experts": 4, "top_k_experts": 2, "moe_intermediate_size": 128},
    text_config=True)


def _in_vllm(name: str, vllm: VllmModel) -> Family:
    """FAMILIES[name], the same actor (the engine's dims over its own), with vLLM's own model for it."""
    return dataclasses.replace(FAMILIES[name], vllm=vllm)


#: The families as train_rl's `vllm_native` runs them (support/programs/family_sync.py):
#: each with vLLM's own model for it (VllmModel), at the dims an engine of 8
#: devices takes (heads of 128 unless the family's own differ, vocabulary
#: 1024), and, for Qwen3, the MaxText names that take MaxText's different
#: paths there (qwen3-0.6b: MaxText refuses; other qwen3-*: tied or not).
#: FAMILIES above are the same families at the direct sync's tiny dims.
VLLM_FAMILIES = {
    "llama3": _in_vllm("llama3", VllmModel(_ENGINE, _HF_ENGINE | {"architectures": ["LlamaForCausalLM"]})),
    "gemma3": _in_vllm("gemma3", VllmModel(
        _ENGINE | {"base_num_kv_heads": 4},
        _HF_ENGINE | {"architectures": ["Gemma3ForCausalLM"], "num_key_value_heads": 4, "query_pre_attn_scalar": 128,
                      # MaxText's gemma3-4b: global layers 1e6 with linear scaling 8, local 1e4
                      "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                          "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                             "rope_theta": 1000000.0}}},
        text_config=True)),
    "qwen3-moe": _in_vllm("qwen3-moe", VllmModel(
        _ENGINE | {"base_num_kv_heads": 4, "base_moe_mlp_dim": 128},
        _HF_ENGINE | {"architectures": ["Qwen3MoeForCausalLM"], "num_key_value_heads": 4, "moe_intermediate_size": 128,
                      "num_experts": 4, "num_local_experts": 4, "num_experts_per_tok": 2})),
    # qwen2.5-1.5b: tied embedding, attention biases, 2 KV heads (repeated to the tensor parallelism).
    "qwen2": Family("qwen2", "qwen2.5-1.5b", 4, vllm=VllmModel(
        _ENGINE | {"base_num_kv_heads": 2},
        _HF_ENGINE | {"architectures": ["Qwen2ForCausalLM"], "num_key_value_heads": 2}, embedding_scale=0.25)),
    # qwen3-8b: dense, untied (MaxText names other than qwen3-0.6b pick the qwen3_moe converter table).
    "qwen3": Family("qwen3", "qwen3-8b", 4, vllm=VllmModel(
        _ENGINE, _HF_ENGINE | {"architectures": ["Qwen3ForCausalLM"]})),
    # qwen3-1.7b: dense, tied (the LM head is the embedding).
    "qwen3-tied": Family("qwen3-tied", "qwen3-1.7b", 4, vllm=VllmModel(
        _ENGINE, _HF_ENGINE | {"architectures": ["Qwen3ForCausalLM"], "tie_word_embeddings": True},
        embedding_scale=0.25)),
    # qwen3-0.6b, MaxText's RL test's model: tied (its converter table is None).
    "qwen3-0.6b": Family("qwen3-0.6b", "qwen3-0.6b", 2, vllm=VllmModel(
        _ENGINE, _HF_ENGINE | {"architectures": ["Qwen3ForCausalLM"]}, embedding_scale=0.25)),
    # gpt-oss-20b: its own heads of 64 (16 query, 8 KV), attention sinks and biases.
    "gpt-oss": _in_vllm("gpt-oss", VllmModel(
        _ENGINE | {"base_num_query_heads": 16, "head_dim": 64, "base_mlp_dim": 128, "base_moe_mlp_dim": 128},
        _HF_ENGINE | {"architectures": ["GptOssForCausalLM"], "num_attention_heads": 16, "head_dim": 64,
                      "intermediate_size": 128, "num_local_experts": 4, "num_experts_per_tok": 2,
                      "experts_per_token": 2},
        # tpu-inference's JAX GptOss holds bfloat16 whatever the model's dtype
        # (gpt_oss.py: `dtype: jnp.dtype = jnp.bfloat16`), and its hd64
        # attention kernel refuses a float32 KV cache: rl.yml's bfloat16.
        dtype="bfloat16")),
    # gemma4-26b (MoE): heads of 128, its global layers' too (8 KV heads: the
    # tensor parallelism), 4 experts; scanned (train_rl's actor) and unscanned;
    # 12 layers, 2 blocks and no remainder, as gemma4-26b's 30 and -31b's 60
    # (MaxText 0.2.4's forward of a scanned remainder reads `config.lora`,
    # which train_rl's RLConfig lacks: an AttributeError in the reference).
    "gemma4": dataclasses.replace(FAMILIES["gemma4"], layers=12, vllm=_GEMMA4_ENGINE),
    "gemma4-unscanned": dataclasses.replace(FAMILIES["gemma4-unscanned"], layers=12, vllm=_GEMMA4_ENGINE),
    # deepseek3-671b: 3 dense layers and 1 MoE layer, as tpu-inference's JAX
    # DeepseekV3 builds it (deepseek_v3.py's module constants: the 671B's dims,
    # first_k_dense_replace 3, the embedding's vocabulary 129280; only the
    # layer count and the embedding's hidden size come from config.json, the
    # layers keep 7168: no engine of this size fits here). The actor's layers
    # are tiny: MaxText's mapping names none of its scanned stacks anyway.
    "deepseek3": Family("deepseek3", "deepseek3-671b", 4, dict(
        first_num_dense_layers=3, num_experts=8, num_experts_per_tok=2, base_moe_mlp_dim=64, q_lora_rank=64,
        kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, **_CPU_MOE), vllm=VllmModel(
        _ENGINE | {"vocab_size": 129280},
        {"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 128, "pad_token_id": 0, "bos_token_id": 1,
         "eos_token_id": 2})),
    # deepseek2-16b's shape, 1 dense and 2 MoE layers (MaxText names it; its
    # Tunix integration has no deepseek2 mapping).
    "deepseek2": Family("deepseek2", "deepseek2-16b", 3, dict(
        first_num_dense_layers=1, num_experts=8, num_experts_per_tok=2, base_moe_mlp_dim=64, kv_lora_rank=64,
        qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32, **_CPU_MOE), vllm=VllmModel(
        _ENGINE, _HF_ENGINE | {"architectures": ["DeepseekV2ForCausalLM"], "moe_intermediate_size": 64,
                               "n_routed_experts": 8, "num_experts_per_tok": 2, "kv_lora_rank": 64,
                               "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32})),
}
#: The families MaxText also builds with an unscanned actor (`scan_layers=False`,
#: a user's choice, as Gemma 4's shipped recipe makes it; Gemma 4's own
#: `gemma4-unscanned` is above): the same models, their layers `layers_K` in
#: the actor as in the engine. (DeepSeek stops at the engine either way.)
UNSCANNED = ("llama3", "gemma3", "qwen2", "qwen3", "qwen3-moe", "gpt-oss")
VLLM_FAMILIES.update({f"{name}-unscanned": dataclasses.replace(VLLM_FAMILIES[name], name=f"{name}-unscanned", scan_layers=False)
                      for name in UNSCANNED})


def actor(family: Family, **dims):
    """The train_rl actor (TunixMaxTextAdapter around the scanned model) and its mesh;
    `dims` replace the tiny ones (the benchmarks' larger models)."""
    import jax
    from maxtext.configs import pyconfig
    from maxtext.utils import model_creation_utils

    config = pyconfig.initialize(
        ["", os.path.join(_configs_dir(), "base.yml")],
        **(_TINY | dims), **family.overrides, model_name=family.model_name, base_num_decoder_layers=family.layers,
        scan_layers=family.scan_layers, attention="dot_product", ici_fsdp_parallelism=len(jax.devices()), init_weights_seed=0,
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


# -- one family's models, as the sync tests use them --------------------------


class FamilyModels:
    """One family's actor (moved as training moves it), its rollout target,
    the values the target must receive and the actor's whole flat state."""

    #: The sources, as each sync path hands them over (`source`).
    SOURCES = ("param-only, MaxText pre-unroll", "param-only", "unfiltered", "unfiltered, chunked")

    def __init__(self, family: Family):
        import jax
        import jax.numpy as jnp
        from flax import nnx

        self.family = family
        self.actor, _ = actor(family)
        # Counts that differ from layer to layer (a fresh model's are all 0),
        # so a count from the wrong layer shows; the keys differ already.
        counts = nnx.state(self.actor, nnx.RngCount)
        nnx.update(self.actor, jax.tree.map(lambda c: c + jnp.arange(c.size, dtype=c.dtype).reshape(c.shape) * 7 + 3, counts))
        # Parameters moved as training moves them (a fresh model's norm scales
        # are all ones, the target's too), so a weight left stale shows.
        params = nnx.state(self.actor, nnx.Param)
        keys = iter(jax.random.split(jax.random.key(7), len(jax.tree.leaves(params))))
        nnx.update(self.actor, jax.tree.map(lambda p: p + 0.01 * jax.random.normal(next(keys), p.shape, p.dtype), params))
        self.target = target(family)
        self.expected = expected_params(self.actor, family, self.target)
        self.actor_flat = {tuple(p): v for p, v in nnx.to_flat_state(nnx.state(self.actor))}

    def source(self, name: str):
        """(source state, reshard_chunk_size) as the named path hands them over:
        MaxText 0.2.4's own sync (train_rl, MaxTextVllmRollout and
        RLCluster.sync_weights pass the actor's nnx.Param state, which
        MaxTextVllmSampler unrolls before Tunix); Tunix's own vLLM rollout
        (no MaxText pre-unroll); the whole state (rng state included) as
        Tunix's VllmRollout loads it at start-up and RLCluster's offload
        paths sync it; and that as MaxText's validate_converter passes it."""
        from flax import nnx

        if name == "param-only, MaxText pre-unroll":
            return maxtext_pre_unroll(param_state(self.actor)), None
        if name == "param-only":
            return param_state(self.actor), None
        if name == "unfiltered":
            return nnx.state(self.actor), None
        if name == "unfiltered, chunked":
            return {"base": nnx.state(self.actor)["base"]}, 128
        raise ValueError(name)

    def fresh_target(self):
        import jax

        return jax.tree.map(lambda x: x.copy(), self.target)

    def sync(self, module, source: str, shims=None, **kwargs):
        """A fresh target synced from the named source by `module`'s
        transfer_state_directly (the installed tunix.generate.utils, or the
        pins' or a series prefix's copy of it), with `shims` entered around it."""
        import contextlib

        from tunix.rl import reshard

        state, chunk = self.source(source)
        dst = self.fresh_target()
        with shims or contextlib.nullcontext():
            module.transfer_state_directly(state, dst, reshard_fn=reshard.reshard_pytree, reshard_chunk_size=chunk, **kwargs)
        return dst

    def outcome(self, dst) -> dict[str, list]:
        """What the target `dst` holds after a sync: per nnx.Param exact /
        stale / wrong, per per-layer rng leaf its own layer's value or not,
        shardings kept (each a list of paths)."""
        import jax
        import numpy as np
        from flax import nnx

        before = {tuple(p): v[...] for p, v in nnx.to_flat_state(self.target)}
        after = {tuple(p): v for p, v in nnx.to_flat_state(dst)}
        out: dict[str, list] = {"exact": [], "stale": [], "wrong": [], "rng_own": [], "rng_kept": [], "rng_other": [], "sharding": []}
        for path, var in after.items():
            got = var[...]
            if got.sharding != before[path].sharding:
                out["sharding"].append(path)
            if isinstance(var, nnx.Param):
                want = self.expected[path]
                if got.shape == want.shape and got.dtype == want.dtype and np.array_equal(np.asarray(got), want):
                    out["exact"].append(path)
                elif np.array_equal(np.asarray(got), np.asarray(before[path])):
                    out["stale"].append(path)
                else:
                    out["wrong"].append(path)
            elif isinstance(var, nnx.RngState) and is_layer_path(path):
                src_path, idx = per_layer_rng_source(path, self.family, self.actor_flat)
                want, old = self.actor_flat[src_path][...], before[path]
                want = want if idx is None else want[idx]
                if jax.dtypes.issubdtype(got.dtype, jax.dtypes.prng_key):
                    got, want, old = (jax.random.key_data(x) for x in (got, want, old))
                if np.array_equal(np.asarray(got), np.asarray(want)):
                    out["rng_own"].append(path)
                else:
                    out["rng_kept" if np.array_equal(np.asarray(got), np.asarray(old)) else "rng_other"].append(path)
        return out

    def layer_params(self) -> list[tuple]:
        """The target's parameters of its unrolled layers (`layers_K`,
        `dense_layers_K`, ...), sorted."""
        from flax import nnx

        return sorted(tuple(p) for p, v in nnx.to_flat_state(self.target) if isinstance(v, nnx.Param) and is_layer_path(p))


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
#
# MaxText's layout of a scanned model against its unrolled rollout model: a
# stack `NAME` (`layers`; DeepSeek's `dense_layers`, `moe_layers`) holds layer
# K of the unrolled `NAME_K` at index K of its scan axis; a stack scanned in
# blocks of a layer pattern of P slots (`layers.layers_J`: Gemma3, GPT-OSS)
# holds layer R * P + J at index R, and the layers after the last repeat are
# `NAME_remainder.layers_J`, unstacked. This is what MaxText's own unrolls do
# (maxtext_vllm_rollout's unroll_qwen_scanned_weights and
# unroll_gemma_scanned_weights; generate_param_only_checkpoint's
# _possibly_unroll_params_nnx for `dense_layers` and `moe_layers`), written
# once here for every family; the tests check it against MaxText's own
# pre-unroll where that runs. Parameters are scanned on MaxText's
# `param_scan_axis` (1), Flax NNX's other state (rng counts and keys) on 0.
#
# Gemma 4 (Gemma4ScannableBlock, nnx_decoders._init_scanned_gemma4) scans its
# pattern (GEMMA4_ATTENTION_PATTERN: 5 local layers, then 1 global) as a block
# of its own: `scanned_blocks.local_layers` holds local slot J of repeat R at
# index (R, J) (the blocks' scan outside, the local layers' scan inside: a
# parameter (..., R, J, ...) from axis 1, rng state (R, J)),
# `scanned_blocks.global_layer` the global layer of repeat R at index R; the
# layers after the last repeat are the block `layers_remainder`, its
# `local_layers` at index J (and a `global_layer` unstacked). An unscanned
# model holds `layers_K` as the target does.


_LAYER = re.compile(r"^layers_(\d+)$")
_STACKED = re.compile(r"^(\w*layers)_(\d+)$")
PARAM_SCAN_AXIS = 1


def is_layer_path(path) -> bool:
    """Whether a flat path runs through an unrolled layer (`layers_K`, `dense_layers_K`, ...)."""
    return any(isinstance(part, str) and _STACKED.match(part) for part in path)


def layer_source(target_path: tuple, source_paths, layers: int) -> tuple[tuple, int | tuple[int, int] | None]:
    """(source path, index on its scan axis (Gemma 4's local layers: the
    indices on its two, outer first), or None: the source is that layer
    alone) of the unrolled target layer leaf `target_path` (under the
    runner's `model`), in a source whose paths (under `base`) are
    `source_paths`, of a model of `layers` decoder layers."""
    i = next(j for j, part in enumerate(target_path) if isinstance(part, str) and _STACKED.match(part))
    stacked = _STACKED.match(target_path[i])
    assert stacked is not None  # (found by it above)
    name, k = stacked.group(1), int(stacked.group(2))
    prefix, suffix = ("base",) + tuple(target_path[1:i]), tuple(target_path[i + 1:])
    if prefix + (target_path[i],) + suffix in source_paths:
        return prefix + (target_path[i],) + suffix, None  # unscanned
    if name == "layers" and any(tuple(path[:i + 1]) == prefix + ("scanned_blocks",) for path in source_paths):
        return _gemma4_layer_source(prefix, suffix, k, layers)

    def slots_under(stack: str) -> set[int]:
        found = set()
        for path in source_paths:
            if tuple(path[:i + 1]) == prefix + (stack,) and len(path) > i + 1:
                m = _LAYER.match(str(path[i + 1]))
                if m:
                    found.add(int(m.group(1)))
        return found

    slots = slots_under(name)
    if not slots:
        return prefix + (name,) + suffix, k
    repeats = (layers - len(slots_under(f"{name}_remainder"))) // len(slots)
    if k < repeats * len(slots):
        return prefix + (name, f"layers_{k % len(slots)}") + suffix, k // len(slots)
    return prefix + (f"{name}_remainder", f"layers_{k - repeats * len(slots)}") + suffix, None


def _gemma4_layer_source(prefix: tuple, suffix: tuple, k: int, layers: int):
    """layer_source of layer `k` in Gemma 4's scanned blocks, by MaxText's pattern."""
    from maxtext.common.common_types import AttentionType
    from maxtext.models import gemma4

    pattern = gemma4.GEMMA4_ATTENTION_PATTERN
    repeats = layers // len(pattern)
    block, slot = ("scanned_blocks", k % len(pattern)) if k < repeats * len(pattern) else \
        ("layers_remainder", k - repeats * len(pattern))
    local = sum(1 for kind in pattern[:slot] if kind == AttentionType.LOCAL_SLIDING)
    is_local = pattern[slot] == AttentionType.LOCAL_SLIDING
    path = prefix + (block, "local_layers" if is_local else "global_layer") + suffix
    if block == "scanned_blocks":
        return path, ((k // len(pattern), local) if is_local else k // len(pattern))
    return path, (local if is_local else None)


def per_layer_rng_source(target_path: tuple, family: Family, source_paths) -> tuple[tuple, int | tuple[int, int] | None]:
    """(actor state path, layer index (Gemma 4's local layers: two) or None) of the rng leaf that this target
    layer leaf stands for: the same Variable of the same layer (MaxText's
    unrolls drop rng state, so only the layout says which)."""
    return layer_source(target_path, source_paths, family.layers)


def unrolled_params(actor_model, family: Family, target_paths) -> dict:
    """Target path (under the runner's `model`) -> the actor's value of each
    unrolled layer parameter and each parameter beside the layers, by
    MaxText's layout (above)."""
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    source = {tuple(path): var[...] for path, var in nnx.to_flat_state(param_state(actor_model))}
    out = {}
    for path in target_paths:
        if not any(isinstance(part, str) and _STACKED.match(part) for part in path):
            out[path] = np.asarray(source[("base",) + tuple(path[1:])]) if ("base",) + tuple(path[1:]) in source else None
            continue
        src, index = layer_source(path, source, family.layers)
        if src not in source:
            out[path] = None
            continue
        value = source[src]
        for i in () if index is None else index if isinstance(index, tuple) else (index,):
            value = jnp.take(value, i, axis=PARAM_SCAN_AXIS)
        out[path] = np.asarray(value)
    return out


def expected_params(actor_model, family: Family, target_state) -> dict:
    """Target path (under the runner's `model`) -> the value its nnx.Param must
    hold: the actor's parameters unrolled by MaxText's layout, and MoE gate/up
    fused for the prefused target by MaxText's own checkpoint-loading fusion
    (model_creation_utils._fuse_moe_weights: a reference no one here wrote)."""
    import numpy as np
    from flax import nnx
    from flax.traverse_util import flatten_dict, unflatten_dict
    from maxtext.utils import model_creation_utils

    target_params = [tuple(p) for p, v in nnx.to_flat_state(target_state) if isinstance(v, nnx.Param)]
    # The unrolled layers' split gate/up (wi_0, wi_1) where the target holds them fused (wi).
    wanted = set(target_params) | {p[:-1] + (half,) for p in target_params if p[-1] == "wi" for half in ("wi_0", "wi_1")}
    unrolled = {p[1:]: v for p, v in unrolled_params(actor_model, family, list(wanted)).items() if v is not None}
    model = nnx.to_pure_dict(target_state)["model"]
    fused = model_creation_utils._fuse_moe_weights(unflatten_dict(unrolled), model)
    expected = {("model",) + tuple(k): np.asarray(v) for k, v in flatten_dict(fused).items()}
    missing = [".".join(map(str, p)) for p in target_params if p not in expected]
    assert not missing, f"{family.name}: target parameters MaxText's layout gives no actor value for: {missing}"
    return {p: expected[p] for p in target_params}
