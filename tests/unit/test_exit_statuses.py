"""Every way the command can end has its documented status: a wrong command
line 2, a bad input 3 with one clear line (no traceback), an unexpected error
4 with a "please report" line (its traceback only under -v). Each case is
run as a user runs it: `python -m maxtext_rl_overlay ...` in a fresh process."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from maxtext_rl_overlay import __main__ as cli
from maxtext_rl_overlay.checks.reports import load_report
from maxtext_rl_overlay.config.pins import load_project
from maxtext_rl_overlay.core.errors import ExitCode
from maxtext_rl_overlay.maintain import lint, testmatrix
from maxtext_rl_overlay.smoke import report as smoke_report
from support import ROOT
from support.project import project_copy
from unit.unit_support import maxtext_version
from unit.unit_support import served as serve

PACKAGE = ROOT / "overlay" / "maxtext_rl_overlay"


def _cli(*args: str, env: dict[str, str] | None = None, pythonpath: pathlib.Path | None = None,
         cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
    full = dict(os.environ, **(env or {}))
    if pythonpath is not None:
        full["PYTHONPATH"] = str(pythonpath)
    return subprocess.run([sys.executable, "-m", "maxtext_rl_overlay", *args], capture_output=True, text=True, env=full, cwd=cwd,
                          timeout=300)


@pytest.fixture
def project(tmp_path) -> pathlib.Path:
    return project_copy(tmp_path / "project")


def _edit(path: pathlib.Path, pattern: str, new: str) -> None:
    """Replace the first match of `pattern` (one line: the value may move)."""
    text, n = re.subn(pattern, new, path.read_text(), count=1, flags=re.M)
    assert n == 1, f"{pattern!r} not in {path}"
    path.write_text(text)


def _error_lines(done: subprocess.CompletedProcess) -> list[str]:
    assert "Traceback" not in done.stderr, done.stderr
    return [line for line in done.stderr.splitlines() if "error:" in line]


# -- 2: the command line was wrong -------------------------------------------

@pytest.mark.parametrize("args, says", [
    (["rebase"], "NAME and NEW_REF are required"),
    (["build", "--only", "bogus"], "argument --only: unknown distribution(s) bogus"),
    (["build", "--source", "bogus=/x"], "argument --source: unknown distribution 'bogus'"),
    (["build", "--base-url", "ftp://x"], "argument --base-url: 'ftp://x': expected the http(s) URL"),
    (["build", "--source", "vllm=/x", "--source", "vllm=/y"], "--source vllm given twice"),
    (["build", "--python", ""], "argument --python: an interpreter is needed"),
    (["rebase", "--continue", "vllm"], "--continue and --abort take no NAME"),
    (["rebase", "vllm", "HEAD", "--source", "/a", "--source", "/b"], "given twice"),
    (["rebase", "vllm", "HEAD", "--source", "bogus=/x"], "unknown distribution 'bogus'"),
], ids=["rebase-no-arguments", "only-bogus", "source-bogus", "base-url-ftp", "source-twice", "python-empty", "continue-with-name",
        "rebase-source-twice", "rebase-source-bogus"])
def test_usage_errors_exit_2_with_the_usage(project, args, says):
    done = _cli(*args, "--project", str(project))
    assert done.returncode == ExitCode.USAGE, done.stderr
    (line,) = _error_lines(done)
    assert says in line, done.stderr
    assert done.stderr.startswith("usage: maxtext-rl-overlay "), done.stderr


def test_each_error_carries_its_status():
    """The CLI exits with the status of the error it ends at."""
    from maxtext_rl_overlay.core import errors, staging
    from maxtext_rl_overlay.smoke import run

    assert vars(cli)["ExitCode"] is errors.ExitCode  # (__main__ imports it: not an export)
    carried = {kind: kind.status for kind in (errors.OverlayError, errors.UsageError, errors.CheckFailed, errors.TimedOut,
                                              errors.ProgramMissing, run.CannotRun, run.BrokenStack, staging.NoSpace)}
    assert carried == {errors.OverlayError: 3, errors.UsageError: 2, errors.CheckFailed: 1, errors.TimedOut: 3, errors.ProgramMissing: 3,
                       run.CannotRun: 3, run.BrokenStack: 1, staging.NoSpace: 3}


# -- 3: a bad input, said in one line ----------------------------------------

def test_smoke_where_the_engine_or_the_reference_is_missing_cannot_run(monkeypatch, capsys):
    """smoke runs where the stack is installed, with transformers for its
    reference: a package missing is status 3, named, with the install to run
    (here a module no environment has stands for a missing package)."""
    from maxtext_rl_overlay.smoke import run

    monkeypatch.setitem(run.NEEDED, "mrl_no_such_reference", "mrl-no-such-reference")
    assert cli.main(["smoke", "--cpu-simulation"]) == ExitCode.ERROR
    captured = capsys.readouterr()
    assert "smoke: cannot run here: smoke needs " in captured.err and "mrl-no-such-reference" in captured.err, captured.err
    assert "uv pip install -c constraints.txt maxtext-rl-overlay transformers" in captured.err
    assert captured.out == ""


@pytest.mark.parametrize("value", ["0", "-5", "inf", "nan", "soon"])
def test_smoke_timeout_must_be_positive_and_finite(value):
    done = _cli("smoke", "--cpu-simulation", "--timeout", value)
    assert done.returncode == ExitCode.USAGE, done.stderr
    assert "--timeout" in done.stderr and value in done.stderr, done.stderr


def test_smoke_json_in_a_folder_that_does_not_exist_is_said_before_any_work(tmp_path):
    done = _cli("smoke", "--cpu-simulation", "--json", str(tmp_path / "no-such-folder" / "smoke.json"))
    assert done.returncode == ExitCode.ERROR, done.stderr
    (line,) = _error_lines(done)
    assert "cannot write" in line and "no-such-folder/smoke.json" in line, line


def test_smoke_that_cannot_run_leaves_its_json_saying_so_not_an_old_pass(monkeypatch, tmp_path, capsys):
    """A stale FILE from a passing run must not survive a run that did not pass."""
    from maxtext_rl_overlay.smoke import run

    out = tmp_path / "smoke.json"
    smoke_report.write_json(out, run.SmokeReport(False, []), cpu_simulation=True)  # an earlier run's pass
    monkeypatch.setitem(run.NEEDED, "mrl_no_such_reference", "mrl-no-such-reference")
    assert cli.main(["smoke", "--cpu-simulation", "--json", str(out)]) == ExitCode.ERROR
    doc = load_report(out, "smoke")
    assert doc["ok"] is False and doc["finished"] and "mrl-no-such-reference" in (doc["cannot_run"] or ""), doc


def test_smoke_json_replaces_only_a_file_smoke_wrote(monkeypatch, tmp_path, capsys):
    """--json README.md, a typo away, is refused before any work and left as
    it was; smoke's own result (and an empty file) is replaced."""
    from maxtext_rl_overlay.smoke import run

    monkeypatch.setitem(run.NEEDED, "mrl_no_such_reference", "mrl-no-such-reference")  # no engine here: ends at once
    foreign = tmp_path / "README.md"
    foreign.write_text("# my notes\n")
    assert cli.main(["smoke", "--cpu-simulation", "--json", str(foreign)]) == ExitCode.ERROR
    assert foreign.read_text() == "# my notes\n"
    assert "is not a smoke result the tool wrote" in capsys.readouterr().err
    ours = tmp_path / "smoke.json"
    smoke_report.write_json(ours, run.SmokeReport(False, []), cpu_simulation=True)
    for path in (ours, tmp_path / "empty.json"):
        path.touch()
        assert cli.main(["smoke", "--cpu-simulation", "--json", str(path)]) == ExitCode.ERROR
        assert load_report(path, "smoke")["cannot_run"], path


