"""smoke's checks and table on generates given here: what each check says
yes and no to (the engine runs in tests/fixes/test_smoke.py)."""

from __future__ import annotations

import math
import pathlib

from maxtext_rl_overlay.smoke import checks, configurations, report
from maxtext_rl_overlay.smoke.cpu_simulation import NOTICE
from maxtext_rl_overlay.smoke.run import Configuration, SmokeReport


def _rows(*token_rows: list[int], logprob: float = -0.5) -> list[dict]:
    return [{"tokens": tokens, "logprobs": [logprob] * len(tokens)} for tokens in token_rows]


FIRST = _rows([3, 4, 5], [6, 7, 8])  # the first model's reference
SECOND = _rows([3, 9], [6, 7, 8])  # the second's: the first prompt decodes apart (an end token sooner)


def test_synced_passes_where_the_engine_decodes_the_second_model():
    out = checks.synced(_rows([3, 9], [6, 7, 8], logprob=-0.50001), SECOND, FIRST, "cpu", "transformers")
    assert [(c.name, c.ok) for c in out] == [("synced greedy tokens", True), ("synced greedy logprobs", True)]


def test_synced_says_no_where_the_engine_kept_the_first_models_weights():
    tokens, _ = checks.synced(FIRST, SECOND, FIRST, "cpu", "transformers")
    assert not tokens.ok and "1 prompt(s) decode as the first model still" in tokens.detail, tokens


def test_synced_says_no_where_the_two_models_cannot_be_told_apart():
    [check] = checks.synced(FIRST, FIRST, FIRST, "cpu", "transformers")
    assert check.name == "synced model decodes apart" and not check.ok, check


def test_greedy_logprobs_beyond_the_platforms_tolerance_say_no():
    tokens, logprobs = checks.greedy(_rows([3, 4, 5], [6, 7, 8], logprob=-0.6), FIRST, "cpu")
    assert tokens.ok and not logprobs.ok and "1.00e-01" in logprobs.detail
    # A TPU's gate runs at checks.GATE_PRECISION: float32 to a few ulps, so 0.02 off is no rounding there.
    assert checks.GATE_PRECISION == "highest"
    assert checks.greedy(_rows([3, 4, 5], [6, 7, 8], logprob=-0.5005), FIRST, "tpu")[1].ok
    assert not checks.greedy(_rows([3, 4, 5], [6, 7, 8], logprob=-0.52), FIRST, "tpu")[1].ok


def test_the_default_precision_is_measured_against_its_own_bound():
    """jax's default precision on a TPU (one bfloat16 pass a matmul) moved
    the logprobs by up to 0.10 on a v5e: within DEFAULT_PRECISION_BOUND; a
    stack worse than that, or one whose switch of precision compiled
    nothing (the measurement would be the gate's precision again), says no."""
    name = checks.DEFAULT_PRECISION
    tokens, logprobs = checks.default_precision(_rows([3, 9], [6, 7, 8], logprob=-0.6), SECOND, 10, "transformers")
    assert (tokens.name, logprobs.name) == (f"{name} tokens", f"{name} logprobs")
    assert tokens.ok and logprobs.ok and "10 program(s) compiled at jax's default precision" in logprobs.detail, logprobs
    _, worse = checks.default_precision(_rows([3, 9], [6, 7, 8], logprob=-0.5 - 2 * checks.DEFAULT_PRECISION_BOUND), SECOND, 10, "transformers")
    assert not worse.ok, worse
    _, uncompiled = checks.default_precision(_rows([3, 9], [6, 7, 8], logprob=-0.6), SECOND, 0, "transformers")
    assert not uncompiled.ok and "no program compiled after the switch of precision" in uncompiled.detail, uncompiled
    wrong, _ = checks.default_precision(FIRST, SECOND, 10, "transformers")
    assert not wrong.ok, wrong


# -- the sampled rows, on logits given here --------------------------------
#
# A slowly falling distribution over 300 ids (logit -0.01 * id): at the
# sampled settings top-p over the top 50 keeps the first 39 of them, so a
# sampler ignoring top-p would draw one of the other 11 about one time in 5,
# and top-p over the whole vocabulary keeps ~200, so one ignoring top-k would
# leave the kept set most of the time. Every position of every row sees these logits.

LOGITS = [-0.01 * i for i in range(300)]


