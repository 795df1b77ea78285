"""google-tunix 0004 (Take the anchor policy snapshot only for a learner
that reads it): Tunix's RLEngine.sync_weights, which train_rl's GRPO runs at
every step, ends each weight sync by copying the actor's whole state to
pinned host memory (the anchor policy). Only get_actor_per_token_logps reads
that copy, and GRPOLearner asks for it only when use_rollout_logps is off or
sampler_is is "token"; MaxText's train_rl keeps Tunix's defaults, so at the
pin the copy is taken at every step and never read (on the v5e at
qwen3-0.6b the pins' weight sync took 2.91 s a step, the overlay's 0.28 s:
docs/hardware.md, "The pins side by side at qwen3-0.6b").

With 0004, GRPOLearner turns the snapshot off where its config never reads
it: no copy is taken at any sync, and the trained actor is the same as with
the snapshot on (the pin's way: the flag set back after the learner is made,
the same sync code). Where its config reads it (use_rollout_logps off), the
snapshot is taken at every sync, as at the pin, and read.

The learner, the engine and the rollout are Tunix's own, on Tunix's toy
transformer (tunix.tests.test_common), built as upstream's own GRPO tests
build them; the rollout (Tunix's vanilla one) on a mesh of its own, its
model a copy, so the weights are synced at every step as vLLM's are in
train_rl.
"""

from __future__ import annotations

from typing import Any

import pytest

from support.fixes import unpatched
from support.fixes.matrix import MAXTEXT_SHIMS
from support.fixes.train_rl_stand_ins import sync_weights_as_on_tpu

pytestmark = pytest.mark.skipif(
    MAXTEXT_SHIMS, reason="the plain run of the MaxText cell and py312 run it; MaxText's shims are not on Tunix's learner")

#: GRPO steps of each run (one prompt of two generations a step).
STEPS = 2


@pytest.fixture(scope="module")
def tunix_with_0004():
    if not any(p.name.startswith("0004-") for p in unpatched.series("google-tunix")):
        pytest.skip("the installed google-tunix is an unpinned stand-in 0004 was left out of (it predates "
                    "use_rollout_logps): would have checked that GRPO's weight sync takes no anchor snapshot it never reads")


