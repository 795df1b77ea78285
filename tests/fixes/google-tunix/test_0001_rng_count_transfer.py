"""The Tunix fix: Flax NNX rng-count leaves in `transfer_state_directly`, on hand-made trees.

patches/google-tunix/0001 makes `tunix.generate.utils` unroll a scanned
MaxText state into an unrolled (vLLM) state when the source holds Flax NNX
rng counts. These hand-made trees pin the mechanisms at the report's sizes:

* a count stacked to `(80,)` (Llama-3.1-70B), whose rank cannot hold the
  default `scan_axis=1` (upstream: IndexError at `arr.shape[scan_axis]`);
* a scalar `()` count under `layers` for 34 layers (upstream: IndexError at
  `unstacked_cache[cache_key][layer_idx]`): a Variable the scan broadcast to
  every layer, which all of them share. (In the real Gemma3-4B, the scalar the
  report's error met is the decoder-level `dropout.rngs`, which upstream's
  fallback path matched; test_0001_maxtext_models.py syncs real MaxText
  models, where every layer has its own rng state.)
* more layers than MaxText's shim's fixed 256, layer-count mismatches, the
  helpers called positionally as MaxText's shim calls them.

Each bug is first reproduced on the upstream module (the installed file with
the series reverse-applied, see support/fixes/unpatched.py) with the report's exact error,
then shown fixed in the installed, patched tunix. Every target is a real
`nnx.State` of arrays sharded over the simulated 8-device mesh, and the
transfer goes through Tunix's own `reshard_pytree`, as in MaxText's RL trainer.
The same transfer under MaxText 0.2.4's run-time shims is checked last.
"""

from __future__ import annotations

import pathlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tunix.generate import utils as patched
from tunix.rl import reshard

from support.fixes import maxtext_shims
from support.fixes.matrix import AXIS_TYPES
from support.fixes.meshes import make_mesh
from support.fixes.tunix_errors import SCALAR_RNG, STACKED_RNG, assert_report_error
from support.fixes.unpatched import load_before, load_unpatched

D, H, F = 8, 4, 16  # embed dim, head dim, mlp dim: tiny, the layer count matters
SCAN_AXIS = 1  # transfer_state_directly's default, what MaxText uses
RNG = ("dropout", "rngs", "params", "count")  # the report's leaf


@pytest.fixture(scope="module")
def upstream():
    mod = load_unpatched("google-tunix", "tunix.generate.utils")
    # The two must really differ, or every "before" below proves nothing.
    assert "num_tgt_layers" in pathlib.Path(patched.__file__).read_text()
    assert "num_tgt_layers" not in pathlib.Path(mod.__file__).read_text()
    return mod


@pytest.fixture(scope="module", params=AXIS_TYPES)
def mesh(request):
    assert jax.device_count() == 8, "conftest should simulate 8 devices"
    return make_mesh((2, 4), request.param)


def _put(mesh, value, *spec):
    return jax.device_put(value, NamedSharding(mesh, P(*spec)))


def _random(shape, seed, dtype=jnp.float32):
    return jax.random.normal(jax.random.key(seed), shape, jnp.float32).astype(dtype)


def _nest(flat: dict) -> dict:
    tree: dict = {}
    for path, leaf in flat.items():
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = leaf
    return tree


