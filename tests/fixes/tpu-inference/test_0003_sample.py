"""tpu-inference: `sample()` and every sharding constraint under Explicit mesh axes
(patches/tpu-inference/0003), with MaxText 0.2.4's run-time shims and without.

At the pin, with Explicit mesh axes (jax.make_mesh's default in JAX 0.11),
`sample()` fails on every call: `jax.lax.with_sharding_constraint` only asserts
there. MaxText replaces that function process-wide with a fallback to
`reshard`; then greedy works, but sampling with top-k/top-p fails in
`binary_search.float32_bsearch` (select cases sharded differently). The patch
gives tpu-inference `constrain_sharding` (constraint under Auto axes, reshard
under Explicit ones) at every call site, and shards the search state of
`topk_mask`/`topp_mask` like their input's batch axes. Where the sampling
parameters are placed otherwise than the logits' rows is patch 0004's
(test_0004_sampling_parameters.py); the other call sites are in
test_0003_call_sites.py.

Each failure is first shown on the upstream modules (the installed files with
the series reverse-applied, see support/fixes/unpatched.py), then the
INSTALLED, patched code runs: tokens equal to the unsharded run for greedy, the
same tokens for a fixed key under Explicit and Auto axes for sampling, and
under Auto axes the very same program as upstream.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.core import ShardingTypeError  # not exported publicly
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from support.fixes import maxtext_shims
from support.fixes.matrix import AXIS_TYPES
from support.fixes.meshes import WSC_ASSERT, make_mesh, mesh_ids
from support.fixes.sampling import (
    BSEARCH,
    SELECT_ERROR,
    TOP_K,
    TOP_P,
    B,
    before_0006,
    host_logits,
    metadata,
    run_sample,
    unsharded_sample,
    upstream_sampling,
)
from support.fixes.unpatched import load_unpatched

LAYERS = "tpu_inference.layers.jax.layers"


@pytest.fixture(scope="module")
def upstream_bsearch():
    return load_unpatched("tpu-inference", BSEARCH)


@pytest.fixture(scope="module")
def upstream(upstream_bsearch):
    return upstream_sampling(upstream_bsearch)


# --------------------------------------------------------------------------
# Upstream: the failures.


@mesh_ids
def test_unpatched_sample_fails_explicit(upstream, mesh_shape):
    mesh = make_mesh(mesh_shape, "explicit")
    for do_sampling in (False, True):  # greedy: the final wsc to P(); sampling: the first
        with maxtext_shims.upstream_failure(AssertionError, match=re.escape(WSC_ASSERT)):
            run_sample(upstream, mesh, do_sampling)
    # Under MaxText's global fallback to reshard, greedy works but sampling
    # fails in the top-k/top-p binary search.
    with maxtext_shims.maxtext_shims():
        tokens, _ = run_sample(upstream, mesh, False)
        np.testing.assert_array_equal(tokens, np.argmax(host_logits(), axis=-1))
        with pytest.raises(ShardingTypeError, match=re.escape(SELECT_ERROR)) as excinfo:
            run_sample(upstream, mesh, True)
    frames = [e.frame.code.name for e in excinfo.traceback]
    assert "float32_bsearch" in frames or "int32_predicate" in frames, frames


def test_unpatched_masks_fail_explicit(upstream_bsearch):
    import tpu_inference.layers.common.binary_search as bsearch

    mesh = make_mesh((2, 4), "explicit")
    host = host_logits()
    x = jax.device_put(host, NamedSharding(mesh, P("data", None)))
    k = jnp.asarray(TOP_K)  # per row, as sample() passes them
    p = jnp.asarray(TOP_P)
    with jax.set_mesh(mesh):
        for fn, arg in (("topk_mask", k), ("topp_mask", p)):
            with pytest.raises(ShardingTypeError, match=re.escape(SELECT_ERROR)):
                jax.jit(getattr(upstream_bsearch, fn))(x, jax.device_put(arg, NamedSharding(mesh, P("data"))), -1e12)
            got = jax.jit(getattr(bsearch, fn))(x, jax.device_put(arg, NamedSharding(mesh, P("data"))), -1e12)
            assert jax.typeof(got).sharding.spec == P("data", None)
            want = getattr(bsearch, fn)(jnp.asarray(host), arg, -1e12)  # one device
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=fn)


# --------------------------------------------------------------------------
# Patched: every mesh, both axis types.


@mesh_ids
def test_sample_greedy_and_sampling(patched, mesh_shape):
    greedy_ref, greedy_logits_ref = unsharded_sample(patched, False)
    np.testing.assert_array_equal(greedy_ref, np.argmax(host_logits(), axis=-1))
    sampled_ref, _ = unsharded_sample(patched, True)
    results = {}
    for axis_type in AXIS_TYPES:
        mesh = make_mesh(mesh_shape, axis_type)
        tokens, logits = run_sample(patched, mesh, False)
        np.testing.assert_array_equal(tokens, greedy_ref, err_msg=f"greedy {axis_type}")
        np.testing.assert_array_equal(logits, greedy_logits_ref)
        results[axis_type] = run_sample(patched, mesh, True)
        # temperature 0 rows are greedy; top_k 1 rows are the argmax too
        assert results[axis_type][0][2] == greedy_ref[2] and results[axis_type][0][4] == greedy_ref[4]
    tokens = {a: r[0] for a, r in results.items()}
    for axis_type in AXIS_TYPES:
        np.testing.assert_array_equal(tokens[axis_type], tokens[AXIS_TYPES[0]], err_msg=f"sampling {axis_type}")
        np.testing.assert_allclose(results[axis_type][1], results[AXIS_TYPES[0]][1], rtol=1e-6)
    # and the same draw as on one device
    np.testing.assert_array_equal(tokens[AXIS_TYPES[0]], sampled_ref)
    # the masks really masked: top_k=1 leaves one finite logit, top_k=5 five
    processed = results[AXIS_TYPES[0]][1]
    assert (processed[4] > -1e11).sum() == 1
    assert (processed[0] > -1e11).sum() <= 5


def test_sample_auto_program_unchanged(patched, upstream):
    """Auto axes: sample() with 0001-0005 lowers to exactly upstream's program
    (patch 0006 changes it where the mesh partitions the vocab: its own
    tests), and the installed one gives upstream's tokens."""
    mesh = make_mesh((2, 4), "auto")
    x = jax.device_put(host_logits(), NamedSharding(mesh, P("data", "model")))
    series = before_0006()
    for do_sampling in (False, True):
        md = metadata(mesh, do_sampling)
        with jax.set_mesh(mesh):
            mine = series.sample.lower(jax.random.key(0), mesh, x, md).as_text()
            theirs = upstream.sample.lower(jax.random.key(0), mesh, x, md).as_text()
        assert mine == theirs, do_sampling
        np.testing.assert_array_equal(run_sample(patched, mesh, do_sampling)[0], run_sample(upstream, mesh, do_sampling)[0])


