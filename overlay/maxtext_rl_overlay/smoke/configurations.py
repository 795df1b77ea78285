"""The engine configurations `smoke` runs, as data: each one's name, what it
is, the engine process's environment, vLLM's `additional_config` and
`hf_overrides`, the reference its generates are checked against, and the
code that syncs a second model into it. The parent (run.py) and the engine
process (engine.py) read them here; nothing here imports jax or vLLM.

vLLM's `LLM` runs on all of the machine's chips, as train_rl's rollout
configures it (engine.llm_kwargs), in one of these configurations.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

from . import maxtext_model, sync


@dataclasses.dataclass(frozen=True)
class SecondModelSync:
    """How a second model's weights go into the running engine: the code
    train_rl's rollout syncs with (sync.py), and that code in words."""

    path: str
    #: (engine, second checkpoint, chips, the engine's additional_config) ->
    #: what the run showed of the path it took, in words (None: nothing more).
    run: Callable[[Any, pathlib.Path, int, dict[str, Any]], str | None]


@dataclasses.dataclass(frozen=True)
class EngineConfiguration:
    name: str
    summary: str
    #: Set in the engine process before tpu_inference is imported.
    environment: Mapping[str, str]
    #: vLLM's `additional_config`, for (checkpoint, chips, the matmul
    #: precision smoke pins for the engine; None: jax's default).
    additional_config: Callable[[pathlib.Path, int, str | None], dict[str, Any]]
    #: vLLM's `hf_overrides`: the model's architecture where it is not the checkpoint's.
    overrides: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: What the engine's generates are checked against, in words.
    reference: str = "transformers"
    #: A second model synced into the running engine; None: no sync.
    sync: SecondModelSync | None = None
    #: vLLM's arguments that differ from engine.llm_kwargs'.
    llm_args: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: Where the model takes its matmul precision from additional_config when
    #: it is built, not from jax's default: why the engine, once started,
    #: cannot be switched to jax's default (no row at it). "": it can.
    precision_at_build: str = ""
    #: MaxText's tiny model the engine runs, made (with MaxText's own
    #: references) by maxtext_model.py; None: not MaxText's.
    maxtext: maxtext_model.TinyModel | None = None


def device_indexes_config(chips: int) -> dict[str, Any]:
    """Tunix's rollout sharding: every chip named by `device_indexes`."""
    return {"sharding": {"sharding_strategy": {"device_indexes": list(range(chips))}}}


#: vLLM's Llama on Tunix's mesh: the runner builds its ("data", "model") mesh
#: from the device_indexes.
LLAMA = EngineConfiguration(
    name="llama-device-indexes",
    summary="vLLM's Llama on Tunix's device_indexes 2D mesh",
    environment={},
    additional_config=lambda _checkpoint, chips, _precision: device_indexes_config(chips),
    sync=SecondModelSync("Tunix's VllmSampler.update_params: transfer_state_with_mappings from Tunix's Llama3", sync.tunix_llama),
)
def _maxtext(name: str, summary: str, model: maxtext_model.TinyModel) -> EngineConfiguration:
    """MaxText's `model` as train_rl's maxtext_on_vllm runs it:
    MaxTextForCausalLM, NEW_MODEL_DESIGN=1 (the 7-axis mesh), its weights
    restored by the adapter's own load_weights; the second model synced
    from a scanned actor by Tunix's transfer_state_directly."""
    return EngineConfiguration(
        name=name,
        summary=summary,
        environment={"NEW_MODEL_DESIGN": "1"},
        additional_config=lambda checkpoint, chips, precision: maxtext_model.engine_additional_config(checkpoint, precision, model, chips),
        overrides={"architectures": ["MaxTextForCausalLM"]},
        reference="MaxText's own forward",
        sync=SecondModelSync("MaxText's MaxTextVllmSampler.load_checkpoint: transfer_state_directly unstacks the scanned actor's "
                             "whole state (no pre-unroll, as Tunix's VllmRollout loads it)",
                             functools.partial(sync.maxtext_actor, model=model)),
        precision_at_build="MaxText's layers take matmul_precision from its config (smoke sets it to the pinned precision) "
                           "and pass it to every matmul when the model is built",
        maxtext=model,
    )


MAXTEXT = _maxtext("maxtext-new-model-design", "MaxText's model (MaxTextForCausalLM, NEW_MODEL_DESIGN=1), where maxtext is installed",
                   maxtext_model.QWEN3)
#: MaxText's MoE with fewer KV heads than the chips' tensor parallelism (as
#: gemma3-4b's 4 or qwen3-30b-a3b's 4 on a v6e-8): the engine's model has them
#: padded, so the sync aligns the actor's KV weights (Tunix's
#: `_bulk_align_and_unstack`) where the chips are more than the heads.
MAXTEXT_MOE = _maxtext("maxtext-moe-kv-padded", "MaxText's MoE (qwen3-30b-a3b shrunk: 4 KV heads, 4 experts), KV heads padded "
                       "to the chips where they are fewer, where maxtext is installed", maxtext_model.QWEN3_MOE)
#: What smoke runs, in this order.
SMOKE = (LLAMA, MAXTEXT, MAXTEXT_MOE)


def named(name: str) -> EngineConfiguration:
    for configuration in SMOKE:
        if configuration.name == name:
            return configuration
    raise ValueError(f"unknown smoke configuration {name!r}")
