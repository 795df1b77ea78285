"""train_rl's `vllm_native` configuration, family by family: each family
MaxText 0.2.4's Tunix integration maps, a tiny actor built by MaxText's own
code through train_rl's own set-up, vLLM's own model for it in the engine
(dummy weights, Tunix's device_indexes mesh, tensor parallelism over the 8
devices), and the first weight sync MaxText's rollout makes
(support/programs/family_sync.py: one process a family).

What each family does on the overlay (FAMILIES below), as the runs of
2026-12-06 showed it:

- llama3, qwen2 (qwen2.5-1.5b: tied), qwen3-1.7b (tied), gpt-oss with
  MaxText's own `MODEL_IMPL_TYPE=flax_nnx`: every weight of the engine's
  model written (only its rng state left, by design), and the engine's
  greedy tokens MaxText's own forward's. The logprobs agree within 1e-4 for
  llama3; for the Qwen models within 1e-2: their weights were dumped and are
  the actor's exactly (the sync's part), the rest is how vLLM's Qwen models
  and MaxText's compute; gpt-oss runs bfloat16 (tpu-inference's JAX GptOss
  holds its weights in it).
- qwen3 untied (qwen3-8b and larger): MaxText's Qwen mapping sends the LM
  head to `model.lm_head`, tpu-inference's Qwen3 holds `lm_head.weight`: the
  sync stops at the rollout's start naming it (google-tunix 0003); before,
  the engine generated from a random LM head with an error line in the log.
- qwen3-0.6b: MaxText refuses it (`_create_model_converter`:
  NotImplementedError, before the engine).
- qwen3 MoE, gemma3 and gpt-oss at train_rl's default MODEL_IMPL_TYPE:
  vLLM's torch models through torchax, whose state is a dict: Tunix's
  `transfer_state_with_mappings` stops at the rollout's start
  (`AttributeError: 'dict' object has no attribute 'flat_state'`) at the
  pin as on the overlay. (Upstream's b9ff349c8 accepts a dict there, but
  writes into a copy the sampler throws away: the engine would keep its
  dummy weights without a word; the series carries only that commit's
  reshard part.)
- deepseek3: vLLM's DeepseekV3 refuses the engine (MLA needs
  NEW_MODEL_DESIGN=1 and data-parallel attention); deepseek2: MaxText has
  no mapping for it.

Full matrix only (an engine start a family, 45-120 s each on 2 cores); the
quick matrix has 0003's mechanism (tests/fixes/google-tunix/test_0003_stale_weights.py).
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
                       "have synced each family's tiny actor into vLLM's own model as train_rl's vllm_native does"),
    pytest.mark.skipif(os.environ.get("MRL_QUICK") == "1", reason="the full matrix's (an engine start a family): would have run "
                       "train_rl's vllm_native for every family and checked the engine's weights and tokens"),
    pytest.mark.skipif(maxtext_shims.GLOBAL, reason="the plain run's: the engine runs in a process of its own, which the "
                       "session-wide shims do not reach"),
]


@dataclasses.dataclass(frozen=True)
class Outcome:
    #: "synced": the run finished; else the exception's type and a part of its message.
    stops: tuple[str, str] | None = None
    #: The engine's logprobs against MaxText's own forward (synced runs).
    logprob_tolerance: float = 1e-4
    #: family_sync's extra arguments.
    args: tuple[str, ...] = ()


FAMILIES = {
    "llama3": Outcome(),
    "qwen2": Outcome(logprob_tolerance=1e-2),
    "qwen3-tied": Outcome(logprob_tolerance=1e-2),
    "gpt-oss-flax": Outcome(logprob_tolerance=1e-1, args=("--model-impl", "flax_nnx")),
    "qwen3": Outcome(stops=("ValueError", "target weights would keep their old values, no mapping reaching them "
                                           "(the rollout would generate from weights that training never updates): lm_head.weight.")),
    "qwen3-0.6b": Outcome(stops=("NotImplementedError", "qwen3-0.6b has no HuggingFace-target conversion rules")),
    "qwen3-moe": Outcome(stops=("AttributeError", "'dict' object has no attribute 'flat_state'")),
    "gemma3": Outcome(stops=("AttributeError", "'dict' object has no attribute 'flat_state'")),
    "gpt-oss": Outcome(stops=("AttributeError", "'dict' object has no attribute 'flat_state'")),
    "deepseek3": Outcome(stops=("ValueError", "MLA models require")),
    "deepseek2": Outcome(stops=("ValueError", "deepseek2-16b vLLM weight mapping not found.")),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_vllm_native_family(name, tmp_path, record_property):
    outcome = FAMILIES[name]
    family = name.removesuffix("-flax")
    out = tmp_path / "result.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-m", "support.programs.family_sync", str(out), "--family", family,
                           "--configuration", "vllm_native", *outcome.args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=1500)
    assert out.is_file(), proc.stderr[-4000:]
    result = json.loads(out.read_text())
    leaves = result.get("leaves") or {}
    record_property("engine", json.dumps(result.get("engine")))
    record_property("stale parameters", json.dumps(leaves.get("stale_param_like")))
    stopped = result.get("stopped")
    if outcome.stops is not None:
        assert stopped, f"{name} was to stop with {outcome.stops}, and synced: {result.get('compare')}"
        record_property("stopped", f"{stopped['type']}: {stopped['message'][:300]}")
        assert stopped["type"].endswith(outcome.stops[0]) and outcome.stops[1] in stopped["message"], stopped
        return
    assert not stopped and result.get("finished"), (stopped, proc.stderr[-4000:])
    # Every parameter of the engine's model written: what stays is rng state.
    assert leaves["stale_param_like"] == [], leaves["stale_param_like"]
    compare = result["compare"]
    record_property("compare", json.dumps(compare))
    assert compare["tokens_equal"], compare
    assert compare["max_logprob_difference"] <= outcome.logprob_tolerance, compare