def _source(mesh, num_layers, *, rng=None, ordinary=True):
    """A scanned MaxText-like state: layers stacked at SCAN_AXIS.

    `rng` is the rng-count leaf under `decoder/layers/...`: "stacked" gives it
    shape (num_layers,) (Llama), "scalar" shape () (Gemma3), None leaves it out.
    """
    L = num_layers
    flat: dict[tuple[str, ...], Any] = {}
    if ordinary:
        flat.update({
            # pure unstack, sharded source
            ("decoder", "layers", "mlp", "w1", "kernel"): nnx.Param(
                _put(mesh, _random((D, L, F), 1), "data", None, "model")),
            # pure unstack of a rank-2 leaf (norm scale): layers at axis 1
            ("decoder", "layers", "pre_norm", "scale"): nnx.Param(
                _put(mesh, _random((D, L), 2), "data", None)),
            # bulk align: 2 KV heads repeated to the target's 4
            ("decoder", "layers", "attention", "key", "kernel"): nnx.Param(
                _put(mesh, _random((D, L, 2, H), 3), None, None, None, None)),
            # bf16 -> f32 cast before unstacking
            ("decoder", "layers", "attention", "out", "kernel"): nnx.Param(
                _put(mesh, _random((H, L, D), 4, jnp.bfloat16), None, None, "data")),
            # direct match, not scanned
            ("decoder", "decoder_norm", "scale"): nnx.Param(
                _put(mesh, _random((D,), 5), None)),
        })
    if rng == "stacked":
        counts = (jnp.arange(L, dtype=jnp.uint32) * 7 + 3)
        flat[("decoder", "layers") + RNG] = nnx.RngCount(_put(mesh, counts, None))
    elif rng == "scalar":
        flat[("decoder", "layers") + RNG] = nnx.RngCount(
            _put(mesh, jnp.array(41, jnp.uint32)))
    elif rng is not None:
        raise ValueError(rng)
    return nnx.State({"base": _nest(flat)})


def _target(mesh, num_layers, *, rng=True, ordinary=True):
    """An unrolled vLLM-like state: layers_0..layers_{n-1}, sharded, zeroed."""
    flat: dict[tuple[str, ...], Any] = {}
    for i in range(num_layers):
        layer = ("decoder", f"layers_{i}")
        if ordinary:
            flat[layer + ("mlp", "w1", "kernel")] = nnx.Param(
                _put(mesh, jnp.zeros((D, F)), None, "model"))
            flat[layer + ("pre_norm", "scale")] = nnx.Param(
                _put(mesh, jnp.zeros((D,)), "model"))
            flat[layer + ("attention", "key", "kernel")] = nnx.Param(
                _put(mesh, jnp.zeros((D, 4, H)), None, "model", None))
            flat[layer + ("attention", "out", "kernel")] = nnx.Param(
                _put(mesh, jnp.zeros((H, D)), None, "model"))
        if rng:
            flat[layer + RNG] = nnx.RngCount(_put(mesh, jnp.array(0, jnp.uint32)))
    if ordinary:
        flat[("decoder", "decoder_norm", "scale")] = nnx.Param(
            _put(mesh, jnp.zeros((D,)), None))
    return nnx.State({"model": _nest(flat)})


def _flat(state) -> dict:
    return {path: var[...] for path, var in nnx.to_flat_state(state)}


def _layer_path(i, leaf):
    return ("model", "decoder", f"layers_{i}") + leaf


def _is_rng(path) -> bool:
    return path[-len(RNG):] == RNG


def _transfer(module, src, dst, **kwargs):
    module.transfer_state_directly(src, dst, reshard_fn=reshard.reshard_pytree, **kwargs)
    return dst


# -- Llama-3.1-70B: a stacked (80,) rng count --------------------------------


def test_stacked_rng_count_upstream_fails(upstream, mesh):
    with pytest.raises(IndexError) as excinfo:
        _transfer(upstream, _source(mesh, 80, rng="stacked"), _target(mesh, 80))
    assert_report_error(excinfo, STACKED_RNG)


