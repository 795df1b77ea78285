"""tpu-inference: sampling and logprobs on the vocab-sharded logits of the
runner's mesh (patches/tpu-inference/0006).

On the runner's mesh (Auto axes; support/fixes/runner.py builds it with the
runner's own code), upstream's `sample()` and `compute_and_gather_logprobs`
compile with an all-gather of the whole [B, V] logits onto every device.
Patch 0006 passes the runner's mesh to them and works shard by shard: each
shard's candidates (values, global ids) cross devices, never the vocab.

These tests run the INSTALLED wheel against the pin's sampler
(support/fixes/runner.py: upstream_sampler) on the same mesh and inputs:
- the compiled programs: upstream's hold a collective yielding a tensor with
  the vocab as a dimension, the overlay's none; where the mesh does not
  partition the vocab ("model" of size 1) the overlay's program is
  upstream's, text for text;
- greedy and sampled tokens for the same keys identical to upstream's, the
  processed logits (the top-k/top-p sets, ties at the k-th value included)
  identical, including rows that take the fallback searches (top_k above the
  candidate budget; top-p needing more than the candidates);
- logprobs (raw and processed, sampled-token and prompt): ids and ranks
  identical, logprobs equal to float rounding.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from support.fixes.logprobs import assert_same_result, collective_results
from support.fixes.matrix import MESHES, TOP_K
from support.fixes.meshes import mesh_ids
from support.fixes.runner import overlay_sampler, runner_mesh, upstream_sampler

B, V = 8, 1024
KEYS = (0, 1, 2, 3)

@pytest.fixture(scope="module")
def upstream():
    return upstream_sampler().sampling


@pytest.fixture(scope="module")
def overlay():
    return overlay_sampler().sampling


def partitions_vocab(mesh_shape) -> bool:
    return mesh_shape[1] > 1  # ("data", "model"): the vocab is sharded over "model"


def logits_with_ties() -> np.ndarray:
    rng = np.random.default_rng(20261202)
    x = (rng.normal(size=(B, V)) * 3).astype(np.float32)
    x[0, [3, 700]] = x[0].max() + 1  # a tie for the maximum: argmax takes the first
    # Row 1: the 5th largest value four times, on different shards (top_k 5: all kept).
    top = np.sort(x[1])[::-1]
    x[1, [10, 300, 555, 1000]] = top[4]
    # Row 3: 100 equal values at the top (top_k 70 > the budget: the fallback search; ties kept).
    x[3, ::10][:100] = 9.0
    # Row 5: a flat row with top_p 0.999: more than the candidates are kept (the fallback search).
    x[5] = rng.normal(size=V).astype(np.float32) * 0.01
    return x


TEMPERATURE = np.array([0.7, 1.0, 0.0, 1.3, 0.5, 1.0, 2.0, 0.9], np.float32)
TOP_KS = np.array([5, 5, 3, 70, 1, 0, 10, 20], np.int32)
TOP_P = np.array([0.9, 1.0, 1.0, 1.0, 0.5, 0.999, 0.95, 0.7], np.float32)


def metadata(mesh, do_sampling, top_k=TOP_KS, temperature=TEMPERATURE, top_p=TOP_P):
    from tpu_inference.layers.common.sharding import ShardingAxisName
    from tpu_inference.layers.jax.sample.sampling_metadata import TPUSupportedSamplingMetadata

    def put(a, spec):
        return jax.device_put(a, NamedSharding(mesh, spec))

    dummy = put(np.zeros((2,), np.int32), P())
    if not do_sampling:
        return TPUSupportedSamplingMetadata(do_sampling=False, _cache_collision_dummy=dummy)
    rows = P(ShardingAxisName.ATTN_DATA)
    return TPUSupportedSamplingMetadata(temperature=put(temperature, rows), top_k=put(top_k, rows), top_p=put(top_p, rows),
                                        _cache_collision_dummy=dummy, do_sampling=True)


def logits_on(mesh, x=None):
    from tpu_inference.layers.common.sharding import ShardingAxisName

    x = logits_with_ties() if x is None else x
    return jax.device_put(x, NamedSharding(mesh, P(ShardingAxisName.MLP_DATA, ShardingAxisName.MLP_TENSOR)))


def programs(module, mesh, k=20, stage=lambda lowered: lowered.compile()) -> dict[str, str]:
    """The compiled HLO (or another `stage`'s text) of each program as the
    runner calls it (the overlay's logprobs functions with the runner's mesh;
    the pin's take none)."""
    x = logits_on(mesh)
    ids = jax.device_put(np.arange(B, dtype=np.int32), NamedSharding(mesh, P()))
    takes_mesh = (mesh,) if module.__name__.endswith("sampling") else ()
    out = {}
    for sampled in (False, True):
        out[f"sample(do_sampling={sampled})"] = stage(module.sample.lower(jax.random.key(0), mesh, x, metadata(mesh, sampled))).as_text()
    out["compute_and_gather_logprobs"] = stage(module.compute_and_gather_logprobs.lower(x, ids, k, *takes_mesh)).as_text()
    out["compute_and_gather_prompt_logprobs"] = stage(module.compute_and_gather_prompt_logprobs.lower(x, ids, k, *takes_mesh)).as_text()
    return out


def vocab_collectives(hlo: str) -> list:
    return [c for c in collective_results(hlo) if V in c[2]]


@mesh_ids
def test_no_collective_moves_the_vocab(upstream, overlay, mesh_shape):
    mesh = runner_mesh(mesh_shape, "auto")
    theirs, ours = programs(upstream, mesh), programs(overlay, mesh)
    if not partitions_vocab(mesh_shape):
        # Today's path stays where the mesh does not partition the vocab:
        # upstream's StableHLO, text for text (the compiled HLO names the source files).
        assert programs(overlay, mesh, stage=lambda lowered: lowered) == programs(upstream, mesh, stage=lambda lowered: lowered)
        return
    # Upstream: the sampling and logprobs programs gather the whole rows
    # (all-gather f32[8,1024]); its greedy argmax XLA partitions here.
    gathered = [k for k, v in theirs.items() if vocab_collectives(v)]
    assert gathered == [k for k in theirs if k != "sample(do_sampling=False)"], {k: vocab_collectives(v) for k, v in theirs.items()}
    assert {k: vocab_collectives(v) for k, v in ours.items()} == dict.fromkeys(ours, [])


@mesh_ids
def test_sampled_tokens_and_sets_are_upstreams(upstream, overlay, mesh_shape):
    mesh = runner_mesh(mesh_shape, "auto")
    x = logits_on(mesh)
    for sampled in (False, True):
        for key in KEYS:
            want_tokens, want_logits = upstream.sample(jax.random.key(key), mesh, x, metadata(mesh, sampled))
            got_tokens, got_logits = overlay.sample(jax.random.key(key), mesh, x, metadata(mesh, sampled))
            np.testing.assert_array_equal(np.asarray(got_tokens), np.asarray(want_tokens), err_msg=f"tokens, key {key}")
            want_logits, got_logits = np.asarray(want_logits), np.asarray(got_logits)
            # The same top-k/top-p sets (masked to -1e12), the same values.
            np.testing.assert_array_equal(got_logits <= -1e11, want_logits <= -1e11, err_msg="kept set")
            np.testing.assert_allclose(got_logits, want_logits, rtol=1e-6, err_msg="processed logits")
    kept = (np.asarray(overlay.sample(jax.random.key(0), mesh, x, metadata(mesh, True))[1]) > -1e11).sum(axis=1)
    # The ties and fallbacks the rows are built for really happened.
    host = logits_with_ties()
    assert kept[1] == (host[1] >= host[1, 10]).sum() > TOP_KS[1], kept  # every tie at the k-th value
    assert kept[3] == 100 and kept[5] > 64 * mesh_shape[1], kept  # the fallbacks: more than the candidates


# The (2, 4) mesh (rows and vocab both split, as in the engine's tiny MoE)
# in the quick matrix too: there the bug this test names showed.
@pytest.mark.parametrize("mesh_shape", sorted(set(MESHES) | {(2, 4)}), ids=lambda m: "x".join(map(str, m)))
def test_bfloat16_logits_keep_upstreams_sets(upstream, overlay, mesh_shape):
    """A bfloat16 model's logits (the engine's tiny MoE, any bfloat16 model
    on a TPU) hold many ties. At the rollout's settings (temperature 0.9,
    top_k 50, top_p 0.95) the top-p threshold falls on one of the row's
    own probabilities: the overlay keeps every value upstream keeps (ties
    included) and draws the same tokens. The candidates' probabilities,
    computed apart from the row's, once rounded an ulp away and cut the
    threshold's own value on the (2, 4) mesh (22 of 40 seeds and keys, by hand)."""
    mesh = runner_mesh(mesh_shape, "auto")
    meta = metadata(mesh, True, temperature=np.full(B, 0.9, np.float32), top_k=np.full(B, 50, np.int32), top_p=np.full(B, 0.95, np.float32))
    for seed in range(10):
        rng = np.random.default_rng(seed)
        x = logits_on(mesh, np.asarray(jax.numpy.asarray(rng.normal(size=(B, V)) * 3, jax.numpy.bfloat16), np.float32))
        want_tokens, want_logits = upstream.sample(jax.random.key(seed), mesh, x, meta)
        got_tokens, got_logits = overlay.sample(jax.random.key(seed), mesh, x, meta)
        np.testing.assert_array_equal(np.asarray(got_tokens), np.asarray(want_tokens), err_msg=f"tokens, seed {seed}")
        np.testing.assert_array_equal(np.asarray(got_logits) <= -1e11, np.asarray(want_logits) <= -1e11, err_msg=f"kept set, seed {seed}")


@mesh_ids
@pytest.mark.parametrize("k", TOP_K)
def test_logprobs_are_upstreams(upstream, overlay, mesh_shape, k):
    mesh = runner_mesh(mesh_shape, "auto")
    x = logits_on(mesh)
    _, processed = overlay.sample(jax.random.key(0), mesh, x, metadata(mesh, True))
    ids = jax.device_put(np.array([0, 3, 700, 1023, 5, 1000, 10, 300], np.int32), NamedSharding(mesh, P()))
    for what, logits in (("raw", x), ("processed", processed)):
        for fn in ("compute_and_gather_logprobs", "compute_and_gather_prompt_logprobs"):
            want = getattr(upstream, fn)(logits, ids, k)
            got = getattr(overlay, fn)(logits, ids, k, mesh)
            assert_same_result([np.asarray(a) for a in got[:3]], [np.asarray(a) for a in want[:3]], "float32", f"{fn} {what} k={k}")


def test_vocab_layout_only_where_the_vocab_is_partitioned():
    from tpu_inference.layers.jax.sample import vocab_sharded

    assert vocab_sharded.vocab_layout(runner_mesh((1, 8), "auto"), (B, V)).vocab_axes == ("model",)
    assert vocab_sharded.vocab_layout(runner_mesh((8, 1), "auto"), (B, V)) is None  # all devices on the rows
    assert vocab_sharded.vocab_layout(runner_mesh((1, 8), "explicit"), (B, V)) is None  # 0001-0004's path
    assert vocab_sharded.vocab_layout(None, (B, V)) is None
    assert vocab_sharded.vocab_layout(runner_mesh((1, 8), "auto"), (B, V + 1)) is None  # not evenly split
    assert not vocab_sharded.uses_candidates(vocab_sharded.vocab_layout(runner_mesh((1, 8), "auto"), (B, V)), V, V // 8)


def test_dp_attention_mesh_keeps_todays_programs(upstream, overlay):
    """Data-parallel attention over every device (NEW_MODEL_DESIGN's 7
    axes, all 8 devices on "attn_dp"; with TP=1, EP=8 the engine puts the
    experts on "expert" instead: test_series_engine_start.py's tiny MoE):
    the vocab is not partitioned outside the data axes, so the
    overlay lowers to upstream's programs, text for text, and they compile."""
    from tpu_inference.layers.common.sharding import MESH_AXIS_NAMES, ShardingAxisName, ShardingAxisNameBase
    from tpu_inference.layers.jax.sample import vocab_sharded

    shape = tuple(8 if name == "attn_dp" else 1 for name in MESH_AXIS_NAMES)
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(shape), MESH_AXIS_NAMES)  # Auto axes, as the runner's
    saved = dict(ShardingAxisName._overrides)
    # The axis names NEW_MODEL_DESIGN=1 gives (this process chose the 2D ones).
    ShardingAxisName.override(**{name: getattr(ShardingAxisNameBase, name) for name in ("ATTN_DATA", "MLP_DATA", "MLP_TENSOR")})
    try:
        assert vocab_sharded.vocab_layout(mesh, (B, V)) is None
        programs(overlay, mesh)  # they compile
        assert programs(overlay, mesh, stage=lambda lowered: lowered) == programs(upstream, mesh, stage=lambda lowered: lowered)
    finally:
        ShardingAxisName.reset()
        ShardingAxisName.override(**saved)