def _fake_python(tmp_path: pathlib.Path, stdout: str, stderr: str = "") -> str:
    """An interpreter that answers smoke's import probe as a broken or busy one would."""
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\ncat <<'OUT'\n{stdout}\nOUT\ncat >&2 <<'ERR'\n{stderr}\nERR\n")
    fake.chmod(0o755)
    return str(fake)


def test_a_package_that_fails_to_import_is_named_not_a_missing_tpu(tmp_path):
    from maxtext_rl_overlay.smoke import run

    fake = _fake_python(tmp_path, json.dumps({"errors": {"torch": "OSError: libtorch_cpu.so: cannot open shared object file"},
                                              "backend": None}))
    with pytest.raises(run.BrokenStack, match="torch fails to import: OSError: libtorch_cpu.so"):
        run._probe(fake, ask_backend=True)


def test_a_tpu_held_by_another_process_is_said_so(tmp_path):
    from maxtext_rl_overlay.smoke import run

    fake = _fake_python(tmp_path, json.dumps({"errors": {}, "backend": "cpu"}),
                        "Unable to initialize backend 'tpu': ABORTED: The TPU is already in use by process with pid 4242.")
    with pytest.raises(run.CannotRun, match="the TPU is held by another process.*pid 4242"):
        run._probe(fake, ask_backend=True)
    assert run._probe(_fake_python(tmp_path, json.dumps({"errors": {}, "backend": "cpu"})), ask_backend=True) == "cpu"