def _kept() -> list[int]:
    """The ids top-k then top-p keep at the sampled settings, worked out here."""
    t, k, p = checks.SAMPLED["temperature"], int(checks.SAMPLED["top_k"]), checks.SAMPLED["top_p"]
    weights = [math.exp(x / t) for x in LOGITS[:k]]
    kept, mass = [], 0.0
    for i, w in enumerate(weights):
        if mass >= p * sum(weights):
            break
        kept.append(i)
        mass += w
    return kept


def _processed_logprob(token: int, kept: list[int], temperature: float) -> float:
    return LOGITS[token] / temperature - math.log(sum(math.exp(LOGITS[i] / temperature) for i in kept))


def _sampled(tokens: list[list[int]], logprob=None) -> tuple[list[dict], list[list[list[float]]]]:
    """Rows with these draws and the engine's processed logprobs (or `logprob`'s), and the reference's logits."""
    kept = _kept()
    lp = logprob or (lambda token: _processed_logprob(token, kept, checks.SAMPLED["temperature"]))
    rows = [{"tokens": row, "logprobs": [lp(t) for t in row]} for row in tokens]
    return rows, [[LOGITS] * len(row) for row in tokens]


def _draws(rows: int = 6, length: int = 32) -> list[list[int]]:
    """Draws inside the kept set, each row its own."""
    kept = _kept()
    return [[kept[(r * 7 + i * 3) % len(kept)] for i in range(length)] for r in range(rows)]


def _checks(rows, logits, platform="cpu") -> dict[str, checks.CheckResult]:
    return {c.name: c for c in checks.sampled(rows, logits, platform)}


def test_the_kept_set_here_is_the_one_the_comment_says():
    assert len(_kept()) == 39


def test_right_draws_pass_every_sampled_check():
    out = _checks(*_sampled(_draws()))
    assert list(out) == ["sampled draws differ", "sampled within top-k, top-p", "sampled logprobs", "sampled draws can tell"]
    assert all(c.ok for c in out.values()), out
    assert "192 draws at temperature 1.5, top_k 50, top_p 0.8" in out["sampled within top-k, top-p"].detail


def test_a_draw_that_top_p_cuts_says_no():
    draws = _draws()
    draws[2][5] = 47  # in the top 50, beyond top-p's 39
    out = _checks(*_sampled(draws, logprob=lambda t: -3.0))
    assert not out["sampled within top-k, top-p"].ok and "row 2 token 5: 47, rank 47" in out["sampled within top-k, top-p"].detail


def test_a_draw_that_top_k_cuts_says_no():
    draws = _draws()
    draws[0][0] = 120
    out = _checks(*_sampled(draws, logprob=lambda t: -3.0))
    assert not out["sampled within top-k, top-p"].ok and "row 0 token 0: 120, rank 120" in out["sampled within top-k, top-p"].detail


def test_logprobs_of_the_unprocessed_logits_say_no():
    raw = lambda t: LOGITS[t] - math.log(sum(math.exp(x) for x in LOGITS))  # noqa: E731
    out = _checks(*_sampled(_draws(), logprob=raw))
    assert out["sampled within top-k, top-p"].ok and not out["sampled logprobs"].ok, out


def test_logprobs_at_another_temperature_say_no():
    out = _checks(*_sampled(_draws(), logprob=lambda t: _processed_logprob(t, _kept(), 1.0)))
    assert not out["sampled logprobs"].ok, out["sampled logprobs"]


def test_a_token_on_the_top_p_boundary_is_rounding_not_a_failure():
    """Where the mass before a token is within the boundary of top-p, the
    engine may keep it or not: logprobs over either set pass; a token
    further from the cut is not given that leeway."""
    t, band = checks.SAMPLED["temperature"], checks.BOUNDARY["cpu"][1]

    def logits_with_mass_before_10th(before: float) -> list[float]:
        # Nine ids share `before`, the next 41 the rest of the top 50, the others far below.
        weights = [before / 9] * 9 + [(1 - before) / 41] * 41
        return [t * math.log(w) for w in weights] + [-50.0] * 250

    def engine_logprob(logits: list[float], token: int, kept: int) -> float:
        return logits[token] / t - math.log(sum(math.exp(x / t) for x in logits[:kept]))

    for before, ok in ((checks.SAMPLED["top_p"] - band / 10, True), (checks.SAMPLED["top_p"] - band * 10, False)):
        logits = logits_with_mass_before_10th(before)  # the reference keeps the 10th id, by a hair or by a margin
        draws = [[(r + i) % 9 for i in range(32)] for r in range(6)]
        rows = [{"tokens": row, "logprobs": [engine_logprob(logits, x, 9) for x in row]} for row in draws]  # the engine cut it
        out = {c.name: c for c in checks.sampled(rows, [[logits] * 32] * 6, "cpu")}
        assert out["sampled within top-k, top-p"].ok and out["sampled logprobs"].ok == ok, (before, out["sampled logprobs"])


