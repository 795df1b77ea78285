"""google-tunix 0006 (Run transfer_state_directly as one compiled program per
structure): the direct sync is traced once per (source structure, target
structure, shardings) into one jitted program that the later syncs run
whole, its outputs on the target's shardings, the old target buffers
donated.

On tiny real MaxText models (built by MaxText's own code,
support/fixes/maxtext_models.py), synced as Tunix's VllmSampler syncs them
(reshard_pytree, the old buffers deleted, every weight required):

* the program writes what the leaf-by-leaf sync (the series before 0006)
  writes, bit for bit, every target leaf, in the families whose mapping
  does most (the dense qwen3 of the user shape; deepseek3's two stacks, its
  MoE fused and aligned; gemma4's blocks scanned twice);
* a second sync of the same structure compiles nothing and runs no Python
  walk, writes the new values, and takes the old target buffers (donated
  where the backend takes donation, a TPU: the new weights written where
  they were; deleted after the program where it takes none, the CPU, as
  the leaf-by-leaf sync deletes them); no target buffer is the actor's;
* a target that already holds one of the source's buffers keeps it (not
  donated), and a target on other devices than the source's is written by
  the program on the source's devices and moved by reshard_fn.

test_0002/test_0003/test_0005 and tests/fixes/test_families.py check the
families leaf by leaf through the same installed sync: since 0006 it is the
program they run.
"""

from __future__ import annotations

import logging

import pytest

from support.fixes import maxtext_models, maxtext_shims, unpatched

pytestmark = pytest.mark.skipif(
    maxtext_shims.GLOBAL,
    reason="the plain run of the MaxText cell syncs the real models; the shims run would repeat it: the session-wide "
           "shims (jax.lax.top_k, with_sharding_constraint) are not on the sync's path",
)

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@pytest.fixture(scope="module")
def modules():
    """(the series before 0006, the installed tunix.generate.utils)."""
    _, before, patched = unpatched.tunix_sync_modules("0006", "_SyncProgram")
    return before, patched


def _sync(module, source, dst) -> None:
    from tunix.rl import reshard

    module.transfer_state_directly(source, dst, reshard_fn=reshard.reshard_pytree, delete_dst_buffers=True,
                                   **unpatched.weights_required())


def _leaves(state) -> dict:
    import jax
    import numpy as np
    from flax import nnx

    out = {}
    for path, var in nnx.to_flat_state(state):
        value = var[...]
        if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
            value = jax.random.key_data(value)
        out[tuple(path)] = np.asarray(value)
    return out


def _buffers(arrays) -> set[int]:
    return {shard.data.unsafe_buffer_pointer() for x in arrays for shard in x.addressable_shards}


class _Compiles:
    """The XLA programs compiled while inside the block."""

    def __init__(self) -> None:
        import jax

        self.count, self.on = 0, False
        jax.monitoring.register_event_duration_secs_listener(self._heard)

    def _heard(self, event: str, duration: float, **_: object) -> None:
        if self.on and event == COMPILE_EVENT:
            self.count += 1

    def __enter__(self) -> _Compiles:
        self.count, self.on = 0, True
        return self

    def __exit__(self, *exc: object) -> None:
        self.on = False


@pytest.mark.parametrize("family", ["qwen3", "deepseek3", "gemma4"])
def test_the_program_writes_what_the_leaf_by_leaf_sync_writes(family, family_models, modules):
    import numpy as np
    from flax import nnx

    before, patched = modules
    models = family_models(family)
    source = nnx.state(models.actor)  # rng state too: every kind of leaf the mapping moves
    by_leaf, by_program = models.fresh_target(), models.fresh_target()
    _sync(before, source, by_leaf)
    _sync(patched, source, by_program)
    want, got = _leaves(by_leaf), _leaves(by_program)
    assert got.keys() == want.keys()
    differ = [p for p in want if want[p].dtype != got[p].dtype or not np.array_equal(want[p], got[p])]
    assert not differ, differ[:5]
    # And it is the values the target must receive (support/fixes/maxtext_models.py's own unroll).
    outcome = models.outcome(by_program)
    assert len(outcome["exact"]) == len(models.expected) and not outcome["sharding"], {k: v[:3] for k, v in outcome.items()}
    print(f"{family}: {len(got)} target leaves, the program's equal to the leaf-by-leaf sync's")


