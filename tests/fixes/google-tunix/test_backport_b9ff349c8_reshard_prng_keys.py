"""Tunix: typed PRNG keys through `reshard_pytree`
(patches/google-tunix/backport-b9ff349c8-*, the reshard part of upstream's b9ff349c8).

`reshard_pytree` is the reshard function of every weight sync of Tunix's
vLLM rollout, and our 0001 sends Flax NNX rng state through that sync: an
`nnx.RngKey` holds a typed key array (dtype `key<fry>`).

- At the pin, `reshard_pytree` hands the tree as it is to the reshard
  function it picks (Pathways' reshard where the Pathways proxy backend is,
  else `jax.device_put`): the typed keys reach it.
- With the backport, the reshard function is only ever handed plain arrays
  (the keys' uint32 data), and the keys come back typed, with their own
  implementation, on the target sharding, with the same bits.

What the CPU simulation cannot show is a reshard function failing on a typed
key: on CPU `reshard_pytree` falls back to `jax.device_put`, which moves typed
keys itself, and Pathways' reshard needs the Pathways proxy backend (see the
patch). So the reshard function is recorded here: `jax.device_put` as the
real `_get_reshard_fn_jax_device_put` builds it, wrapped to record what it is
handed. Both versions of `reshard_pytree` are the real ones (the pin's: the
installed reshard.py with the series reverse-applied, support/fixes/unpatched.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from tunix.generate import utils
from tunix.rl import reshard

from support.fixes.meshes import make_mesh
from support.fixes.unpatched import load_unpatched

KEY = "key<fry>"


@pytest.fixture(scope="module")
def mesh():
    return make_mesh((2, 4), "auto")


@pytest.fixture(scope="module")
def pin():
    return load_unpatched("google-tunix", "tunix.rl.reshard")


def _recording(module, monkeypatch) -> list[str]:
    """Make `module.reshard_pytree` pick a recording `jax.device_put` (built
    by the module's own factory); returns the dtypes it is handed."""
    seen: list[str] = []
    build = module._get_reshard_fn_jax_device_put

    def recording_factory(**kwargs):
        put = build(**kwargs)

        def reshard_fn(source, target):
            seen.extend(str(leaf.dtype) for leaf in jax.tree.leaves(source))
            return put(source, target)

        return reshard_fn

    monkeypatch.setattr(module, "_get_reshard_fn_jax_device_put", recording_factory)
    return seen


def _tree(mesh):
    """A weight and rng state as an RngKey holds it: one key, and keys
    stacked over 8 layers (a scanned MaxText decoder's)."""
    return (
        {
            "w": jax.device_put(jnp.arange(8.0).reshape(2, 4), NamedSharding(mesh, P())),
            "key": jax.random.key(42),
            "layer_keys": jax.random.split(jax.random.key(7), 8),
        },
        {
            "w": NamedSharding(mesh, P("data", "model")),
            "key": NamedSharding(mesh, P()),
            "layer_keys": NamedSharding(mesh, P("model")),
        },
    )


def test_the_pins_reshard_function_is_handed_typed_keys(pin, mesh, monkeypatch):
    seen = _recording(pin, monkeypatch)
    source, target = _tree(mesh)
    pin.reshard_pytree(source, target, cache_plan=False)
    assert sorted(seen) == sorted(["float32", KEY, KEY]), seen


def test_reshard_function_is_handed_key_data_and_keys_come_back_typed(mesh, monkeypatch):
    seen = _recording(reshard, monkeypatch)
    source, target = _tree(mesh)
    out = jax.block_until_ready(reshard.reshard_pytree(source, target, cache_plan=False))
    assert sorted(seen) == ["float32", "uint32", "uint32"], seen
    for name in ("key", "layer_keys"):
        assert jax.dtypes.issubdtype(out[name].dtype, jax.dtypes.prng_key), out[name].dtype
        assert jax.random.key_impl(out[name]) == jax.random.key_impl(source[name])
        assert out[name].sharding.is_equivalent_to(target[name], out[name].ndim), out[name].sharding
        np.testing.assert_array_equal(jax.random.key_data(out[name]), jax.random.key_data(source[name]))
    assert out["w"].sharding.is_equivalent_to(target["w"], 2)
    np.testing.assert_array_equal(out["w"], source["w"])


@pytest.mark.parametrize("version", ["pin", "overlay"])
def test_the_sync_sends_rng_keys_through_reshard_pytree(version, pin, mesh, monkeypatch):
    """The weight sync's path (0001's transfer_state_directly with
    reshard_fn=reshard_pytree, as VllmSampler.update_params calls it): an
    unrolled target's per-layer RngKey gets the scanned source's keys. Under
    the pin's reshard_pytree its reshard function is handed them typed; under
    the backport's, only their data."""
    module = pin if version == "pin" else reshard
    seen = _recording(module, monkeypatch)
    layers = 4
    keys = jax.random.split(jax.random.key(3), layers)
    src = nnx.State({"decoder": {"layers": {"attention_op": {"rngs": {"dropout": {"key": nnx.RngKey(keys)}}}}}})
    dst = nnx.State({"decoder": {
        f"layers_{i}": {"attention_op": {"rngs": {"dropout": {"key": nnx.RngKey(
            jax.device_put(jax.random.key(100 + i), NamedSharding(mesh, P())))}}}}
        for i in range(layers)}})
    utils.transfer_state_directly(src, dst, reshard_fn=module.reshard_pytree, scan_axis=0)
    assert set(seen) == ({KEY} if version == "pin" else {"uint32"}), seen
    for i in range(layers):
        got = dst["decoder"][f"layers_{i}"]["attention_op"]["rngs"]["dropout"]["key"][...]
        assert jax.dtypes.issubdtype(got.dtype, jax.dtypes.prng_key), got.dtype
        np.testing.assert_array_equal(jax.random.key_data(got), jax.random.key_data(keys[i]))
