"""A tiny mixture-of-experts model for the engine: Llama 4's text model
(every layer MoE: 8 experts, one routed a token, plus a shared expert), as
tpu-inference's own JAX `Llama4ForCausalLM` serves it.

transformers writes it (a `Llama4ForConditionalGeneration` whose vision
tower is tiny: the engine's loader reads the `language_model.` weights
only), with the architecture the engine looks up set to
`Llama4ForCausalLM`. In bfloat16: the engine's Llama 4 builds its
parameters in bfloat16 whatever the engine's dtype, and its loader
reinterprets the checkpoint's bytes as the parameter's dtype.

Its reference is the pin's engine on the same weights, not transformers:
the pin's Llama 4 and transformers' decode this model apart beyond
bfloat16's rounding (logprobs up to ~1 apart where the tokens agree), with
the pin's sampler as with the overlay's, so the cause is outside the
sampler, which is what the MoE engine checks.
"""

from __future__ import annotations

import json
import pathlib

SEED = 0
#: Llama 4's text model, tiny. 4 KV heads: under TP=1, EP=8 and
#: data-parallel attention the engine splits the 8 devices into
#: attn_dp_expert 2 (the rows) x expert 4, an axis the
#: LM head shards the vocab by: the rows and the vocab both split.
TEXT = dict(
    vocab_size=1024, hidden_size=128, intermediate_size=64, intermediate_size_mlp=256, num_hidden_layers=2,
    num_attention_heads=8, num_key_value_heads=4, head_dim=16, num_local_experts=8, num_experts_per_tok=1,
    interleave_moe_layer_step=1, max_position_embeddings=256, initializer_range=0.5, rms_norm_eps=1e-5,
    no_rope_layers=[1, 1], use_qk_norm=False, attention_chunk_size=8192, bos_token_id=1, eos_token_id=2, pad_token_id=0,
    rope_scaling=None,
)
VISION = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=32, patch_size=16,
              vision_output_dim=64, projector_input_dim=64, projector_output_dim=128)


def write_checkpoint(path: pathlib.Path, seed: int = SEED) -> pathlib.Path:
    import torch
    import transformers

    config = transformers.Llama4Config(text_config=TEXT, vision_config=VISION, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = transformers.Llama4ForConditionalGeneration(config).eval().to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    written = json.loads((path / "config.json").read_text())
    written["architectures"] = ["Llama4ForCausalLM"]  # tpu-inference's JAX Llama 4 (text)
    (path / "config.json").write_text(json.dumps(written, indent=1))
    return path
