"""What `smoke` checks in an engine's generates, against references no one
here wrote (transformers' own greedy `generate` and forward on the same
checkpoint). Each check is a named yes or no with what it saw."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from . import tiny_llama
from .protocol import Generate

#: The sampled batch: the greedy reference prompts (temperature 0) in one
#: batch with SAMPLED_ROWS requests on one prompt, sampled as train_rl's
#: rollout samples: a temperature other than 1, a top-k (rl.yml's
#: decode_sampling_top_k, 50) and a top-p below 1 (rl.yml's default of 1.0
#: would leave top-p untried). The temperature is above train_rl's 0.9 and
#: top-p at 0.8 so that the draws can tell (MISS_BOUND): MaxText's tiny qwen3 is
#: peaked (at 0.9 it keeps 5.6 tokens on average), and there a sampler
#: ignoring top-k would stay inside 192 draws' kept sets with probability 1e-2.
SAMPLED_PROMPT = [1, 17, 230, 5, 911, 42]
SAMPLED_ROWS = 6
SAMPLED = {"temperature": 1.5, "top_k": 50, "top_p": 0.8}
SAMPLED_TOKENS = 32
#: The error model. The reference is the same model in another implementation
#: (transformers: torch, float32, CPU; or MaxText's own forward), so a healthy
#: engine differs from it by rounding alone, and how much depends on the
#: precision of the engine's float32 matmuls:
#: - on the CPU, XLA computes them in float32: the logprobs agree to ~1e-5;
#: - on a TPU at jax's default precision (what train_rl runs at), each is one
#:   bfloat16 pass: both operands rounded to 8 significant bits (a relative
#:   error up to 2^-9 each), products summed in float32, so a logit moves by up
#:   to ~2^-8 of the sum of its products' magnitudes. On smoke's tiny Llama that
#:   is 0.06-0.10 nats on a v5e, the size of what a broken sampler shows (a draw
#:   at the edge of top-p moves, and top-p ignored reads 0.2);
#: - at "highest" (float32 to within a few ulps: six bfloat16 passes) the TPU
#:   agreed with transformers to 6e-5 (greedy) and 1.4e-4 (sampled).
#: So on a TPU the gate's generates run at GATE_PRECISION, pinned by smoke for
#: its own engine process (and said in its output), against the tolerances
#: below; the default precision is measured last, in the same engine
#: (DEFAULT_PRECISION_BOUND). docs/install.md gives the measured margins.
GATE_PRECISION = "highest"
#: How far the engine's logprobs may be from the reference's: on the CPU, and
#: on a TPU at GATE_PRECISION.
LOGPROB_TOLERANCE = {"cpu": 1e-4, "tpu": 1e-3}
#: Where the reference's kept set is a matter of rounding: a logit within this
#: of the k-th largest (scaled by the temperature), a token whose probability
#: mass before it is within this of top-p. Such a token may be in or out of the
#: engine's set; the checks accept either (logit units, probability mass).
BOUNDARY = {"cpu": (1e-3, 1e-3), "tpu": (1e-2, 5e-3)}
#: How far a TPU's greedy logprobs at jax's default precision may be from the
#: reference's: 3x the worst measured on a v5e (0.10). A stack whose default
#: numerics are worse than one bfloat16 pass (bfloat16 accumulation, bfloat16
#: activations throughout) fails it; the tokens must still be the reference's
#: (the model it runs on has greedy margins of 0.16 and more).
DEFAULT_PRECISION_BOUND = 0.3
#: The generate run at jax's default precision: its name, also the checks'.
DEFAULT_PRECISION = "greedy at default precision"
#: The draws must be able to tell: a sampler that ignores top-p, or top-k,
#: stays inside every kept set of the batch with at most this probability.
MISS_BOUND = 1e-6


def generates() -> list[Generate]:
    """The generates the engine runs on the first model, in this order."""
    greedy = {"temperature": 0.0, "max_tokens": tiny_llama.REFERENCE_TOKENS}
    sampled = dict(SAMPLED, max_tokens=SAMPLED_TOKENS, ignore_eos=True)
    return [
        Generate("greedy", tiny_llama.REFERENCE_PROMPTS, greedy),
        Generate("sampled", tiny_llama.REFERENCE_PROMPTS + [SAMPLED_PROMPT] * SAMPLED_ROWS,
                 [greedy] * len(tiny_llama.REFERENCE_PROMPTS) + [sampled] * SAMPLED_ROWS),
    ]


def split_sampled(rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The sampled batch's greedy rows and its sampled rows."""
    n = len(tiny_llama.REFERENCE_PROMPTS)
    return rows[:n], rows[n:]


