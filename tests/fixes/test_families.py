"""train_rl's weight sync, family by family, in both of its configurations:
each family MaxText 0.2.4's Tunix integration maps, a tiny actor built by
MaxText's own code through train_rl's own set-up, the engine started as
train_rl's rollout starts it (dummy weights, tensor parallelism over the 8
devices), and the first weight sync MaxText's rollout makes
(support/programs/family_sync.py, one process a run; the families' data:
support/fixes/maxtext_models.py's VLLM_FAMILIES). A run that syncs must
write every parameter of the engine's model (only its rng state and caches
stay) and decode as MaxText's own forward of the actor does.

What each does on the overlay (OUTCOMES below):

`maxtext_on_vllm` (MaxText's model in vLLM; Tunix's
transfer_state_directly, every weight required: google-tunix 0001, 0002,
0003; MaxText's pre-unroll for Gemma alone: the maxtext series' 0.2.5
backport; Gemma 4's scanned blocks: google-tunix 0005): llama3, gemma3,
qwen2, qwen3 (8b, 1.7b, 0.6b), qwen3 MoE and gemma4 (gemma4-26b's MoE,
scanned and unscanned) sync every weight and decode MaxText's tokens;
gpt-oss syncs all 75 of the engine's parameters (with MaxText 0.2.4's own
pre-unroll it stopped before Tunix: its AssertionError "failed to unroll
any layers"), and its generate then stops in tpu-inference's gmm_v2 kernel
at these tiny dims; deepseek3 and deepseek2 are
refused by tpu-inference at train_rl's defaults (MLA needs data-parallel
attention, `enable_dp_attention`; with it, run once by hand, deepseek3's
first sync wrote all 55 parameters of MaxText's model, none stale).

`vllm_native` (vLLM's own model; MaxText's mapping, Tunix's
transfer_state_with_mappings, every weight required: 0003): llama3, qwen2
(tied), qwen3-1.7b (tied), an untied qwen3 (its LM head mapped to
tpu-inference's `lm_head.weight`: the maxtext series' 0001; at the pins it
generated from a random head) and gpt-oss at MaxText's own
`MODEL_IMPL_TYPE=flax_nnx` sync every weight and decode MaxText's tokens
(llama3 within 1e-4; the Qwen models within 1e-2, their weights the
actor's exactly; gpt-oss in bfloat16, tpu-inference's JAX GptOss's
dtype); qwen3-0.6b is refused by MaxText (no conversion rules); qwen3 MoE,
gemma3 and gpt-oss at the default implementation (vLLM's torch models
through torchax, whose dict state Tunix's sync cannot take: an
AttributeError at the first sync at the pins) and deepseek3 (its mapping
names layers a scanned DeepSeek lacks) are refused before the first sync,
naming the configuration that works (the maxtext series' 0002); deepseek2
and gemma4 have no MaxText mapping (MaxText's ValueError, before the
rollout is made).

Unscanned (`scan_layers=False`, maxtext_models.UNSCANNED and
gemma4-unscanned): in `maxtext_on_vllm` every family syncs as scanned
(gpt-oss up to the same kernel); in `vllm_native` MaxText's mapping names
the scanned stack only, so every family is refused before the engine
starts (the maxtext series' 0003) where every layer weight would have
stayed stale.

Full matrix only (an engine start a run, 45-120 s each on 2 cores); the
quick matrix has 0002's and 0003's own tests.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from support import TESTS
from support.fixes import maxtext_shims

pytestmark = [
    pytest.mark.timeout(1800),
    pytest.mark.skipif(os.environ.get("MRL_MAXTEXT") != "1", reason="needs MaxText 0.2.4 (the matrix's maxtext-0.2.4 cell): would "
                       "have synced each family's tiny actor into the engine as train_rl's two configurations do"),
    pytest.mark.skipif(os.environ.get("MRL_QUICK") == "1", reason="the full matrix's (an engine start a run): would have run "
                       "train_rl's first sync for every family in both configurations and checked the engine's weights and tokens"),
    pytest.mark.skipif(maxtext_shims.GLOBAL, reason="the plain run's: the engine runs in a process of its own, which the "
                       "session-wide shims do not reach"),
]


@dataclasses.dataclass(frozen=True)
class Outcome:
    #: None: the run syncs; else the exception's type and a part of its message.
    stops: tuple[str, str] | None = None
    #: The engine's logprobs against MaxText's own forward (runs that sync).
    logprob_tolerance: float = 1e-4
    #: family_sync's extra arguments.
    args: tuple[str, ...] = ()
    #: A run that stops after its first sync (`stops`, in the engine's
    #: generate): that sync wrote every parameter of the engine's model.
    synced: bool = False


#: tpu-inference's gmm kernel (MaxText's MoE in vLLM) needs 2 x 128 lanes of
#: the MoE's hidden width a device: at tensor parallelism 8, a width of 1024.
MOE_WIDTH = ("--vllm-model", '{"dims": {"base_moe_mlp_dim": 1024}}')
#: The maxtext series' 0002: refused before the first sync, naming maxtext_on_vllm.
NATIVE_REFUSED = ("NotImplementedError", "cannot be synced into vLLM's own model")
MLA_REFUSED = ("ValidationError", "MLA models require both the NEW_MODEL_DESIGN=1")
#: The maxtext series' 0003: an unscanned actor into vLLM's own model, refused before the engine starts.
UNSCANNED_REFUSED = ("NotImplementedError", "names the scanned actor's layers only")

OUTCOMES = {
    ("llama3", "maxtext_on_vllm"): Outcome(),
    ("gemma3", "maxtext_on_vllm"): Outcome(),
    ("qwen2", "maxtext_on_vllm"): Outcome(),
    ("qwen3", "maxtext_on_vllm"): Outcome(),
    ("qwen3-tied", "maxtext_on_vllm"): Outcome(),
    ("qwen3-0.6b", "maxtext_on_vllm"): Outcome(),
    ("qwen3-moe", "maxtext_on_vllm"): Outcome(args=MOE_WIDTH),
    # Its first sync writes every weight; the engine's generate then stops in
    # tpu-inference's gmm_v2 kernel (gpt-oss's fused activation needs 256
    # lanes of a width these tiny dims do not have).
    ("gpt-oss", "maxtext_on_vllm"): Outcome(stops=("ValueError", "should be divisible by 2 * num_lanes when fuse_act is enabled"),
                                            args=MOE_WIDTH, synced=True),
    # (float32; one run each: tokens equal, the largest difference 1.3e-04 scanned, 1.2e-04 unscanned)
    ("gemma4", "maxtext_on_vllm"): Outcome(logprob_tolerance=1e-3, args=MOE_WIDTH),
    ("gemma4-unscanned", "maxtext_on_vllm"): Outcome(logprob_tolerance=1e-3, args=MOE_WIDTH),
    # The actor unscanned (scan_layers=False; maxtext_models.UNSCANNED): one run each,
    # tokens equal, the largest difference 1.4e-06 to 3.1e-06.
    ("llama3-unscanned", "maxtext_on_vllm"): Outcome(),
    ("gemma3-unscanned", "maxtext_on_vllm"): Outcome(),
    ("qwen2-unscanned", "maxtext_on_vllm"): Outcome(),
    ("qwen3-unscanned", "maxtext_on_vllm"): Outcome(),
    ("qwen3-moe-unscanned", "maxtext_on_vllm"): Outcome(args=MOE_WIDTH),
    ("gpt-oss-unscanned", "maxtext_on_vllm"): Outcome(stops=("ValueError", "should be divisible by 2 * num_lanes when fuse_act is enabled"),
                                                      args=MOE_WIDTH, synced=True),
    ("deepseek3", "maxtext_on_vllm"): Outcome(stops=MLA_REFUSED),
    ("deepseek2", "maxtext_on_vllm"): Outcome(stops=MLA_REFUSED),
    ("llama3", "vllm_native"): Outcome(),
    ("qwen2", "vllm_native"): Outcome(logprob_tolerance=1e-2),
    ("qwen3-tied", "vllm_native"): Outcome(logprob_tolerance=1e-2),
    ("gpt-oss", "vllm_native", "flax_nnx"): Outcome(logprob_tolerance=1e-1, args=("--model-impl", "flax_nnx")),
    ("qwen3", "vllm_native"): Outcome(logprob_tolerance=1e-2),
    ("qwen3-0.6b", "vllm_native"): Outcome(stops=("NotImplementedError", "qwen3-0.6b has no HuggingFace-target conversion rules")),
    ("qwen3-moe", "vllm_native"): Outcome(stops=NATIVE_REFUSED),
    ("gemma3", "vllm_native"): Outcome(stops=NATIVE_REFUSED),
    ("gpt-oss", "vllm_native"): Outcome(stops=NATIVE_REFUSED),
    ("deepseek3", "vllm_native"): Outcome(stops=NATIVE_REFUSED),
    ("deepseek2", "vllm_native"): Outcome(stops=("ValueError", "deepseek2-16b vLLM weight mapping not found.")),
    # MaxText has no Gemma 4 mapping for vLLM's own model (its ValueError, before the rollout is made).
    ("gemma4", "vllm_native"): Outcome(stops=("ValueError", "gemma4-26b vLLM weight mapping not found."), args=MOE_WIDTH),
    # The actor unscanned: MaxText's mapping names the scanned stack only. Without 0003 (one run each)
    # every layer weight stayed stale and the overlay's Tunix stopped at the first sync naming them
    # (llama3 36 of 39, qwen2 48 of 50, qwen3 44 of 47, gpt-oss with flax_nnx 76 of 79).
    ("llama3-unscanned", "vllm_native"): Outcome(stops=UNSCANNED_REFUSED),
    ("qwen2-unscanned", "vllm_native"): Outcome(stops=UNSCANNED_REFUSED),
    ("qwen3-unscanned", "vllm_native"): Outcome(stops=UNSCANNED_REFUSED),
    ("gpt-oss-unscanned", "vllm_native", "flax_nnx"): Outcome(stops=UNSCANNED_REFUSED, args=("--model-impl", "flax_nnx")),
    ("gemma3-unscanned", "vllm_native"): Outcome(stops=UNSCANNED_REFUSED),
    ("qwen3-moe-unscanned", "vllm_native"): Outcome(stops=UNSCANNED_REFUSED),
    ("gemma4-unscanned", "vllm_native"): Outcome(stops=UNSCANNED_REFUSED, args=MOE_WIDTH),
}


@pytest.mark.parametrize("case", list(OUTCOMES), ids=["-".join(c) for c in OUTCOMES])
def test_the_first_sync_of_each_family(case, tmp_path, record_property):
    outcome = OUTCOMES[case]
    family, configuration = case[:2]
    out = tmp_path / "result.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "support.programs.family_sync", str(out), "--family", family,
                           "--configuration", configuration, *outcome.args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=1500)
    assert out.is_file(), proc.stderr[-4000:]
    result = json.loads(out.read_text())
    leaves = result.get("leaves") or {}
    record_property("engine", json.dumps(result.get("engine")))
    record_property("sync", json.dumps((result.get("sync") or {}).get("tunix_transfers")))
    stopped = result.get("stopped")
    if outcome.stops is not None:
        assert stopped, f"{case} was to stop with {outcome.stops}, and synced: {result.get('compare')}"
        record_property("stopped", f"{stopped['type']}: {stopped['message'][:300]}")
        assert stopped["type"].endswith(outcome.stops[0]) and outcome.stops[1] in stopped["message"], stopped
        if outcome.synced:
            assert leaves["param_like_count"] > 0 and leaves["stale_param_like"] == [], leaves
        return
    assert not stopped and result.get("finished"), (stopped, proc.stderr[-4000:])
    # Every parameter of the engine's model written: what stays is rng state and caches.
    assert leaves["param_like_count"] > 0 and leaves["stale_param_like"] == [], leaves["stale_param_like"]
    compare = result["compare"]
    record_property("compare", json.dumps(compare))
    assert compare["tokens_equal"], compare
    assert compare["max_logprob_difference"] <= outcome.logprob_tolerance, compare
