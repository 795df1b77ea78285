"""google-tunix 0003 (Fail the rollout's direct sync on weights it would
leave stale): a sync that would leave a rollout weight at its old value
stops, naming it, in the path train_rl takes (VllmSampler.update_params:
its direct sync, MaxText's maxtext_on_vllm, and its sync with mappings,
vllm_native), before anything is resharded, written or deleted; rng state,
which differs by design, stays exempt.

The stale sync is a real one: a tiny MaxText deepseek3 (built by MaxText's
own code, support/fixes/maxtext_models.py) whose actor has one scanned
weight under another name, as a MaxText release that renamed a layer's
module would hand it over. Before 0003 (the series up to 0002) the same
sync completes and the rollout model keeps that weight's initial value in
every layer, with a warning naming the source leaf.

VllmSampler.update_params runs as Tunix wrote it, around a stand-in of the
running engine (the runner holding the target state, and the KV-cache
calls it makes): the engine itself is not what is under test here, and
starting one costs a minute; smoke's MaxText configuration syncs through
the same method in a real engine (tests/fixes/test_smoke.py).
"""

from __future__ import annotations

import logging
import pathlib

import pytest

from support.fixes import maxtext_models, maxtext_shims

pytestmark = pytest.mark.skipif(
    maxtext_shims.GLOBAL,
    reason="the plain run of the MaxText cell and py312 run it; the session-wide shims are not on the sync's path",
)

FAMILY = "deepseek3"
#: The scanned weight given another name in the actor's state.
RENAMED = ("base", "decoder", "moe_layers", "self_attention", "wq_a", "kernel")


@pytest.fixture(scope="module")
def stale_case(family_models):
    """(models, the actor's param state with RENAMED's module renamed, the target leaves it would leave stale)."""
    from flax import nnx

    if not maxtext_models.AVAILABLE:
        pytest.skip("needs MaxText 0.2.4 (the matrix's maxtext-0.2.4 cell): would sync a tiny real MaxText deepseek3 "
                    "with one weight renamed and check that the rollout's sync stops naming it")

    models = family_models(FAMILY)
    flat = dict(nnx.to_flat_state(maxtext_models.param_state(models.actor)))
    assert RENAMED in flat, sorted(flat)[:5]
    flat[RENAMED[:-2] + (RENAMED[-2] + "_renamed", RENAMED[-1])] = flat.pop(RENAMED)
    stale = [p for p in models.layer_params() if p[2].startswith("moe_layers_") and p[3:] == RENAMED[3:]]
    assert len(stale) == 3, stale  # each of the 3 MoE layers
    return models, nnx.from_flat_state(flat), stale


def _values(state) -> dict:
    import numpy as np
    from flax import nnx

    return {tuple(p): np.asarray(v[...]) for p, v in nnx.to_flat_state(state) if isinstance(v, nnx.Param)}


def test_before_0003_the_stale_weight_passes_with_a_warning(stale_case, caplog):
    import numpy as np
    from tunix.rl import reshard

    from support.fixes.unpatched import load_before

    models, source, stale = stale_case
    before = load_before("google-tunix", "tunix.generate.utils", "0003", "tunix_generate_utils_before_0003")
    assert "weight_types" not in pathlib.Path(before.__file__).read_text()
    dst = models.fresh_target()
    old = _values(dst)
    with caplog.at_level(logging.WARNING):
        before.transfer_state_directly(source, dst, reshard_fn=reshard.reshard_pytree)
    new = _values(dst)
    assert [p for p in new if np.array_equal(new[p], old[p])] == stale
    assert any("1 source leaves have no target" in r.getMessage() for r in caplog.records)


def test_a_sync_that_would_leave_weights_stale_stops_naming_them(stale_case):
    import numpy as np
    from flax import nnx
    from tunix.generate import utils
    from tunix.rl import reshard

    models, source, _ = stale_case
    dst = models.fresh_target()
    old = _values(dst)
    with pytest.raises(ValueError) as excinfo:
        utils.transfer_state_directly(source, dst, reshard_fn=reshard.reshard_pytree, delete_dst_buffers=True,
                                      weight_types=(nnx.Param,))
    said = str(excinfo.value)
    assert said.startswith(f"transfer_state_directly: 3 of {len(models.expected)} target weights would keep their old values"), said
    assert "decoder.moe_layers_{0-2}.self_attention.wq_a.kernel." in said, said
    assert "Source leaves without a target: decoder.moe_layers.self_attention.wq_a_renamed.kernel." in said, said
    # Nothing resharded, nothing deleted: the target is as it was.
    new = _values(dst)
    assert all(np.array_equal(new[p], old[p]) for p in old)


def test_without_weight_types_the_trees_are_intersected_as_upstream_does(stale_case):
    """Tunix's own contract (its utils_test.py: a target's extra leaves are
    kept): other callers of transfer_state_directly see no change."""
    import numpy as np
    from tunix.generate import utils
    from tunix.rl import reshard

    models, source, stale = stale_case
    dst = models.fresh_target()
    old = _values(dst)
    utils.transfer_state_directly(source, dst, reshard_fn=reshard.reshard_pytree)
    new = _values(dst)
    assert [p for p in new if np.array_equal(new[p], old[p])] == stale


class _ModelConfig:
    """The runner's model config, as the mapped sync reads it (the KV heads and head size it aligns to)."""

    def get_total_num_kv_heads(self):
        return 1

    def get_head_size(self):
        return 4


class _Runner:
    """The running engine's model runner, as update_params reads it: its state and model config."""

    def __init__(self, state):
        self.state = state
        self.model_config = _ModelConfig()


