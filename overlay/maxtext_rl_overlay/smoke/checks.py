"""What `smoke` checks in an engine's generates, against references no one
here wrote (transformers' own greedy `generate` and forward on the same
checkpoint). Each check is a named yes or no with what it saw."""

from __future__ import annotations

import dataclasses
from typing import Any

from . import tiny_llama

#: The sampled batch: one prompt, SAMPLED_ROWS requests, top-k at SAMPLED_TOP_K.
SAMPLED_PROMPT = [1, 17, 230, 5, 911, 42]
SAMPLED_ROWS = 8
SAMPLED_TOP_K = 4
SAMPLED_TOKENS = 6
#: How far the engine's logprobs may be from transformers' (torch, float32,
#: CPU): a different implementation of the same model, so rounding only. On a
#: TPU, float32 matmuls run at the default (bfloat16-pass) precision.
LOGPROB_TOLERANCE = {"cpu": 1e-4, "tpu": 5e-2}


def generates() -> list[tuple[str, list[list[int]], dict[str, Any]]]:
    """(name, prompts, SamplingParams kwargs), run in this order."""
    return [
        ("greedy", tiny_llama.REFERENCE_PROMPTS, {"temperature": 0.0, "max_tokens": tiny_llama.REFERENCE_TOKENS}),
        ("sampled", [SAMPLED_PROMPT] * SAMPLED_ROWS, {"temperature": 1.0, "top_k": SAMPLED_TOP_K, "max_tokens": SAMPLED_TOKENS}),
    ]


def after_sync() -> list[tuple[str, list[list[int]], dict[str, Any]]]:
    """The generates run after the second model is synced into the engine."""
    return [("synced", tiny_llama.REFERENCE_PROMPTS, {"temperature": 0.0, "max_tokens": tiny_llama.REFERENCE_TOKENS})]


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def greedy(outputs: list[dict[str, Any]], reference: list[dict[str, Any]], platform: str, by: str = "transformers", what: str = "greedy") -> list[Check]:
    """The greedy tokens are the reference's (`by` names it) and their logprobs
    agree; `what` names the checks."""
    tolerance = LOGPROB_TOLERANCE.get(platform, LOGPROB_TOLERANCE["tpu"])
    wrong = [i for i, (out, ref) in enumerate(zip(outputs, reference, strict=True)) if out["tokens"] != ref["tokens"]]
    tokens = sum(len(ref["tokens"]) for ref in reference)
    if wrong:
        i = wrong[0]
        seen = f"prompt {i}: engine {outputs[i]['tokens']}, {by} {reference[i]['tokens']}"
        at = next((j for j, (a, b) in enumerate(zip(outputs[i]["tokens"], reference[i]["tokens"], strict=False)) if a != b), None)
        if at is not None and "margins" in reference[i]:  # a near-tie there would be rounding, not a broken engine
            seen += f" (first apart at token {at}; there the reference's best two logprobs are {reference[i]['margins'][at]:.3f} apart)"
        token_check = Check(f"{what} tokens", False, f"{len(wrong)} of {len(reference)} prompts differ; {seen}")
    else:
        token_check = Check(f"{what} tokens", True, f"{len(reference)} prompts, {tokens} tokens, as {by} decodes them")
    diffs = [
        abs(a - b)
        for out, ref in zip(outputs, reference, strict=True)
        if out["tokens"] == ref["tokens"]
        for a, b in zip(out["logprobs"], ref["logprobs"], strict=True)
    ]
    if not diffs:
        logprob_check = Check(f"{what} logprobs", False, "no prompt's tokens matched: nothing to compare")
    else:
        worst = max(diffs)
        logprob_check = Check(f"{what} logprobs", worst <= tolerance, f"max |engine - {by}| {worst:.2e} (tolerance {tolerance:.0e})")
    return [token_check, logprob_check]


def sampled(rows: list[dict[str, Any]], ranks: list[list[int]] | None) -> list[Check]:
    """The draws sample (tpu-inference #1386 coerced top_k to 1: every
    rollout greedy) and, where the reference can rank them (`ranks`), follow top-k."""
    distinct = len({tuple(r["tokens"]) for r in rows})
    differ = Check("sampled draws differ", distinct > 1, f"{distinct} distinct of {len(rows)} requests on one prompt")
    if ranks is None:
        return [differ]
    worst = max(max(r) for r in ranks)
    top_k = Check(
        "sampled within top-k",
        worst < SAMPLED_TOP_K,
        f"highest rank drawn {worst} (top_k {SAMPLED_TOP_K}: ranks 0-{SAMPLED_TOP_K - 1}), by transformers' forward",
    )
    return [differ, top_k]


def synced(outputs: list[dict[str, Any]], reference: list[dict[str, Any]], before: list[dict[str, Any]], platform: str, by: str) -> list[Check]:
    """After the sync, the engine decodes the second model as its reference
    does. The two models' references must differ, or an engine left with
    the first model's weights would pass."""
    differ = sum(new["tokens"] != old["tokens"] for new, old in zip(reference, before, strict=True))
    if not differ:
        return [Check("synced model decodes apart", False, f"{by} decodes the second model as the first: the sync could not be told")]
    checks = greedy(outputs, reference, platform, f"{by} (second model)", what="synced greedy")
    stale = sum(out["tokens"] == old["tokens"] != new["tokens"] for out, old, new in zip(outputs, before, reference, strict=True))
    if stale:  # what was seen: the engine kept the first model's weights there
        checks[0] = Check(checks[0].name, False, f"{checks[0].detail}; {stale} prompt(s) decode as the first model still")
    return checks
