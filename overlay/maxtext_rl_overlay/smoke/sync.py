"""smoke's weight sync: a second model's weights into the running engine, by
the code train_rl's rollout syncs with.

- vLLM's Llama: the source is Tunix's own Llama3 (made from the second
  checkpoint by Tunix's safetensors loader), synced by Tunix's
  `VllmSampler.update_params` with the model's vLLM mappings
  (`transfer_state_with_mappings`).
- MaxText's model: the source is train_rl's actor, MaxText's model with
  scanned layers (`from_pretrained(..., wrap_with_tunix_adapter=True)`,
  restored from the second checkpoint), its whole `nnx.state` (the stacked
  Flax NNX rng counts and keys with it) loaded by MaxText's
  `MaxTextVllmSampler` with neither converter nor pre-unroll, as Tunix's
  `VllmRollout` loads its model at start-up: Tunix's
  `transfer_state_directly` unstacks the scanned layers itself
  (`_unstack_scanned_param`, `_bulk_align_and_unstack`: the seed's second
  bug's path), and the sync says how often each ran, on how many weights
  and how many rng leaves. Where the engine's model has its KV heads padded
  to the chips (fewer heads than chips: configurations.MAXTEXT_MOE on 8),
  the KV weights take `_bulk_align_and_unstack`. MaxText 0.2.4's own
  train_rl never reaches that path: `MaxTextVllmRollout` syncs
  `nnx.state(actor, nnx.Param)` and, for maxtext_on_vllm, its sampler unrolls
  every `decoder.layers` leaf before Tunix sees it
  (`unroll_qwen_scanned_weights`, whose pattern matches llama's and qwen3's
  scanned layers too); for vllm_native a converter or Tunix's mappings sync.

Both samplers are put around the engine this process already started:
their `__init__` would start a second one. update_params then does all of
the rollout's steps (prefix cache reset, KV cache freed, transfer with
`reshard_pytree`, state leaves refreshed, KV cache rebuilt).

Imports jax, Tunix and MaxText when called (the engine process imports
this module before vLLM starts). configurations.py says which configuration
syncs with which.
"""

from __future__ import annotations

import contextlib
import functools
import pathlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .maxtext_model import TinyModel


def tunix_llama(llm: Any, checkpoint: pathlib.Path, devices: int, additional_config: dict[str, Any]) -> str | None:
    """Syncs the Llama at `checkpoint` into `llm` (vLLM's Llama) as Tunix's rollout does."""
    from tunix.generate.vllm_sampler import VllmConfig, VllmSampler

    source, mapping = _tunix_llama_model(checkpoint, devices)
    config = VllmConfig(mapping_config=mapping, additional_config=additional_config, tensor_parallel_size=devices)
    _around(VllmSampler, llm, config).update_params(source)
    return None


def maxtext_actor(llm: Any, checkpoint: pathlib.Path, devices: int, additional_config: dict[str, Any],
                  model: TinyModel | None = None) -> str:
    """Syncs train_rl's actor (the tiny `model`, default the qwen3) restored
    from `checkpoint` into `llm` (MaxText's model) through Tunix's
    scanned-layer unstacking, and says how often each of Tunix's unstacking
    functions ran, on how many weights and rng leaves."""
    from flax import nnx
    from maxtext.integration.vllm.maxtext_vllm_rollout import MaxTextVllmSampler
    from tunix.generate.mappings import MappingConfig
    from tunix.generate.vllm_sampler import VllmConfig

    from .maxtext_model import QWEN3, restore_actor

    actor, scan_axis = restore_actor(checkpoint, model or QWEN3)
    config = VllmConfig(mapping_config=MappingConfig(), additional_config=additional_config, tensor_parallel_size=devices)
    sampler = _around(MaxTextVllmSampler, llm, config)
    # No converter and no pre-unroll: the scanned state goes to Tunix's
    # transfer_state_directly as it is (Tunix's VllmRollout start-up load).
    sampler._converter, sampler._direct_maxtext_sync = None, False
    sampler._scan_axis, sampler._layer_pattern_length = scan_axis, None
    with counting_unstacks() as calls:
        sampler.load_checkpoint(nnx.state(actor))
    return "Tunix's unstacking ran: " + ", ".join(
        f"{name} {len(leaves)} times ({sum(not rng for rng in leaves)} weights, {sum(leaves)} rng leaves)" for name, leaves in calls.items())


#: The two functions of Tunix's transfer_state_directly that unstack a
#: scanned leaf into the unrolled target's layers (the seed's second bug).
UNSTACKS = ("_unstack_scanned_param", "_bulk_align_and_unstack")


#: The argument holding the scanned leaf's path, by unstacking function (Tunix's signatures).
_KEY_PATH = {"_unstack_scanned_param": 2, "_bulk_align_and_unstack": 3}


@contextlib.contextmanager
def counting_unstacks() -> Iterator[dict[str, list[bool]]]:
    """Records the calls of Tunix's unstacking functions while it is entered
    (transfer_state_directly looks them up in its module at each call), each
    as whether its scanned leaf was rng state (Flax NNX's `rngs`) rather than
    a weight; the functions themselves run unchanged."""
    from tunix.generate import utils

    calls: dict[str, list[bool]] = {name: [] for name in UNSTACKS}
    originals = {name: getattr(utils, name) for name in UNSTACKS}

    def counted(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            key_path = kwargs.get("key_path", args[_KEY_PATH[name]] if len(args) > _KEY_PATH[name] else "")
            calls[name].append("rngs" in str(key_path).split("."))
            return function(*args, **kwargs)

        return wrapper

    for name, function in originals.items():
        setattr(utils, name, counted(name, function))
    try:
        yield calls
    finally:
        for name, function in originals.items():
            setattr(utils, name, function)


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
