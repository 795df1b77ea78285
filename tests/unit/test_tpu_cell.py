"""The TPU cell (docs/tpu-cell.md) without a chip: the host's index read,
the host side (the bundle's cell.py) installing offline with Python 3.11
next to a stand-in JAX and writing its report, the report accumulating
across calls, verify's host deviations, smoke's line for a host that
refuses inet sockets, and the stand-ins active only where named. The chip's
part is the `tpu` marker's."""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import importlib.util
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import time
import types
import zipfile
from typing import cast

import pytest

from maxtext_rl_overlay import probes
from maxtext_rl_overlay.checks import verify
from maxtext_rl_overlay.checks.reports import CellStep
from maxtext_rl_overlay.config import reader
from maxtext_rl_overlay.core.errors import OverlayError
from maxtext_rl_overlay.smoke import engine
from maxtext_rl_overlay.smoke import run as smoke_run
from maxtext_rl_overlay.tpucell import bundle, host, hostindex, parts
from support import ROOT
from unit.unit_support import installable_wheel

HOST_PY = ROOT / "overlay" / "maxtext_rl_overlay" / "tpucell" / "host.py"
PARTS_PY = ROOT / "overlay" / "maxtext_rl_overlay" / "tpucell" / "parts.py"
STAND_INS = ROOT / bundle.STAND_INS


def python311() -> str | None:
    """A Python 3.11 as scripts/lib.sh finds a 3.12: MRL_PYTHON311, python3.11 on PATH, pyenv's."""
    root = os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")
    for c in [os.environ.get("MRL_PYTHON311", ""), shutil.which("python3.11") or "",
              *sorted(glob.glob(f"{root}/versions/3.11*/bin/python3"), reverse=True)]:
        if c and os.access(c, os.X_OK) and subprocess.run([c, "-c", "import sys; sys.exit(sys.version_info[:2] != (3, 11))"]).returncode == 0:
            return c
    return None


PY311 = python311()
needs_311 = pytest.mark.skipif(PY311 is None, reason="no Python 3.11 here (MRL_PYTHON311, python3.11 or pyenv's): would have checked that "
                               "the bundle's cell.py installs offline next to a stand-in JAX with the host's Python and writes its report")


def simple_index(root: pathlib.Path, wheels: list[pathlib.Path]) -> pathlib.Path:
    """A PEP 503 index over `wheels`, as the host's is laid out (simple/, files/)."""
    (root / "files").mkdir(parents=True)
    for wheel in wheels:
        shutil.copy2(wheel, root / "files" / wheel.name)
        page = root / "simple" / wheel.name.split("-")[0].replace("_", "-") / "index.html"
        page.parent.mkdir(parents=True, exist_ok=True)
        with page.open("a") as out:
            out.write(f'<a href="../../files/{wheel.name}">{wheel.name}</a>\n')
    (root / "simple" / "index.html").write_text("<html></html>\n")
    return root / "simple"


def test_the_hosts_index_is_read_for_the_hosts_python_and_platform(tmp_path):
    made = tmp_path / "made"
    made.mkdir()
    wheels = [installable_wheel(made, "jax", "0.10.2"), installable_wheel(made, "pybase64", "1.4.0")]
    native = made / "libtpu-0.0.42.1-cp311-cp311-manylinux_2_31_x86_64.whl"
    shutil.copy2(wheels[0], native)
    other = made / "libtpu-0.0.44-cp312-cp312-manylinux_2_31_x86_64.whl"
    shutil.copy2(wheels[0], other)
    index = hostindex.read([str(simple_index(tmp_path / "pypi", [*wheels, native, other]))])
    tags = hostindex.host_tags("3.11", "x86_64-manylinux_2_31")
    assert [str(v) for v in index.versions("libtpu", tags)] == ["0.0.42.1"], "a cp312 wheel is not the host's"
    assert index.provides("pybase64", "1.4.0", tags) and not index.provides("pybase64", "1.4.1", tags)
    assert bundle._one_version(index, "jax", tags) == "0.10.2"
    with pytest.raises(Exception, match="no such folder"):
        hostindex.read([str(tmp_path / "absent")])
    with pytest.raises(Exception, match="expected a version"):
        hostindex.host_tags("three", "x86_64-manylinux_2_31")


