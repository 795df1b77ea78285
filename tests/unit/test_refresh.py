"""The scheduled refresh's logic (scripts/refresh.py), offline: what it moves
and the pull request it writes, from recorded inputs; and that the workflow
only runs the script."""

from __future__ import annotations

import datetime
import importlib.util
import json
import pathlib
import shlex
import sys

import pytest
import yaml

from maxtext_rl_overlay.errors import OverlayError

ROOT = pathlib.Path(__file__).resolve().parents[2]
_SPEC = importlib.util.spec_from_file_location("refresh", ROOT / "scripts" / "refresh.py")
assert _SPEC and _SPEC.loader
refresh = importlib.util.module_from_spec(_SPEC)
sys.modules["refresh"] = refresh  # its dataclasses look their module up
_SPEC.loader.exec_module(refresh)

PINS = {"google-tunix": "0.1.8", "tpu-inference": "0.25.0.dev20260727", "vllm": "0.23.1rc1.dev1474"}
TODAY = datetime.date(2026, 12, 7)
#: A rebase report as scripts/rebase.sh prints it (onto upstream's main of 2026-08-22).
REPORT = """rebase tpu-inference: 7ecc401e6fae -> b8692ff01fa1   version 0.25.0.dev20260727 -> 0.27.0.dev20260822

  patch                                                                         outcome
  backport-984b29c49-Use-raw-Mesh-constructor-when-device_indexes-is-set.patch  dropped: already upstream  (Applied-Upstream: b8692ff01fa1)
  0001-Reshard-logprobs-in-gather_logprobs-for-Explicit-mes.patch               applied cleanly
  0003-Constrain-shardings-and-search-top-k-top-p-under-Exp.patch               applied with 3-way merge

  time: 1.2s
"""
P0003 = "0003-Constrain-shardings-and-search-top-k-top-p-under-Exp.patch"
CONFLICT = REPORT.replace(f"{P0003}               applied with 3-way merge",
                          f"{P0003}               CONFLICT  (tpu_inference/layers/jax/sample/sampling.py)")


def test_a_newer_maxtext_release_moves_every_pin_in_one_rebase():
    moves = refresh.plan("0.2.4", ["0.2.3", "0.2.4", "0.2.5", "0.2.6rc1", "0.3.0.dev1"], PINS, {"tpu-inference": ["v0.32.0"]})
    assert moves == [refresh.Move("maxtext-0.2.5", ("--maxtext", "0.2.5"), ("google-tunix", "tpu-inference", "vllm"))]


def test_without_one_each_upstream_with_a_newer_release_tag_moves():
    tags = {"tpu-inference": ["v0.24.0", "v0.25.0", "v0.27.0", "v0.32.0", "v0.33.0rc1", "nightly"], "google-tunix": ["v0.1.7", "v0.1.8"]}
    moves = refresh.plan("0.2.5", ["0.2.4", "0.2.5"], PINS, tags)
    assert moves == [refresh.Move("tpu-inference-v0.32.0", ("tpu-inference", "v0.32.0"), ("tpu-inference",))]
    assert refresh.plan("0.2.5", ["0.2.5"], PINS, {"google-tunix": ["v0.1.8"], "tpu-inference": ["v0.25.0"]}) == [], \
        "the tag a pin is named after is not newer than the pin"


def test_a_carried_series_makes_a_ready_pull_request_with_the_report_and_the_counts():
    move = refresh.Move("tpu-inference-v0.32.0", ("tpu-inference", "v0.32.0"), ("tpu-inference",))
    pr = refresh.pull_request([move], [refresh.Step("scripts/rebase.sh tpu-inference v0.32.0", 0, REPORT)],
                              refresh.Step("scripts/build-wheels.sh", 0, ""),
                              refresh.Step("scripts/test-matrix.sh --platform cpu --quick", 0, "...\nmatrix: 385 passed, 0 failed, 68 skipped\n"),
                              TODAY)
    assert pr["branch"] == "refresh/2026-12-07-tpu-inference-v0.32.0" and pr["draft"] is False
    assert pr["title"] == "Refresh: tpu-inference-v0.32.0"
    body = pr["body"]
    assert REPORT.strip() in body, "the rebase report, whole"
    backport = "backport-984b29c49-Use-raw-Mesh-constructor-when-device_indexes-is-set.patch"
    assert f"- {backport} (dropped: already upstream  (Applied-Upstream: b8692ff01fa1))" in body
    assert "- 385 passed, 0 failed, 68 skipped" in body
    assert "conflict" not in body.lower()


