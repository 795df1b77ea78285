"""google-tunix backport of upstream 9a17c3714 (Preserve optimizer-state dtypes
across updates): Tunix's PeftTrainer, which train_rl's GRPO actor update runs
(`PeftTrainer._train_step`, its depth-1 path), keeps the optimizer state in
the dtypes it was made with.

At the pin the depth-1 path divides the gradients by the loss's float32
denominator (a `LossOutput`, as GRPO's loss returns): bfloat16 weights'
gradients become float32, optax's Adam writes float32 moments over the
bfloat16 ones, and the jitted train step, its inputs' types changed,
compiles again at the second update (on the chip: the 5.8 s of train_rl's
step-2 actor update). With the backport the moments stay bfloat16 and the
second update compiles nothing.

The trainer here is Tunix's own on a bfloat16 nnx.Linear, as upstream's own
test of the commit builds it (tests/sft/peft_trainer_test.py at 9a17c3714),
with a LossOutput loss; compilations are counted by jax's own event.
"""

from __future__ import annotations

import pytest

from support.fixes import unpatched

MODULE = "tunix.sft.peft_trainer"
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@pytest.fixture(scope="module")
def trainers():
    """(the pin's peft_trainer module, the installed one)."""
    from tunix.sft import peft_trainer

    if not any(p.name.startswith("backport-9a17c3714") for p in unpatched.series("google-tunix")):
        pytest.skip("the installed google-tunix is an unpinned stand-in the backport was left out of (it predates the "
                    "gradient accumulator): would have checked that the optimizer state keeps its bfloat16 dtype")
    return unpatched.load_unpatched("google-tunix", MODULE), peft_trainer


def _run(module, steps: int = 3) -> tuple[list[int], set[str]]:
    """Compilations at each of `steps` train steps, and the optimizer state's float dtypes after them."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx
    from tunix.sft import utils as sft_utils

    compiles: list[str] = []

    def listen(event: str, seconds: float, **_) -> None:
        if event == COMPILE_EVENT:
            compiles.append(event)

    jax.monitoring.register_event_duration_secs_listener(listen)
    try:
        model = nnx.Linear(4, 2, rngs=nnx.Rngs(0), param_dtype=jnp.bfloat16)
        trainer = module.PeftTrainer(model, optax.adamw(1e-3), module.TrainingConfig(eval_every_n_steps=100, max_steps=steps))

        def loss(m, x, y):  # GRPO's form: a sum over tokens and their count (float32)
            return sft_utils.LossOutput(primary_loss=sft_utils.WeightedMetric(jnp.sum((m(x) - y) ** 2), jnp.asarray(2.0, jnp.float32)),
                                        aux_metrics={})

        trainer.with_loss_fn(loss)
        step, _ = trainer.jit_train_and_eval_step()
        inputs = {"x": jnp.ones((2, 4), jnp.bfloat16), "y": jnp.ones((2, 2), jnp.bfloat16)}
        per_step = []
        for _ in range(steps):
            before = len(compiles)
            jax.block_until_ready(step(inputs, is_update_step=jnp.asarray(True)))
            per_step.append(len(compiles) - before)
    finally:
        jax.monitoring.unregister_event_duration_listener(listen)
    state = nnx.state(trainer.optimizer, nnx.optimizer.OptState)
    leaves = jax.tree.leaves(state, is_leaf=lambda v: isinstance(v, nnx.Variable))
    return per_step, {str(v[...].dtype) for v in leaves if jnp.issubdtype(v[...].dtype, jnp.floating)}


def test_the_optimizer_state_keeps_its_dtype_and_the_second_update_compiles_nothing(trainers, record_property):
    pin, installed = trainers
    compiles, dtypes = _run(pin)
    record_property("pin", f"compilations per step {compiles}, optimizer state {sorted(dtypes)}")
    assert dtypes == {"float32"} and compiles[1] > 0, (compiles, dtypes)  # the pin: promoted, and compiled again
    compiles, dtypes = _run(installed)
    record_property("overlay", f"compilations per step {compiles}, optimizer state {sorted(dtypes)}")
    assert dtypes == {"bfloat16"} and compiles[0] > 0 and compiles[1:] == [0, 0], (compiles, dtypes)
