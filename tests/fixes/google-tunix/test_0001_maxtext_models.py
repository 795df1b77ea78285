"""The Tunix fix on real MaxText 0.2.4 models: the weight sync of train_rl and Tunix.

The actor and the rollout target are tiny models built by MaxText's own code
(support/fixes/maxtext_models.py): llama3 (its layers share the decoder's
nnx.Rngs), gemma3 (gemma3-4b's pattern of 6 layers, 14 layers: two scanned
repeats and 2 remainder layers) and qwen3 MoE (a prefused gate/up target).
Each is synced through `transfer_state_directly` with the sources the real
paths hand it:

* "param-only, MaxText pre-unroll": MaxText 0.2.4's own sync (train_rl,
  MaxTextVllmRollout and RLCluster.sync_weights pass `nnx.state(actor,
  nnx.Param)`; MaxTextVllmSampler unrolls it before Tunix);
* "param-only": RLCluster.sync_weights with Tunix's own "vllm" rollout (no
  MaxText pre-unroll);
* "unfiltered": the whole `nnx.state(actor)`, rng state included, as Tunix's
  VllmRollout loads it at start-up and RLCluster's offload paths sync it;
* "unfiltered, chunked": the same as MaxText's validate_converter passes it
  (`{"base": nnx.state(model)}`, `reshard_chunk_size=128`).

Each test first shows what upstream does with the same state (the installed
file with the series reverse-applied), then checks every leaf of the target
on the overlay: each nnx.Param exactly its source value (MaxText's own unroll
and MoE fusion say which), each per-layer rng leaf its own layer's value, a
Variable shared by the layers (listed once, under layers_0) layer 0's value,
every sharding the target's, and no warning. A weight that cannot be mapped
is named in a warning.
"""

from __future__ import annotations

import logging
import pathlib
from typing import Any

import pytest

from support.fixes import maxtext_models, maxtext_shims
from support.fixes.tunix_errors import SCALAR_RNG, STACKED_RNG, assert_report_error

pytestmark = [
    pytest.mark.skipif(
        not maxtext_models.AVAILABLE,
        reason="needs MaxText 0.2.4 (the matrix's maxtext-0.2.4 cell): would sync tiny real llama3, gemma3 and "
        "qwen3 MoE models through transfer_state_directly, upstream and overlay, and check every target value",
    ),
    pytest.mark.skipif(
        maxtext_shims.GLOBAL,
        reason="the plain run of the MaxText cell syncs the real models (minutes); the shims run would repeat it: "
        "the session-wide shims (jax.lax.top_k, with_sharding_constraint) are not on the sync's path, and "
        "train_rl's own patches are applied explicitly in test_upstream_under_maxtext_shims",
    ),
]

SOURCES = list(maxtext_models.FamilyModels.SOURCES)


@pytest.fixture(scope="module")
def modules():
    from tunix.generate import utils as patched

    from support.fixes.unpatched import load_unpatched

    upstream = load_unpatched("google-tunix", "tunix.generate.utils")
    # They must really differ, or every "before" below proves nothing.
    assert "num_block_slots" in pathlib.Path(patched.__file__).read_text()
    assert "num_block_slots" not in pathlib.Path(upstream.__file__).read_text()
    return upstream, patched


#: The families whose structures 0001 maps (the other families: test_0002).
FAMILIES = ("llama3", "gemma3", "qwen3-moe")


@pytest.fixture(scope="module", params=FAMILIES)
def models(request, family_models):
    return family_models(request.param)


def _assert_all_exact(models, out):
    assert not out["wrong"] and not out["stale"], (out["wrong"][:3], out["stale"][:3])
    assert len(out["exact"]) == len(models.expected)
    assert not out["sharding"], out["sharding"][:3]


#: The TPU cell runs the marked tests on its host's chips (one included): the
#: real models' states on the chip, upstream's error beside the overlay's sync.
cell = pytest.mark.tpu_cell


@cell
@pytest.mark.parametrize("source", SOURCES)
def test_sync(models, modules, source, caplog, record_property):
    upstream, patched = modules
    family = models.family.name
    record_property("devices", _devices())
    # -- upstream with the same state
    if source.startswith("unfiltered"):
        with pytest.raises(IndexError) as excinfo:
            models.sync(upstream, source)
        record_property("upstream", assert_report_error(excinfo, SCALAR_RNG if family == "gemma3" else STACKED_RNG))
    else:
        out = models.outcome(models.sync(upstream, source))
        if family == "gemma3" and source == "param-only":
            # No candidate path matches the scanned blocks nor the remainder
            # layers: every layer weight keeps its old value, without a word.
            assert sorted(out["stale"]) == models.layer_params()
            assert not out["wrong"]
        else:
            _assert_all_exact(models, out)

    # -- the overlay
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        out = models.outcome(models.sync(patched, source))
    _assert_all_exact(models, out)
    if source.startswith("unfiltered"):
        # Every per-layer rng leaf was checked, and holds its own layer's value.
        assert out["rng_own"] and not out["rng_kept"] and not out["rng_other"], (out["rng_kept"][:3], out["rng_other"][:3])
    else:
        # No rng state in the source: the target's own is left as it was.
        assert out["rng_kept"] and not out["rng_own"] and not out["rng_other"]
    assert not [r for r in caplog.records if "transfer_state_directly" in r.getMessage()]
    said = (f"{family} | {source}: {len(out['exact'])}/{len(models.expected)} params exact, "
            f"{len(out['rng_own'])} per-layer rng leaves their own layer's")
    record_property("overlay", said)
    print(said)