def test_a_second_sync_compiles_nothing_and_writes_into_the_old_buffers(family_models, modules, caplog):
    import jax
    import numpy as np
    from flax import nnx

    before, patched = modules
    models = family_models("qwen3")
    source = maxtext_models.param_state(models.actor)
    dst = models.fresh_target()
    compiles = _Compiles()
    with compiles, caplog.at_level(logging.INFO, logger="absl"):
        _sync(patched, source, dst)
    first = compiles.count
    assert first >= 1
    assert sum("one program writes" in r.getMessage() for r in caplog.records) == 1

    # The next step's actor: the same structure, other values.
    moved = jax.tree.map(lambda x: jax.jit(lambda y: y * 2, out_shardings=x.sharding)(x), source)
    old = [v[...] for _, v in nnx.to_flat_state(dst) if isinstance(v, nnx.Param)]
    caplog.clear()
    with compiles, caplog.at_level(logging.INFO, logger="absl"):
        _sync(patched, moved, dst)
    assert compiles.count == 0
    assert not any("transfer_state_directly" in r.getMessage() for r in caplog.records)  # no walk: nothing it logs
    assert all(x.is_deleted() for x in old)  # donated (a TPU), or deleted after the program (the CPU takes no donation)
    expected = models.fresh_target()
    _sync(before, moved, expected)
    want, got = _leaves(expected), _leaves(dst)
    assert all(np.array_equal(want[p], got[p]) for p in want)
    new = [v[...] for _, v in nnx.to_flat_state(dst) if isinstance(v, nnx.Param)]
    assert not _buffers(new) & _buffers(jax.tree.leaves(moved))
    print(f"first sync: {first} programs compiled; second: {compiles.count}; {len(old)} old target weights donated or deleted")


def test_a_target_holding_a_source_buffer_keeps_it(family_models, modules):
    """A target weight that is one of the source's arrays (an earlier sync
    outside the program left it so) must outlive the sync: nothing is
    donated, and the source stays whole."""
    import jax
    import numpy as np
    from flax import nnx

    _, patched = modules
    models = family_models("qwen3")
    source = maxtext_models.param_state(models.actor)
    dst = models.fresh_target()
    _sync(patched, source, dst)
    flat = dict(nnx.to_flat_state(dst))
    norm = ("model", "decoder", "decoder_norm", "scale")
    shared = {tuple(p): v for p, v in nnx.to_flat_state(source)}[("base", *norm[1:])][...]
    flat[norm].value = shared
    _sync(patched, source, dst)
    assert not shared.is_deleted()
    assert all(not x.is_deleted() for x in jax.tree.leaves(source))
    assert np.array_equal(np.asarray(dict(nnx.to_flat_state(dst))[norm][...]), models.expected[norm])


def test_a_target_on_other_devices_is_resharded_after_the_program(modules):
    """Source and target on disjoint devices (a rollout on chips of its own):
    the program runs on the source's, reshard_fn moves its outputs."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    _, patched = modules
    devices = jax.devices()
    if len(devices) < 2:
        pytest.skip("needs 2 devices or more (the 8-device CPU simulation): would have synced between disjoint ones")
    half = len(devices) // 2
    on_source = NamedSharding(Mesh(np.array(devices[:half]), ("x",)), P())
    on_target = NamedSharding(Mesh(np.array(devices[half:]), ("x",)), P())
    layers, width = 3, 4
    stacked = jnp.arange(width * layers * width, dtype=jnp.float32).reshape(width, layers, width)
    source = {"decoder": {"layers": {"w": jax.device_put(stacked, on_source)}}}
    target = nnx.State({"decoder": {f"layers_{i}": {"w": nnx.Param(jax.device_put(jnp.zeros((width, width)), on_target))}
                                    for i in range(layers)}})
    _sync(patched, source, target)
    for i in range(layers):
        got = target["decoder"][f"layers_{i}"]["w"][...]
        assert got.sharding.device_set == on_target.device_set
        assert np.array_equal(np.asarray(got), np.asarray(stacked[:, i, :]))