def test_draws_too_few_to_tell_a_broken_sampler_say_no():
    out = _checks(*_sampled(_draws(rows=2, length=4)))
    assert not out["sampled draws can tell"].ok and "bound 1e-06" in out["sampled draws can tell"].detail


def test_sampled_draws_all_alike_say_no():
    assert not _checks(*_sampled([_draws()[0]] * 6))["sampled draws differ"].ok
    [differ] = checks.sampled(_rows([1, 2], [1, 2]), None, "cpu")  # no reference: the draws can still be told alike
    assert not differ.ok


def test_the_table_has_the_sync_seconds_and_the_simulation_on_every_row():
    config = Configuration("llama-device-indexes", chips=8, seconds={"engine_start": 20.0, "greedy": 2.0, "sampled": 1.5,
                                                                      "sync": 3.25, "synced": 0.5},
                           checks=checks.synced(SECOND, SECOND, FIRST, "cpu", "transformers"), sync_path="Tunix's sampler")
    text = report.render(SmokeReport(cpu_simulation=True, configurations=[config]))
    header, *rows = text.splitlines()[:3]
    assert header.split()[:9] == ["configuration", "chips", "engine", "start", "s", "generate", "s", "sync", "s"]
    for row in rows:
        assert row.split()[1:5] == ["8", "20.0", "4.0", "3.2"] and row.endswith(f"[{NOTICE}]"), row
    assert "llama-device-indexes: the second model synced by Tunix's sampler" in text


def test_a_wrong_greedy_token_is_shown_with_the_references_margin_there():
    reference = [dict(row, margins=[2.0, 0.01, 1.0]) for row in FIRST]
    tokens, _ = checks.greedy(_rows([3, 4, 5], [6, 1, 8]), reference, "tpu")
    assert not tokens.ok and "first apart at token 1; there the reference's best two logprobs are 0.010 apart" in tokens.detail


def test_a_chips_table_says_the_precision_smoke_pinned_and_the_one_measured():
    config = Configuration("llama-device-indexes", chips=1, precision="highest", checks=checks.synced(SECOND, SECOND, FIRST, "tpu", "transformers"))
    text = report.render(SmokeReport(cpu_simulation=False, configurations=[config]))
    assert (f"llama-device-indexes: the checks ran at matmul precision 'highest', pinned by smoke; the '{checks.DEFAULT_PRECISION}' rows "
            f"at jax's default (train_rl's), within {checks.DEFAULT_PRECISION_BOUND}") in text, text
    assert NOTICE not in text
    simulated = report.render(SmokeReport(cpu_simulation=True, configurations=[Configuration("llama-device-indexes", precision="default")]))
    assert "pinned by smoke" not in simulated


def test_maxtexts_engine_takes_the_pinned_precision_in_its_own_config():
    """MaxText's layers pass their config's matmul_precision to every matmul
    (jax's default does not override an explicit one): the engine's
    maxtext_config carries the precision smoke pins, and the table says the
    started engine cannot be measured at jax's default."""
    maxtext = configurations.MAXTEXT
    pinned = maxtext.additional_config(pathlib.Path("ckpt"), 1, "highest")["maxtext_config"]
    assert pinned["matmul_precision"] == "highest" and pinned["load_parameters_path"] == str(pathlib.Path("ckpt") / "maxtext-params")
    assert "matmul_precision" not in maxtext.additional_config(pathlib.Path("ckpt"), 1, None)["maxtext_config"]  # MaxText's own default
    assert configurations.LLAMA.additional_config(pathlib.Path("ckpt"), 2, "highest") == configurations.device_indexes_config(2)
    config = Configuration(maxtext.name, chips=1, precision="highest", checks=checks.synced(SECOND, SECOND, FIRST, "tpu", "MaxText's own forward"))
    text = report.render(SmokeReport(cpu_simulation=False, configurations=[config]))
    assert (f"{maxtext.name}: the checks ran at matmul precision 'highest', pinned by smoke; no row at jax's default: "
            f"{maxtext.precision_at_build}, so a started engine keeps it") in text, text