def test_stacked_rng_count_fixed(upstream, mesh):
    L = 80
    src = _source(mesh, L, rng="stacked")
    counts = np.asarray(src["base"]["decoder"]["layers"]["dropout"]["rngs"]["params"]["count"][...])
    dst = _flat(_transfer(patched, src, _target(mesh, L)))
    for i in range(L):
        got = dst[_layer_path(i, RNG)]
        assert got.shape == () and got.dtype == jnp.uint32
        assert int(got) == counts[i] == 7 * i + 3
        assert got.sharding.is_equivalent_to(NamedSharding(mesh, P()), 0)

    # The ordinary scanned weights beside it come out bit-identical to what
    # upstream produces for the same state without the rng leaf (which it can
    # transfer), with the target's sharding.
    reference = _flat(_transfer(upstream, _source(mesh, L), _target(mesh, L, rng=False)))
    ordinary = {k: v for k, v in dst.items() if not _is_rng(k)}
    assert ordinary.keys() == reference.keys()
    assert len(ordinary) == 4 * L + 1
    for path, want in reference.items():
        got = ordinary[path]
        assert got.dtype == want.dtype and got.shape == want.shape, path
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=str(path))
        assert got.sharding == want.sharding, path
    # ... and they are what they should be, not merely equal to each other.
    s = src["base"]["decoder"]
    np.testing.assert_array_equal(
        np.asarray(dst[_layer_path(5, ("mlp", "w1", "kernel"))]),
        np.asarray(s["layers"]["mlp"]["w1"]["kernel"][...][:, 5, :]))
    np.testing.assert_array_equal(
        np.asarray(dst[_layer_path(79, ("attention", "key", "kernel"))]),
        np.repeat(np.asarray(s["layers"]["attention"]["key"]["kernel"][...][:, 79]), 2, axis=1))
    np.testing.assert_array_equal(
        np.asarray(dst[_layer_path(0, ("attention", "out", "kernel"))]),
        np.asarray(s["layers"]["attention"]["out"]["kernel"][...][:, 0, :].astype(jnp.float32)))


# -- one scalar () rng count broadcast to all 34 layers ----------------------


def test_scalar_rng_count_upstream_fails(upstream, mesh):
    with pytest.raises(IndexError) as excinfo:
        _transfer(upstream, _source(mesh, 34, rng="scalar", ordinary=False),
                  _target(mesh, 34, ordinary=False))
    assert_report_error(excinfo, SCALAR_RNG)


def test_scalar_rng_count_fixed_and_shared(mesh):
    """The scalar count reaches all 34 layers. Leaf by leaf (0001 alone, the
    series before 0006) the reshard is handed the one source buffer for every
    layer and, both sides replicated, leaves them all on it; the installed
    sync (0006: one program, its outputs its own) writes each layer's count
    into a buffer of its own, none of them the source's."""
    L = 34
    leaf_by_leaf = load_before("google-tunix", "tunix.generate.utils", "0006", "tunix_generate_utils_before_0006")
    src = _source(mesh, L, rng="scalar")
    scalar = src["base"]["decoder"]["layers"]["dropout"]["rngs"]["params"]["count"][...]
    source_buffers = {tuple(s.data.unsafe_buffer_pointer() for s in scalar.addressable_shards)}
    seen = {}

    def recording_reshard(source, target):
        seen.update(jax.tree_util.tree_flatten_with_path(source)[0])
        return reshard.reshard_pytree(source, target)

    for module in (leaf_by_leaf, patched):
        dst = _target(mesh, L)
        module.transfer_state_directly(src, dst, reshard_fn=recording_reshard)
        flat = _flat(dst)
        rng_paths = [p for p in flat if _is_rng(p)]
        assert len(rng_paths) == L
        for i in range(L):
            assert int(flat[_layer_path(i, RNG)]) == 41
        buffers = {tuple(s.data.unsafe_buffer_pointer() for s in flat[p].addressable_shards) for p in rng_paths}
        if module is leaf_by_leaf:
            given = [v for k, v in seen.items() if tuple(getattr(p, "key", p) for p in k)[-4:] == RNG]
            assert len(given) == L
            assert all(v is scalar for v in given)
            assert buffers == source_buffers
        else:
            assert len(buffers) == L and not buffers & source_buffers


# -- more layers than the workaround's fixed 256 ------------------------------


