"""smoke's checks and table on generates given here: what each check says
yes and no to (the engine runs in tests/fixes/test_smoke.py)."""

from __future__ import annotations

from maxtext_rl_overlay.smoke import checks, report
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
    assert checks.greedy(_rows([3, 4, 5], [6, 7, 8], logprob=-0.52), FIRST, "tpu")[1].ok  # bfloat16 passes on a TPU


def test_sampled_draws_all_alike_say_no():
    differ, top_k = checks.sampled(_rows([1, 2], [1, 2]), [[0, 0], [0, 0]])
    assert not differ.ok and top_k.ok
    assert not checks.sampled(_rows([1, 2], [1, 3]), [[0, checks.SAMPLED_TOP_K]])[1].ok


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
