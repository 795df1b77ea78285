"""Breaks of the installed stack that `smoke` must see, each the check that
must say no: one line of an installed file changed, in a copy of its package
put first on the engine's path (test_smoke.py; the TPU cell runs the same
test on its chips).

The sampler's breaks exist once per path the engine can take: on a mesh that
partitions the vocab (the 8-device CPU simulation, a v6e-8) patch 0006's
vocab-sharded sampler (vocab_sharded.py); where it does not (one chip)
sampling.py's own. A break written for the path the engine does not take
would leave smoke nothing to see, so each run breaks the path its chips
take (`for_chips`), and the test asserts the line is there once.
"""

from __future__ import annotations

import dataclasses

#: The sampler's two paths.
VOCAB_SHARDED = "tpu_inference/layers/jax/sample/vocab_sharded.py"
REPLICATED = "tpu_inference/layers/jax/sample/sampling.py"
#: Tunix's sync with mappings (the Llama configuration's), and its direct
#: sync (MaxText's configuration's: transfer_state_directly), in one file.
TUNIX_SYNC = "tunix/generate/utils.py"
#: smoke's MaxText configurations: the qwen3, and the MoE whose KV heads the engine pads to the chips.
MAXTEXT = "maxtext-new-model-design"
MAXTEXT_MOE = "maxtext-moe-kv-padded"


@dataclasses.dataclass(frozen=True)
class Edit:
    file: str  # inside site-packages: its first folder is the package copied
    right: str  # the line(s) as installed, once in the file
    wrong: str

    @property
    def package(self) -> str:
        return self.file.split("/", 1)[0]


@dataclasses.dataclass(frozen=True)
class Break:
    name: str
    #: The checks that see it: each configuration it reaches fails one of them.
    checks: tuple[str, ...]
    #: By sampler path: the edit on the vocab-sharded path, and on the replicated one.
    sharded: Edit
    replicated: Edit
    #: The configurations it reaches (None: every one smoke runs).
    configurations: tuple[str, ...] | None = None
    #: The function the break is in, which the configuration's sync must say
    #: it ran (its `sync_path`): the check failed because that path was taken.
    ran: str | None = None

    def edit(self, chips: int) -> Edit:
        """The edit for the path an engine on `chips` chips takes (smoke's
        configurations shard the vocab over every chip)."""
        return self.sharded if chips > 1 else self.replicated


def _same(edit: Edit) -> tuple[Edit, Edit]:
    return edit, edit


