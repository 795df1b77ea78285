"""tpu-inference: the rejection samplers of speculative decoding under Explicit
mesh axes (patches/tpu-inference/0005).

`RejectionSampler.forward` (greedy and random) runs its work in a
`jax.shard_map` with in_specs P(ATTN_DATA) for the draft tokens, draft
counts, target logits, bonus tokens and sampling parameters. Under Auto axes
shard_map reshards its inputs to these specs itself; under Explicit axes the
specs must match the arrays' types, and callers place them otherwise (the
logits P("data", "model"), the rest replicated, as `device_array` places it
by default), so upstream fails to trace. 0005 reshards each input to its
spec first.

On real inputs, on the runner's mesh (support/fixes/runner.py): upstream
fails under Explicit axes; the INSTALLED sampler gives under Explicit axes the
tokens upstream gives under Auto axes (and, greedy on one data shard, those
of one device), and under Auto axes lowers to upstream's very program. The
engine's own precompilation of the rejection samplers is checked, with the
rest of the sampler's, in test_series_precompile.py.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from support.fixes.meshes import mesh_ids
from support.fixes.runner import SHARD_MAP_SPECS, runner_mesh

NUM_REQS = 8
DRAFTS = 2  # per request: num_logits = 16, divisible by every data axis


def rejection_inputs(mesh, vocab: int):
    """Target logits sharded as the precompilation shards them, the rest
    replicated, as `device_array` places it by default."""
    rng = np.random.default_rng(20261130)
    num_logits = NUM_REQS * DRAFTS
    logits = (rng.normal(size=(num_logits, vocab)) * 3).astype(np.float32)
    greedy = logits.argmax(-1)
    # accept some drafts, reject others: request r takes the argmax for its
    # first r % 3 drafts
    draft = rng.integers(0, vocab, num_logits).astype(np.int32)
    for r in range(NUM_REQS):
        for j in range(min(r % 3, DRAFTS)):
            draft[r * DRAFTS + j] = greedy[r * DRAFTS + j]
    put = lambda a, spec: jax.device_put(a, NamedSharding(mesh, spec))  # noqa: E731
    return dict(
        draft_token_ids=put(draft, P(None)),
        num_draft_tokens=put(np.full(NUM_REQS, DRAFTS, np.int32), P(None)),
        draft_probs=None,
        target_logits=put(logits, P("data", "model")),
        bonus_token_ids=put(rng.integers(0, vocab, NUM_REQS).astype(np.int32), P(None)),
    )


def rejection_metadata(mesh, do_sampling: bool):
    from tpu_inference.layers.jax.sample.sampling_metadata import TPUSupportedSamplingMetadata

    put = lambda a: jax.device_put(a, NamedSharding(mesh, P(None)))  # noqa: E731
    dummy = put(np.zeros((2,), np.int32))
    if not do_sampling:
        return TPUSupportedSamplingMetadata(_cache_collision_dummy=dummy, do_sampling=False)
    return TPUSupportedSamplingMetadata(
        temperature=put(np.array([0.7, 1.0, 1.3, 0.5, 1.0, 2.0, 0.9, 1.1], np.float32)),
        top_k=put(np.array([5, 0, 3, 50, 1, 0, 10, 20], np.int32)),
        top_p=put(np.array([0.9, 0.8, 1.0, 1.0, 0.5, 1.0, 0.95, 0.7], np.float32)),
        _cache_collision_dummy=dummy,
        do_sampling=True,
    )


def run_rejection(module, mesh, do_sampling: bool, lower: bool = False):
    vocab = 1024
    sampler = module.RejectionSampler(mesh)
    args = rejection_inputs(mesh, vocab)
    md = rejection_metadata(mesh, do_sampling)
    key = jax.device_put(jax.random.key(7), NamedSharding(mesh, P()))
    with jax.set_mesh(mesh):
        if lower:
            return sampler.forward.lower(sampler, **args, sampling_metadata=md, key=key).as_text()
        out = sampler(**args, sampling_metadata=md, key=key)
    return np.asarray(out)


@mesh_ids
def test_rejection_sampler_explicit_matches_auto(overlay, upstream, mesh_shape):
    explicit, auto = runner_mesh(mesh_shape, "explicit"), runner_mesh(mesh_shape, "auto")
    for do_sampling in (False, True):
        what = "random" if do_sampling else "greedy"
        with pytest.raises(ValueError, match=SHARD_MAP_SPECS):
            run_rejection(upstream.rejection, explicit, do_sampling)
        want = run_rejection(upstream.rejection, auto, do_sampling)
        assert want.shape == (NUM_REQS * DRAFTS + NUM_REQS,)
        np.testing.assert_array_equal(run_rejection(overlay.rejection, explicit, do_sampling), want, err_msg=what)
        np.testing.assert_array_equal(run_rejection(overlay.rejection, auto, do_sampling), want, err_msg=what)
        # Auto axes: the patched rejection sampler is upstream's program
        assert run_rejection(overlay.rejection, auto, do_sampling, lower=True) == run_rejection(
            upstream.rejection, auto, do_sampling, lower=True
        ), what
    if mesh_shape[0] == 1:
        # one data shard: the greedy result is the single device's too
        one = jax.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
        np.testing.assert_array_equal(
            run_rejection(overlay.rejection, explicit, False), run_rejection(overlay.rejection, one, False)
        )
