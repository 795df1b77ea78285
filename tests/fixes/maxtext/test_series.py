"""MaxText's own series (patches/maxtext), on the installed overlay build of
MaxText against MaxText 0.2.4's release code (support/fixes/unpatched.py:
the series reverse-applied to the installed files). Each test shows the
release's behaviour first, then the overlay's. What the changes do to a
whole sync, family by family: tests/fixes/test_families.py (full matrix)."""

from __future__ import annotations

import types

import pytest

from support.fixes import maxtext_shims
from support.fixes.unpatched import load_unpatched

pytestmark = [
    pytest.mark.skipif(maxtext_shims.ADAPTER is None, reason="needs MaxText (the matrix's maxtext-0.2.4 cell): would have checked "
                       "MaxText's series against the 0.2.4 release's code: train_rl runs unwrapped, Gemma-only pre-unroll, the "
                       "Qwen LM head's mapping, vLLM-native targets refused before the first sync, an unscanned actor refused there before "
                       "the engine starts"),
    pytest.mark.skipif(maxtext_shims.GLOBAL, reason="the plain run's: the session-wide shims are not on these functions' paths"),
]

TRAIN_RL = "maxtext.trainers.post_train.rl.train_rl"
ROLLOUT = "maxtext.integration.vllm.maxtext_vllm_rollout"


def _what_rl_train_runs_inside(module) -> dict[str, object]:
    """The functions train_rl's body sees: rl_train with its body replaced."""
    import jax
    import tunix.generate.utils as tunix_utils

    seen: dict[str, object] = {}

    def body(argv, kwargs):
        seen.update(wsc=jax.lax.with_sharding_constraint, cast=tunix_utils._apply_dtype_cast,
                    bulk=tunix_utils._bulk_align_and_unstack, unstack=tunix_utils._unstack_scanned_param)

    original = module._rl_train_impl
    module._rl_train_impl = body
    try:
        module.rl_train([], {})
    finally:
        module._rl_train_impl = original
    return seen


def test_train_rl_runs_the_upstreams_unwrapped():
    import importlib

    import jax
    import tunix.generate.utils as tunix_utils

    own = {"wsc": jax.lax.with_sharding_constraint, "cast": tunix_utils._apply_dtype_cast,
           "bulk": tunix_utils._bulk_align_and_unstack, "unstack": tunix_utils._unstack_scanned_param}
    release = _what_rl_train_runs_inside(load_unpatched("maxtext", TRAIN_RL))
    assert all(release[k] is not own[k] for k in own), "MaxText 0.2.4 wraps all four around training"
    installed = importlib.import_module(TRAIN_RL)
    assert not hasattr(installed, "_tpu_inference_compat_patches")
    assert _what_rl_train_runs_inside(installed) == own


def _sampler(module, model_name: str):
    """A MaxTextVllmSampler of `module` on the direct path, its engine left out:
    update_params up to Tunix's, which records what it is handed."""
    sampler = object.__new__(module.MaxTextVllmSampler)
    sampler._converter = None
    sampler._direct_maxtext_sync = True
    sampler._scan_axis = 1
    sampler._layer_pattern_length = None
    sampler._is_gemma = "gemma" in model_name
    return sampler


def _scanned_gpt_oss():
    """GPT-OSS's block-scanned layout as MaxText builds it: `layers.layers_J`, the MoE `GptOssMlp`."""
    import jax.numpy as jnp

    block = {"GptOssMlp": {"wi_0": jnp.ones((8, 2, 16)), "wo": jnp.ones((16, 2, 8))},
             "pre_self_attention_layer_norm": {"scale": jnp.ones((8, 2))}}
    return {"base": {"decoder": {"layers": {"layers_0": block, "layers_1": block}}}}


def test_the_direct_sync_pre_unrolls_gemma_alone(monkeypatch):
    from tunix.generate.vllm_sampler import VllmSampler

    handed = []
    monkeypatch.setattr(VllmSampler, "update_params", lambda self, weights, filter_types=None: handed.append(weights))
    release = load_unpatched("maxtext", ROLLOUT)
    with pytest.raises(AssertionError, match="failed to unroll any layers"):
        _sampler(release, "gpt-oss-20b").update_params(_scanned_gpt_oss())
    import maxtext.integration.vllm.maxtext_vllm_rollout as installed

    weights = _scanned_gpt_oss()
    _sampler(installed, "gpt-oss-20b").update_params(weights)
    assert handed == [weights], "gpt-oss goes to Tunix as the actor holds it: Tunix unstacks the blocks (google-tunix 0002)"
    # Gemma's blocks are still unrolled first, as 0.2.5 does: layer R * 2 + J from block J's index R.
    gemma = {"base": {"decoder": {"layers": {"layers_0": {"mlp": {"wi_0": {"kernel": _scanned_gpt_oss()["base"]["decoder"]["layers"]
                                                                             ["layers_0"]["GptOssMlp"]["wi_0"]}}}}}}}
    _sampler(installed, "gemma3-4b").update_params(gemma)
    assert set(handed[-1]["base"]["decoder"]) == {"layers_0", "layers_1"}, handed[-1]