def make_bundle(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path, pathlib.Path]:
    """A small bundle by hand, laid out as `tpu-cell bundle` lays it out; a
    host index (a folder) holding part of its closure; a stand-in JAX."""
    made = tmp_path / "made"
    made.mkdir()
    on_host = [installable_wheel(made, "regex", "2024.1.1")]
    index = simple_index(tmp_path / "pypi", on_host)
    b = tmp_path / "build" / "tpu-cell" / "bundle"
    (b / "wheels").mkdir(parents=True)
    carried = [installable_wheel(b / "wheels", "pybase64", "1.4.0"), installable_wheel(b / "wheels", "torchvision", "0.28.0")]
    (b / "wheels" / "SHA256SUMS").write_text("".join(f"{hashlib.sha256(w.read_bytes()).hexdigest()}  {w.name}\n" for w in carried))
    (b / "requirements.txt").write_text("jax==0.10.2\npybase64==1.4.0\nregex==2024.1.1\ntorchvision==0.28.0\n")
    (b / "release-closure.txt").write_text("jax==0.11.0\npybase64==1.4.0\nregex==2024.1.1\ntorchvision==0.26.0\nnvidia-nccl==2\n")
    shutil.copy2(HOST_PY, b / "cell.py")
    shutil.copy2(probes.HERE / "host_facts.py", b / host.FACTS)
    shutil.copytree(STAND_INS, b / "stand-ins")
    (b / "run.sh").write_text(bundle.RUN_SH)
    (b / bundle.MARKER).write_text(json.dumps({
        "release": "maxtext-rl-overlay==0.1.0", "host_python": "3.11", "host_jax": "0.10.2", "host_index": [str(index)],
        "release_python": "3.12", "carried": {w.name: "the host's index lacks it" for w in carried}, "upstream_tests": []}))
    jax_dir = tmp_path / "hostjax"
    subprocess.run([sys.executable, "-m", "zipfile", "-e", str(installable_wheel(made, "jax", "0.10.2")), str(jax_dir)], check=True)
    return b, jax_dir, tmp_path / "report"


