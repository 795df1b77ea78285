"""google-tunix 0005 (Map MaxText's scanned Gemma 4 blocks in
transfer_state_directly) on tiny real Gemma 4 models built by MaxText's own
code (support/fixes/maxtext_models.py): gemma4-26b (MoE, a shared expert)
shrunk to 14 layers, the actor as train_rl builds it, scanned
(`scanned_blocks.local_layers`: the pattern's 5 local layers scanned inside
each of 2 blocks; `scanned_blocks.global_layer`; the 2 remaining layers the
block `layers_remainder`), and unscanned (scan_layers=False, the shipped
recipe's); the rollout target as MaxTextForCausalLM.load_weights builds it,
unrolled `layers_K`, on a data=2 x model=4 mesh.

Each is synced as train_rl's `maxtext_on_vllm` syncs it (the actor's
nnx.Param state, MaxText's own pre-unroll, which passes Gemma 4's blocks
through, then transfer_state_directly with every weight required, patch
0003) and as Tunix's own vLLM rollout syncs it (no pre-unroll), and every
target parameter is checked against the actor's value by MaxText's layout,
itself checked against MaxText's own checkpoint mapping of the blocks.

Before 0005 (main before it; the pins alike) every layer weight of the
scanned model keeps its initial value, and the rollout's sync (0003) stops
naming them; the unscanned model syncs every weight. With 0005 every target
parameter of both is the actor's, and each layer's rng state its own.

Not in the quick matrix: the two models take minutes to build.
"""

from __future__ import annotations

import os
import types

import pytest

from support.fixes import maxtext_models, maxtext_shims, unpatched

pytestmark = [
    pytest.mark.skipif(
        not maxtext_models.AVAILABLE,
        reason="needs MaxText 0.2.4 (the matrix's maxtext-0.2.4 cell): would sync a tiny real gemma4-26b, scanned and "
        "unscanned, through transfer_state_directly, before 0005 and with it, and check every target parameter",
    ),
    pytest.mark.skipif(
        maxtext_shims.GLOBAL,
        reason="the plain run of the MaxText cell syncs the real models; the shims run would repeat it: the "
        "session-wide shims (jax.lax.top_k, with_sharding_constraint) are not on the sync's path",
    ),
]

QUICK = os.environ.get("MRL_QUICK") == "1"
#: The scanned Gemma 4 (what 0005 maps), and, in the full matrix, the unscanned one (synced before it already).
FAMILIES = ["gemma4"] if QUICK else list(maxtext_models.GEMMA4)
TRAIN_RL, TUNIX = "param-only, MaxText pre-unroll", "param-only"


@pytest.fixture(scope="module")
def modules():
    """(the pins' transfer_state_directly, the series' before 0005, the installed)."""
    return unpatched.tunix_sync_modules("0005", "_split_local_layer_scans")


def test_the_layout_is_maxtexts_checkpoint_mapping(family_models):
    """The layout the tests require (maxtext_models: layer R * 6 + J is local
    slot J of repeat R at index (R, J) of `scanned_blocks.local_layers`, the
    global layer of repeat R at index R of `scanned_blocks.global_layer`) is
    the one MaxText's own checkpoint conversion maps to Hugging Face's layers
    (GEMMA4_MAXTEXT_TO_HF_PARAM_MAPPING: `[block][local]`, `[block]`), for
    every scanned parameter of the actor. (Its remainder names,
    `layers_remainder-layers_J`, are not 0.2.4's model's `local_layers`:
    the remainder's layout is the block's own, checked by the syncs below.)"""
    import re

    from maxtext.checkpoint_conversion.utils import param_mapping

    models = family_models("gemma4")
    config = models.family.overrides
    mapping = param_mapping.GEMMA4_MAXTEXT_TO_HF_PARAM_MAPPING(
        {"num_hidden_layers": models.family.layers, "num_experts": config["num_experts"]},
        types.SimpleNamespace(share_kv_projections=True, v_norm_with_scale=False),
        scan_layers=True,
    )
    checked = 0
    for key, hf in mapping.items():
        parts = tuple(key.split("-"))
        if parts[:3] != ("params", "decoder", "scanned_blocks"):
            continue
        source = ("base", "decoder") + parts[2:]
        assert source in models.actor_flat, f"MaxText's mapping names {key}, which the actor lacks"
        entries = [(r, j, name) for r, row in enumerate(hf) for j, name in enumerate(row)] if parts[3] == "local_layers" \
            else [(r, None, name) for r, name in enumerate(hf)]
        for r, j, name in entries:
            match = re.search(r"\.layers\.(\d+)\.", name)
            assert match, name
            target = ("model", "decoder", f"layers_{match.group(1)}") + parts[4:]
            got = maxtext_models.layer_source(target, models.actor_flat, models.family.layers)
            assert got == (source, r if j is None else (r, j)), (key, name, got)
            checked += 1
    assert checked > 0


