"""The reports (docs/reports.md): the documented fields are the types'
fields, each report round-trips through its one writer and load_report, and
a reader refuses another kind or another version in words."""

from __future__ import annotations

import json
import re

import pytest

from maxtext_rl_overlay.checks import reports, verify
from maxtext_rl_overlay.core.errors import OverlayError
from maxtext_rl_overlay.maintain import testmatrix
from maxtext_rl_overlay.smoke import report as smoke_report
from maxtext_rl_overlay.smoke.checks import CheckResult
from maxtext_rl_overlay.smoke.run import BrokenStack, CannotRun, Configuration, SmokeReport
from maxtext_rl_overlay.tpucell import host
from support import ROOT

DOC = ROOT / "docs" / "reports.md"


def _documented() -> dict[str, list[str]]:
    """docs/reports.md's field tables, by the type each heading names."""
    tables: dict[str, list[str]] = {}
    current = None
    for line in DOC.read_text().splitlines():
        heading = re.fullmatch(r"### `(\w+)`", line)
        if heading:
            current = heading.group(1)
            tables[current] = []
        elif current and (row := re.match(r"\| `(\w+)` \|", line)):
            tables[current].append(row.group(1))
    return tables


def _keys(kind: type) -> list[str]:
    return list(kind.__annotations__)


def test_the_documented_fields_are_the_types_fields_in_order():
    documented = _documented()
    types = [*reports.DOCUMENTS.values(), *reports.RECORDS]
    assert set(documented) == {t.__name__ for t in types}, "a table per type, and a type per table"
    for kind in types:
        assert documented[kind.__name__] == _keys(kind), kind.__name__


def test_every_report_starts_with_its_version_and_kind():
    for kind, document in reports.DOCUMENTS.items():
        assert _keys(document)[:2] == ["report_version", "kind"], kind
        assert f'| `kind` | str | `"{kind}"` |' in DOC.read_text(), kind


def _verdict(ok: bool) -> verify.Verdict:
    finding = verify.Finding("vllm", verify.Check.FILE, "a" * 64, "b" * 64, ok, subject="vllm/x.py", remedy="" if ok else "reinstall")
    opts = verify.VerifyOptions()
    return verify.Verdict([finding], [], [] if ok else ["what to do"], verify.verdict_line([finding], [], opts), opts)


@pytest.mark.parametrize("ok", [True, False], ids=["yes", "no"])
def test_verify_json_round_trips(tmp_path, ok):
    out = tmp_path / "verify.json"
    verify.write_json(out, None)
    assert reports.load_report(out, "verify")["finished"] is False
    verify.write_json(out, _verdict(ok))
    doc = reports.load_report(out, "verify")
    assert doc == json.loads(reports.dumps(verify.json_document(_verdict(ok))))
    assert doc["ok"] is ok and doc["finished"] and doc["verdict"].startswith("verify: yes" if ok else "verify: NO")
    (finding,) = doc["findings"]
    assert finding["check"] == "file" and finding["subject"] == "vllm/x.py" and finding["remedy"] == ("" if ok else "reinstall")
    assert set(finding) == set(_keys(reports.FindingDocument))


@pytest.mark.parametrize("outcome", [
    None, CannotRun("no TPU here"), BrokenStack("jax fails to import"), SmokeReport(True, []),
    SmokeReport(False, [Configuration("llama", checks=[CheckResult("engine ran", False, "died")])], {"maxtext": "not installed"}),
], ids=["unfinished", "cannot-run", "broken", "pass", "fail"])
def test_smoke_json_has_one_shape_for_every_ending(tmp_path, outcome):
    out = tmp_path / "smoke.json"
    smoke_report.write_json(out, outcome, cpu_simulation=True)
    doc = reports.load_report(out, "smoke")
    assert list(doc) == _keys(reports.SmokeDocument)
    assert doc["finished"] == (outcome is not None)
    assert doc["ok"] == (isinstance(outcome, SmokeReport) and not outcome.failed)
    assert (doc["cannot_run"] is not None) == isinstance(outcome, CannotRun)


def test_matrix_json_round_trips(tmp_path):
    opts = testmatrix.MatrixOptions(tmp_path, tmp_path / "dist", tmp_path / "work", quick=True, json=tmp_path / "matrix.json")
    results = [testmatrix.CellResult("py312", "yes", passed=3, skipped=1, seconds=12.34, stand_ins={"pallas-interpret": 2})]
    testmatrix.write_json(tmp_path / "matrix.json", results, opts)
    doc = reports.load_report(tmp_path / "matrix.json", "test-matrix")
    assert doc["ok"] and doc["quick"] and doc["platform"] == "cpu"
    (run,) = doc["runs"]
    assert list(run) == _keys(reports.MatrixRunDocument) and run["seconds"] == 12.3 and run["stand_ins"] == {"pallas-interpret": 2}


def test_cell_json_round_trips_and_an_older_one_is_refused(tmp_path):
    facts = {"release": "maxtext-rl-overlay==0.1.0", "host_python": "3.11", "host_jax": "0.10.2"}
    path = tmp_path / "cell.json"
    doc = host.read_report(path, facts)
    doc["steps"]["install"] = {"rc": 0, "seconds": 1.0, "when": "2026-01-01T00:00:00Z", "stand_ins": []}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    assert reports.load_report(path, "tpu-cell") == doc
    assert host.read_report(path, facts) == doc, "a later call adds to it"
    path.write_text(json.dumps({"steps": {}}))  # a cell.py before report_version
    with pytest.raises(SystemExit, match="not a cell report of this format"):
        host.read_report(path, facts)


def test_the_cell_writes_the_reports_version_and_types():
    """tpucell/host.py runs on the TPU host with the standard library alone,
    so it cannot import reports at run time: it says cell.json's version
    again (held equal here) and names reports' types for the type checker
    alone, never a copy of them that could drift."""
    assert host.CELL_REPORT_VERSION == reports.VERSIONS["tpu-cell"]
    assert not hasattr(host, "CellDocument") and not hasattr(host, "CellStep")


def test_a_reader_refuses_another_kind_or_version_in_words(tmp_path):
    text = reports.dumps(smoke_report.json_document(None, cpu_simulation=False))
    assert reports.load_report(text, "smoke")["kind"] == "smoke"
    with pytest.raises(OverlayError, match="is a smoke report, not a verify report"):
        reports.load_report(text, "verify")
    for version, which in ((0, "an older"), (reports.VERSIONS["smoke"] + 1, "a newer")):
        other = json.dumps(dict(json.loads(text), report_version=version))
        with pytest.raises(OverlayError, match=f"smoke report_version {version}, {which} format than this tool's"):
            reports.load_report(other, "smoke")
    with pytest.raises(OverlayError, match="not a versioned report"):
        reports.load_report('{"written_by": "maxtext-rl-overlay smoke", "ok": true}', "smoke")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(OverlayError, match="broken.json is not JSON"):
        reports.load_report(broken, "smoke")


def test_a_report_file_replaces_only_its_own_kind(tmp_path):
    out = tmp_path / "report.json"
    smoke_report.write_json(out, None, cpu_simulation=False)
    with pytest.raises(OverlayError, match="is not a verify result the tool wrote"):
        verify.write_json(out, None)
    out.write_text('{\n "written_by": "maxtext-rl-overlay smoke",\n "ok": true\n}\n')  # smoke's, before versions
    smoke_report.write_json(out, None, cpu_simulation=False)
    assert reports.load_report(out, "smoke")["finished"] is False
