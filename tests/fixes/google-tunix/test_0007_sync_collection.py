"""google-tunix 0007 (Skip sync_weights' full collection where the sync freed
the old weights): RLCluster.sync_weights collects garbage after a sync only
where a direct sync kept the old target buffers, or where none ran.

Tunix's own RLCluster.sync_weights (the installed method) on a stand-in
cluster: a tiny real MaxText qwen3 actor (support/fixes/maxtext_models.py,
built by MaxText's code) and a rollout whose update_params is Tunix's direct
sync into the rollout's target, as VllmSampler.update_params calls it:

* the series before 0007 runs a full collection after every sync, the old
  weights freed by the sync or not;
* with 0007 and `delete_dst_buffers` (the vLLM rollout's default) no full
  collection runs, and twenty syncs of an actor that moves each step, with
  Python's collector off throughout, leave jax's live arrays as the second
  sync left them (their count and bytes; the first traces the mapping):
  nothing is left for a collection to free;
* a sync that keeps the old buffers, and a rollout that syncs without
  transfer_state_directly, are collected after, one full collection a sync.

The user-shape train_rl run (tests/fixes/test_train_rl.py,
support/fixes/step_accounting.py) measures what each full collection in the
sync freed, step by step.
"""

from __future__ import annotations

import gc
import pathlib
import types

import pytest

from support.fixes import maxtext_shims, unpatched

pytestmark = pytest.mark.skipif(
    maxtext_shims.GLOBAL,
    reason="the plain run of the MaxText cell runs it; the shims run would repeat it: the session-wide shims "
           "(jax.lax.top_k, with_sharding_constraint) are not on sync_weights' path",
)

SYNCS = 20


class _Rollout:
    """update_params as VllmSampler's direct sync makes it (its KV cache aside)."""

    def __init__(self, target, delete: bool | None) -> None:
        self.target, self.delete = target, delete

    def update_params(self, state, filter_types=None) -> None:
        if self.delete is None:  # a rollout that syncs by other means
            return
        from tunix.generate import utils
        from tunix.rl import reshard

        utils.transfer_state_directly(state, self.target, reshard_fn=reshard.reshard_pytree, delete_dst_buffers=self.delete,
                                      **unpatched.weights_required())


@pytest.fixture(scope="module")
def before():
    """tunix.rl.rl_cluster as the series leaves it before 0007."""
    from tunix.rl import rl_cluster

    module = unpatched.load_before("google-tunix", "tunix.rl.rl_cluster", "0007", "tunix_rl_rl_cluster_before_0007")
    assert "recording_syncs" in pathlib.Path(rl_cluster.__file__).read_text()
    assert "recording_syncs" not in pathlib.Path(module.__file__).read_text()
    return module


@pytest.fixture
def cluster(family_models, before, monkeypatch):
    """(a stand-in RLCluster for sync_weights, the full collections
    sync_weights ran so far, a function that moves its actor as a training
    step does)."""
    import jax
    from flax import nnx
    from tunix.rl import rl_cluster

    models = family_models("qwen3")
    actor = nnx.clone(models.actor)  # the session's models stay as they are
    collections: list[int] = []

    def collect(*_: object) -> int:
        collections.append(1)
        return 0

    for module in (rl_cluster, before):
        monkeypatch.setattr(module, "gc", types.SimpleNamespace(collect=collect))
    step = jax.jit(lambda x: x * 1.0009765625)  # exact in bfloat16 and float32: a new array each step

    def train() -> None:
        params = nnx.state(actor, nnx.Param)
        nnx.update(actor, jax.tree.map(step, params))

    def make(delete: bool | None):
        return types.SimpleNamespace(actor_trainer=types.SimpleNamespace(model=actor),
                                     rollout=_Rollout(models.fresh_target(), delete), snapshot_anchor_policy=False,
                                     global_steps=0)

    return make, collections, train


def _sync(cluster, module=None) -> None:
    from tunix.rl import rl_cluster

    (module or rl_cluster).RLCluster.sync_weights(cluster)


def _live() -> tuple[int, int]:
    import jax

    arrays = jax.live_arrays()
    return len(arrays), sum(x.nbytes for x in arrays)


def test_before_0007_every_sync_is_collected(cluster, before):
    make, collections, train = cluster
    one = make(delete=True)
    for _ in range(2):
        train()
        _sync(one, before)
    assert len(collections) == 2, collections


def test_a_sync_that_freed_the_old_weights_is_not_collected_and_leaves_nothing_behind(cluster):
    make, collections, train = cluster
    one = make(delete=True)
    gc.collect()
    gc.disable()
    try:
        # Two steps first: the actor's arrays (shared with the session's models until its first step) its
        # own, the program compiled (the first sync traces the mapping and walks the states once).
        for _ in range(2):
            train()
            _sync(one)
        first = _live()
        after = []
        for _ in range(SYNCS):
            train()
            _sync(one)
            after.append(_live())
    finally:
        gc.enable()
    assert collections == [], "sync_weights collected after a sync that had freed the old weights itself"
    assert all(a == first for a in after), (first, after)
    assert one.global_steps == SYNCS + 2
    print(f"{SYNCS} syncs after the first two, no full collection, the collector off: {first[0]} live arrays, "
          f"{first[1] / 2**20:.2f} MiB after each")


@pytest.mark.parametrize("delete", [False, None], ids=["the old buffers kept", "no direct sync"])
def test_a_sync_that_left_the_old_weights_is_collected_after(cluster, delete):
    make, collections, train = cluster
    other = make(delete=delete)
    for _ in range(2):
        train()
        _sync(other)
    assert len(collections) == 2, collections