@pytest.mark.parametrize("axis_type", AXIS_TYPES)
def test_under_maxtext_shims(patched, axis_type):
    """MaxText 0.2.4 wraps everything in its shims: the overlay must not care."""
    mesh = make_mesh((2, 4), axis_type)
    x = jax.device_put(host_logits(), NamedSharding(mesh, P("data", "model")))
    tokens_in = jax.device_put(np.arange(B, dtype=np.int32) * 7, NamedSharding(mesh, P()))
    plain = [run_sample(patched, mesh, s) for s in (False, True)]
    with jax.set_mesh(mesh):
        plain_lp = patched.compute_and_gather_logprobs(x, tokens_in, 5)
    orig = jax.lax.with_sharding_constraint
    with maxtext_shims.maxtext_shims():
        assert jax.lax.with_sharding_constraint is not orig  # the shims are active
        jax.clear_caches()  # retrace: the shims act at trace time
        shimmed = [run_sample(patched, mesh, s) for s in (False, True)]
        with jax.set_mesh(mesh):
            shimmed_lp = patched.compute_and_gather_logprobs(x, tokens_in, 5)
    jax.clear_caches()
    for (t0, l0), (t1, l1) in zip(plain, shimmed, strict=True):
        np.testing.assert_array_equal(t0, t1)
        np.testing.assert_array_equal(l0, l1)
    for name in ("logprob_token_ids", "logprobs", "selected_token_ranks"):
        np.testing.assert_array_equal(np.asarray(getattr(plain_lp, name)), np.asarray(getattr(shimmed_lp, name)))


# --------------------------------------------------------------------------
# constrain_sharding itself.