def after_sync() -> list[Generate]:
    """The generates run after the second model is synced into the engine."""
    return [Generate("synced", tiny_llama.REFERENCE_PROMPTS, {"temperature": 0.0, "max_tokens": tiny_llama.REFERENCE_TOKENS})]


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """One row of smoke's table: a check's name, pass or not, and what it saw
    (verify's Check is another thing: the kinds of finding verify makes)."""

    name: str
    ok: bool
    detail: str


def at_default_precision() -> list[Generate]:
    """The generate run last, on the synced (second) model, at jax's default precision."""
    return [Generate(DEFAULT_PRECISION, tiny_llama.REFERENCE_PROMPTS, {"temperature": 0.0, "max_tokens": tiny_llama.REFERENCE_TOKENS})]


def greedy(outputs: list[dict[str, Any]], reference: list[dict[str, Any]], platform: str, by: str = "transformers", what: str = "greedy",
           tolerance: float | None = None) -> list[CheckResult]:
    """The greedy tokens are the reference's (`by` names it) and their logprobs
    agree (within `tolerance`, by default the platform's); `what` names the checks."""
    if tolerance is None:
        tolerance = LOGPROB_TOLERANCE.get(platform, LOGPROB_TOLERANCE["tpu"])
    wrong = [i for i, (out, ref) in enumerate(zip(outputs, reference, strict=True)) if out["tokens"] != ref["tokens"]]
    tokens = sum(len(ref["tokens"]) for ref in reference)
    if wrong:
        i = wrong[0]
        seen = f"prompt {i}: engine {outputs[i]['tokens']}, {by} {reference[i]['tokens']}"
        at = next((j for j, (a, b) in enumerate(zip(outputs[i]["tokens"], reference[i]["tokens"], strict=False)) if a != b), None)
        if at is not None and "margins" in reference[i]:  # a near-tie there would be rounding, not a broken engine
            seen += f" (first apart at token {at}; there the reference's best two logprobs are {reference[i]['margins'][at]:.3f} apart)"
        token_check = CheckResult(f"{what} tokens", False, f"{len(wrong)} of {len(reference)} prompts differ; {seen}")
    else:
        token_check = CheckResult(f"{what} tokens", True, f"{len(reference)} prompts, {tokens} tokens, as {by} decodes them")
    diffs = [
        (abs(a - b), i, j, a, b)
        for i, (out, ref) in enumerate(zip(outputs, reference, strict=True))
        if out["tokens"] == ref["tokens"]
        for j, (a, b) in enumerate(zip(out["logprobs"], ref["logprobs"], strict=True))
    ]
    if not diffs:
        logprob_check = CheckResult(f"{what} logprobs", False, "no prompt's tokens matched: nothing to compare")
    else:
        worst, i, j, seen, expected = max(diffs)
        where = "" if worst <= tolerance else f", at prompt {i} token {j}: engine {seen:.6f}, {by} {expected:.6f}"
        logprob_check = CheckResult(f"{what} logprobs", worst <= tolerance, f"max |engine - {by}| {worst:.2e} (tolerance {tolerance:.0e}){where}")
    return [token_check, logprob_check]