class _Engine:
    """A stand-in of vLLM's LLM around a runner: the calls update_params makes."""

    def __init__(self, state):
        self.calls: list[str] = []
        runner = _Runner(state)
        self.llm_engine = type("E", (), {"model_executor": type("X", (), {"driver_worker": type("W", (), {"model_runner": runner})})})

    def reset_prefix_cache(self):
        self.calls.append("reset_prefix_cache")

    def collective_rpc(self, method):
        self.calls.append(method)


def _sampler(state):
    from tunix.generate.mappings import MappingConfig
    from tunix.generate.vllm_sampler import VllmConfig, VllmSampler

    sampler = VllmSampler.__new__(VllmSampler)
    sampler.llm, sampler._driver = _Engine(state), None
    sampler.config = VllmConfig(mapping_config=MappingConfig(), additional_config={"maxtext_config": {}}, tensor_parallel_size=8)
    sampler.args = {"tensor_parallel_size": 8}
    sampler.to_hf_key_mappings, sampler.to_hf_transpose_keys, sampler.to_hf_hook_fns = {}, None, None
    return sampler


def test_the_rollouts_sync_requires_every_weight(stale_case):
    """VllmSampler.update_params (what MaxTextVllmSampler's load_checkpoint and
    RLCluster.sync_weights call) stops on the stale sync; the right one syncs."""
    import numpy as np
    from flax import nnx

    models, source, _ = stale_case
    dst = models.fresh_target()
    sampler = _sampler(dst)
    with pytest.raises(ValueError, match=r"3 of \d+ target weights would keep their old values"):
        sampler.update_params(source, (nnx.Param,))
    # The initial load passes no filter: nnx.Param is required all the same.
    with pytest.raises(ValueError, match=r"3 of \d+ target weights would keep their old values"):
        sampler.update_params(source)
    # A LoRA actor's sync (RLCluster.sync_weights' filter) requires the LoRA weights alone; the target has none.
    sampler.update_params(source, (nnx.LoRAParam,))

    right = models.fresh_target()
    sampler = _sampler(right)
    sampler.update_params(maxtext_models.param_state(models.actor), (nnx.Param,))
    got = _values(right)
    assert all(np.array_equal(got[p], models.expected[p]) for p in models.expected)
    assert sampler.llm.calls == ["reset_prefix_cache", "delete_kv_cache", "reinitialize_kv_cache"]


# -- the sync with mappings (vllm_native): its mechanism on a small state -----
#
# The real one: tests/fixes/test_families.py (MaxText's Qwen
# mapping names the LM head `model.lm_head`, tpu-inference's untied Qwen3
# holds `lm_head.weight`; full matrix).


def _mapped_case(tied: bool):
    """(source, target, mappings): the mappings reach the embedding and the
    norm of the target, not its LM head, which is the embedding's shape
    (`tied`: a head Tunix mirrors the embedding into) or its transpose."""
    import jax.numpy as jnp
    from flax import nnx

    source = nnx.State({"embedding": nnx.Param(jnp.arange(12.0).reshape(3, 4)), "norm": nnx.Param(jnp.ones(4) * 2)})
    head = (3, 4) if tied else (4, 3)
    target = nnx.State({"model": {"embed": {"embedding": nnx.Param(jnp.zeros((3, 4)))}, "norm": nnx.Param(jnp.zeros(4)),
                                  "lm_head": nnx.Param(jnp.full(head, -1.0))},
                        "rng": nnx.RngKey(jnp.zeros((2,), jnp.uint32))})
    mappings = {"embedding": ("model.embed.embedding", None), "norm": ("model.norm", None)}
    return source, target, mappings


def test_a_mapped_sync_that_would_leave_a_weight_stale_stops_naming_it():
    import numpy as np
    from flax import nnx
    from tunix.generate import utils

    from support.fixes.unpatched import load_before

    before = load_before("google-tunix", "tunix.generate.utils", "0003", "tunix_generate_utils_before_0003_mapped")
    source, target, mappings = _mapped_case(tied=False)
    kept = before.transfer_state_with_mappings(source, target, mappings)  # before 0003: the head keeps its value
    assert np.all(np.asarray(kept["model"]["lm_head"][...]) == -1.0)

    source, target, mappings = _mapped_case(tied=False)
    with pytest.raises(ValueError, match=r"1 of 3 target weights would keep their old values, no mapping reaching them .*: "
                                         r"model\.lm_head\.$"):
        utils.transfer_state_with_mappings(source, target, mappings, weight_types=(nnx.Param,))
    assert np.all(np.asarray(target["model"]["embed"]["embedding"][...]) == 0.0), "nothing is written before the check"

    # A head Tunix mirrors the tied embedding into is reached; rng state is never required.
    source, target, mappings = _mapped_case(tied=True)
    done = utils.transfer_state_with_mappings(source, target, mappings, weight_types=(nnx.Param,))
    np.testing.assert_array_equal(np.asarray(done["model"]["lm_head"][...]), np.arange(12.0).reshape(3, 4))
    # Without weight_types, Tunix's own contract: what no mapping reaches keeps its value.
    source, target, mappings = _mapped_case(tied=False)
    kept = utils.transfer_state_with_mappings(source, target, mappings)
    assert np.all(np.asarray(kept["model"]["lm_head"][...]) == -1.0)


def test_the_rollouts_mapped_sync_requires_every_weight():
    """VllmSampler.update_params with mappings (vllm_native) passes the kind it syncs."""
    from flax import nnx

    source, target, mappings = _mapped_case(tied=False)
    sampler = _sampler(target)
    sampler.to_hf_key_mappings = mappings
    with pytest.raises(ValueError, match="model.lm_head"):
        sampler.update_params(source, (nnx.Param,))
