"""MaxText's own models for `smoke`'s MaxText configurations: a tiny model
(`TinyModel`: MaxText's qwen3, and its qwen3 MoE with fewer KV heads than a
v6e-8's tensor parallelism) built by MaxText's code (`from_pretrained`,
seeded), written as the NNX checkpoint `MaxTextForCausalLM.load_weights`
restores, and MaxText's own forward decoding it greedily, the engine's
reference. Needs maxtext (the `[maxtext]` install); imports it, and jax,
only when called.

Run in a process of its own, on the host CPU as 8 devices, as the engine
has the 8 chips (cpu_simulation.simulate_v6e_8; on a TPU VM the engines hold
the chips meanwhile). On one CPU device MaxText's forward of the same
weights differs from the engine's by up to 7e-3 in a logprob, where on 8 it
agrees to 1e-5: the reference keeps the engine's device count.

    python -m maxtext_rl_overlay.smoke.maxtext_model FOLDER [TIMEOUT [MODEL]]

writes the checkpoint into FOLDER and MaxText's greedy tokens for
tiny_llama.REFERENCE_PROMPTS to FOLDER/reference.json; and the second model,
the one smoke syncs into the engine, into FOLDER/SECOND with its own
reference.json: train_rl's actor (scanned layers, another seed), which the
engine process restores (restore_actor). Then it waits for the rows the
engine sampled (FOLDER/ROWS_FILE) and writes MaxText's logits at each drawn
position (FOLDER/LOGITS_FILE): the reference of the sampled checks.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import sys
from collections.abc import Mapping
from typing import Any

from . import tiny_llama

# MaxText's config for a model built here, outside a training run: one
# process, no checkpointing, synthetic data, no goodput recording, and no
# persistent compilation cache (MaxText's default, ~/jax_cache, is shared by
# every MaxText process of the machine, and jax writes its entries in place:
# a reference must not depend on what other processes left or are writing).
OFFLINE = dict(
    jax_cache_dir="",
    per_device_batch_size=1,
    override_model_config=True,
    skip_jax_distributed_system=True,
    enable_checkpointing=False,
    dataset_type="synthetic",
    enable_goodput_recording=False,
    monitor_goodput=False,
)


def configs_dir() -> str:
    import maxtext

    return os.path.join(os.path.dirname(maxtext.__file__), "configs")


# -- MaxText's model in vLLM's engine ------------------------------------------
#
# A tiny qwen3-0.6b (MaxText's RL test's model) for MaxTextForCausalLM in the
# engine (tests/fixes/tpu-inference/test_series_engine_start.py) and for
# train_rl's rollouts (support/programs/train_rl_run.py). 8 heads and a
# vocabulary of 1024 split evenly over the 8 devices; heads of 128 as in the
# real models: tpu-inference pads smaller heads to 128, which Tunix's sync
# refuses for MaxText's attention-output kernel ("Padding/repetition only
# supported for attention weights").

ENGINE_MODEL_NAME = "qwen3-0.6b"
#: The tiny model's dimensions, in MaxText's words and in Hugging Face's.
ENGINE_DIMS = {
    "base_emb_dim": 128,
    "base_num_query_heads": 8,
    "base_num_kv_heads": 8,
    "head_dim": 128,
    "base_mlp_dim": 256,
    "base_num_decoder_layers": 2,
    "vocab_size": 1024,
}
ENGINE_HF_DIMS = {
    "hidden_size": 128,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 512,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
#: The config.json vLLM reads for it (the KV cache's layout; the model is MaxText's).
ENGINE_HF_CONFIG = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
    "attention_bias": False,
    **ENGINE_HF_DIMS,
}
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


@dataclasses.dataclass(frozen=True)
class TinyModel:
    """A tiny model MaxText builds for the engine: MaxText's model name, its
    dimensions (MaxText's words), MaxText's other settings for it, and the
    config.json vLLM reads (the KV cache's layout, the KV heads the adapter
    pads to the tensor parallelism; the model itself is MaxText's)."""

    model_name: str
    dims: Mapping[str, Any]
    hf_config: Mapping[str, Any]
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def moe(self) -> bool:
        return int(self.settings.get("num_experts", 1)) > 1

    def engine_settings(self, chips: int) -> dict[str, Any]:
        """MaxText's settings of the engine's model on `chips` chips: train_rl's
        MaxTextVllmRollout makes a MoE's gate/up prefused at tensor parallelism
        above 1 (maxtext_vllm_rollout.prepare_direct_sync_additional_config)."""
        return {**self.settings, **({"prefuse_moe_weights": True} if self.moe and chips > 1 else {})}


#: MaxText's RL test's qwen3-0.6b, tiny (the sizes above).
QWEN3 = TinyModel(ENGINE_MODEL_NAME, ENGINE_DIMS, ENGINE_HF_CONFIG)
#: qwen3-30b-a3b (MoE) shrunk, with its 4 KV heads: fewer than a v6e-8's
#: tensor parallelism of 8, so MaxText's vLLM adapter pads them to 8
#: (adapter.py, "Padding num_kv_heads"), MaxText's restore repeats the
#: checkpoint's heads to match, and the sync of a scanned actor aligns each
#: KV weight through Tunix's `_bulk_align_and_unstack` (the seed's second
#: fix site carrying weights). 4 experts, 2 a token, dense matmuls (the CPU
#: has no megablox kernel).
QWEN3_MOE = TinyModel(
    "qwen3-30b-a3b",
    {**ENGINE_DIMS, "base_num_kv_heads": 4, "base_moe_mlp_dim": 1024},
    {**ENGINE_HF_CONFIG, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_key_value_heads": 4,
     "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 1024, "norm_topk_prob": True, "decoder_sparse_step": 1,
     "tie_word_embeddings": False},
    {"num_experts": 4, "num_experts_per_tok": 2, "megablox": False, "sparse_matmul": False, "capacity_factor": -1},
)
#: By MaxText's model name (what the reference process is told).
MODELS = {m.model_name: m for m in (QWEN3, QWEN3_MOE)}


def engine_additional_config(checkpoint: pathlib.Path, matmul_precision: str | None = None, model: TinyModel = QWEN3,
                             chips: int = 1) -> dict[str, Any]:
    """vLLM's `additional_config` for MaxTextForCausalLM on `checkpoint`, as
    train_rl passes it (`maxtext_config`), with the checkpoint to load
    (`load_parameters_path`: MaxTextForCausalLM.load_weights restores it).

    `matmul_precision`: MaxText's setting of that name (None: its default,
    "default", train_rl's). MaxText's layers pass it to every matmul as an
    explicit `precision`, which jax_default_matmul_precision does not
    override (jax reads its default only where a matmul names none), and
    bake it in when the model is built. `model` on `chips` chips: the tiny
    model, and MaxText's settings of it as train_rl's rollout passes them."""
    return {
        "maxtext_config": {
            "model_name": model.model_name,
            "log_config": "false",
            "override_model_config": True,
            **model.dims,
            **model.engine_settings(chips),
            **_ENGINE_PRECISION,
            **({"matmul_precision": matmul_precision} if matmul_precision else {}),
            "load_parameters_path": str(checkpoint / ENGINE_PARAMS),
        }
    }


#: The second model's folder under the engine's model folder, and its seed:
#: chosen, like tiny_llama.SEEDS, for greedy margins of at least 0.17 with its
#: norms drawn (the engine's model has 0.17 too; seed 9's came within 0.014).
SECOND = "second"
_SECOND_SEED = 4


def _model_config(model: TinyModel, run_name: str, **overrides: Any) -> Any:
    """MaxText's config of the tiny `model`, built here (OFFLINE, but where
    `overrides` say otherwise)."""
    from maxtext.configs import pyconfig

    settings = dict(model.dims, **model.settings, **_ENGINE_PRECISION, **OFFLINE)
    settings.update(attention="dot_product", max_target_length=64, max_prefill_predict_length=32, **overrides)
    return pyconfig.initialize(["", os.path.join(configs_dir(), "base.yml")], model_name=model.model_name,
                               run_name=run_name, **settings)


def _write_model(path: pathlib.Path, config: Any, constants_spread: float = 0.0) -> tuple[Any, Any]:
    """MaxText's model of `config` initialised at random (`from_pretrained`
    without a checkpoint; the embedding scaled by ENGINE_EMBEDDING_SCALE), its
    parameters written to path/ENGINE_PARAMS as the NNX checkpoint
    `from_pretrained` restores (each nnx.Param as {"value": array}, Orbax).
    With `constants_spread`, every parameter MaxText initialises to one value
    (the norms' scales) is that value times 1 + spread * N(0, 1)."""
    import jax
    import jax.numpy as jnp
    import orbax.checkpoint as ocp
    from flax import nnx
    from maxtext.utils import model_creation_utils

    model, mesh = model_creation_utils.from_pretrained(config, devices=jax.devices())
    embedding = model.token_embedder.embedding
    embedding.value = embedding.value * ENGINE_EMBEDDING_SCALE
    if constants_spread:
        key = jax.random.key(config.init_weights_seed)
        for _, node in nnx.iter_graph(model):
            if isinstance(node, nnx.Param) and node.value.size > 1 and bool(jnp.all(node.value == node.value.ravel()[0])):
                key, draw = jax.random.split(key)
                spread = 1 + constants_spread * jax.random.normal(draw, node.value.shape, node.value.dtype)
                node.value = jax.device_put(node.value * spread, node.value.sharding)
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    ocp.PyTreeCheckpointer().save(path / ENGINE_PARAMS, jax.tree.map(lambda x: {"value": x}, params))
    return model, mesh


def _actor_config(model: TinyModel, path: pathlib.Path | None = None) -> Any:
    """The second model as train_rl's actor has it: scanned layers."""
    # MaxText restores a checkpoint only with checkpointing on.
    load = {"load_parameters_path": str(path / ENGINE_PARAMS), "enable_checkpointing": True} if path else {}
    return _model_config(model, "smoke-actor", scan_layers=True, init_weights_seed=_SECOND_SEED, **load)


def write_actor_checkpoint(path: pathlib.Path, model: TinyModel = QWEN3) -> tuple[Any, Any, Any]:
    """The second model (train_rl's actor: scanned layers; seeded apart from
    the engine's, its norms drawn too: it differs from the engine's model in
    every parameter), written to path/ENGINE_PARAMS. Returns the model, its
    mesh and config: MaxText's own forward of it is the reference after the sync."""
    from .tiny_llama import CONSTANTS_SPREAD

    config = _actor_config(model)
    actor, mesh = _write_model(path, config, CONSTANTS_SPREAD)
    return actor, mesh, config


def restore_actor(path: pathlib.Path, model: TinyModel = QWEN3) -> tuple[Any, int]:
    """The second model restored as train_rl builds its actor
    (`from_pretrained` with `load_parameters_path`, wrapped in the Tunix
    adapter), and the scan axis of its parameters."""
    import jax
    from maxtext.utils import model_creation_utils

    config = _actor_config(model, path)
    actor, _ = model_creation_utils.from_pretrained(config, devices=jax.devices(), wrap_with_tunix_adapter=True)
    return actor, int(getattr(config, "param_scan_axis", 1))


def write_engine_checkpoint(path: pathlib.Path, model: TinyModel = QWEN3) -> tuple[Any, Any, Any]:
    """The tiny model the engine starts on (_write_model, seed 0), unrolled as
    vLLM's MaxText model has it (`scan_layers=False`), and the config.json vLLM
    reads, written to path. Returns the model, its mesh and config: MaxText's
    own forward of it is the engine's reference (reference_greedy)."""
    config = _model_config(model, "engine-reference", scan_layers=False, init_weights_seed=0)
    engine_model, mesh = _write_model(path, config)
    (path / "config.json").write_text(json.dumps(dict(model.hf_config)))
    return engine_model, mesh, config


class Forward:
    """MaxText's own forward of a model (its `__call__`, training mode,
    dot-product attention, the whole sequence at once), jitted once: the
    log-softmax of its logits at every position of a token sequence."""

    def __init__(self, model: Any, mesh: Any, config: Any) -> None:
        import jax
        import jax.numpy as jnp
        from flax import nnx

        self.mesh, self.config, self.length = mesh, config, config.max_target_length
        graphdef, self.state = nnx.split(model)

        def forward(state: Any, tokens: Any, segments: Any) -> Any:
            positions = jnp.arange(self.length, dtype=jnp.int32)[None]
            logits = nnx.merge(graphdef, state)(tokens, positions, decoder_segment_ids=segments, enable_dropout=False)
            return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)

        self._logprobs = jax.jit(forward)

    def __call__(self, sequence: list[int]) -> Any:
        """[len(sequence), vocab]: at each position, the next token's log-probabilities."""
        import flax.linen as nn
        import numpy as np

        # Padded to one length (one compilation); causal attention: the
        # padding after the last token does not reach it.
        tokens = np.zeros((1, self.length), np.int32)
        tokens[0, : len(sequence)] = sequence
        segments = (np.arange(self.length) < len(sequence)).astype(np.int32)[None]
        with self.mesh, nn.logical_axis_rules(self.config.logical_axis_rules):
            return np.asarray(self._logprobs(self.state, tokens, segments))[0, : len(sequence)]


def reference_greedy(forward: Forward, prompts: list[list[int]], max_tokens: int) -> list[dict[str, Any]]:
    """MaxText's own forward decoding greedily: per prompt the tokens, each
    token's logprob (log_softmax of the logits) and the margin between the
    best and second-best logprob."""
    import numpy as np

    out = []
    for prompt in prompts:
        sequence, values, margins = list(prompt), [], []
        for _ in range(max_tokens):
            lp = forward(sequence)[-1]
            second, best = np.sort(lp)[-2:]
            token = int(np.argmax(lp))
            sequence.append(token)
            values.append(float(lp[token]))
            margins.append(float(best - second))
        out.append({"prompt": prompt, "tokens": sequence[len(prompt) :], "logprobs": values, "margins": margins})
    return out


def reference_logits(forward: Forward, prompt: list[int], rows: list[list[int]]) -> list[list[list[float]]]:
    """For each row of tokens drawn after `prompt`, MaxText's log-probabilities
    at each drawn position (the logits up to a constant per position, which
    temperature, top-k and top-p do not see)."""
    return [forward(prompt + tokens)[len(prompt) - 1 : -1].tolist() for tokens in rows]


#: The files of the exchange with smoke about the sampled rows (in FOLDER):
#: smoke writes the drawn rows, this process MaxText's logits at them.
ROWS_FILE, LOGITS_FILE = "sampled-rows.json", "sampled-logits.json"


def write_json(path: pathlib.Path, value: Any) -> None:
    """Written whole or not at all: the reader polls for the name."""
    part = path.with_name(path.name + ".part")
    part.write_text(json.dumps(value))
    os.replace(part, path)


def main(folder: pathlib.Path, timeout: float, model: TinyModel = QWEN3) -> int:
    """Write both models of `model` and their greedy references; then wait (up
    to `timeout`, and while smoke lives) for the engine's sampled rows, and
    write MaxText's logits at them for the first model."""
    import time

    from .cpu_simulation import simulate_v6e_8

    simulate_v6e_8()  # before jax is imported
    folder.mkdir(parents=True, exist_ok=True)
    forwards = []
    for where, write in ((folder, write_engine_checkpoint), (folder / SECOND, write_actor_checkpoint)):
        forwards.append(Forward(*write(where, model)))
        write_json(where / "reference.json", reference_greedy(forwards[-1], tiny_llama.REFERENCE_PROMPTS, tiny_llama.REFERENCE_TOKENS))
    parent, deadline = os.getppid(), time.monotonic() + timeout
    while not (folder / ROWS_FILE).is_file():
        if time.monotonic() > deadline or os.getppid() != parent:
            return 0  # no rows asked for: smoke stopped before, or has no sampled rows to check
        time.sleep(0.5)
    request = json.loads((folder / ROWS_FILE).read_text())
    write_json(folder / LOGITS_FILE, reference_logits(forwards[0], request["prompt"], request["rows"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 3600.0,
                  MODELS[sys.argv[3]] if len(sys.argv) > 3 else QWEN3))