def test_no_gemma4_converter_on_the_direct_path():
    config = types.SimpleNamespace(rollout_tensor_parallelism=1, num_decoder_layers=35, base_num_decoder_layers=35)
    release = load_unpatched("maxtext", ROLLOUT)
    with pytest.raises(Exception) as failed:  # noqa: PT011 - the release's converter fails on e2b's 35 layers, whatever the attribute
        made = release._create_model_converter("gemma4-e2b", config=config, mesh=None)
        assert made is not None, "the release builds a converter Tunix never calls"
        raise AssertionError("built")
    print(f"the release: {type(failed.value).__name__}: {failed.value}")
    import maxtext.integration.vllm.maxtext_vllm_rollout as installed

    assert installed._create_model_converter("gemma4-e2b", config=config, mesh=None) is None


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_an_untied_qwens_head_maps_to_tpu_inferences_lm_head(family):
    import importlib

    module = f"maxtext.integration.tunix.weight_mapping.{family}"
    head = "base.decoder.logits_dense.kernel"

    def mapped(mod):
        cls = next(v for v in vars(mod).values() if isinstance(v, type) and hasattr(v, "to_hf_mapping") and v.__module__ == mod.__name__)
        return cls.to_hf_mapping()[head][0]

    assert mapped(load_unpatched("maxtext", module)) == "model.lm_head"
    assert mapped(importlib.import_module(module)) == "lm_head.weight"
    # Where tpu-inference's Qwen models hold it: JaxLmHead, prefix "lm_head", its kernel `weight`.
    import inspect

    source = inspect.getsource(importlib.import_module(f"tpu_inference.models.jax.{family}"))
    assert 'prefix="lm_head"' in source.replace("'", '"') and "self.lm_head = JaxLmHead(" in source


def test_a_torchax_target_is_refused_before_the_first_sync():
    import jax.numpy as jnp
    import maxtext.integration.vllm.maxtext_vllm_rollout as installed
    from flax import nnx
    from tunix.generate import utils

    # What the release left to the first sync: Tunix's mapped sync on vLLM's torchax state (a dict).
    source = nnx.State({"embedding": nnx.Param(jnp.ones((3, 4)))})
    with pytest.raises(AttributeError, match="flat_state"):
        utils.transfer_state_with_mappings(source, {"model.embed_tokens.weight": jnp.zeros((3, 4))},
                                           {"embedding": ("model.embed_tokens.weight", None)})
    with pytest.raises(NotImplementedError, match=r"gemma3-4b cannot be synced into vLLM's own model .* torchax .* \"maxtext_config\""):
        installed._refuse_torchax_target(types.SimpleNamespace(transformer_state={}), "gemma3-4b")
    installed._refuse_torchax_target(types.SimpleNamespace(transformer_state=nnx.State({})), "llama3.1-8b")  # a JAX model: synced


def test_an_unscanned_actor_in_vllms_own_model_is_refused_before_the_engine_starts():
    import maxtext.integration.vllm.maxtext_vllm_rollout as installed
    from maxtext.integration.tunix.utils import VllmWeightMapping

    # The release's mapping for vLLM's own model names the scanned stack only, whatever the actor's
    # scan_layers: an unscanned actor's `layers_K` reach no key (test_families: every layer weight stale).
    keys = VllmWeightMapping("llama3.1-8b", {"num_hidden_layers": 4}).to_hf_mapping()
    layer_keys = [k for k in keys if ".decoder.layers" in k]
    assert layer_keys and all(".decoder.layers." in k for k in layer_keys), layer_keys

    def construct(scan_layers: bool, overrides=None):
        maxtext_config = types.SimpleNamespace(model_name="llama3.1-8b", scan_layers=scan_layers, vllm_additional_config={},
                                               vllm_hf_overrides=overrides)
        rollout_config = types.SimpleNamespace(kv_cache_size=64, rollout_vllm_additional_config={})
        return installed.MaxTextVllmRollout(None, None, None, rollout_config, maxtext_config)

    with pytest.raises(NotImplementedError, match=r"llama3.1-8b cannot be synced into vLLM's own model .* scan_layers=False"):
        construct(False)
    # Scanned, or MaxText's model in vLLM (whose direct sync maps `layers_K` to `layers_K`), the same
    # construction goes past the check, and stops further on, on what these stand-ins lack.
    for scan_layers, overrides in ((True, None), (False, {"architectures": ["MaxTextForCausalLM"]})):
        with pytest.raises(AttributeError):
            construct(scan_layers, overrides)