def run_cell(b: pathlib.Path, report: pathlib.Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    """The bundle's run.sh, as the host runs it."""
    return subprocess.run(["bash", str(b / "run.sh"), "--report", str(report), *args], env=env, capture_output=True, text=True, timeout=300)


def host_env(jax_dir: pathlib.Path) -> dict[str, str]:
    """The stand-in host: Python 3.11, the stand-in JAX on PYTHONPATH, no package index but the bundle's."""
    assert PY311 is not None
    return dict(os.environ, PYTHONPATH=str(jax_dir), PYTHON=PY311, PIP_NO_INDEX="", PIP_CONFIG_FILE=os.devnull)


@needs_311
def test_the_bundle_installs_offline_next_to_the_hosts_jax_and_the_report_accumulates(tmp_path):
    b, jax_dir, report = make_bundle(tmp_path)
    env = host_env(jax_dir)

    def cell(*args: str) -> subprocess.CompletedProcess:
        return run_cell(b, report, env, *args)

    done = cell("--steps", "install", "--host-stand-ins", "torchvision-no-ops")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((report / "cell.json").read_text())
    site = tmp_path / "build" / "tpu-cell" / "site"
    assert (site / "pybase64").is_dir() and (site / "regex").is_dir(), "one from the bundle, one from the host's index"
    assert not (site / "jax").exists(), "the host's own JAX is kept, not installed again"
    # The site's bytecode is compiled at its final path (pip installed into a staging folder, compiling nothing).
    assert list((site / "regex" / "__pycache__").glob("*.cpython-311.pyc")), "the installed modules' bytecode"
    assert "; bytecode compiled in " in doc["steps"]["install"]["summary"], doc["steps"]["install"]["summary"]
    assert not any(str(site.with_name(site.name + ".partial")) in p.read_bytes().decode("latin-1") for p in site.rglob("*.pyc"))
    assert doc["host"]["python"].startswith("3.11.") and doc["host"]["jax"] == "0.10.2"
    assert doc["host"]["writes_bytecode"] is (not env.get("PYTHONDONTWRITEBYTECODE")), (doc["host"], env.get("PYTHONDONTWRITEBYTECODE"))
    assert doc["steps"]["install"]["rc"] == 0 and doc["steps"]["install"]["stand_ins"] == ["torchvision-no-ops"]
    deviations = doc["deviations"]
    assert deviations[0].startswith("Python 3.11") and "jax 0.10.2 (the release's: 0.11.0)" in deviations
    assert "torchvision 0.28.0 (the release's: 0.26.0)" in deviations and "not installed (1): nvidia-nccl" in deviations, deviations
    md = (report / "cell.md").read_text()
    assert "| install |" in md and "torchvision-no-ops" in md and "jax 0.10.2 (the release's: 0.11.0)" in md
    # A second call (a later chip call): install is skipped, and its run is kept beside the first call's, not over it.
    again = cell("--steps", "install", "--host-stand-ins", "torchvision-no-ops")
    steps = json.loads((report / "cell.json").read_text())["steps"]
    assert again.returncode == 0 and "already installed" in steps[f"install{host.RERUN}2"]["summary"], steps
    assert steps["install"] == doc["steps"]["install"], steps
    assert "| install.2 |" in (report / "cell.md").read_text(), "the rerun's row, in the step's place"
    assert not [p for p in report.rglob("*") if "#" in p.name] and not [k for k in steps if "#" in k], "no name with a #"
    # --budget (a chip call's hard limit): a step that could not finish inside it is not started, and says so.
    cut = cell("--steps", "verify", "--budget", "30", "--host-stand-ins", "torchvision-no-ops")
    verify = json.loads((report / "cell.json").read_text())["steps"]["verify"]
    assert cut.returncode == 0 and verify["rc"] is None, cut.stdout + cut.stderr
    assert verify["summary"].startswith("not run: ") and f"of --budget left (a step needs {host.MIN_STEP_SECONDS})" in verify["summary"]
    # A bundle made for another JAX is refused, saying how to make the right one.
    env["PYTHONPATH"] = ""
    refused = cell("--steps", "install")
    assert refused.returncode != 0 and "make it again with --host-jax not installed" in refused.stderr


@needs_311
def test_a_pytest_step_stops_before_its_bound_and_keeps_the_record_of_the_tests_it_ran(tmp_path):
    """A pytest step that would outrun its bound is stopped by the cell's
    plugin before the next test, not killed: its JUnit record and counts stay
    (a killed pytest writes none)."""
    assert PY311 is not None
    if subprocess.run([PY311, "-c", "import pytest"], capture_output=True).returncode != 0:
        pytest.skip(f"{PY311} has no pytest (the host's python3 has): would have checked that a step past its bound keeps its tests' record")
    b, jax_dir, report = make_bundle(tmp_path)
    (b / "upstream" / "tests").mkdir(parents=True)
    (b / "upstream" / "tests" / "test_slow.py").write_text(
        "import time, pytest\n\n@pytest.mark.parametrize('i', range(200))\ndef test_slow(i):\n    time.sleep(0.2)\n")
    facts = json.loads((b / bundle.MARKER).read_text())
    (b / bundle.MARKER).write_text(json.dumps(facts | {"upstream_tests": ["tests/test_slow.py"]}))
    env = host_env(jax_dir)
    installed = run_cell(b, report, env, "--steps", "install")
    assert installed.returncode == 0, installed.stdout + installed.stderr
    done = run_cell(b, report, env, "--steps", "upstream", "--timeout", str(host.STOP_MARGIN_SECONDS + 10))
    assert done.returncode in (0, 2), done.stdout + done.stderr
    step = json.loads((report / "cell.json").read_text())["steps"]["upstream"]
    assert not step["timed_out"] and step["rc"] == 2, (done.stdout, step)  # pytest's "interrupted", not the cell's kill
    assert 1 <= step["tests"]["passed"] < 200 and step["tests"]["failures"] == 0, step
    assert step["summary"].startswith(f"stopped before its bound: {step['tests']['passed']} passed"), step
    # The plugin said, in the step's log, how long collecting took and what was left of the bound.
    collected = [line for line in (report / "steps" / "upstream.log").read_text().splitlines() if line.startswith(host.COLLECTED)]
    assert len(collected) == 1 and collected[0].startswith(f"{host.COLLECTED} 200 test(s) in ") and "of the step's bound left" in collected[0]


def test_a_steps_run_records_come_to_one_flat_folder(tmp_path):
    """A train-rl step's runs write their records into runs/LABEL/; after the
    step they lie in runs/ itself, each named for the step's run, beside the
    earlier runs' (no folder below runs/ to copy, no name written over)."""
    runs = tmp_path / host.RUNS
    (runs / "train-rl-user").mkdir(parents=True)
    (runs / "train-rl-user" / "test_user0.json").write_text("first")
    host.flatten_runs(runs / "train-rl-user")
    (runs / "train-rl-user.2").mkdir()
    for name in ("test_user0.json", "test_user0.log"):
        (runs / "train-rl-user.2" / name).write_text("second")
    host.flatten_runs(runs / "train-rl-user.2")
    host.flatten_runs(runs / "train-rl")  # a step whose runs wrote nothing
    assert sorted(p.name for p in runs.iterdir()) == ["train-rl-user.2.test_user0.json", "train-rl-user.2.test_user0.log",
                                                      "train-rl-user.test_user0.json"]
    assert (runs / "train-rl-user.test_user0.json").read_text() == "first"


def test_a_label_names_its_step_whichever_cell_wrote_it():
    assert [host.step_of(label) for label in ("train-rl-user", "train-rl-user.3", "bench-sync#2")] == ["train-rl-user", "train-rl-user",
                                                                                                      "bench-sync"]


def test_a_killed_step_says_whether_pytest_had_collected_its_tests():
    """A step killed at its bound is "TIMED OUT", with the plugin's collection line where its log has one."""
    said = f"{host.COLLECTED} 1 test(s) in 95.2 s; 16 s of the step's bound left"
    assert host._timed_out(cast(CellStep, {"timed_out": True, "tail": ["warnings", said]})) == f"TIMED OUT ({said.removeprefix('tpu-cell: ')})"
    assert host._timed_out(cast(CellStep, {"timed_out": True, "tail": []})) == "TIMED OUT"


def requiring_python(wheel: pathlib.Path, spec: str) -> pathlib.Path:
    """`wheel` rewritten in place to say Requires-Python `spec` (as MaxText 0.2.4 says >=3.12)."""
    with zipfile.ZipFile(wheel) as zin:
        files = {i.filename: zin.read(i) for i in zin.infolist()}
    with zipfile.ZipFile(wheel, "w") as zout:
        for name, data in files.items():
            zout.writestr(name, data + f"Requires-Python: {spec}\n".encode() if name.endswith("/METADATA") else data)
    return wheel


@needs_311
def test_a_bundle_in_parts_is_put_together_on_the_host_only_when_every_part_is_there_and_sound(tmp_path):
    """The MaxText form's bundle is larger than one call carries: made in
    parts (each at most the size asked for, with their SHA256SUMS), staged
    on the host one call at a time, refused while a part is missing or
    damaged (naming it), then put together and installed; the report says
    it came in parts, and names each left-out distribution with its reason
    and the distribution installed below its Requires-Python."""
    assert PY311 is not None
    b, jax_dir, report = make_bundle(tmp_path)
    relaxed = requiring_python(installable_wheel(b / "wheels", "maxtext", "0.2.4", package={"maxtext/__init__.py": b"x = 1\n" * 2000}),
                               ">=3.12")
    wheels = sorted((b / "wheels").glob("*.whl"))
    (b / "wheels" / "SHA256SUMS").write_text("".join(f"{hashlib.sha256(w.read_bytes()).hexdigest()}  {w.name}\n" for w in wheels))
    for listed in ("requirements.txt", "release-closure.txt"):  # the MaxText form's release closure holds it too
        (b / listed).write_text((b / listed).read_text() + "maxtext==0.2.4\n")
    facts = json.loads((b / bundle.MARKER).read_text())
    left_out = {"tensorflow": "imported only under try/except ImportError", "seqio": "never imported by train_rl or smoke"}
    (b / bundle.MARKER).write_text(json.dumps(facts | {"form": "maxtext", "left_out": left_out, "requires_python_relaxed": {"maxtext": ">=3.12"},
                                                       "carried": facts["carried"] | {relaxed.name: "the host's index lacks it"}}))
    largest = max(p.stat().st_size for p in b.rglob("*") if p.is_file())
    size = largest + 4 * parts.TAR_BLOCK + parts.TAR_END + 4096  # room for the largest file and a little more
    made_parts = parts.split(b, b / bundle.PARTS, size, skip=(bundle.PARTS,))
    assert len(made_parts) >= 2 and all(p.stat().st_size <= size for p in made_parts), made_parts
    assert [p.name for p in made_parts] == [parts.part_name(n, len(made_parts)) for n in range(1, len(made_parts) + 1)]
    with pytest.raises(parts.PartsError, match="fits no part"):
        parts.split(b, tmp_path / "tiny", 4096, skip=(bundle.PARTS,))

    # The host: a fresh checkout's copy holding only what each call carried (one part and the sums), a stage under its /tmp.
    host_root, stage = tmp_path / "host", tmp_path / "host-tmp" / "mrl-parts"
    carried = host_root / "build" / "tpu-cell" / "bundle" / bundle.PARTS
    env = host_env(jax_dir)

    def call(*which: pathlib.Path, into: bool = True) -> subprocess.CompletedProcess:
        shutil.rmtree(host_root, ignore_errors=True)
        carried.mkdir(parents=True)
        for part in which:
            shutil.copy2(part, carried / part.name)
        shutil.copy2(b / bundle.PARTS / parts.SUMS, carried / parts.SUMS)
        more = ["--into", str(carried.parent)] if into else []
        return subprocess.run([PY311, str(PARTS_PY), str(carried), "--stage", str(stage), *more], env=env, capture_output=True, text=True)

    first = call(made_parts[0], into=False)
    assert first.returncode == 0 and f"1 of {len(made_parts)} staged" in first.stdout, first
    assert f"missing {', '.join(p.name for p in made_parts[1:])}" in first.stderr, first.stderr
    refused = call(made_parts[0])
    assert refused.returncode == 1 and "NOT put together" in refused.stderr and made_parts[-1].name in refused.stderr, refused
    assert not (carried.parent / "run.sh").exists(), "nothing is put together while a part is missing"
    damaged = tmp_path / "damaged" / made_parts[-1].name
    damaged.parent.mkdir()
    damaged.write_bytes(made_parts[-1].read_bytes()[:-1] + b"\1")
    bad = call(damaged)
    assert bad.returncode == 1 and f"{damaged.name}: sha256" in bad.stderr and "damaged" in bad.stderr, bad
    assert not (carried.parent / "run.sh").exists()
    for part in made_parts[1:-1]:
        assert call(part, into=False).returncode == 0
    last = call(made_parts[-1])
    assert last.returncode == 0 and "put together" in last.stdout, last
    put = carried.parent
    assert sorted(str(p.relative_to(put)) for p in put.rglob("*") if p.is_file() and p.relative_to(put).parts[0] not in (bundle.PARTS,)) == sorted(
        [*(str(p.relative_to(b)) for p in b.rglob("*") if p.is_file() and p.relative_to(b).parts[0] != bundle.PARTS), parts.RECEIVED])

    # The call that carried the last part installs, with the host's Python: maxtext below its Requires-Python, said.
    done = run_cell(put, host_root / "report", env, "--steps", "install", "--host-stand-ins", "maxtext-py311-aliases")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((host_root / "report" / "cell.json").read_text())
    assert (host_root / "build" / "tpu-cell" / "site" / "maxtext").is_dir()
    assert "Requires-Python not checked (pip --ignore-requires-python) for maxtext (it says >=3.12)" in doc["steps"]["install"]["summary"]
    assert doc["bundle"]["form"] == "maxtext" and doc["bundle"]["left_out"] == left_out
    assert doc["bundle"]["summary"].startswith(f"came in {len(made_parts)} parts ({made_parts[0].name}"), doc["bundle"]
    assert "left out: tensorflow (imported only under try/except ImportError)" in doc["deviations"]
    assert any(line.startswith("maxtext 0.2.4 says Requires-Python >=3.12: installed on Python 3.11") for line in doc["deviations"])
    md = (host_root / "report" / "cell.md").read_text()
    assert "- left out: seqio: never imported by train_rl or smoke" in md and f"came in {len(made_parts)} parts" in md


def test_left_outs_are_taken_with_their_reasons(tmp_path):
    """--leave-out NAME,...:REASON (repeated) and --leave-out-file: each left-out distribution keeps its reason."""
    listed = tmp_path / "leave-out.txt"
    listed.write_text("# why each\ntensorflow: imported only under try/except ImportError\nSeqIO,tensorflow_text: never imported\n")
    args = __import__("maxtext_rl_overlay.__main__", fromlist=["_parser"])._parser().parse_args(
        ["tpu-cell", "bundle", "--release", str(tmp_path), "--out", str(tmp_path / "b"), "--host-index", str(tmp_path), "--form", "maxtext",
         "--leave-out", "nixl,hf-transfer:not imported", "--leave-out", "plain", "--leave-out-file", str(listed), "--part-size", "40"])
    opts = bundle.BundleOptions.from_args(args)
    assert opts.form == "maxtext" and opts.part_size == 40 << 20
    assert opts.leave_out == {"nixl": "not imported", "hf-transfer": "not imported", "plain": "no reason given (--leave-out without one)",
                              "tensorflow": "imported only under try/except ImportError", "seqio": "never imported",
                              "tensorflow-text": "never imported"}
    with pytest.raises(OverlayError, match="--form other"):
        bundle.make(dataclasses.replace(opts, form="other"))


def test_the_maxtext_aliases_stand_in_rewrites_only_its_two_modules_and_only_where_named(tmp_path):
    """MaxText 0.2.4 on the host's Python 3.11: its two PEP 695 aliases are a
    SyntaxError there; maxtext-py311-aliases reads them as assignments in
    those two modules only, writes no bytecode, and is active only where named."""
    mhc = tmp_path / "site" / "maxtext" / "kernels" / "mhc"
    mhc.mkdir(parents=True)
    for folder in (mhc.parent.parent, mhc.parent, mhc):
        (folder / "__init__.py").write_text("")
    (mhc / "common.py").write_text("import typing\n# an alias\ntype KernelContext = tuple[int, int, int]\nBEFORE = 1\n")
    (mhc / "api.py").write_text("from typing import Literal\nfrom maxtext.kernels.mhc import common\n"
                                "type Implementation = Literal['mosaic', 'xla']\nCONTEXT = common.KernelContext\n")
    (mhc / "other.py").write_text("type Other = int\n")
    source = (mhc / "common.py").read_text()
    spec = importlib.util.spec_from_file_location("mrl_stand_ins", STAND_INS / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    stand_ins = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stand_ins)  # none asked in this process: it only defines them
    assert stand_ins.rewrite_aliases(source) == source.replace("type KernelContext =", "KernelContext =")
    if PY311 is None:
        pytest.skip("no Python 3.11 here: would have imported the two modules with and without the stand-in")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "site"), str(STAND_INS)]))
    program = ("import importlib, sys\nfor m in sys.argv[1:]:\n    try:\n        v = importlib.import_module(m)\n"
               "        print(m, 'ok', getattr(v, 'CONTEXT', getattr(v, 'KernelContext', None)))\n"
               "    except SyntaxError as e:\n        print(m, 'SyntaxError', e.lineno)\n")
    modules = ["maxtext.kernels.mhc.api", "maxtext.kernels.mhc.other"]

    def run(asked: str) -> list[str]:
        done = subprocess.run([PY311, "-c", program, *modules], env=env | {"MRL_HOST_STAND_INS": asked}, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    assert run("")[0].startswith("maxtext.kernels.mhc.api SyntaxError"), "without it, Python 3.11 cannot read MaxText's aliases"
    assert run("no-inet-sockets")[0].startswith("maxtext.kernels.mhc.api SyntaxError"), "another stand-in named: still not rewritten"
    named = run("maxtext-py311-aliases")
    assert named == ["maxtext.kernels.mhc.api ok tuple[int, int, int]", "maxtext.kernels.mhc.other SyntaxError 1"], named
    assert not list(mhc.glob("__pycache__/common*.pyc")) and not list(mhc.glob("__pycache__/api*.pyc")), "no bytecode of a rewritten module"
    # What the tool reads (config/reader.py host_stand_ins): the module's ACTIVE, in the process that asks.
    said = subprocess.run([PY311, "-c", "import sys; print(sys.modules['sitecustomize'].ACTIVE)"],
                          env=env | {"MRL_HOST_STAND_INS": "maxtext-py311-aliases"}, capture_output=True, text=True)
    assert said.stdout.startswith("{'maxtext-py311-aliases': \"MaxText's two PEP 695 aliases"), said


def test_an_unknown_step_or_stand_in_is_a_usage_error(tmp_path):
    shutil.copytree(STAND_INS, tmp_path / host.STAND_INS_FILE.parent)  # the bundle's stand-ins, whose NAMES the cell accepts
    with pytest.raises(SystemExit):
        host.main(["--bundle", str(tmp_path), "--report", str(tmp_path / "r"), "--steps", "verify,chip"])
    with pytest.raises(SystemExit):
        host.main(["--bundle", str(tmp_path), "--report", str(tmp_path / "r"), "--host-stand-ins", "no-sockets"])


def test_verify_names_every_deviation_and_accepts_only_torchs_version(tmp_path, monkeypatch):
    closure = tmp_path / "release-closure.txt"
    closure.write_text("# The release's closure (maxtext-rl-overlay==0.1.0, Python 3.9 on x86_64-manylinux_2_31).\n"
                       "packaging==0.0.1\nnot-a-real-distribution==1.0\n")
    lines = verify.host_deviations(closure)
    assert lines[0] == f"Python {'.'.join(map(str, sys.version_info[:3]))} (the release's: 3.9)"
    assert any(line.startswith("packaging ") and line.endswith("(the release's: 0.0.1)") for line in lines)
    assert lines[-1] == "not installed (1): not-a-real-distribution"
    torch = verify.Finding("torch", verify.Check.VERSION, "2.11.0", "2.13.0+cpu", False)
    ours = verify.Finding("vllm", verify.Check.VERSION, "0.25.0+mrl.3", "0.25.0", False)
    accepted = verify.accept_deviations([torch, ours], ["torch 2.13.0+cpu (the release's: 2.11.0)"])
    assert accepted[0].ok and accepted[0].problem is verify.Problem.DEVIATION and verify.DEVIATION in accepted[0].shown
    assert not accepted[1].ok
    assert not verify.accept_deviations([torch], [])[0].ok, "without the option, today's verdict"


def test_smoke_on_a_host_that_refuses_inet_sockets_says_so_and_names_the_stand_in(monkeypatch):
    def refused(*args, **kwargs):
        raise OSError(97, "Address family not supported by protocol")

    monkeypatch.setattr(socket, "socket", refused)
    # The stand-ins' module as Python imports it at start-up (sitecustomize), with what it made active.
    stand_ins = types.ModuleType(reader.STAND_INS_MODULE)
    monkeypatch.setitem(sys.modules, reader.STAND_INS_MODULE, stand_ins)
    for active in ({}, {"torchvision-no-ops": "torchvision imports without its C++ ops"}):
        stand_ins.ACTIVE = active  # type: ignore[attr-defined]
        with pytest.raises(smoke_run.CannotRun, match="this host refuses inet sockets.*'no-inet-sockets'") as caught:
            smoke_run._check_inet_sockets()
        assert caught.value.status == 3
    monkeypatch.setitem(sys.modules, reader.STAND_INS_MODULE, types.ModuleType("a host's own sitecustomize"))
    with pytest.raises(smoke_run.CannotRun):
        smoke_run._check_inet_sockets()
    what = "vLLM's get_open_port answers 29511 unbound; a world-size-1 gloo group is torch's fake backend"
    stand_ins.ACTIVE = {"no-inet-sockets": what}  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, reader.STAND_INS_MODULE, stand_ins)
    smoke_run._check_inet_sockets()
    assert reader.host_stand_ins() == {"no-inet-sockets": what}
    assert engine.host_stand_in_labels() == [f"host stand-in: no-inet-sockets: {what}"], "one line a stand-in, whatever its words hold"