def _train(monkeypatch, *, use_rollout_logps: bool, snapshot: bool | None = None) -> dict:
    """One GRPO run of STEPS steps: the snapshots taken at its syncs, the
    actor's logprobs asked of the trainer, its syncs, and the trained actor's
    parameters. `snapshot` sets the engine's flag after the learner is made."""
    import jax
    import numpy as np
    import optax
    from flax import nnx
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from tunix.rl import rl_cluster as rl_engine_lib
    from tunix.rl.grpo import grpo_learner as grpo_lib
    from tunix.rl.rollout import base_rollout
    from tunix.tests import test_common as tc

    # The rollout's mesh another layout of the trainer's devices (as train_rl's engine shares the trainer's
    # chips): its model a copy of its own, which every sync reshards.
    devices = sorted(jax.devices(), key=lambda d: d.id)[:4]
    trainer_mesh = Mesh(np.array(devices).reshape(len(devices), 1), ("fsdp", "tp"))
    rollout_mesh = Mesh(np.array(devices).reshape(1, len(devices)), ("fsdp", "tp"))
    vocab = tc.MockVocab()
    config = tc.ModelConfig(vocab_size=vocab.GetPieceSize())

    def on_the_trainers_devices():
        model = tc.ToyTransformer(config=config, rngs=nnx.Rngs(0))
        nnx.update(model, jax.device_put(nnx.state(model), NamedSharding(trainer_mesh, PartitionSpec())))
        return model

    engine = rl_engine_lib.RLEngine(
        actor=on_the_trainers_devices(),
        reference=on_the_trainers_devices(),
        tokenizer=vocab,
        cluster_config=rl_engine_lib.ClusterConfig(
            role_to_mesh={rl_engine_lib.Role.ACTOR: trainer_mesh, rl_engine_lib.Role.REFERENCE: trainer_mesh,
                          rl_engine_lib.Role.ROLLOUT: rollout_mesh},
            rollout_engine="vanilla",
            offload_to_cpu=False,
            training_config=rl_engine_lib.RLTrainingConfig(actor_optimizer=optax.sgd(1e-2), eval_every_n_steps=100,
                                                           max_steps=STEPS),
            rollout_config=base_rollout.RolloutConfig(max_tokens_to_generate=8, max_prompt_length=32,
                                                      kv_cache_size=64, temperature=0.9, return_logprobs=True),
        ),
    )
    learner = grpo_lib.GRPOLearner(rl_engine=engine, reward_fns=lambda completions, **_: np.arange(len(completions)),
                                   algo_config=grpo_lib.GRPOConfig(num_generations=2, num_iterations=1,
                                                                   use_rollout_logps=use_rollout_logps))
    assert learner.should_sync_weights
    if snapshot is not None:
        engine.snapshot_anchor_policy = snapshot

    seen: dict[str, Any] = {"snapshots": 0, "actor_logps": 0, "syncs": 0}
    put = rl_engine_lib.rl_utils.put_params_on_memory_kind

    def counted_put(params, memory_kind):
        seen["snapshots"] += memory_kind == "pinned_host"
        return put(params, memory_kind)

    monkeypatch.setattr(rl_engine_lib.rl_utils, "put_params_on_memory_kind", counted_put)
    guards: list[str] = []
    # The sync's CPU-only transfer guards entered as on a TPU (train_rl's runs do the same): they refuse the
    # reshard's copy through the host that the CPU backend makes between two meshes.
    monkeypatch.setattr(engine, "sync_weights", sync_weights_as_on_tpu(engine.sync_weights, guards))
    for name in ("get_actor_per_token_logps", "sync_weights"):
        method, key = getattr(engine, name), "actor_logps" if name.startswith("get") else "syncs"

        def counted(*args, _method=method, _key=key, **kwargs):
            seen[_key] += 1
            return _method(*args, **kwargs)

        monkeypatch.setattr(engine, name, counted)
    prompts = ["input string", "hello world", "My name", "hello there"]
    data = [{"prompts": np.array([p]), "answer": np.array([p])} for p in prompts * STEPS]  # batches of one
    learner.train(data, None)
    seen["flag"] = engine.snapshot_anchor_policy
    seen["anchor_held"] = engine._anchor_policy_state is not None
    seen["actor"] = {k: np.asarray(v) for k, v in nnx.to_flat_state(nnx.state(engine.actor_trainer.model, nnx.Param))}
    monkeypatch.undo()
    return seen


def test_grpo_with_the_rollouts_logprobs_takes_no_anchor_snapshot_and_trains_the_same(tunix_with_0004, monkeypatch,
                                                                                        record_property):
    import numpy as np

    pin_way = _train(monkeypatch, use_rollout_logps=True, snapshot=True)
    record_property("snapshot on (the pin's way)", {k: v for k, v in pin_way.items() if k != "actor"})
    assert pin_way["syncs"] == STEPS and pin_way["snapshots"] == STEPS and pin_way["actor_logps"] == 0, pin_way

    overlay = _train(monkeypatch, use_rollout_logps=True)
    record_property("overlay", {k: v for k, v in overlay.items() if k != "actor"})
    assert overlay["flag"] is False and overlay["syncs"] == STEPS, overlay
    assert overlay["snapshots"] == 0 and not overlay["anchor_held"] and overlay["actor_logps"] == 0, overlay
    assert overlay["actor"].keys() == pin_way["actor"].keys()
    for key, value in overlay["actor"].items():
        np.testing.assert_array_equal(value, pin_way["actor"][key], err_msg=str(key))


def test_grpo_that_reads_the_anchor_still_snapshots_it_at_every_sync(tunix_with_0004, monkeypatch):
    seen = _train(monkeypatch, use_rollout_logps=False)
    assert seen["flag"] is True and seen["syncs"] == STEPS, seen
    assert seen["snapshots"] == STEPS and seen["anchor_held"] and seen["actor_logps"] >= STEPS, seen