@pytest.mark.parametrize("rng", ["stacked", "scalar"])
def test_more_than_256_layers(rng, mesh):
    L = 300
    src = _source(mesh, L, rng=rng, ordinary=False)
    dst = _flat(_transfer(patched, src, _target(mesh, L, ordinary=False)))
    assert len(dst) == L
    want = [7 * i + 3 for i in range(L)] if rng == "stacked" else [41] * L
    assert [int(dst[_layer_path(i, RNG)]) for i in range(L)] == want


# -- a stacked leaf whose layer count differs from the target's ---------------


def test_stacked_count_mismatch_raises_value_error(upstream, mesh):
    # rng count (80,) into a 34-layer target: upstream IndexError, now a
    # ValueError naming the leaf, its shape and the expected layer count.
    with pytest.raises(IndexError):
        _transfer(upstream, _source(mesh, 80, rng="stacked", ordinary=False),
                  _target(mesh, 34, ordinary=False))
    with pytest.raises(ValueError) as excinfo:
        _transfer(patched, _source(mesh, 80, rng="stacked", ordinary=False),
                  _target(mesh, 34, ordinary=False))
    message = str(excinfo.value)
    assert "decoder.layers.dropout.rngs.params.count" in message
    assert "(80,)" in message and "34 layers" in message


def _mismatch(src_layers, tgt_layers):
    """The fix's message for the first scanned weight (any of them) it meets."""
    return (
        rf"^Scanned source decoder\.layers\.[\w.]+ of shape \(\d+, {src_layers}(, \d+)*\)"
        rf" holds {src_layers} layers along scan axis 1, but the target expects"
        rf" {tgt_layers} layers of shape \(\d+(, \d+)*\)\.$"
    )


def test_ordinary_weight_count_mismatch_raises_value_error(upstream, mesh):
    # Fewer source layers than target layers: upstream IndexError.
    with pytest.raises(IndexError):
        _transfer(upstream, _source(mesh, 34), _target(mesh, 80, rng=False))
    with pytest.raises(ValueError, match=_mismatch(34, 80)):
        _transfer(patched, _source(mesh, 34), _target(mesh, 80, rng=False))
    # More source layers than target layers: upstream silently transfers the
    # first 34 of 80 layers; the fix refuses.
    src = _source(mesh, 80)
    dst = _flat(_transfer(upstream, src, _target(mesh, 34, rng=False)))
    np.testing.assert_array_equal(
        np.asarray(dst[_layer_path(33, ("mlp", "w1", "kernel"))]),
        np.asarray(src["base"]["decoder"]["layers"]["mlp"]["w1"]["kernel"][...][:, 33, :]))
    with pytest.raises(ValueError, match=_mismatch(80, 34)):
        _transfer(patched, _source(mesh, 80), _target(mesh, 34, rng=False))


# -- the helpers, called positionally as MaxText does -------------------------


def test_bulk_align_and_unstack_positional(upstream, mesh):
    path = "decoder.layers.dropout.rngs.params.count"
    per_layer = _put(mesh, jnp.array(0, jnp.uint32))
    val = _put(mesh, jnp.arange(80, dtype=jnp.uint32), None)
    with pytest.raises(IndexError) as excinfo:
        upstream._bulk_align_and_unstack(val, SCAN_AXIS, per_layer, path)
    assert_report_error(excinfo, STACKED_RNG)
    out = patched._bulk_align_and_unstack(val, SCAN_AXIS, per_layer, path)
    assert len(out) == 80
    assert all(o.shape == () for o in out)
    assert [int(o) for o in out] == list(range(80))

    # An ordinary scanned weight needing alignment: bit-identical to upstream.
    kv = _put(mesh, _random((D, 80, 2, H), 9), None, None, None, None)
    tgt = _put(mesh, jnp.zeros((D, 4, H)), None, "model", None)
    want = upstream._bulk_align_and_unstack(kv, SCAN_AXIS, tgt, "attention.key.kernel")
    got = patched._bulk_align_and_unstack(kv, SCAN_AXIS, tgt, "attention.key.kernel")
    assert len(got) == len(want) == 80
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape == (D, 4, H) and g.dtype == w.dtype
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w))

    # A leaf with no layer axis at all: a ValueError naming it, not an IndexError.
    with pytest.raises(ValueError, match=r"Cannot unstack decoder\.layers\.x of shape \(\)"):
        patched._bulk_align_and_unstack(jnp.array(1.0), SCAN_AXIS, jnp.array(0.0), "decoder.layers.x")