def test_the_stand_ins_are_active_only_where_named(tmp_path):
    """MRL_HOST_STAND_INS is the one variable: a process started with it and
    the stand-ins' folder on PYTHONPATH (a step's, or smoke's engine, which
    inherits both) activates those it names, and the tool reads them there."""
    program = "from maxtext_rl_overlay.config.reader import host_stand_ins; print(sorted(host_stand_ins()))"
    env = dict(os.environ, PYTHONPATH=str(STAND_INS))
    for asked in ("", "no-inet-sockets", "torchvision-no-ops", "no-inet-sockets,torchvision-no-ops"):
        done = subprocess.run([sys.executable, "-c", program], env=env | {"MRL_HOST_STAND_INS": asked}, capture_output=True, text=True)
        assert done.returncode == 0 and done.stdout.strip() == str(sorted(a for a in asked.split(",") if a)), done
    wrong = subprocess.run([sys.executable, "-c", "pass"], env=env | {"MRL_HOST_STAND_INS": "sockets"}, capture_output=True, text=True)
    assert wrong.returncode != 0 and "unknown stand-in(s) sockets" in wrong.stderr


def test_a_killed_steps_libtpu_lockfile_is_removed_only_where_no_process_holds_a_chip(tmp_path, monkeypatch):
    """libtpu's lockfile outlives a step killed past its bound, and the next
    step's process then cannot open the chip (seen on a v5e): the cell removes
    it, but never while a process holds a TPU device file."""
    lockfile = tmp_path / "libtpu_lockfile"
    assert not host.clear_stale_libtpu_lock(lockfile), "no lockfile: nothing to remove"
    lockfile.write_text("")
    monkeypatch.setattr(host, "chip_holders", lambda: [4242])
    assert not host.clear_stale_libtpu_lock(lockfile) and lockfile.exists()
    monkeypatch.setattr(host, "chip_holders", lambda: [])
    assert host.clear_stale_libtpu_lock(lockfile) and not lockfile.exists()
    monkeypatch.undo()
    assert os.getpid() not in host.chip_holders(), "this process holds no TPU device file"