def test_constrain_sharding_semantics():
    from tpu_inference.layers.common.sharding_constraint import constrain_sharding

    x_host = np.arange(8 * 16, dtype=np.float32).reshape(8, 16)

    # Auto: exactly jax.lax.with_sharding_constraint.
    auto = make_mesh((2, 4), "auto")
    xa = jax.device_put(x_host, NamedSharding(auto, P("data", None)))
    for target in (NamedSharding(auto, P(None, "model")), P("model", None), P()):
        with jax.set_mesh(auto):
            mine = jax.jit(lambda a, t=target: constrain_sharding(a, t) * 2).lower(xa).as_text()
            theirs = jax.jit(lambda a, t=target: jax.lax.with_sharding_constraint(a, t) * 2).lower(xa).as_text()
        assert mine == theirs, target

    explicit = make_mesh((2, 4), "explicit")
    xe = jax.device_put(x_host, NamedSharding(explicit, P("data", None)))
    seen: dict[str, Any] = {}

    def f(a):
        same = constrain_sharding(a, P("data"))  # already so: the very same tracer
        seen["same"] = same is a
        unconstrained = constrain_sharding(a, P(P.UNCONSTRAINED, "model"))
        seen["unconstrained"] = jax.typeof(unconstrained).sharding.spec
        tree = constrain_sharding({"a": a, "b": (a, a)}, {"a": P(), "b": NamedSharding(explicit, P(None, "model"))})
        seen["tree"] = jax.tree.map(lambda t: jax.typeof(t).sharding.spec, tree)
        return constrain_sharding(a, NamedSharding(explicit, P(None, ("data", "model"))))

    with jax.set_mesh(explicit):
        out = jax.jit(f)(xe)
    assert seen["same"]
    assert seen["unconstrained"] == P("data", "model")
    assert seen["tree"] == {"a": P(None, None), "b": (P(None, "model"), P(None, "model"))}
    assert jax.typeof(out).sharding.spec == P(None, ("data", "model"))
    np.testing.assert_array_equal(np.asarray(out), x_host)
    # eager, on a concrete array, without a mesh set
    eager = constrain_sharding(xe, NamedSharding(explicit, P()))
    assert eager.sharding.spec == P(None, None) and np.array_equal(np.asarray(eager), x_host)
    with maxtext_shims.upstream_failure(AssertionError, match=re.escape(WSC_ASSERT)), jax.set_mesh(explicit):
        jax.jit(lambda a: jax.lax.with_sharding_constraint(a, P()))(xe)  # what it replaces

    # Mixed mesh: a spec naming only Auto axes is constrained, one naming an
    # Explicit axis is resharded.
    mixed = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Auto, AxisType.Explicit))
    # (Not handled: a spec naming Auto axes for an array sharded over Explicit
    # ones; reshard refuses Auto axes and the constraint refuses Explicit ones.)
    xm = jax.device_put(x_host, NamedSharding(mixed, P(None, "model")))
    xr = jax.device_put(x_host, NamedSharding(mixed, P()))
    with jax.set_mesh(mixed):
        to_auto = jax.jit(lambda a: constrain_sharding(a, P("data", None)))
        assert "sharding_constraint" in to_auto.lower(xr).as_text()
        np.testing.assert_array_equal(np.asarray(to_auto(xr)), x_host)
        to_explicit = jax.jit(lambda a: constrain_sharding(a, P(None, None)))(xm)
        assert jax.typeof(to_explicit).sharding.spec == P(None, None)
    np.testing.assert_array_equal(np.asarray(to_explicit), x_host)


# --------------------------------------------------------------------------
# Other call sites that run on CPU: tpu_inference/layers/jax/layers.py.


def _layers_outputs(layers, mesh):
    from flax import nnx

    hidden, inter, vocab, T = 64, 128, 256, 16
    x = jax.device_put(
        np.asarray(jax.random.normal(jax.random.key(1), (T, hidden)), np.float32),
        NamedSharding(mesh, P("model", None)),  # tokens sharded: every constraint must move data
    )
    out = {}
    with jax.set_mesh(mesh):
        norm = layers.RMSNorm(dims=hidden, random_init=True, epsilon=1e-5, rngs=nnx.Rngs(0), dtype=jnp.float32)
        out["RMSNorm"] = norm(x)  # two sites, both to P()
        ffw = layers.DenseFFW(
            random_init=True, dtype=jnp.float32, hidden_act="silu", hidden_size=hidden,
            intermediate_size=inter, rngs=nnx.Rngs(0), mesh=mesh,
        )
        out["DenseFFW"] = ffw(x)
        emb = layers.Embedder(vocab_size=vocab, hidden_size=hidden, dtype=jnp.float32, random_init=True, rngs=nnx.Rngs(0))
        out["Embedder.decode"] = emb(x, decode=True)
        head = layers.LMhead(
            vocab_size=vocab, hidden_size=hidden, dtype=jnp.float32, random_init=True, rngs=nnx.Rngs(0),
            dv_sharding=(None, None),
        )
        out["LMhead.decode"] = head(x)
    return {k: np.asarray(v) for k, v in out.items()}


def test_layers_call_sites_explicit():
    patched_layers = importlib.import_module(LAYERS)
    upstream_layers = load_unpatched("tpu-inference", LAYERS)
    explicit = make_mesh((2, 4), "explicit", ("data", "model"))
    with maxtext_shims.upstream_failure(AssertionError, match=re.escape(WSC_ASSERT)):
        _layers_outputs(upstream_layers, explicit)
    got = _layers_outputs(patched_layers, explicit)
    want = _layers_outputs(patched_layers, make_mesh((2, 4), "auto", ("data", "model")))
    upstream_auto = _layers_outputs(upstream_layers, make_mesh((2, 4), "auto", ("data", "model")))
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5, err_msg=name)
        np.testing.assert_array_equal(want[name], upstream_auto[name], err_msg=name)