def _devices() -> str:
    """Where the states are, in words (the TPU cell's record says it was the chip)."""
    import jax

    devices = jax.devices()
    return f"{len(devices)} {devices[0].platform} device(s), {devices[0].device_kind}"


@cell
def test_shared_rng_leaf_receives_layer_0(models, modules):
    """The target's layers share one nnx.Rngs (llama3 and qwen3: the decoder's,
    at `self_attention.attention_op.rngs` / `moe_block.rngs`; gemma3: the
    layers' `rngs`); nnx.state lists it once, under layers_0. The overlay gives
    it layer 0's value: the first layer holding it, where nnx.state puts it."""
    import jax
    import numpy as np
    from flax import nnx

    _, patched = modules
    flat = {tuple(p): v for p, v in nnx.to_flat_state(models.target)}

    def layer_free(path):
        return tuple("*" if str(p).startswith("layers_") else p for p in path)

    layers_of: dict[Any, Any] = {}
    for path in flat:
        if any(str(p).startswith("layers_") for p in path):
            layers_of.setdefault(layer_free(path), set()).add(next(p for p in path if str(p).startswith("layers_")))
    shared = [path for path, var in flat.items() if isinstance(var, nnx.RngState) and layers_of.get(layer_free(path)) == {"layers_0"}]
    assert shared, "no target rng leaf is listed under layers_0 alone"
    dst = {tuple(p): v for p, v in nnx.to_flat_state(models.sync(patched, "unfiltered"))}
    for path in shared:
        src_path, idx = maxtext_models.per_layer_rng_source(path, models.family, models.actor_flat)
        assert idx == 0
        got, want = dst[path][...], models.actor_flat[src_path][...][0]
        if jax.dtypes.issubdtype(got.dtype, jax.dtypes.prng_key):
            got, want = jax.random.key_data(got), jax.random.key_data(want)
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want), err_msg=str(path))
    print(f"{models.family.name}: shared rng leaves given layer 0's value: {['.'.join(map(str, p)) for p in shared]}")


def test_upstream_under_maxtext_shims(models, modules):
    """What MaxText 0.2.4's train_rl patches (`_tpu_inference_compat_patches`,
    the real ones, made on upstream's module) make of the unfiltered state:
    they rescue llama3 and qwen3, but on gemma3 every layer weight stays stale
    and the per-layer rng leaves get the decoder-level `dropout.rngs`."""
    upstream, _ = modules
    out = models.outcome(models.sync(upstream, "unfiltered", maxtext_shims.train_rl_patches_on(upstream)))
    if models.family.name == "gemma3":
        assert sorted(out["stale"]) == models.layer_params()
        assert out["rng_other"]
    else:
        _assert_all_exact(models, out)
        assert not out["rng_other"]
    print(f"{models.family.name} | unfiltered | upstream + MaxText's shims: {len(out['exact'])} exact, "
          f"{len(out['stale'])} stale, {len(out['rng_other'])} rng leaves of another layer")


def test_an_unmappable_weight_is_named(models, modules, caplog):
    """A source weight with no target (here: one scanned weight renamed) is
    named in a warning; so is a leaf beside the layers that is no layer's value
    (the decoder-level `dropout.rngs`, once the layers' own rng state is gone;
    MaxText's shims give it to every layer), where the target has such leaves."""
    from flax import nnx

    _, patched = modules
    from tunix.rl import reshard

    flat = dict(nnx.to_flat_state(maxtext_models.param_state(models.actor)))
    renamed_from = next(p for p in flat if "layers" in p)
    renamed = renamed_from[:-2] + (renamed_from[-2] + "_renamed", renamed_from[-1])
    flat[renamed] = flat.pop(renamed_from)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        patched.transfer_state_directly(nnx.from_flat_state(flat), models.fresh_target(), reshard_fn=reshard.reshard_pytree)
    messages = [r.getMessage() for r in caplog.records if "transfer_state_directly" in r.getMessage()]
    assert len(messages) == 1 and "1 source leaves have no target" in messages[0]
    assert messages[0].endswith(": " + ".".join(map(str, renamed[1:]))), messages[0]

    # The decoder-level rng beside the layers, with no per-layer rng left.
    state = {p: v for p, v in nnx.to_flat_state(nnx.state(models.actor)) if not (isinstance(v, nnx.RngState) and p[2] != "dropout")}
    beside = [p for p, v in nnx.to_flat_state(models.target) if isinstance(v, nnx.RngState) and p[2] == "layers_1"
              and ("base", p[1]) + p[3:] in state]
    if models.family.name == "gemma3" or not beside:
        return  # gemma3: its scanned blocks have no path beside the layers; qwen3 MoE: no per-layer rng beside them
    dst = models.fresh_target()
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        patched.transfer_state_directly(nnx.from_flat_state(state), dst, reshard_fn=reshard.reshard_pytree)
    messages = [r.getMessage() for r in caplog.records if "transfer_state_directly" in r.getMessage()]
    assert any("decoder.dropout.rngs.params.count is not stacked over layers" in m for m in messages), messages
    out = models.outcome(dst)
    _assert_all_exact(models, out)
