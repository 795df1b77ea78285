"""google-tunix 0002 (Map MaxText's DeepSeek stacks and block-scanned MoE in
transfer_state_directly) on every family MaxText 0.2.4's Tunix integration
ships a weight mapping for: llama3, qwen2, qwen3 dense and MoE, gemma3,
gpt-oss, deepseek3 and deepseek2's shape, each a tiny real model built by
MaxText's own code (support/fixes/maxtext_models.py: the actor as train_rl
builds it, scanned; the rollout target as MaxTextForCausalLM.load_weights
builds it, unrolled, on a data=2 x model=4 mesh).

Each family is synced as train_rl's `maxtext_on_vllm` syncs it (the actor's
nnx.Param state, MaxText's own pre-unroll, then transfer_state_directly as
VllmSampler.update_params calls it: every weight required, patch 0003) and
as Tunix's own vLLM rollout syncs it (no pre-unroll), and every target
parameter is checked against the actor's value by MaxText's layout, which
is checked against MaxText's own pre-unroll wherever that runs.

What the series did before 0002 (main before it; the pins alike), on the
same states: DeepSeek's `dense_layers_K` and `moe_layers_K` all kept their
initial values (only a warning named the source leaves), and GPT-OSS's
prefused MoE `wi` of every layer too, on the path without MaxText's
pre-unroll; MaxText 0.2.4's own pre-unroll stops on GPT-OSS before Tunix is
called (test_maxtexts_pre_unroll_stops_on_gpt_oss: MaxText's code, not the
series'). With 0002 every target parameter of every family is the actor's.

The quick matrix takes the families 0002 changes (deepseek3, gpt-oss); the
full matrix every family.
"""

from __future__ import annotations

import os
import re

import pytest

from support.fixes import maxtext_models, maxtext_shims, unpatched

pytestmark = [
    pytest.mark.skipif(
        not maxtext_models.AVAILABLE,
        reason="needs MaxText 0.2.4 (the matrix's maxtext-0.2.4 cell): would sync tiny real models of every family "
        "MaxText's train_rl maps (deepseek3, deepseek2, gemma3, gpt-oss, llama3, qwen2, qwen3 dense and MoE) through "
        "transfer_state_directly, before 0002 and with it, and check every target parameter",
    ),
    pytest.mark.skipif(
        maxtext_shims.GLOBAL,
        reason="the plain run of the MaxText cell syncs the real models; the shims run would repeat it: the "
        "session-wide shims (jax.lax.top_k, with_sharding_constraint) are not on the sync's path",
    ),
]

#: The families whose structures 0002 maps: DeepSeek's stacks, GPT-OSS's block-scanned MoE.
CHANGED = {"deepseek3", "deepseek2", "gpt-oss"}
QUICK = os.environ.get("MRL_QUICK") == "1"
#: Gemma 4 (no mapping of MaxText 0.2.4's Tunix integration) is test_0005's.
FAMILIES = ["deepseek3", "gpt-oss"] if QUICK else [f for f in maxtext_models.FAMILIES if f not in maxtext_models.GEMMA4]
TRAIN_RL, TUNIX = "param-only, MaxText pre-unroll", "param-only"
#: MaxText 0.2.4's pre-unroll stops on these (maxtext_vllm_rollout.unroll_gemma_scanned_weights).
PRE_UNROLL_STOPS = {"gpt-oss"}


@pytest.fixture(scope="module")
def modules():
    """(the pins' transfer_state_directly, the series' before 0002, the installed)."""
    return unpatched.tunix_sync_modules("0002", "target_layer_pattern")


@pytest.mark.parametrize("family", FAMILIES)
def test_the_layout_checked_against_is_maxtexts_own(family_models, family, record_property):
    """The values the tests require (MaxText's layout, maxtext_models) equal
    MaxText's own pre-unroll of the actor, leaf by leaf, wherever it runs."""
    import numpy as np
    from flax.traverse_util import flatten_dict

    models = family_models(family)
    if family in PRE_UNROLL_STOPS:
        pytest.skip(f"MaxText 0.2.4's pre-unroll stops on {family} (test_maxtexts_pre_unroll_stops_on_gpt_oss): no "
                    "unroll of MaxText's own to check the layout against; the layout's blocks are gemma3's, checked there")
    unrolled, _ = models.source(TRAIN_RL)
    unrolled = flatten_dict(unrolled.to_pure_dict() if hasattr(unrolled, "to_pure_dict") else unrolled)
    layout = maxtext_models.unrolled_params(models.actor, models.family, [("model",) + k[1:] for k in unrolled])
    differ = [k for k in unrolled if layout[("model",) + k[1:]] is None
              or not np.array_equal(np.asarray(unrolled[k]), layout[("model",) + k[1:]])]
    unrolled_layers = sum(1 for k in unrolled if maxtext_models.is_layer_path(k))
    record_property("maxtext pre-unroll", f"{len(unrolled)} leaves ({unrolled_layers} of unrolled layers)")
    assert not differ, differ[:3]