def test_a_step_killed_past_its_bound_takes_its_descendants_in_other_sessions_with_it(tmp_path):
    """smoke's engines run in sessions of their own; one left alive after its
    step was killed kept the chip (seen on a v5e). The kill reaches every
    process below the step, whatever its session."""
    pid_file = tmp_path / "grandchild.pid"
    grandchild = f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(600)"
    child = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                              f"subprocess.Popen([sys.executable, '-c', {grandchild!r}], start_new_session=True); time.sleep(600)"],
                             start_new_session=True)
    try:
        for _ in range(200):
            if pid_file.is_file() and pid_file.read_text():
                break
            time.sleep(0.05)
        orphan = int(pid_file.read_text())
        assert orphan in host.descendants(child.pid) and os.getsid(orphan) != os.getsid(child.pid)
        host.kill_descendants(child.pid)
        for _ in range(200):
            try:
                os.kill(orphan, 0)
            except ProcessLookupError:
                break
            if pathlib.Path(f"/proc/{orphan}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                break  # killed, waiting for its parent (gone or stopped) to reap it
            time.sleep(0.05)
        else:
            pytest.fail(f"process {orphan}, below the killed step, still runs")
    finally:
        os.killpg(child.pid, 9)
        child.wait()


@pytest.mark.tpu
def test_the_cell_on_a_chip():
    """On a TPU cell host only (run.sh's steps there: verify, smoke,
    tests/fixes on one chip with the real kernels, upstream's sampler and
    RPA kernel tests, the benchmarks)."""
    import importlib.util

    if importlib.util.find_spec("jax") is None:
        pytest.skip("needs a TPU cell host: would have run the bundle's steps (verify --host-deviations, smoke, tests/fixes on one chip "
                    "with the real kernels, upstream's sampler and ragged-paged-attention tests, the benchmarks) and checked the report")
    import jax

    if jax.default_backend() != "tpu":
        pytest.skip("needs a TPU: would have run the TPU cell's steps on the chip and checked cell.json")


def test_the_host_runs_its_probe_as_the_tool_runs_probes():
    """tpucell/host.py stands alone on the host and says probes.RUN again: the two must not drift."""
    assert host.RUN_PROBE == probes.RUN


def test_a_stand_in_hook_beside_a_finder_that_asks_every_other_finder_runs_once_and_does_not_recurse(tmp_path):
    """The train_rl run's import snapshots (support/fixes/replaced.py) ask
    every other finder for a module, as the stand-ins' hook finder does: on
    the chip the two asked each other until Python's recursion limit, and
    train_rl stopped in its imports. Whichever comes first in sys.meta_path,
    the module imports, the hook runs, and the snapshot is taken."""
    (tmp_path / "tunix").mkdir()
    (tmp_path / "tunix" / "__init__.py").write_text("VALUE = 1\n")
    program = f"""
import importlib.util, sys
sys.path[:0] = [{str(tmp_path)!r}, {str(ROOT / 'tests')!r}]
spec = importlib.util.spec_from_file_location("mrl_stand_ins", {str(STAND_INS / 'sitecustomize.py')!r})
stand_ins = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stand_ins)
from support.fixes.replaced import ImportSnapshots
hooked, snapshots = [], ImportSnapshots()
stand_ins._hooks.hooks["tunix"] = lambda module: hooked.append(module.VALUE)
order = [snapshots, stand_ins._hooks] if sys.argv[1] == "snapshots-first" else [stand_ins._hooks, snapshots]
sys.meta_path[:0] = order
import tunix
print(hooked, sorted(snapshots.snapshots))
"""
    for order in ("snapshots-first", "hook-first"):
        done = subprocess.run([sys.executable, "-c", program, order], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, (order, done.stderr[-2000:])
        assert done.stdout.split("\n")[0] == "[1] ['tunix']", (order, done.stdout)


def test_the_cells_pytest_plugin_counts_a_setup_only_for_a_test_that_makes_its_fixtures_anew(monkeypatch):
    """On the chip the cell stopped after a train_rl run's first test (161 s,
    its module fixture's run included) where the next tests, on the same run,
    take a second: the plugin estimates the next test by the longest call,
    and adds the longest setup only where the next test's module or
    parameters differ (its fixtures are made anew)."""
    import types

    monkeypatch.setattr(host, "_longest", {"setup": 0.0, "call": 0.0})
    for when, seconds in (("setup", 150.0), ("call", 11.0), ("teardown", 99.0)):
        host.pytest_runtest_logreport(types.SimpleNamespace(when=when, duration=seconds))
    assert host._longest == {"setup": 150.0, "call": 11.0}
    module, other = object(), object()

    def test(params: dict, in_module: object = module) -> types.SimpleNamespace:
        return types.SimpleNamespace(module=in_module, callspec=types.SimpleNamespace(params=params),
                                     session=types.SimpleNamespace(shouldstop=False))

    monkeypatch.setenv(host.STOP_AT_VARIABLE, str(time.time() + 100))
    first = test({"overlay_run": "maxtext_on_vllm"})
    host.pytest_runtest_teardown(first, test({"overlay_run": "maxtext_on_vllm"}))
    assert first.session.shouldstop is False, "the same run: a call's time fits"
    for anew in (test({"overlay_run": "vllm_native"}), test({"overlay_run": "maxtext_on_vllm"}, other)):
        host.pytest_runtest_teardown(first, anew)
        assert isinstance(first.session.shouldstop, str) and first.session.shouldstop.startswith(host.STOPPED), first.session.shouldstop
        assert "the next test could take 161 s" in first.session.shouldstop
        first.session.shouldstop = False
    host.pytest_runtest_teardown(first, None)
    assert first.session.shouldstop is False, "no next test: nothing to stop"


def test_the_cell_knows_the_stand_ins_from_the_ones_the_bundle_carries(tmp_path):
    """The names --host-stand-ins accepts are the carried sitecustomize.py's
    NAMES, read without running it: one list, the stand-ins' own."""
    (tmp_path / "stand-ins").mkdir()
    shutil.copy2(STAND_INS / "sitecustomize.py", tmp_path / host.STAND_INS_FILE)
    spec = importlib.util.spec_from_file_location("mrl_stand_ins_names", STAND_INS / "sitecustomize.py")
    assert spec is not None and spec.loader is not None
    stand_ins = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stand_ins)  # none asked in this process: it only defines them
    assert host.carried_stand_ins(tmp_path) == stand_ins.NAMES and "maxtext-py311-aliases" in stand_ins.NAMES