def test_a_conflict_makes_a_draft_naming_it_and_nothing_is_built():
    move = refresh.Move("maxtext-0.2.5", ("--maxtext", "0.2.5"), ("google-tunix", "tpu-inference", "vllm"))
    pr = refresh.pull_request([move], [refresh.Step("scripts/rebase.sh --maxtext 0.2.5", 1, CONFLICT)], None, None, TODAY)
    assert pr["draft"] is True and pr["title"] == "Refresh: maxtext-0.2.5 (needs work)"
    assert pr["branch"] == "refresh/2026-12-07-maxtext-0.2.5"
    assert f"**Stopped at a conflict** in {P0003}" in pr["body"]
    assert "CPU matrix" not in pr["body"], "nothing was built after a stop"


def test_a_failed_matrix_is_a_draft_with_its_counts():
    move = refresh.Move("google-tunix-v0.1.9", ("google-tunix", "v0.1.9"), ("google-tunix",))
    pr = refresh.pull_request([move], [refresh.Step("scripts/rebase.sh google-tunix v0.1.9", 0, REPORT)], refresh.Step("b", 0, ""),
                              refresh.Step("m", 1, "matrix: 380 passed, 5 failed, 68 skipped\n"), TODAY)
    assert pr["draft"] is True and "- 380 passed, 5 failed, 68 skipped" in pr["body"]


def test_the_workflow_runs_the_script_weekly_and_on_demand_and_opens_its_pull_request():
    doc = yaml.safe_load((ROOT / ".github" / "workflows" / "refresh.yml").read_text())
    on = doc[True] if True in doc else doc["on"]  # YAML 1.1 reads the key `on` as true
    assert "workflow_dispatch" in on and on["schedule"][0]["cron"]
    (job,) = doc["jobs"].values()
    runs = [step["run"] for step in job["steps"] if "run" in step]
    commands = [shlex.split(line)[0] for run in runs for line in run.splitlines() if line.strip()]
    assert ".venv/bin/python" in commands and any("scripts/refresh.py" in run for run in runs)
    assert any("gh pr create" in run and "--body-file" in run for run in runs), runs
    assert all(len(run.splitlines()) <= 12 for run in runs), "the logic lives in scripts/refresh.py, not the YAML"


def test_the_refresh_replaces_only_its_own_outputs(tmp_path):
    """pr.md and pr.json in --work: a user's file of that name is refused
    before any work (status 3 in main), the refresh's own is replaced."""
    pr = {"branch": "refresh/x", "title": "Refresh: x", "draft": False, "body": "the body\n"}
    refresh.check_outputs(tmp_path)  # absent
    refresh.write_pull_request(tmp_path, pr)
    assert (tmp_path / "pr.md").read_text() == refresh.MD_MARK + "\nthe body\n"
    assert json.loads((tmp_path / "pr.json").read_text()) == {"branch": "refresh/x", "title": "Refresh: x", "draft": False,
                                                             "written_by": refresh.JSON_MARK}
    refresh.check_outputs(tmp_path)  # its own
    refresh.write_pull_request(tmp_path, dict(pr, body="again\n"))
    assert (tmp_path / "pr.md").read_text() == refresh.MD_MARK + "\nagain\n"
    for name, foreign in (("pr.md", "my notes\n"), ("pr.json", '{"branch": "mine"}')):
        (tmp_path / name).write_text(foreign)
        with pytest.raises(OverlayError, match=f"{tmp_path / name} is not a pull request (body|record) the tool wrote"):
            refresh.check_outputs(tmp_path)
        with pytest.raises(OverlayError):
            refresh.write_pull_request(tmp_path, pr)
        assert (tmp_path / name).read_text() == foreign
        (tmp_path / name).write_text("")  # empty: replaced
    refresh.check_outputs(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pr.json", "pr.md"]