@dataclasses.dataclass(frozen=True)
class _Position:
    """One sampled position as the reference sees it: the kept set's
    candidates (ids by descending logit, each with its probability in the
    top-k distribution and the mass before it) and what a broken sampler
    would do there."""

    order: list[int]  # the top-k ids (and any tied with the k-th within the boundary), by descending logit
    scaled: list[float]  # their logits / temperature
    before: list[float]  # the top-k probability mass before each
    sizes: list[int]  # the kept set is order[:n] for one of these n (one, unless rounding could move the cut)
    miss_top_p: float  # log P(a sampler ignoring top-p draws inside the kept set)
    miss_top_k: float  # log P(a sampler ignoring top-k draws inside the kept set)


def _position(logits: list[float], platform: str) -> _Position:
    temperature, k, p = SAMPLED["temperature"], int(SAMPLED["top_k"]), SAMPLED["top_p"]
    logit_band, _ = BOUNDARY.get(platform, BOUNDARY["tpu"])
    scaled_all = [x / temperature for x in logits]
    ranked = sorted(range(len(scaled_all)), key=lambda i: -scaled_all[i])
    floor = scaled_all[ranked[k - 1]] - logit_band
    order = ranked[:k] + [i for i in ranked[k:] if scaled_all[i] >= floor]
    top = scaled_all[ranked[0]]
    weights = [math.exp(scaled_all[i] - top) for i in ranked[:k]]
    total = sum(weights)
    probs = [w / total for w in weights]
    before, mass = [], 0.0
    for q in probs:
        before.append(mass)
        mass += q
    kept = sum(b < p for b in before[:k])
    _, mass_band = BOUNDARY.get(platform, BOUNDARY["tpu"])
    sizes = [n for n in range(1, k + 1) if before[n - 1] < p + mass_band and (n == k or before[n] >= p - mass_band)]
    if sizes and sizes[-1] == k:  # all of top-k kept: a token tied with the k-th may be too
        sizes += range(k + 1, len(order) + 1)
    # A sampler ignoring top-p draws from the whole top-k distribution.
    miss_top_p = math.log(max(sum(probs[:kept]), 1e-300))
    # One ignoring top-k draws from top-p over the whole vocabulary.
    full = [math.exp(scaled_all[i] - top) for i in ranked]
    full_total, mass, nucleus = sum(full), 0.0, []
    for i, w in zip(ranked, full, strict=True):
        if mass >= p * full_total:
            break
        nucleus.append((i, w))
        mass += w
    inside = set(ranked[:kept])
    miss_top_k = math.log(max(sum(w for i, w in nucleus if i in inside) / sum(w for _, w in nucleus), 1e-300))
    return _Position(order, [scaled_all[i] for i in order], before + [1.0] * (len(order) - k), sizes, miss_top_p, miss_top_k)


def _logprob_candidates(position: _Position, at: int) -> list[float]:
    """The processed logprob of the token at `at` in `position.order`: its
    log-softmax over each kept set that holds it."""
    out = []
    for n in position.sizes:
        if n > at:
            top = position.scaled[0]
            out.append(position.scaled[at] - top - math.log(sum(math.exp(z - top) for z in position.scaled[:n])))
    return out