BREAKS = [
    Break("greedy takes the least likely token", ("greedy tokens",),
          Edit(VOCAB_SHARDED, "        return _argmax(logits, _shard_offset(logits, layout), layout)\n",
               "        return _argmax(-logits, _shard_offset(logits, layout), layout)\n"),
          Edit(REPLICATED, "    greedy_tokens = jnp.argmax(logits, axis=-1)\n", "    greedy_tokens = jnp.argmax(-logits, axis=-1)\n")),
    Break("top-p ignored", ("sampled within top-k, top-p",),
          Edit(VOCAB_SHARDED, "        apply_topp = (top_p < 1.0)[:, None]\n", "        apply_topp = (top_p < 0.0)[:, None]\n"),
          Edit(REPLICATED, "    should_apply_topp = jnp.expand_dims(top_p < 1.0, axis=-1)\n",
               "    should_apply_topp = jnp.expand_dims(top_p < 0.0, axis=-1)\n")),
    Break("top-k ignored", ("sampled within top-k, top-p",),
          Edit(VOCAB_SHARDED, "        apply_topk = (top_k > 0)[:, None]\n", "        apply_topk = (top_k < 0)[:, None]\n"),
          Edit(REPLICATED, "    should_apply_topk = jnp.expand_dims(top_k > 0, axis=-1)\n",
               "    should_apply_topk = jnp.expand_dims(top_k < 0, axis=-1)\n")),
    Break("temperature ignored", ("sampled logprobs",),
          Edit(VOCAB_SHARDED, "        z = logits / jnp.expand_dims(temperature.astype(jnp.float32), -1)\n",
               "        z = logits + 0 * jnp.expand_dims(temperature.astype(jnp.float32), -1)\n"),
          Edit(REPLICATED, "    logits = logits / temperatures\n", "    logits = logits + 0 * temperatures\n")),
    Break("processed logprobs from the unprocessed logits", ("sampled logprobs",),
          Edit(VOCAB_SHARDED, "        ret_logits = jnp.where(is_greedy[:, None], logits, processed)\n", "        ret_logits = logits\n"),
          Edit(REPLICATED, "        ret_logits = jnp.where(jnp.expand_dims(is_greedy, axis=-1), logits,\n                               processed_logits)\n",
               "        ret_logits = logits\n")),
    # The sync, not the sampler: Tunix's transfer with mappings skips every
    # norm, so the engine keeps the first model's (the second's are drawn).
    Break("the Llama's norms not synced", ("synced greedy tokens", "synced greedy logprobs"),
          *_same(Edit(TUNIX_SYNC, "    val = _apply_transpose(val, flat_src_key, transpose_keys, rollout_engine)\n",
                      "    if 'norm' in str(flat_src_key):\n      continue\n"
                      "    val = _apply_transpose(val, flat_src_key, transpose_keys, rollout_engine)\n")),
          configurations=("llama-device-indexes",)),
    # MaxText's sync: Tunix's transfer_state_directly takes no target norm
    # (the layers' nor the decoder's), whichever path the source comes by.
    Break("MaxText's norms not synced", ("synced greedy tokens", "synced greedy logprobs"),
          *_same(Edit(TUNIX_SYNC, "      path_str = '.'.join(str(k) for k in key_tuple)\n      # Try Direct Match\n",
                      "      path_str = '.'.join(str(k) for k in key_tuple)\n      if 'norm' in path_str:\n        continue\n"
                      "      # Try Direct Match\n")),
          configurations=(MAXTEXT,)),
    # Inside Tunix's unstacking of a scanned leaf (the seed's second bug's
    # function): the layers come out in reverse order. Only a sync that
    # unstacks through it can fail for it, and the sync says it ran.
    Break("MaxText's scanned layers unstacked in reverse order", ("synced greedy tokens", "synced greedy logprobs"),
          *_same(Edit(TUNIX_SYNC, "      # Unstack along the 0th axis\n",
                      "      src_val = src_val[::-1]\n      # Unstack along the 0th axis\n")),
          configurations=(MAXTEXT,), ran="_unstack_scanned_param"),
    # The seed's fix site carrying weights: where the engine's model has its
    # KV heads padded to the chips, each scanned KV weight is aligned (its
    # heads repeated) and unstacked in one go by _bulk_align_and_unstack.
    # Its layers come out in reverse order ...
    Break("MaxText's aligned layers unstacked in reverse order", ("synced greedy tokens", "synced greedy logprobs"),
          *_same(Edit(TUNIX_SYNC, "  return tuple(jnp.unstack(aligned, axis=scan_axis))\n",
                      "  return tuple(jnp.unstack(aligned, axis=scan_axis))[::-1]\n")),
          configurations=(MAXTEXT_MOE,), ran="_bulk_align_and_unstack"),
    # ... or its KV heads are repeated as whole tiles (heads 0 1 2 3 0 1 2 3,
    # not 0 0 1 1 2 2 3 3): the padded model's query heads read other heads' keys and values.
    Break("MaxText's KV heads repeated in the wrong order", ("synced greedy tokens", "synced greedy logprobs"),
          *_same(Edit(TUNIX_SYNC, "    out = jnp.repeat(out, count, axis=axis)\n",
                      "    out = jnp.concatenate([out] * count, axis=axis)\n")),
          configurations=(MAXTEXT_MOE,), ran="_bulk_align_and_unstack"),
]
NAMED = {b.name: b for b in BREAKS}
