"""MaxText's own model for `smoke`'s MaxText configuration: a tiny qwen3
built by MaxText's code (`from_pretrained`, seeded), written as the NNX
checkpoint `MaxTextForCausalLM.load_weights` restores, and MaxText's own
forward decoding it greedily, the engine's reference. Needs maxtext (the
`[maxtext]` install); imports it, and jax, only when called.

Run in a process of its own, on the host CPU as 8 devices, as the engine
has the 8 chips (cpu_simulation.simulate_v6e_8; on a TPU VM the engines hold
the chips meanwhile). On one CPU device MaxText's forward of the same
weights differs from the engine's by up to 7e-3 in a logprob, where on 8 it
agrees to 1e-5: the reference keeps the engine's device count.

    python -m maxtext_rl_overlay.smoke.maxtext_model FOLDER

writes the checkpoint into FOLDER and MaxText's greedy tokens for
tiny_llama.REFERENCE_PROMPTS to FOLDER/reference.json; and the second model,
the one smoke syncs into the engine, into FOLDER/SECOND with its own
reference.json: train_rl's actor (scanned layers, another seed), which the
engine process restores (restore_actor).
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
from typing import Any

from . import tiny_llama

# MaxText's config for a model built here, outside a training run: one
# process, no checkpointing, synthetic data, no goodput recording.
OFFLINE = dict(
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
# train_rl's rollouts (support/fixes/train_rl_run.py). 8 heads and a
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


def engine_additional_config(checkpoint: pathlib.Path) -> dict[str, Any]:
    """vLLM's `additional_config` for MaxTextForCausalLM on `checkpoint`, as
    train_rl passes it (`maxtext_config`), with the checkpoint to load
    (`load_parameters_path`: MaxTextForCausalLM.load_weights restores it)."""
    return {
        "maxtext_config": {
            "model_name": ENGINE_MODEL_NAME,
            "log_config": "false",
            "override_model_config": True,
            **ENGINE_DIMS,
            **_ENGINE_PRECISION,
            "load_parameters_path": str(checkpoint / ENGINE_PARAMS),
        }
    }


#: The second model's folder under the engine's model folder, and its seed:
#: chosen, like tiny_llama.SEEDS, for greedy margins of at least 0.28 (the
#: engine's model has 0.17).
SECOND = "second"
_SECOND_SEED = 9


def _model_config(run_name: str, **overrides: Any) -> Any:
    """MaxText's config of the tiny qwen3, built here (OFFLINE, but where
    `overrides` say otherwise)."""
    from maxtext.configs import pyconfig

    settings = dict(ENGINE_DIMS, **_ENGINE_PRECISION, **OFFLINE)
    settings.update(attention="dot_product", max_target_length=64, max_prefill_predict_length=32, **overrides)
    return pyconfig.initialize(["", os.path.join(configs_dir(), "base.yml")], model_name=ENGINE_MODEL_NAME,
                               run_name=run_name, **settings)


def _write_model(path: pathlib.Path, config: Any) -> tuple[Any, Any]:
    """MaxText's model of `config` initialised at random (`from_pretrained`
    without a checkpoint; the embedding scaled by ENGINE_EMBEDDING_SCALE), its
    parameters written to path/ENGINE_PARAMS as the NNX checkpoint
    `from_pretrained` restores (each nnx.Param as {"value": array}, Orbax)."""
    import jax
    import orbax.checkpoint as ocp
    from flax import nnx
    from maxtext.utils import model_creation_utils

    model, mesh = model_creation_utils.from_pretrained(config, devices=jax.devices())
    embedding = model.token_embedder.embedding
    embedding.value = embedding.value * ENGINE_EMBEDDING_SCALE
    params = nnx.to_pure_dict(nnx.state(model, nnx.Param))
    ocp.PyTreeCheckpointer().save(path / ENGINE_PARAMS, jax.tree.map(lambda x: {"value": x}, params))
    return model, mesh


def _actor_config(path: pathlib.Path | None = None) -> Any:
    """The second model as train_rl's actor has it: scanned layers."""
    # MaxText restores a checkpoint only with checkpointing on.
    load = {"load_parameters_path": str(path / ENGINE_PARAMS), "enable_checkpointing": True} if path else {}
    return _model_config("smoke-actor", scan_layers=True, init_weights_seed=_SECOND_SEED, **load)


def write_actor_checkpoint(path: pathlib.Path) -> tuple[Any, Any, Any]:
    """The second model (train_rl's actor: scanned layers; seeded apart from
    the engine's), written to path/ENGINE_PARAMS. Returns the model, its mesh
    and config: MaxText's own forward of it is the reference after the sync."""
    config = _actor_config()
    model, mesh = _write_model(path, config)
    return model, mesh, config


def restore_actor(path: pathlib.Path) -> tuple[Any, int]:
    """The second model restored as train_rl builds its actor
    (`from_pretrained` with `load_parameters_path`, wrapped in the Tunix
    adapter), and the scan axis of its parameters."""
    import jax
    from maxtext.utils import model_creation_utils

    config = _actor_config(path)
    actor, _ = model_creation_utils.from_pretrained(config, devices=jax.devices(), wrap_with_tunix_adapter=True)
    return actor, int(getattr(config, "param_scan_axis", 1))


def write_engine_checkpoint(path: pathlib.Path) -> tuple[Any, Any, Any]:
    """The tiny qwen3 the engine starts on (_write_model, seed 0), unrolled as
    vLLM's MaxText model has it (`scan_layers=False`), and the config.json vLLM
    reads, written to path. Returns the model, its mesh and config: MaxText's
    own forward of it is the engine's reference (reference_greedy)."""
    config = _model_config("engine-reference", scan_layers=False, init_weights_seed=0)
    model, mesh = _write_model(path, config)
    (path / "config.json").write_text(json.dumps(ENGINE_HF_CONFIG))
    return model, mesh, config


def reference_greedy(model: Any, mesh: Any, config: Any, prompts: list[list[int]], max_tokens: int) -> list[dict[str, Any]]:
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

    def forward(state: Any, tokens: Any, segments: Any) -> Any:
        positions = jnp.arange(length, dtype=jnp.int32)[None]
        logits = nnx.merge(graphdef, state)(tokens, positions, decoder_segment_ids=segments, enable_dropout=False)
        return jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)

    logprobs = jax.jit(forward)

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
            out.append({"prompt": prompt, "tokens": sequence[len(prompt) :], "logprobs": values, "margins": margins})
    return out


def main(folder: pathlib.Path) -> int:
    from .cpu_simulation import simulate_v6e_8

    simulate_v6e_8()  # before jax is imported
    folder.mkdir(parents=True, exist_ok=True)
    for where, write in ((folder, write_engine_checkpoint), (folder / SECOND, write_actor_checkpoint)):
        model, mesh, config = write(where)
        reference = reference_greedy(model, mesh, config, tiny_llama.REFERENCE_PROMPTS, tiny_llama.REFERENCE_TOKENS)
        (where / "reference.json").write_text(json.dumps(reference))
    return 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1])))
