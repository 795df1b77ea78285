"""smoke's weight sync: a second model's weights into the running engine, by
the code train_rl's rollout syncs with.

- vLLM's Llama: the source is Tunix's own Llama3 (made from the second
  checkpoint by Tunix's safetensors loader), synced by Tunix's
  `VllmSampler.update_params` with the model's vLLM mappings
  (`transfer_state_with_mappings`).
- MaxText's model: the source is train_rl's actor, MaxText's model with
  scanned layers (`from_pretrained(..., wrap_with_tunix_adapter=True)`,
  restored from the second checkpoint), its `nnx.Param` state synced by
  MaxText's `MaxTextVllmSampler.update_params` (its scanned-layer unroll, then
  Tunix's `transfer_state_directly`), as `MaxTextVllmRollout` does for
  `maxtext_on_vllm`.

Both samplers are put around the engine this process already started:
their `__init__` would start a second one. update_params then does all of
the rollout's steps (prefix cache reset, KV cache freed, transfer with
`reshard_pytree`, state leaves refreshed, KV cache rebuilt).

Imports jax, Tunix and MaxText when called (the engine process imports
this module before vLLM starts). configurations.py says which configuration
syncs with which.
"""

from __future__ import annotations

import pathlib
from typing import Any


def tunix_llama(llm: Any, checkpoint: pathlib.Path, devices: int, additional_config: dict[str, Any]) -> None:
    """Syncs the Llama at `checkpoint` into `llm` (vLLM's Llama) as Tunix's rollout does."""
    from tunix.generate.vllm_sampler import VllmConfig, VllmSampler

    source, mapping = _tunix_llama_model(checkpoint, devices)
    config = VllmConfig(mapping_config=mapping, additional_config=additional_config, tensor_parallel_size=devices)
    _around(VllmSampler, llm, config).update_params(source)


def maxtext_actor(llm: Any, checkpoint: pathlib.Path, devices: int, additional_config: dict[str, Any]) -> None:
    """Syncs train_rl's actor restored from `checkpoint` into `llm` (MaxText's
    model) as MaxTextVllmRollout does for maxtext_on_vllm."""
    from flax import nnx
    from maxtext.integration.vllm.maxtext_vllm_rollout import MaxTextVllmSampler
    from tunix.generate.mappings import MappingConfig
    from tunix.generate.vllm_sampler import VllmConfig

    from .maxtext_model import restore_actor

    actor, scan_axis = restore_actor(checkpoint)
    config = VllmConfig(mapping_config=MappingConfig(), additional_config=additional_config, tensor_parallel_size=devices)
    sampler = _around(MaxTextVllmSampler, llm, config)
    # MaxTextVllmRollout's choices for maxtext_on_vllm: no converter, the
    # direct sync, the scan axis of MaxText's parameters.
    sampler._converter, sampler._direct_maxtext_sync = None, True
    sampler._scan_axis, sampler._layer_pattern_length = scan_axis, None
    sampler.update_params(nnx.state(actor, nnx.Param))


def _around(cls: Any, llm: Any, config: Any) -> Any:
    """An instance of Tunix's sampler class `cls` around an engine already
    started, with the attributes its __init__ sets besides the engine."""
    sampler = cls.__new__(cls)
    sampler.llm, sampler._driver, sampler.config = llm, None, config
    sampler.args = {"tensor_parallel_size": config.tensor_parallel_size}
    sampler.to_hf_key_mappings = dict(config.mapping_config.to_hf_mappings or {})
    sampler.to_hf_transpose_keys = config.mapping_config.to_hf_transpose_keys
    sampler.to_hf_hook_fns = config.mapping_config.to_hf_hook_fns
    return sampler


def _tunix_llama_model(checkpoint: pathlib.Path, devices: int) -> tuple[Any, Any]:
    """Tunix's Llama3 made from the checkpoint, on an fsdp mesh of all the
    chips (a trainer's layout, not the engine's: the sync reshards), its state
    and its vLLM mappings."""
    import jax
    from flax import nnx
    from tunix.generate.mappings import MappingConfig
    from tunix.models.llama3 import model as llama3
    from tunix.models.llama3 import params

    from .tiny_llama import CONFIG

    config = llama3.ModelConfig(
        num_layers=CONFIG["num_hidden_layers"],
        vocab_size=CONFIG["vocab_size"],
        embed_dim=CONFIG["hidden_size"],
        hidden_dim=CONFIG["intermediate_size"],
        num_heads=CONFIG["num_attention_heads"],
        head_dim=CONFIG["head_dim"],
        num_kv_heads=CONFIG["num_key_value_heads"],
        rope_theta=int(CONFIG["rope_theta"]),
        norm_eps=CONFIG["rms_norm_eps"],
        weight_tying=CONFIG["tie_word_embeddings"],
    )
    mesh = jax.make_mesh((devices, 1), ("fsdp", "tp"))
    with mesh:
        model = params.create_model_from_safe_tensors(str(checkpoint), config, mesh)
    return nnx.state(model), MappingConfig.build(model=model, backend="vllm_jax")
