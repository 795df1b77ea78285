"""bench_maxtext_sync's model sizes are models MaxText will build, and each
name says its parameter count.

A size MaxText refuses is only found where the benchmark runs, on a chip, and
it stops the larger sizes there: the first chip run of the table stopped at
"520M" (12 query heads over 8 KV heads: "Invalid num_kv_heads for GQA").
"""

from __future__ import annotations

import pytest

from bench import bench_maxtext_sync


def llama3_params(dims: dict) -> int:
    """The parameters of MaxText's llama3 decoder with these overrides: the
    embedding and the untied logits head, per layer the attention's four
    projections, the three MLP matrices and two norms, and the final norm."""
    emb, vocab, head = dims["base_emb_dim"], dims["vocab_size"], dims["head_dim"]
    q, kv = dims["base_num_query_heads"] * head, dims["base_num_kv_heads"] * head
    layer = emb * q * 2 + emb * kv * 2 + 3 * emb * dims["base_mlp_dim"] + 2 * emb
    return 2 * vocab * emb + dims["layers"] * layer + emb


#: The sizes given by their dims (llama3-shaped); the others name a shipped MaxText config (its own dims).
LLAMA3_SIZES = [name for name, dims in bench_maxtext_sync.SIZES.items() if "family" not in dims]


def named_count(name: str) -> float:
    return float(name[:-1]) * {"M": 1e6, "B": 1e9}[name[-1]]


@pytest.mark.parametrize("name", LLAMA3_SIZES)
def test_a_size_is_grouped_query_attention_maxtext_builds(name):
    dims = bench_maxtext_sync.SIZES[name]
    assert dims["base_num_query_heads"] % dims["base_num_kv_heads"] == 0, dims


@pytest.mark.parametrize("name", LLAMA3_SIZES)
def test_a_size_is_named_for_its_parameters(name):
    count = llama3_params(bench_maxtext_sync.SIZES[name])
    assert abs(count - named_count(name)) / named_count(name) < 0.1, f"{name}: {count / 1e6:.1f} M parameters"


def test_the_count_is_the_one_measured_on_the_chip():
    # The chip's run printed 471.1 M and 1137.8 M for the two largest (the
    # target's parameters, counted from its arrays): the formula above agrees.
    assert round(llama3_params(bench_maxtext_sync.SIZES["470M"]) / 1e5) == 4711
    assert round(llama3_params(bench_maxtext_sync.SIZES["1.1B"]) / 1e5) == 11378


def test_a_named_config_is_maxtexts_own():
    """A size named for a shipped config (the user shape's qwen3-0.6b) gives
    that config's own dims (configs/models/qwen3-0.6b.yml's), over the test
    models' tiny defaults."""
    dims = bench_maxtext_sync.SIZES["qwen3-0.6b"]
    assert dims == {"family": "qwen3", "model_name": "qwen3-0.6b", "base_emb_dim": 1024, "base_num_query_heads": 16,
                    "base_num_kv_heads": 8, "head_dim": 128, "base_mlp_dim": 3072, "vocab_size": 151936, "layers": 28}
    assert "qwen3-0.6b" not in bench_maxtext_sync.DEFAULT_SIZES["cpu"]
