"""The command line: its exit statuses, -v, --version, and the shared runner
and staging helpers every stage uses."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from maxtext_rl_overlay import __main__ as cli
from maxtext_rl_overlay.config.pins import load_project
from maxtext_rl_overlay.core import proc, staging
from maxtext_rl_overlay.core.errors import ExitCode, OverlayError, ProgramMissing, TimedOut
from support import ROOT


def _cli(*args: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "maxtext_rl_overlay", *args], capture_output=True, text=True, cwd=cwd)


def test_exit_statuses_are_distinct_and_documented():
    """docs/command.md's table (the README links it) and --help name each."""
    table = dict(re.findall(r"(?m)^\| (\d+) \| (.+) \|$", (ROOT / "docs" / "command.md").read_text()))
    assert sorted(int(k) for k in table) == sorted(int(c) for c in ExitCode)
    assert len(set(ExitCode)) == len(ExitCode.__members__)
    help_text = _cli("--help").stdout
    for code in ExitCode:
        assert re.search(rf"(?m)^  {int(code)}\s+\S", help_text), help_text


def test_usage_error_and_failure_exit_differently(tmp_path):
    usage = _cli("rebase", "no-such-upstream", "HEAD")
    assert usage.returncode == ExitCode.USAGE and "invalid choice" in usage.stderr
    failure = _cli("lint", cwd=tmp_path)  # no checkout here
    assert failure.returncode == ExitCode.ERROR, failure.stderr
    assert "not inside a maxtext-rl-overlay checkout" in failure.stderr and "Traceback" not in failure.stderr


def test_version_and_every_subcommand_has_help():
    from maxtext_rl_overlay import __version__

    assert _cli("--version").stdout.strip() == f"maxtext-rl-overlay {__version__}"
    top = _cli("--help").stdout
    for name in ("verify", "build", "lint", "rebase", "test-matrix", "clean"):
        assert re.search(rf"(?m)^    {name}\s+\S", top), top
        sub = _cli(name, "--help").stdout
        assert "-v, --verbose" in sub and "exit status:" in sub
        if name not in ("verify", "clean"):  # they act on the installed stack, the cache: not a checkout
            assert "--project DIR" in sub and "the maxtext-rl-overlay checkout" in sub


def test_verbose_before_or_after_the_subcommand():
    for args in (["-v", "lint"], ["lint", "-v"]):
        done = _cli(*args, "--project", str(ROOT))
        assert done.returncode == 0, done.stderr
    quiet = cli._parser().parse_args(["lint"])
    loud = cli._parser().parse_args(["lint", "-v"])
    early = cli._parser().parse_args(["-v", "lint"])
    assert (quiet.verbose, loud.verbose, early.verbose) == (False, True, True)


def test_a_failing_program_is_an_overlay_error_with_its_output_tail():
    script = "import sys\nfor i in range(40): print('line', i)\nsys.exit(4)"
    with pytest.raises(OverlayError) as info:
        proc.run([sys.executable, "-c", script], who="demo", what="counting")
    message = str(info.value)
    assert message.startswith("demo: counting failed (") and "exited with 4" in message
    assert "line 39" in message and "line 24" not in message  # the tail, not the whole output
    assert proc.run([sys.executable, "-c", "raise SystemExit(4)"], what="x", check=False).returncode == 4
    with pytest.raises(ProgramMissing, match=r"^demo: x: no-such-program-mrl is not installed \(or not on PATH\)\.$") as missing:
        proc.run(["no-such-program-mrl"], who="demo", what="x")
    assert missing.value.program == "no-such-program-mrl"
    for check in (True, False):  # a time-out is raised whether or not the caller reads the status itself
        with pytest.raises(TimedOut, match=r"^x: .+ did not finish within 1 s\.$") as late:
            proc.run([sys.executable, "-c", "import time; time.sleep(5)"], what="x", timeout=1, check=check)
        assert (late.value.program, late.value.seconds) == (sys.executable, 1)


def test_verbose_streams_a_long_step_and_still_captures_it(capsys):
    proc.set_verbose(True)
    try:
        done = proc.run([sys.executable, "-c", "print('hello'); import sys; print('warn', file=sys.stderr)"],
                        who="demo", what="greeting", log=True)
    finally:
        proc.set_verbose(False)
    err = capsys.readouterr().err
    assert "[demo] $ " in err and "[demo] | hello" in err and "[demo] | warn" in err
    assert done.stdout == "hello\n" and done.stderr == "warn\n"