@pytest.mark.parametrize("source", [TRAIN_RL, TUNIX])
@pytest.mark.parametrize("family", FAMILIES)
def test_every_target_weight_gets_the_actors_value(family_models, modules, family, source, caplog, record_property):
    import logging

    if source == TRAIN_RL and family in PRE_UNROLL_STOPS:
        pytest.skip(f"MaxText 0.2.4's pre-unroll stops on {family} before Tunix is called "
                    "(test_maxtexts_pre_unroll_stops_on_gpt_oss); the Tunix rollout's source is checked instead")
    pins, before, patched = modules
    models = family_models(family)
    layers = models.layer_params()

    # -- the series before 0002, and the pins, on the same state
    for name, module in (("before 0002", before), ("the pins", pins)):
        out = models.outcome(models.sync(module, source))
        stale = sorted(out["stale"])
        record_property(name, f"{len(out['exact'])}/{len(models.expected)} exact, {len(stale)} stale, {len(out['wrong'])} wrong")
        if family.startswith("deepseek"):
            # Every weight of dense_layers_K and moe_layers_K keeps its initial value.
            assert stale == layers and not out["wrong"], (stale[:3], out["wrong"][:3])
        elif family in ("gpt-oss", "gemma3") and source == TUNIX and name == "the pins":
            # The pins know no blocks: every layer weight keeps its initial value (gemma3: test_0001's).
            assert stale == layers and not out["wrong"], (stale[:3], out["wrong"][:3])
        elif family == "gpt-oss" and name == "before 0002":
            # 0001 maps the blocks, but not the scanned MoE gate/up into the prefused `wi`.
            assert stale == [p for p in layers if p[-1] == "wi"] and not out["wrong"], (stale[:3], out["wrong"][:3])
        else:
            assert not stale and not out["wrong"], (stale[:3], out["wrong"][:3])

    # -- the overlay, every weight required as the rollout's sync requires it
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        out = models.outcome(models.sync(patched, source, **unpatched.weights_required()))
    assert not out["wrong"] and not out["stale"], (out["wrong"][:3], out["stale"][:3])
    assert len(out["exact"]) == len(models.expected) and not out["sharding"], out["sharding"][:3]
    assert not [r for r in caplog.records if "transfer_state_directly" in r.getMessage()]
    said = f"{family} | {source}: {len(out['exact'])}/{len(models.expected)} target parameters the actor's"
    record_property("overlay", said)
    print(said)


@pytest.mark.parametrize("family", sorted(CHANGED & set(FAMILIES)))
def test_each_layers_rng_state_is_its_own(family_models, modules, family):
    """The whole state (as Tunix's VllmRollout loads it at start-up): the rng
    leaves of DeepSeek's stacks and of GPT-OSS's blocks reach their own layers."""
    _, _, patched = modules
    models = family_models(family)
    out = models.outcome(models.sync(patched, "unfiltered"))
    assert not out["wrong"] and not out["stale"] and len(out["exact"]) == len(models.expected)
    assert out["rng_own"] and not out["rng_kept"] and not out["rng_other"], (out["rng_kept"][:3], out["rng_other"][:3])


@pytest.mark.skipif("gpt-oss" not in FAMILIES, reason="gpt-oss is not among this run's families")
def test_maxtexts_pre_unroll_stops_on_gpt_oss(family_models):
    """MaxText 0.2.4's own pre-unroll (MaxTextVllmSampler.update_params, before
    Tunix) sizes the blocks' scan from the keys holding `mlp` and `wi_0`;
    GPT-OSS's are `GptOssMlp`'s, so it finds no repeat and asserts. MaxText
    0.2.5 applies that unroll to Gemma alone. The series cannot reach this
    (it is MaxText's code): train_rl's maxtext_on_vllm stops there on
    GPT-OSS at its first sync, the rollout's start; vllm_native is MaxText's
    own GPT-OSS configuration (docs/fixes.md)."""
    models = family_models("gpt-oss")
    with pytest.raises(AssertionError, match=re.escape("Detected scanned structure, but failed to unroll any layers!")):
        models.source(TRAIN_RL)