def test_a_tpu_held_by_another_process_is_said_so_where_jax_raises_instead_of_falling_back(tmp_path):
    """On a v5e (jax 0.10.2, libtpu 0.0.42) jax.default_backend() raises where
    another process holds the chip (seen on the chip: smoke said "the
    installed stack is broken" before): the real probe, with a jax that
    raises as that one did, answers the refusal and smoke says the TPU is held."""
    from maxtext_rl_overlay import probes
    from maxtext_rl_overlay.smoke import run

    fake_jax = tmp_path / "site" / "jax"
    fake_jax.mkdir(parents=True)
    (fake_jax / "__init__.py").write_text(
        "def default_backend():\n"
        "    raise RuntimeError(\"Unable to initialize backend 'tpu': ABORTED: The TPU is already in use by process with pid 4242. \"\n"
        "                       \"Not attempting to load libtpu.so in this process.\")\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    done = subprocess.run(probes.command(sys.executable, "backend", "1", "jax"), capture_output=True, text=True, env=env, check=True)
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["backend"] is None and "already in use by process with pid 4242" in answer["backend_error"], answer
    with pytest.raises(run.CannotRun, match="the TPU is held by another process.*pid 4242"):
        run._probe(_fake_python(tmp_path, json.dumps(answer)), ask_backend=True)
    # The other form the chip gave (a holder started by another pytest): libtpu could not take its lockfile.
    locked = dict(answer, backend_error="RuntimeError: Unable to initialize backend 'tpu': ABORTED: Internal error when accessing "
                  "libtpu multi-process lockfile. Run \"$ sudo rm /tmp/libtpu_lockfile\".")
    with pytest.raises(run.CannotRun, match="the TPU is held by another process.*lockfile.*a dead one's: remove it"):
        run._probe(_fake_python(tmp_path, json.dumps(locked)), ask_backend=True)
    other = dict(answer, backend_error="RuntimeError: Unable to initialize backend 'tpu': INTERNAL: no chips")
    with pytest.raises(run.BrokenStack, match="jax imports but cannot open a backend: RuntimeError: .*no chips"):
        run._probe(_fake_python(tmp_path, json.dumps(other)), ask_backend=True)


def test_a_revision_that_is_not_a_number(project):
    _edit(project / "pyproject.toml", r"^revision = \d+$", 'revision = "two"')
    done = _cli("lint", "--project", str(project))
    assert done.returncode == ExitCode.ERROR
    (line,) = _error_lines(done)
    assert "[tool.maxtext-rl-overlay]: revision must be a whole number (0 or more), not 'two'" in line


def test_a_pyproject_that_is_not_toml(project):
    (project / "pyproject.toml").write_text((project / "pyproject.toml").read_text() + "\n[tool.broken\n")
    done = _cli("lint", "--project", str(project))
    assert done.returncode == ExitCode.ERROR
    (line,) = _error_lines(done)
    assert re.search(r"pyproject\.toml is not valid TOML: .*\(at line \d+, column \d+\)", line), line


def test_an_invalid_requirement_in_the_maxtext_extra(project, tmp_path):
    _edit(project / "pyproject.toml", r'^maxtext = \["([^"]+)"\]$', r'maxtext = ["\1 ;; x"]')
    done = _cli("build", "--only", "google-tunix", "--project", str(project), env={"MRL_CACHE_DIR": str(tmp_path / "cache")})
    assert done.returncode == ExitCode.ERROR
    (line,) = _error_lines(done)
    assert "the [project.optional-dependencies] extra 'maxtext' must hold exactly one requirement" in line
    assert "(Expected " in line, line  # packaging's reason, its first line


#: Bad values of the project's files, each found when the project is read.
#: Before: a KeyError (4) after every wheel was built (dynamic version), a
#: failure in the middle of the build (a string of dependencies, a date), a
#: wheel that fails late or not at all (the version), and lint passed them all.
BAD_PROJECT = {
    "version-dynamic": ("pyproject.toml", r'^version = "0\.1\.0"$', 'dynamic = ["version"]', "[project]: dynamic lists version"),
    "dependencies-string": ("pyproject.toml", r"^dependencies = \[.*\]$", 'dependencies = "packaging>=24"',
                            "[project]: dependencies must be a list of strings, not 'packaging>=24'"),
    "extra-unknown": ("pyproject.toml", r"^(overrides-file = .*)$", r'\1\nextra = "maxtex"',
                      "[tool.maxtext-rl-overlay.maxtext]: extra = 'maxtex' names no extra of [project.optional-dependencies]"),
    "pin-date": ("patches/google-tunix/pin.toml", r"^date = .*$", 'date = "last tuesday"', "date = 'last tuesday' is not an ISO 8601 date"),
    "pin-version": ("patches/google-tunix/pin.toml", r"^version = .*$", 'version = "0.1.8 final"', "version = '0.1.8 final' is not a PEP 440 version"),
}


@pytest.mark.parametrize("case", BAD_PROJECT)
def test_a_bad_project_value_is_refused_before_any_work(project, tmp_path, case):
    """lint and build say it in one line naming the file and the key, with
    status 3, and the build starts nothing (not even its cache)."""
    file, pattern, new, says = BAD_PROJECT[case]
    _edit(project / file, pattern, new)
    cache = tmp_path / "cache"
    for args in (["lint"], ["build", "--only", "google-tunix"]):
        done = _cli(*args, "--project", str(project), env={"MRL_CACHE_DIR": str(cache)})
        assert done.returncode == ExitCode.ERROR, (args, done.stderr)
        (line,) = _error_lines(done)
        assert str(project / file) in line and says in line, line
    assert not cache.exists(), "the build began its work"


@pytest.mark.parametrize("pattern, new, says", [
    (r"^\[tool\.maxtext-rl-overlay\.matrix\.quick\]\n(.*\n)*?(?=\[tool\.ruff\])", 'quick = "yes"\n\n',
     "[tool.maxtext-rl-overlay.matrix.quick] must be a table, not 'yes'"),
    (r'^(  \{ name = "py312", python = )"3\.12"', r"\g<1>3.10", "cell 'py312': python = 3.1 is a number (TOML reads 3.10 as 3.1)"),
], ids=["quick-string", "python-number"])
def test_a_bad_matrix_table_is_refused_by_lint_and_test_matrix(project, tmp_path, pattern, new, says):
    """Before: lint died with a ValueError (4) on the first, and passed the
    second, which the matrix then ran as Python "3.1"."""
    _edit(project / "pyproject.toml", pattern, new)
    wheels = tmp_path / "dist"
    wheels.mkdir()
    for args in (["lint"], ["test-matrix", "--quick", "--wheels", str(wheels), "--work", str(tmp_path / "work")]):
        done = _cli(*args, "--project", str(project))
        assert done.returncode == ExitCode.ERROR, (args, done.stderr)
        (line,) = _error_lines(done)
        assert str(project / "pyproject.toml") in line and says in line, line


def test_a_quick_part_of_the_suite_that_does_not_exist_is_refused_before_any_venv(project, tmp_path):
    """pytest would end that run with no test collected; the matrix says so before it makes a venv."""
    # The parts the quick matrix names, as files (the fast tests of a rebase run this in a copy without tests/fixes).
    for paths in testmatrix.load_matrix(load_project(project).options.matrix, where="pyproject.toml", quick=True).tests.values():
        for path in paths:
            (project / path.split("::")[0]).parent.mkdir(parents=True, exist_ok=True)
            (project / path.split("::")[0]).touch()
    _edit(project / "pyproject.toml", r'^  "tests/fixes/test_platform\.py",$', '  "tests/fixes/test_platfrom.py",')
    assert _cli("lint", "--project", str(project)).returncode == ExitCode.OK  # the table's types are right
    wheels, work = tmp_path / "dist", tmp_path / "work"
    wheels.mkdir()
    done = _cli("test-matrix", "--quick", "--wheels", str(wheels), "--work", str(work), "--project", str(project))
    assert done.returncode == ExitCode.ERROR, done.stderr
    (line,) = _error_lines(done)
    assert "[tool.maxtext-rl-overlay.matrix.quick.tests] maxtext-0.2.4/plain: tests/fixes/test_platfrom.py does not exist" in line, line
    assert not work.exists()


def test_a_source_for_a_distribution_only_leaves_out(project, tmp_path):
    """It would be ignored in silence: the user meant to build it, or named the wrong one."""
    done = _cli("build", "--only", "google-tunix", "--source", f"vllm={tmp_path}", "--project", str(project),
                env={"MRL_CACHE_DIR": str(tmp_path / "cache"), "UV_DEFAULT_INDEX": "http://127.0.0.1:9"})  # no index: fail fast if it went on
    assert done.returncode == ExitCode.ERROR
    (line,) = _error_lines(done)
    assert f"--source vllm={tmp_path}: --only google-tunix leaves vllm out, so the source would not be used" in line, line
    assert not (tmp_path / "cache").exists(), "refused before any work"


@pytest.fixture
def index_without_the_file(tmp_path):
    """A package index (HTTP, 127.0.0.1) whose file list names a MaxText
    wheel that it does not serve."""
    served = tmp_path / "index"
    (served / "maxtext").mkdir(parents=True)
    wheel = f"maxtext-{maxtext_version(ROOT)}-py3-none-any.whl"
    listing = {"files": [{"filename": wheel, "url": f"../gone/{wheel}",
                          "hashes": {"sha256": "0" * 64}}]}
    (served / "maxtext" / "index.html").write_text(json.dumps(listing))
    with serve(served) as url:
        yield url


def test_a_failed_download_from_the_package_index(project, tmp_path, index_without_the_file):
    done = _cli("build", "--only", "google-tunix", "--project", str(project),
                env={"MRL_CACHE_DIR": str(tmp_path / "cache"), "UV_DEFAULT_INDEX": index_without_the_file})
    assert done.returncode == ExitCode.ERROR
    (line,) = _error_lines(done)
    assert f"cannot download maxtext-{maxtext_version(ROOT)}-py3-none-any.whl from the package index" in line and "HTTP Error 404" in line


@pytest.mark.parametrize("text, says", [("this is not JSON\n", "is not JSON"), ("[1, 2]\n", "is not a JSON object")], ids=["text", "list"])
def test_a_manifest_that_is_not_json(tmp_path, text, says):
    copy = tmp_path / "site"
    shutil.copytree(PACKAGE, copy / PACKAGE.name, ignore=shutil.ignore_patterns("__pycache__", "manifest.json"))
    (copy / PACKAGE.name / "manifest.json").write_text(text)
    done = _cli("verify", "--no-imports", pythonpath=copy, cwd=tmp_path)
    assert done.returncode == ExitCode.ERROR
    (line,) = _error_lines(done)
    assert f"the installed manifest {says}" in line and "reinstall maxtext-rl-overlay" in line


# -- 4: an unexpected error ----------------------------------------------------

def test_an_unexpected_error_is_a_bug_to_report_with_its_traceback_under_v(monkeypatch, capsys):
    def broken(args):
        raise RuntimeError("an invariant broke\nsecond line")

    monkeypatch.setattr(lint, "command", broken)
    assert cli.main(["lint", "--project", str(ROOT)]) == ExitCode.INTERNAL
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.splitlines() == [
        "maxtext-rl-overlay: unexpected error: RuntimeError: an invariant broke",
        "maxtext-rl-overlay: this is a bug in maxtext-rl-overlay; please report it, with the output of the same command run with -v "
        "(which shows the traceback).",
    ]
    assert cli.main(["lint", "-v", "--project", str(ROOT)]) == ExitCode.INTERNAL
    err = capsys.readouterr().err
    assert err.startswith("Traceback (most recent call last):") and "RuntimeError: an invariant broke" in err