def test_git_runs_without_the_users_configuration(tmp_path, monkeypatch):
    from maxtext_rl_overlay.core.git import out

    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[user]\n\tname = Someone Else\n")
    monkeypatch.setenv("HOME", str(home))
    assert out("config", "user.name", cwd=tmp_path, check=False) == ""
    assert out("var", "GIT_COMMITTER_IDENT", cwd=tmp_path).startswith("maxtext-rl-overlay <")


def test_staged_dir_appears_whole_or_not_at_all(tmp_path):
    dest = tmp_path / "dest"
    with pytest.raises(RuntimeError):
        with staging.staged_dir(dest) as tmp:
            (tmp / "half").write_text("written")
            raise RuntimeError("stop")
    assert not dest.exists() and list(tmp_path.iterdir()) == []
    with staging.staged_dir(dest) as tmp:
        (tmp / "a").write_text("1")
    assert (dest / "a").read_text() == "1"
    (dest / "MARK").write_text("")  # what says that the folder is the caller's to replace
    with staging.staged_dir(dest, replace="MARK", mode=0o755) as tmp:
        (tmp / "b").write_text("2")
    assert sorted(p.name for p in dest.iterdir()) == ["b"] and oct(dest.stat().st_mode & 0o777) == "0o755"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dest"]  # nothing left beside it


@pytest.mark.parametrize("script, flag", [("test-matrix.sh", "--platform"), ("test-matrix.sh", "--wheels"), ("publish-pages.sh", "--dist"),
                                          ("publish-pages.sh", "--tag"), ("publish-pages.sh", "--site"), ("publish-pages.sh", "--branch")])
def test_a_script_flag_without_its_value_is_a_usage_error(script, flag, tmp_path):
    done = subprocess.run(["bash", str(ROOT / "scripts" / script), flag], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert f"{flag} needs a value" in done.stderr and "usage: scripts/" in done.stderr
    assert "unbound variable" not in done.stderr


def test_rebase_sh_documents_the_commands_exit_statuses():
    header = " ".join(line.lstrip("# ") for line in (ROOT / "scripts" / "rebase.sh").read_text().splitlines() if line.startswith("#"))
    statuses = header[header.index("Exit status"):]
    assert sorted(int(n) for n in re.findall(r"(?<![\w.-])(\d+) (?:once|at|when|on)\b", statuses)) == sorted(int(c) for c in ExitCode)


def test_lint_reports_a_malformed_patch_as_a_finding_and_goes_on(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy2(ROOT / "pyproject.toml", project / "pyproject.toml")
    shutil.copytree(ROOT / "patches", project / "patches")
    series = [path for pin in load_project(project).pins.values() for path in pin.series]
    broken = series[0]
    broken.write_text("not a patch at all\n")
    done = _cli("lint", "--project", str(project))
    assert done.returncode == ExitCode.CHECK_FAILED, done.stderr
    assert f"{broken} is not a git format-patch file" in done.stdout and "Traceback" not in done.stderr
    assert done.stdout.rstrip().endswith(f"lint: {len(series)} patch(es), 1 problem(s)")  # the others linted too


def test_the_rebase_modes_are_one_typed_request(tmp_path, monkeypatch):
    """The command line hands the rebase its flags; rebase/options.py says
    which of its five modes they ask for, with each --source where it goes."""
    from maxtext_rl_overlay.rebase.options import Abort, FindBase, RebaseOptions, ReleaseOptions, Resume, parse_request

    monkeypatch.chdir(tmp_path)  # a relative PATH is resolved where the command is given
    none: dict[str, object] = dict(name=None, new_ref=None, maxtext=None, sources=[], build=False, standins=False, apply_vllm_lkg=False,
                find_base=False, run_tests=True, resume=False, abort=False)

    def parse(**given):
        return parse_request(tmp_path, **{**none, **given})

    assert parse(resume=True) == Resume(tmp_path)
    assert parse(abort=True) == parse(resume=True, abort=True) == Abort(tmp_path)
    sources = ["mirror", "google-tunix=https://example.invalid/tunix.git"]
    one = parse(name="vllm", new_ref="HEAD", sources=sources, build=True, run_tests=False)
    assert one == RebaseOptions(tmp_path, "vllm", "HEAD", source=str(tmp_path / "mirror"), build=True,
                                build_sources={"google-tunix": "https://example.invalid/tunix.git"}, run_tests=False)
    assert parse(name="vllm", new_ref="HEAD", sources=["vllm=mirror"]).source == str(tmp_path / "mirror")  # its own, named
    assert parse(name="vllm", new_ref="HEAD", find_base=True) == FindBase(RebaseOptions(tmp_path, "vllm", "HEAD"))
    assert parse(maxtext="0.2.4", sources=["vllm=/m"], standins=True) == ReleaseOptions(tmp_path, "0.2.4", {"vllm": "/m"}, standins=True)