def test_unstack_scanned_param_positional(upstream):
    val = jnp.arange(80, dtype=jnp.uint32)
    tgt = jnp.array(0, jnp.uint32)
    with pytest.raises(ValueError):  # upstream transposes with perm (1, 0)
        upstream._unstack_scanned_param(val, tgt, "count", SCAN_AXIS)
    out = patched._unstack_scanned_param(val, tgt, "count", SCAN_AXIS)
    assert [int(o) for o in out] == list(range(80))
    w = _random((D, 80, F), 11)
    want = upstream._unstack_scanned_param(w, jnp.zeros((D, F)), "w", SCAN_AXIS)
    got = patched._unstack_scanned_param(w, jnp.zeros((D, F)), "w", SCAN_AXIS)
    assert len(got) == len(want) == 80
    for g, x in zip(got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(x))


# --------------------------------------------------------------------------
# Tunix transfer_state_directly under MaxText's shims, and the bf16 -> f32 cast.


def test_tunix_transfer_under_maxtext_shims():
    from tunix.generate import utils as tunix_utils

    mesh = make_mesh((2, 4), "explicit")
    out_kernel = ("attention", "out", "kernel")  # bf16 in the source, f32 in the target
    for rng, layers in (("stacked", 80), ("scalar", 34)):
        plain = _flat(_transfer(tunix_utils, _source(mesh, layers, rng=rng), _target(mesh, layers)))
        with maxtext_shims.maxtext_shims():
            shimmed = _flat(_transfer(tunix_utils, _source(mesh, layers, rng=rng), _target(mesh, layers)))
        assert plain.keys() == shimmed.keys()
        for path in plain:
            a, b = plain[path], shimmed[path]
            if path[-3:] == out_kernel:
                # Tunix casts to the target's dtype; MaxText's shim keeps bf16.
                assert a.dtype == jnp.float32 and b.dtype == jnp.bfloat16, path
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b.astype(jnp.float32)))
            else:
                assert a.dtype == b.dtype and a.shape == b.shape, path
                np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=str(path))
        assert int(plain[_layer_path(layers - 1, RNG)]) == int(shimmed[_layer_path(layers - 1, RNG)])


def test_tpu_inference_params_take_the_model_dtype():
    """Why the bf16 -> f32 skip is not needed at the pin: tpu-inference's JAX layers
    create their weights in the dtype they are given (upstream 56f7404d0), so a
    bf16 model has bf16 targets and Tunix's cast is a no-op for them."""
    from flax import nnx
    from tpu_inference.layers.jax.embed import JaxEmbed
    from tpu_inference.layers.jax.linear import JaxEinsum, JaxLinear
    from tpu_inference.layers.jax.norm import JaxRmsNorm

    rngs = nnx.Rngs(0)
    layers = {
        "JaxEinsum": JaxEinsum("TD,DF->TF", (8, 16), rngs=rngs, dtype=jnp.bfloat16),
        "JaxLinear": JaxLinear(8, 16, rngs=rngs, dtype=jnp.bfloat16),
        "JaxEmbed": JaxEmbed(num_embeddings=32, features=8, rngs=rngs, dtype=jnp.bfloat16),
        "JaxRmsNorm": JaxRmsNorm(8, rngs=rngs, dtype=jnp.bfloat16),
    }
    for name, layer in layers.items():
        dtypes = {leaf.dtype for leaf in jax.tree.leaves(nnx.state(layer, nnx.Param))}
        assert dtypes == {jnp.dtype(jnp.bfloat16)}, (name, dtypes)
