"""The output channel: one form for every line a person reads on stderr,
-v held there, and a sink a test can swap (output.captured)."""

from __future__ import annotations

import sys

import pytest

from maxtext_rl_overlay.core import output, proc, staging


def test_every_kind_of_line_has_its_prefix():
    with output.captured() as got:
        output.note("vllm", "building")
        output.say("cleared what a stopped run left")
        output.warn("could not remove x")
        output.warn("not built: vllm", who="build")
        output.relay("one\n\ntwo\n", who="cell")
    assert got.lines == [
        "[vllm] building",
        "maxtext-rl-overlay: cleared what a stopped run left",
        "maxtext-rl-overlay: warning: could not remove x",
        "[build] warning: not built: vllm",
        "[cell] | one",
        "[cell] | ",
        "[cell] | two",
    ]


def test_a_step_says_its_start_and_its_end(capsys):
    with output.captured() as got:
        with output.step("x", "working"):
            pass
        with pytest.raises(RuntimeError), output.step("x", "breaking"):
            raise RuntimeError
    assert got.lines[0] == "[x] working ..." and got.lines[1].startswith("[x] working: done in ")
    assert got.lines[2] == "[x] breaking ..." and got.lines[3].startswith("[x] breaking: failed after ")
    assert capsys.readouterr().err == "", "captured lines are not written"


def test_without_a_capture_lines_go_to_stderr_and_stdout_stays_for_results(capsys):
    output.note("x", "hello")
    assert capsys.readouterr() == ("", "[x] hello\n")


def test_a_line_of_the_run_as_a_whole_goes_through_the_channel(tmp_path):
    dest = tmp_path / "result"
    (tmp_path / "result.0123abcd").write_text("a killed run's staged copy")
    with output.captured() as got:
        staging.recover(dest)
        staging.recover(dest)  # nothing left: nothing said
    assert got.lines == [f"maxtext-rl-overlay: cleared what a stopped run left beside {dest}: result.0123abcd"]


def test_verbose_is_the_channels_and_a_capture_can_set_it_for_its_block():
    assert not output.verbose()
    with output.captured(verbose=True) as got:
        assert output.verbose()
        proc.run([sys.executable, "-c", "print('hi')"], who="demo", what="greeting", log=True)
    assert not output.verbose(), "put back after the block"
    assert got.lines[0].startswith("[demo] $ ") and "[demo] | hi" in got.lines, got.lines
    proc.set_verbose(True)  # the CLI's call: the same switch
    try:
        assert output.verbose()
    finally:
        proc.set_verbose(False)
    with output.captured() as quiet:
        proc.run([sys.executable, "-c", "print('hi')"], who="demo", what="greeting", log=True)
    assert quiet.lines == [], "without -v no command is echoed"


def test_the_command_lines_errors_and_verdicts_go_through_the_channel(tmp_path, capsys):
    """What the CLI itself says on stderr (an error, a NO verdict) is the
    channel's too: a test that swaps the sink sees it, stdout holds none of it."""
    from maxtext_rl_overlay.__main__ import main

    with output.captured() as got:
        status = main(["lint", "--project", str(tmp_path)])
    assert status != 0
    assert got.lines and got.lines[0].startswith("maxtext-rl-overlay: error: ") and "pyproject.toml" in got.lines[0], got.lines
    with output.captured() as got:
        output.verdict("smoke: NO - 1 check(s) failed")
    assert got.lines == ["smoke: NO - 1 check(s) failed"]
    assert capsys.readouterr().err == ""


def test_under_github_actions_a_long_step_is_folded_and_its_end_shows(monkeypatch):
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    with output.captured() as got:
        with output.step("vllm", "building 100%"):
            output.note("vllm", "inside")
        with pytest.raises(RuntimeError), output.step("build", "resolving"):
            raise RuntimeError("no")
    assert [line.split(": done in")[0].split(": failed after")[0] for line in got.lines] == [
        "::group::[vllm] building 100%25",
        "[vllm] building 100% ...",
        "[vllm] inside",
        "::endgroup::",
        "[vllm] building 100%",
        "::group::[build] resolving",
        "[build] resolving ...",
        "::endgroup::",
        "[build] resolving",
    ]


def test_under_github_actions_a_no_is_also_an_error_annotation(monkeypatch, tmp_path, capsys):
    from maxtext_rl_overlay.checks import verify
    from maxtext_rl_overlay.checks.verdict import Command, Said

    def command(ok: bool) -> int:
        return Command("verify", None, lambda: ok, lambda ok: "the table",
                       lambda ok: Said(ok, "verify: yes - fine" if ok else "verify: NO - 1 check(s) failed.", ("do this",)),
                       lambda outcome: verify.json_document(None))()

    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    assert command(False) == 1
    out, err = capsys.readouterr()
    assert out == "the table\n"
    assert err == "\nverify: NO - 1 check(s) failed.\n  do this\n::error::verify: NO - 1 check(s) failed.\n"
    assert command(True) == 0
    out, err = capsys.readouterr()
    assert (out, err) == ("the table\n\nverify: yes - fine\n", "")
    monkeypatch.setenv("GITHUB_ACTIONS", "false")
    assert command(False) == 1
    assert capsys.readouterr().err == "\nverify: NO - 1 check(s) failed.\n  do this\n"


def test_an_annotation_is_one_line(monkeypatch):
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    with output.captured() as got:
        output.annotate_error("smoke: NO - a\nb\r 100%")
    assert got.lines == ["::error::smoke: NO - a%0Ab%0D 100%25"]
