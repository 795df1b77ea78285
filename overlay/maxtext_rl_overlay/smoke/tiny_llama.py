"""A tiny Llama with non-degenerate random weights, as a local Hugging Face
checkpoint, and transformers' own greedy generation on it: the reference the
engine's tokens and logprobs are compared with.

The weights come from transformers' own initialisation (`LlamaForCausalLM`,
seeded) with `initializer_range` 0.2 instead of 0.02: with 0.02 the logits
of so small a model are nearly uniform (top logprob near -ln V), and greedy
tokens would be tie-breaks. Written with `save_pretrained` as safetensors, it
is loaded by the engine's real weight loader.

Imports torch and transformers when called (the engine script imports this
module too, and must not import them before vLLM does).
"""

from __future__ import annotations

import pathlib
from typing import Any

#: The checkpoint's config (transformers' LlamaConfig arguments).
CONFIG = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 8,
    "num_key_value_heads": 8,
    "head_dim": 16,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "initializer_range": 0.2,
}
SEED = 0
#: smoke's two models: the engine starts on the first, the second (its norms
#: drawn: CONSTANTS_SPREAD) is synced into it. Seeded for their greedy margins:
#: over the 16 reference tokens the best two logprobs are at least 0.07 apart
#: (0.078 and 0.159; seed 0's come within 0.02), beyond what a TPU's float32
#: matmuls at default precision move them.
SEEDS = (3, 8)
#: The prompts the reference comparison generates from (token ids; no tokenizer).
REFERENCE_PROMPTS = [[1, 5, 7, 9, 11, 13], [1, 900, 31, 415, 77, 260, 8, 512, 1000, 3, 64]]
REFERENCE_TOKENS = 8


#: The second model's parameters that transformers initialises to a constant
#: (every RMSNorm weight is ones) are drawn around it instead, with this
#: spread: the second model then differs from the first in every parameter,
#: so a sync that leaves any of them stale decodes apart from its reference.
CONSTANTS_SPREAD = 0.3


def write_checkpoint(path: pathlib.Path, seed: int = SEED, constants_spread: float = 0.0) -> pathlib.Path:
    """The tiny Llama of `seed`; with `constants_spread`, every parameter
    initialised to one value (the norms) is that value times 1 + spread * N(0, 1)."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**CONFIG, torch_dtype="float32")).eval()
    if constants_spread:
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.numel() > 1 and bool((parameter == parameter.flatten()[0]).all()):
                    parameter.mul_(1 + constants_spread * torch.randn_like(parameter))
    model.save_pretrained(path, safe_serialization=True)
    return path


def reference_greedy(path: pathlib.Path, prompts: list[list[int]], max_tokens: int) -> list[dict[str, Any]]:
    """transformers' greedy `generate` on the checkpoint (torch, CPU, float32):
    per prompt the tokens, each token's logprob (log_softmax of the raw
    logits) and the margin between the best and second-best logprob."""
    import torch
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    out = []
    for prompt in prompts:
        with torch.no_grad():
            gen = model.generate(
                torch.tensor([prompt]), max_new_tokens=max_tokens, do_sample=False,
                output_logits=True, return_dict_in_generate=True, pad_token_id=0,
            )
        tokens = gen.sequences[0, len(prompt):].tolist()
        logprobs, margins = [], []
        for token, logits in zip(tokens, gen.logits, strict=True):
            lp = torch.log_softmax(logits[0].float(), dim=-1)
            top2 = torch.topk(lp, 2).values
            logprobs.append(float(lp[token]))
            margins.append(float(top2[0] - top2[1]))
        out.append({"prompt": prompt, "tokens": tokens, "logprobs": logprobs, "margins": margins})
    return out


def reference_logits(path: pathlib.Path, prompt: list[int], rows: list[list[int]]) -> list[list[list[float]]]:
    """For each row of tokens generated after `prompt`, transformers' logits
    (float32) at each drawn position: the next-token scores the row's draws
    were made from, before temperature, top-k and top-p."""
    import torch
    import transformers

    model = transformers.LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    out = []
    for tokens in rows:
        with torch.no_grad():
            logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
        out.append(logits.float().tolist())
    return out