def sampled(rows: list[dict[str, Any]], logits: list[list[list[float]]] | None, platform: str, by: str = "transformers") -> list[CheckResult]:
    """The sampled rows of the batch. They must differ between requests
    (tpu-inference #1386 coerced top_k to 1: every rollout greedy); where the
    reference gives its logits at each drawn position (`logits`, per row and
    token: the reference's forward over the prompt and the drawn tokens),
    every draw lies in the set top-k then top-p keep at the temperature, the
    engine's logprobs are the reference's log-softmax over that set (the
    rollout's processed logprobs), and the batch is one that a sampler
    ignoring top-p, or top-k, would have left with probability at least
    1 - MISS_BOUND."""
    distinct = len({tuple(r["tokens"]) for r in rows})
    differ = CheckResult("sampled draws differ", distinct > 1, f"{distinct} distinct of {len(rows)} requests on one prompt")
    if logits is None:
        return [differ]
    settings = ", ".join(f"{k} {v}" for k, v in SAMPLED.items())
    whose = by + ("'" if by.endswith("s") else "'s")  # transformers' logits, MaxText's own forward's
    tolerance = LOGPROB_TOLERANCE.get(platform, LOGPROB_TOLERANCE["tpu"])
    outside, diffs, miss_top_p, miss_top_k, draws = [], [], 0.0, 0.0, 0
    for r, (row, row_logits) in enumerate(zip(rows, logits, strict=True)):
        for t, (token, logprob, position_logits) in enumerate(zip(row["tokens"], row["logprobs"], row_logits, strict=True)):
            draws += 1
            position = _position(position_logits, platform)
            miss_top_p += position.miss_top_p
            miss_top_k += position.miss_top_k
            at = position.order.index(token) if token in position.order else len(position.order)
            candidates = _logprob_candidates(position, at) if at < len(position.order) else []
            if not candidates:
                rank = sum(x > position_logits[token] for x in position_logits)
                where = f", top-k mass before it {position.before[at]:.3f}" if at < len(position.order) else ""
                outside.append(f"row {r} token {t}: {token}, rank {rank}{where}")
                continue
            diffs.append(min(abs(logprob - c) for c in candidates))
    within = CheckResult(
        "sampled within top-k, top-p",
        not outside,
        f"{draws} draws at {settings}, each in the set {whose} logits keep" if not outside
        else f"{len(outside)} of {draws} draws outside the set {whose} logits keep at {settings}; first: {outside[0]}",
    )
    worst = max(diffs) if diffs else math.inf
    logprobs = CheckResult("sampled logprobs", bool(diffs) and worst <= tolerance,
                     f"max |engine - {whose} log-softmax over the kept set| {worst:.2e} (tolerance {tolerance:.0e}), processed logprobs"
                     if diffs else "no draw inside the kept set: nothing to compare")
    power = CheckResult(
        "sampled draws can tell",
        max(miss_top_p, miss_top_k) <= math.log(MISS_BOUND),
        f"a sampler ignoring top-p would stay inside every kept set with probability {math.exp(miss_top_p):.1e}, "
        f"one ignoring top-k {math.exp(miss_top_k):.1e} (bound {MISS_BOUND:.0e})",
    )
    return [differ, within, logprobs, power]


def synced(outputs: list[dict[str, Any]], reference: list[dict[str, Any]], before: list[dict[str, Any]], platform: str, by: str) -> list[CheckResult]:
    """After the sync, the engine decodes the second model as its reference
    does. The two models' references must differ, or an engine left with
    the first model's weights would pass."""
    differ = sum(new["tokens"] != old["tokens"] for new, old in zip(reference, before, strict=True))
    if not differ:
        return [CheckResult("synced model decodes apart", False, f"{by} decodes the second model as the first: the sync could not be told")]
    checks = greedy(outputs, reference, platform, f"{by} (second model)", what="synced greedy")
    stale = sum(out["tokens"] == old["tokens"] != new["tokens"] for out, old, new in zip(outputs, before, reference, strict=True))
    if stale:  # what was seen: the engine kept the first model's weights there
        checks[0] = CheckResult(checks[0].name, False, f"{checks[0].detail}; {stale} prompt(s) decode as the first model still")
    return checks


def default_precision(outputs: list[dict[str, Any]], reference: list[dict[str, Any]], compiled: int, by: str) -> list[CheckResult]:
    """The synced model's greedy decode at jax's default precision, against its
    reference within DEFAULT_PRECISION_BOUND. `compiled`: the programs the
    engine compiled for it; none would mean the switch of precision reached no
    program, and the measurement would be the gate's precision again."""
    checks = greedy(outputs, reference, "tpu", f"{by} (second model)", what=DEFAULT_PRECISION, tolerance=DEFAULT_PRECISION_BOUND)
    if not compiled:
        checks[1] = CheckResult(checks[1].name, False, f"{checks[1].detail}; but no program compiled after the switch of precision: "
                          "the engine ran at the gate's precision, not jax's default")
    else:
        checks[1] = CheckResult(checks[1].name, checks[1].ok, f"{checks[1].detail}, {compiled} program(s) compiled at jax's default precision")
    return checks