def test_maxtexts_pre_unroll_passes_gemma4_through(family_models):
    """MaxText 0.2.4's own pre-unroll (MaxTextVllmSampler.update_params, for
    Gemma) looks for `layers.layers_J` and `scanned_blocks.layers_J`; Gemma
    4's blocks are `scanned_blocks.local_layers` and `.global_layer`, so it
    hands them to Tunix as they are: the sync is Tunix's alone."""
    from flax import nnx
    from flax.traverse_util import flatten_dict

    models = family_models("gemma4")
    unrolled, _ = models.source(TRAIN_RL)
    unrolled = flatten_dict(unrolled.to_pure_dict() if hasattr(unrolled, "to_pure_dict") else unrolled)
    scanned = {tuple(p) for p, _ in nnx.to_flat_state(maxtext_models.param_state(models.actor))}
    assert set(unrolled) == scanned
    assert any("scanned_blocks" in k for k in scanned) and any("layers_remainder" in k for k in scanned)


@pytest.mark.parametrize("source", [TRAIN_RL, TUNIX])
@pytest.mark.parametrize("family", FAMILIES)
def test_every_target_weight_gets_the_actors_value(family_models, modules, family, source, caplog, record_property):
    import logging

    pins, before, patched = modules
    models = family_models(family)
    layers = models.layer_params()
    scanned = models.family.scan_layers

    # -- the series before 0005, and the pins, on the same state
    for name, module in (("before 0005", before), ("the pins", pins)):
        out = models.outcome(models.sync(module, source))
        stale = sorted(out["stale"])
        record_property(name, f"{len(out['exact'])}/{len(models.expected)} exact, {len(stale)} stale, {len(out['wrong'])} wrong")
        if scanned:
            # Every weight of every layer keeps its initial value.
            assert stale == layers and not out["wrong"], (stale[:3], out["wrong"][:3])
        else:
            assert not stale and not out["wrong"], (stale[:3], out["wrong"][:3])
    if scanned:
        # Before 0005 the rollout's sync (0003) stops, naming them.
        with pytest.raises(ValueError, match=f"{len(layers)} of {len(models.expected)} target weights would keep"):
            models.sync(before, source, **unpatched.weights_required())

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


@pytest.mark.parametrize("source", ["unfiltered", "unfiltered, chunked"])
@pytest.mark.parametrize("family", FAMILIES)
def test_each_layers_rng_state_is_its_own(family_models, modules, family, source):
    """The whole state (as Tunix's VllmRollout loads it at start-up; chunked as
    MaxText's validate_converter passes it): every parameter the actor's, the
    rng leaves of every layer, local, global and remainder, their own layer's."""
    _, _, patched = modules
    models = family_models(family)
    out = models.outcome(models.sync(patched, source))
    assert not out["wrong"] and not out["stale"] and len(out["exact"]) == len(models.expected)
    assert out["rng_own"] and not out["rng_kept"] and not out["rng_other"], (out["rng_kept"][:3], out["rng_other"][:3])


def test_a_scanned_target_keeps_the_scanned_names(family_models, modules):
    """A target that holds Gemma 4's blocks as the actor does (a scanned copy)
    is synced name by name, as before 0005: every leaf the actor's."""
    import jax
    import numpy as np
    from flax import nnx
    from tunix.rl import reshard

    _, _, patched = modules
    models = family_models("gemma4")
    source = maxtext_models.param_state(models.actor)["base"]
    dst = jax.tree.map(lambda x: x * 0, source)
    patched.transfer_state_directly(source, dst, reshard_fn=reshard.reshard_pytree, **unpatched.weights_required())
    got = {tuple(p): v[...] for p, v in nnx.to_flat_state(dst)}
    want = {tuple(p): v[...] for p, v in nnx.to_flat_state(source)}
    assert got.keys() == want.keys()
    differ = [p for p in want if not np.array_equal(np.asarray(got[p]), np.asarray(want[p]))]
    assert not differ, differ[:3]
