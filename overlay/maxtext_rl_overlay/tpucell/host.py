"""The TPU cell on its host: `bash BUNDLE/run.sh --report DIR [--steps ...]`
(run.sh runs this file, the bundle's cell.py, with the host's python3).

Standard library only, Python 3.11: it runs before anything is installed.
It reads the host (its Python, its JAX and libtpu on PYTHONPATH, its
index, its chips), installs the bundle offline into --target, appended to
PYTHONPATH after the host's own folders (the host's JAX stays first), and
runs each step asked for in a process of its own with its own timeout. The
report, DIR/cell.json and DIR/cell.md, accumulates: a later call adds its
steps to what an earlier call wrote (the host may be a fresh machine each
call; install is skipped where --target already holds this bundle's
install). Host stand-ins (the bundle's stand-ins/) are active only where
named with --host-stand-ins, and every step says which were."""

from __future__ import annotations

import argparse
import ast
import contextlib
import datetime
import hashlib
import json
import os
import pathlib
import platform
import shutil
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # cell.json's types are reports'; on the host this file runs alone, standard library only
    from ..checks.reports import CellDocument, CellStep

try:  # in the package (the tests, the bundle's maker)
    from ..probes import host_facts
except ImportError:  # on the host, as the bundle's cell.py: the bundle carries the probe beside it
    import host_facts  # type: ignore[import-not-found, no-redef]

STEPS = ("install", "verify", "smoke", "fixes", "fixes-engines", "train-rl", "train-rl-user", "upstream", "bench", "bench-decode",
         "bench-sync")
#: Each step's own bound, seconds (--timeout overrides them all).
TIMEOUTS = {"install": 480, "verify": 480, "smoke": 540, "fixes": 540, "fixes-engines": 570, "train-rl": 570, "train-rl-user": 570,
            "upstream": 540,
            "bench": 540, "bench-decode": 540, "bench-sync": 480}
#: The most the install spends compiling the site's bytecode.
COMPILE_SECONDS = 300
#: Under --budget, a step with less than this left of it is not started (it could not finish).
MIN_STEP_SECONDS = 60
#: The part of tests/fixes whose tests start engines in processes of their
#: own on the chips: its pytest process stays off them (one process at a
#: time can hold a chip), the rest of the tpu_cell tests hold them in-process.
ENGINE_TESTS = "tests/fixes/test_smoke.py"
#: train_rl on the chips, each run in a process of its own (MaxText needed): as ENGINE_TESTS.
TRAIN_RL_TESTS = "tests/fixes/test_train_rl.py"
#: Where the bundle carries its host stand-ins (the tool's scripts/tpu-cell/stand_ins): NAMES there lists them.
STAND_INS_FILE = pathlib.Path("stand-ins") / "sitecustomize.py"


def carried_stand_ins(bundle: pathlib.Path) -> tuple[str, ...]:
    """The host stand-ins the bundle carries: its sitecustomize.py's NAMES,
    read, not imported (an import would activate those named in the
    environment)."""
    try:
        text = (bundle / STAND_INS_FILE).read_text()
    except OSError as error:
        raise SystemExit(f"tpu-cell: cannot read the stand-ins this bundle carries: {error}") from None
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "NAMES" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    raise SystemExit(f"tpu-cell: {bundle / STAND_INS_FILE} lists no NAMES")


#: The one variable of the host stand-ins: --host-stand-ins, for sitecustomize.py to activate in each
#: process of a step (which are active, and what each replaces, is that module's ACTIVE).
STAND_INS_VARIABLE = "MRL_HOST_STAND_INS"
INSTALLED = ".mrl-tpu-cell-installed"
#: Where libtpu keeps its multi-process lock (its own error message names it).
LIBTPU_LOCKFILE = pathlib.Path("/tmp/libtpu_lockfile")
#: cell.json's format (docs/reports.md); a report folder holding another is refused, not mixed.
CELL_REPORT_VERSION = 1
#: A step's K-th run (K from 2) is kept as NAME.K: its result, log, JUnit record and JSON. No `#`
#: in any name the report writes: copies and URLs drop or cut at it (an older cell.py wrote NAME#K).
RERUN = "."
#: The train-rl steps' run records, in one flat folder of the report: each file named LABEL.FILE
#: (flatten_runs), so that a copy of the report one folder deep has them all.
RUNS = "runs"


#: The bundle's copy of the tool's probes/host_facts.py, beside this file
#: (cell.py): run with the host's python and a step's PYTHONPATH, it says what
#: is installed where and, asked, jax's devices.
FACTS = "host_facts.py"
#: How a probe runs: as `python -c` would see the path (probes.RUN; this file stands alone on the host).
RUN_PROBE = "import runpy, sys; sys.argv[:] = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"


class Cell:
    def __init__(self, args: argparse.Namespace) -> None:
        self.bundle: pathlib.Path = args.bundle.resolve()
        self.facts = json.loads((self.bundle / "bundle.json").read_text())
        self.report_dir: pathlib.Path = args.report.resolve()
        self.target: pathlib.Path = (args.target or self.bundle.parent / "site").resolve()
        self.python: str = sys.executable
        self.stand_ins: list[str] = args.host_stand_ins
        self.timeout: float | None = args.timeout
        # --budget: the whole call's steps end inside it (a chip host's call has a hard limit).
        self.deadline: float | None = time.monotonic() + args.budget if args.budget else None
        self.host_path = os.environ.get("PYTHONPATH", "")
        self.report_dir.mkdir(parents=True, exist_ok=True)
        (self.report_dir / "steps").mkdir(exist_ok=True)
        self.report = read_report(self.report_dir / "cell.json", self.facts)
        self.current: dict[str, str] = {}  # step -> the label this run of it is kept under (next_label)

    # -- the environment of every step -------------------------------------

    def env(self) -> dict[str, str]:
        parts = [p for p in self.host_path.split(os.pathsep) if p] + [str(self.target)]
        if self.stand_ins:
            parts.append(str(self.bundle / "stand-ins"))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(parts), PATH=f"{self.target / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}")
        env[STAND_INS_VARIABLE] = ",".join(self.stand_ins)
        return env

    def host_facts(self, devices: bool) -> dict[str, Any]:
        """The host's Python, what its own PYTHONPATH holds (JAX), and its chips."""
        env = dict(os.environ, PYTHONPATH=self.host_path)
        done = subprocess.run([self.python, "-c", RUN_PROBE, str(self.bundle / FACTS), "1" if devices else "0"], env=env, capture_output=True, text=True,
                              timeout=300)
        try:
            found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            raise SystemExit(f"tpu-cell: could not read the host's facts: {done.stderr.strip()[-500:]}") from None
        host_path = [os.path.realpath(p) for p in self.host_path.split(os.pathsep) if p]
        found["host_path_distributions"] = {n: v for n, (v, where) in found["distributions"].items()
                                            if any(os.path.realpath(where).startswith(p) for p in host_path)}
        facts = {
            "python": found["python"],
            "glibc": platform.libc_ver()[1],
            "machine": platform.machine(),
            # Whether the steps' Pythons write the bytecode they compile (PYTHONDONTWRITEBYTECODE unset):
            # where not, only what the install compiled is kept (compile_bytecode).
            "writes_bytecode": not sys.flags.dont_write_bytecode,
            "jax": found["distributions"].get("jax", ["not installed"])[0],
            "jaxlib": found["distributions"].get("jaxlib", ["not installed"])[0],
            "libtpu": found["distributions"].get("libtpu", ["not installed"])[0],
            "host_path_distributions": found["host_path_distributions"],
        }
        if devices:
            facts["devices"] = found.get("devices")
        return facts

    # -- install -------------------------------------------------------------

    def check_host(self, host: dict[str, Any]) -> None:
        """The bundle was made for this host: its Python, its JAX, its index."""
        want_python, want_jax = self.facts["host_python"], self.facts["host_jax"]
        if not host["python"].startswith(want_python + "."):
            raise SystemExit(f"tpu-cell: this host's Python is {host['python']}; the bundle was made for {want_python}: make it again "
                             f"with --host-python {'.'.join(host['python'].split('.')[:2])}.")
        if host["jax"] != want_jax:
            raise SystemExit(f"tpu-cell: this host's JAX (on PYTHONPATH) is {host['jax']}; the bundle was resolved for {want_jax}: "
                             f"make it again with --host-jax {host['jax']}.")
        libc, version = platform.libc_ver()
        want_glibc = int(self.facts.get("host_platform", "x86_64-manylinux_2_17").rsplit("_", 1)[-1])
        if libc != "glibc" or int(version.split(".")[1]) < want_glibc:
            raise SystemExit(f"tpu-cell: this host's C library is {libc} {version}; the bundle was made for glibc 2.{want_glibc} or newer: "
                             "make it again with --host-platform naming this host's.")
        for where in self.facts["host_index"]:
            folder = where.removeprefix("file://")
            if not os.path.isdir(folder):
                raise SystemExit(f"tpu-cell: the host's index {where}, which the bundle was made against, is not on this host.")

    def install(self) -> dict[str, Any]:
        host = self.host_facts(devices=False)
        self.check_host(host)
        self.check_sums()
        kept = {host_facts.normal(n) for n in host["host_path_distributions"]}
        wanted = host_facts.release_pins((self.bundle / "requirements.txt").read_text())
        pins = {n: v for n, v in wanted.items() if n not in kept}
        key = hashlib.sha256(json.dumps([sorted(pins.items()), (self.bundle / "wheels" / "SHA256SUMS").read_text()]).encode()).hexdigest()
        marker = self.target / INSTALLED
        if marker.is_file() and marker.read_text().strip() == key:
            return {"rc": 0, "summary": f"already installed in {self.target} (this bundle, these pins): skipped", "seconds": 0.0}
        requirements = self.report_dir / "steps" / "install-requirements.txt"
        requirements.write_text("".join(f"{n}=={v}\n" for n, v in sorted(pins.items())))
        staging = self.target.with_name(self.target.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        cmd = [self.python, "-m", "pip", "install", "--isolated", "--no-input", "--disable-pip-version-check", "--only-binary=:all:",
               "--no-deps", "--no-compile", "--target", str(staging), "--find-links", str(self.bundle / "wheels")]
        first = True
        for where in self.facts["host_index"]:
            url = where if where.startswith("file://") else pathlib.Path(where).resolve().as_uri()
            simple = any(os.path.isfile(os.path.join(where.removeprefix("file://"), d, "index.html"))
                         for d in os.listdir(where.removeprefix("file://")))
            if simple:
                cmd += ["--index-url" if first else "--extra-index-url", url]
                first = False
            else:
                cmd += ["--find-links", where.removeprefix("file://")]
        if first:
            cmd.append("--no-index")
        relaxed = self.facts.get("requires_python_relaxed") or {}
        if relaxed:
            # Resolved here for this Python with only these relaxed (bundle.json): every other pin's Requires-Python was checked.
            cmd.append("--ignore-requires-python")
        cmd += ["-r", str(requirements)]
        result = self.run("install", cmd, env=dict(os.environ, PIP_CONFIG_FILE=os.devnull, PYTHONPATH=self.host_path))
        if result["rc"] == 0:
            shutil.rmtree(self.target, ignore_errors=True)
            staging.rename(self.target)
            marker.write_text(key + "\n")
            # The distributions' size, as pip installed them: the bytecode compiled next is not counted.
            size = sum(p.stat().st_size for p in self.target.rglob("*") if p.is_file() and not p.is_symlink())
            compiled = self.compile_bytecode()
            result["summary"] = (f"{len(pins)} distribution(s) into {self.target} ({size / 2**30:.2f} GiB); the host's own kept: "
                                 + ", ".join(f"{n} {v}" for n, v in sorted(host["host_path_distributions"].items())
                                             if host_facts.normal(n) in wanted))
            if relaxed:
                result["summary"] += ("; Requires-Python not checked (pip --ignore-requires-python) for "
                                      + ", ".join(f"{n} (it says {w})" for n, w in sorted(relaxed.items())))
            result["summary"] += "; " + compiled
        return result

    def compile_bytecode(self) -> str:
        """Compile the installed site's bytecode, once, at its final path (pip
        compiled nothing: it installed into the staging folder, whose path the
        bytecode would name). A host that sets PYTHONDONTWRITEBYTECODE would
        otherwise compile every module from source in every process of every
        step: on the CPU rehearsal, the MaxText tests' collection took 38.6 s
        without bytecode and 18 s with it. What this Python cannot compile
        (MaxText's Python 3.12-only modules, which a stand-in rewrites as it
        imports them) is left to compile from source; bytecode is an
        optimisation, so no failure here fails the install."""
        began = time.monotonic()
        cmd = [self.python, "-W", "ignore", "-m", "compileall", "-qq", "-j", "0", str(self.target)]
        try:
            done = subprocess.run(cmd, env=dict(os.environ, PYTHONPATH=self.host_path), capture_output=True, text=True,
                                  timeout=max(min(COMPILE_SECONDS, self.budget_left()), 1))
        except subprocess.TimeoutExpired:
            return f"bytecode not compiled: out of time after {time.monotonic() - began:.0f} s (each process compiles what it imports)"
        seconds = time.monotonic() - began
        if done.returncode == 0:
            return f"bytecode compiled in {seconds:.1f} s"
        return f"bytecode compiled in {seconds:.1f} s, but for sources this Python cannot compile (they compile as they are imported)"

    def check_sums(self) -> None:
        for line in (self.bundle / "wheels" / "SHA256SUMS").read_text().splitlines():
            digest, name = line.split(None, 1)
            got = hashlib.sha256((self.bundle / "wheels" / name).read_bytes()).hexdigest()
            if got != digest:
                raise SystemExit(f"tpu-cell: wheels/{name} differs from the bundle's SHA256SUMS: the copy is damaged; carry the bundle again.")

    # -- the steps -------------------------------------------------------------

    def run(self, name: str, cmd: list[str], *, env: dict[str, str] | None = None, junit: pathlib.Path | None = None,
            cwd: pathlib.Path | None = None, timeout: float | None = None) -> dict[str, Any]:
        """`timeout`: the step's bound where the caller has read it already (self.bound)."""
        log = self.report_dir / "steps" / f"{self.label(name)}.log"
        timeout = timeout or self.bound(name)
        print(f"[tpu-cell] {name}: {' '.join(cmd[:6])}{' ...' if len(cmd) > 6 else ''} (at most {timeout:.0f} s; log {log})", flush=True)
        began = time.monotonic()
        with log.open("w") as out:
            child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env or self.env(), cwd=cwd or self.bundle,
                                     start_new_session=True)
            try:
                rc = child.wait(timeout=timeout)
                timed_out = False
            except subprocess.TimeoutExpired:
                # Its descendants first: smoke's engines run in sessions of their own, out of
                # the step's process group, and one left alive keeps the chip (seen on a v5e:
                # the next step found "The TPU is already in use by process with pid N").
                kill_descendants(child.pid)
                os.killpg(child.pid, 9)
                rc, timed_out = child.wait(), True
        seconds = round(time.monotonic() - began, 1)
        tail = log.read_text(errors="replace").strip().splitlines()[-15:]
        if timed_out and clear_stale_libtpu_lock():
            tail.append(f"tpu-cell: removed {LIBTPU_LOCKFILE}: the killed step's, no process holds a chip")
        result: dict[str, Any] = {"rc": rc, "seconds": seconds, "timed_out": timed_out, "command": " ".join(cmd), "tail": tail}
        if junit is not None and junit.is_file():
            result["tests"] = counts = junit_counts(junit)
            if STOPPED in log.read_text(errors="replace"):
                result["summary"] = (f"stopped before its bound: {counts['passed']} passed, {counts['failures'] + counts['errors']} failed, "
                                     f"{counts['skipped']} skipped; the tests after them not run")
        return result

    def pytest(self, name: str, paths: list[str], extra_env: dict[str, str], *more: str) -> dict[str, Any]:
        junit = self.report_dir / "steps" / f"{self.label(name)}.xml"
        junit.unlink(missing_ok=True)  # a killed run writes none: an earlier call's must not stand for it
        # This file, as a pytest plugin (`-p cell`, the bundle's root is the step's folder), stops the
        # session before a test that would not finish inside the bound: the tests run keep their record.
        # One reading of the bound for both: the plugin's stop and the cell's kill.
        timeout = self.bound(name)
        env = self.env() | extra_env | {STOP_AT_VARIABLE: str(time.time() + timeout)}
        return self.run(name, [self.python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "-p", "cell", f"--junitxml={junit}",
                               *more, *paths], env=env, junit=junit, timeout=timeout)

    def bound(self, name: str) -> float:
        """The step's bound: its own (or --timeout), cut to what is left of --budget."""
        return min(self.timeout or TIMEOUTS[name], self.budget_left())

    def budget_left(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()

    def step(self, name: str, passthrough: list[str]) -> dict[str, Any]:
        if (left := self.budget_left()) < MIN_STEP_SECONDS:
            return {"rc": None, "seconds": 0.0, "summary": f"not run: {max(left, 0):.0f} s of --budget left (a step needs {MIN_STEP_SECONDS})"}
        tool = [self.python, "-m", "maxtext_rl_overlay"]
        if name == "install":
            return self.install()
        if not (self.target / INSTALLED).is_file():
            return {"rc": None, "summary": f"not run: nothing installed in {self.target} (run the install step first)", "seconds": 0.0}
        if name == "verify":
            return self.run(name, [*tool, "verify", "--host-deviations", str(self.bundle / "release-closure.txt"), *passthrough])
        if name == "smoke":
            json_file = self.report_dir / "steps" / f"{self.label(name)}.json"
            result = self.run(name, [*tool, "smoke", "--json", str(json_file), *passthrough])
            if json_file.is_file():
                doc = json.loads(json_file.read_text())
                result["failed"] = doc.get("failed")
                result["cannot_run"] = doc.get("cannot_run")
            return result
        tests = {"PYTHONPATH": self.env()["PYTHONPATH"] + os.pathsep + str(self.bundle / "tests")}
        # tests/fixes' TPU cell mode: the tests marked tpu_cell, on this host's chips, however many
        # (tests/support/fixes/matrix.py), the kernels compiled for them (no interpret mode).
        if name in ("fixes", "fixes-engines", "train-rl", "train-rl-user"):
            cell = tests | {"MRL_PLATFORM": "tpu", "MRL_TPU_CHIPS": str(self.chips())}
        if name == "fixes":
            return self.pytest(name, ["tests/fixes"], cell | {"MRL_QUICK": "1"}, "-m", "tpu_cell", "--ignore", ENGINE_TESTS,
                               "--ignore", TRAIN_RL_TESTS, *passthrough)
        if name == "fixes-engines":
            # The whole of it (MRL_QUICK=0: the breaks smoke must see); jax in this process on the CPU,
            # the engines the tests start on the chips.
            return self.pytest(name, [ENGINE_TESTS], cell | {"MRL_QUICK": "0", "JAX_PLATFORMS": "cpu"}, "-m", "tpu_cell", *passthrough)
        if name in ("train-rl", "train-rl-user"):
            # The overlay's runs (MRL_QUICK=1; -k to choose a configuration), MaxText's train_rl on the chips:
            # the tiny shape's two steps, or (train-rl-user) a user's shape, each step explained.
            marker = "tpu_cell and user_shape" if name == "train-rl-user" else "tpu_cell and not user_shape"
            # Each run's record and log in the report (MRL_RUN_RECORDS): a run the step's bound kills keeps them.
            records = self.report_dir / RUNS / self.label(name)
            try:
                return self.pytest(name, [TRAIN_RL_TESTS], cell | {"MRL_QUICK": "1", "MRL_MAXTEXT": "1", "JAX_PLATFORMS": "cpu",
                                                                   "MRL_RUN_RECORDS": str(records)},
                                   "-m", marker, *passthrough)
            finally:
                flatten_runs(records)
        if name == "upstream":
            return self.pytest(name, [f"upstream/{p}" for p in self.facts["upstream_tests"]], {}, "--rootdir", "upstream", *passthrough)
        if name == "bench":
            return self.run(name, [self.python, "tests/bench/bench_logprobs.py", "--platform", "tpu", *passthrough], env=self.env() | tests)
        if name == "bench-decode":
            json_file = self.report_dir / "steps" / f"{self.label(name)}.json"
            return self.run(name, [self.python, "tests/bench/bench_decode.py", "--json", str(json_file), *passthrough], env=self.env() | tests)
        if name == "bench-sync":
            json_file = self.report_dir / "steps" / f"{self.label(name)}.json"
            return self.run(name, [self.python, "tests/bench/bench_maxtext_sync.py", "--platform", "tpu", "--json", str(json_file),
                                   *passthrough], env=self.env() | tests)
        raise SystemExit(f"tpu-cell: unknown step {name}")

    def chips(self) -> int:
        """The host's chips, as its facts counted them (in a process of their own)."""
        devices = self.report.get("host", {}).get("devices") or {}
        if devices.get("backend") != "tpu" or not devices.get("count"):
            raise SystemExit(f"tpu-cell: no TPU chips on this host ({devices}): tests/fixes' TPU cell mode needs them")
        return int(devices["count"])

    def label(self, name: str) -> str:
        """The name this run of a step is kept under (its result, log, JUnit record and JSON)."""
        return self.current.get(name, name)

    def next_label(self, name: str) -> str:
        """`NAME` for a step's first run in the report, `NAME.K` for its K-th,
        in this call (--repeat) or a later one (the same step again with other
        arguments): no run's result or files are written over another's."""
        taken = self.report["steps"]
        if name not in taken:
            return name
        k = 2
        while f"{name}{RERUN}{k}" in taken:
            k += 1
        return f"{name}{RERUN}{k}"

    # -- the report ------------------------------------------------------------

    def deviations(self) -> list[str]:
        """What this host runs that differs from the release's closure, as
        the probe's `deviations` says in a step's environment (verify
        --host-deviations says the same; the Requires-Python relaxed, those
        the bundle names), and what the bundle itself changed: wheels
        rebuilt for this host, distributions left out."""
        closure = self.bundle / "release-closure.txt"
        relaxed = ",".join(host_facts.normal(n) for n in self.facts.get("requires_python_relaxed") or {})
        done = subprocess.run([self.python, "-c", RUN_PROBE, str(self.bundle / FACTS), "deviations", str(closure), relaxed],
                              env=self.env(), capture_output=True, text=True, timeout=300)
        try:
            lines: list[str] = json.loads(done.stdout.strip().splitlines()[-1])["deviations"]
        except (IndexError, ValueError, KeyError):
            return ["could not be read: " + done.stderr.strip()[-300:]]
        lines += [f"{w}: {why}" for w, why in self.facts["carried"].items() if "rebuilt" in why]
        lines += [f"left out: {n} ({why})" for n, why in sorted(_left_out(self.facts).items())]
        return lines

    def bundle_facts(self) -> dict[str, Any]:
        """cell.json's `bundle`: the form, what was left out and why, and whether the bundle came in parts."""
        facts: dict[str, Any] = {"form": self.facts.get("form", "plain"), "left_out": _left_out(self.facts)}
        received = self.bundle / PARTS_RECEIVED
        if received.is_file():
            got = json.loads(received.read_text())
            facts["parts"] = got
            facts["summary"] = (f"came in {len(got['parts'])} parts ({', '.join(p['name'] for p in got['parts'])}), each checked "
                                f"against the parts' SHA256SUMS, put together on this host {got['when']}")
        else:
            facts["summary"] = "came whole (one call)"
        return facts

    def write(self) -> None:
        """cell.json and cell.md: the one place either is written."""
        (self.report_dir / "cell.json").write_text(json.dumps(self.report, indent=1) + "\n")
        (self.report_dir / "cell.md").write_text(render(self.report))


#: What parts.py writes into a bundle it put together from parts (parts.RECEIVED; this file stands alone on the host).
PARTS_RECEIVED = "PARTS-RECEIVED.json"


def step_of(label: str) -> str:
    """The step a report's label names: NAME, NAME.K, or an older cell.py's
    NAME#K (a report folder accumulates across calls of either)."""
    return label.replace("#", RERUN).split(RERUN)[0]


def flatten_runs(folder: pathlib.Path) -> None:
    """The records a step's train_rl runs wrote into runs/LABEL/, moved to
    runs/LABEL.FILE beside every other step's (the test names its files, not
    the cell, so the label goes in front). Run after the step, killed or not;
    a cell killed mid-step leaves them in runs/LABEL/."""
    if not folder.is_dir():
        return
    for record in sorted(folder.iterdir()):
        if record.is_file():
            record.replace(folder.parent / f"{folder.name}.{record.name}")
    with contextlib.suppress(OSError):  # something else in it: left as it is
        folder.rmdir()


def _left_out(facts: dict[str, Any]) -> dict[str, str]:
    """bundle.json's left-outs, name -> why (an older bundle's: a list of names)."""
    left = facts.get("left_out") or {}
    return dict(left) if isinstance(left, dict) else {n: "no reason recorded" for n in left}


def read_report(path: pathlib.Path, facts: dict[str, Any]) -> CellDocument:
    """The report an earlier call left in the folder, to add to; a new one
    for this bundle where there is none. One of another format (an older
    cell.py's) is refused: its steps would be misread."""
    fresh: CellDocument = {"report_version": CELL_REPORT_VERSION, "kind": "tpu-cell", "release": facts["release"],
                           "bundle_python": facts["host_python"], "bundle_jax": facts["host_jax"], "host": {}, "deviations": [], "steps": {}}
    if not path.is_file():
        return fresh
    try:
        found = json.loads(path.read_text())
    except ValueError:
        raise SystemExit(f"tpu-cell: {path} is not JSON: give --report another folder, or remove it.") from None
    version = found.get("report_version") if isinstance(found, dict) else None
    if not isinstance(found, dict) or found.get("kind") != "tpu-cell" or version != CELL_REPORT_VERSION:
        raise SystemExit(f"tpu-cell: {path} is not a cell report of this format (report_version {version!r}, this cell.py's is "
                         f"{CELL_REPORT_VERSION}): give --report another folder, or remove it.")
    report: CellDocument = found  # type: ignore[assignment]
    report["release"], report["bundle_python"], report["bundle_jax"] = fresh["release"], fresh["bundle_python"], fresh["bundle_jax"]
    return report


def chip_holders() -> list[int]:
    """The processes that hold one of this host's TPU device files open."""
    holders = []
    for fd_dir in pathlib.Path("/proc").glob("[0-9]*/fd"):
        try:
            targets = [os.readlink(fd) for fd in fd_dir.iterdir()]
        except OSError:  # gone, or not ours to read
            continue
        if any(t.startswith(("/dev/accel", "/dev/vfio/")) for t in targets):
            holders.append(int(fd_dir.parent.name))
    return holders


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (children, theirs, ...), read from /proc:
    whatever session or process group each one moved to."""
    parents: dict[int, list[int]] = {}
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        parents.setdefault(ppid, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_descendants(pid: int) -> None:
    """SIGKILL to every process below `pid`: each stopped first, and the tree
    read again until no new one appears, so none forks a child unseen."""
    stopped: set[int] = set()
    while new := [each for each in descendants(pid) if each not in stopped]:
        for each in new:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(each, signal.SIGSTOP)
        stopped.update(new)
    for each in stopped:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(each, signal.SIGKILL)


def clear_stale_libtpu_lock(lockfile: pathlib.Path | None = None) -> bool:
    """libtpu leaves its lockfile behind when its process is killed, and the
    next process on the chip then fails to start ("Internal error when
    accessing libtpu multi-process lockfile"); a step past its bound is killed
    with SIGKILL. Remove the file where no process holds a chip any more
    (what libtpu's own message asks a person to do); True if it was removed."""
    lockfile = lockfile or LIBTPU_LOCKFILE
    if not lockfile.exists() or chip_holders():
        return False
    lockfile.unlink(missing_ok=True)
    return True


# -- as a pytest plugin in the cell's pytest steps (`-p cell`) --------------------

#: When the step's bound ends (epoch seconds), for the plugin below.
STOP_AT_VARIABLE = "MRL_TPU_CELL_STOP_AT"
#: What the plugin stops a session with (pytest prints it; the step's summary reads it).
STOPPED = "tpu-cell: stopped before the step's bound"
#: A test is started only where the bound leaves the longest test so far this much more.
STOP_MARGIN_SECONDS = 10.0
#: The longest setup and the longest call so far, in seconds (pytest's own durations).
_longest = {"setup": 0.0, "call": 0.0}
#: What the plugin says once the tests are collected (the step's log, so its tail and a killed step's summary).
COLLECTED = "tpu-cell: collected"
#: When pytest loaded the plugin: about when the step's pytest started.
_LOADED = time.time()


def pytest_collection_finish(session: Any) -> None:
    """Say how long collecting took and how much of the bound is left: the
    tests' imports cost the cell's pytest steps a minute or more on a chip
    host, and a step killed there otherwise leaves an empty log (pytest -q
    prints nothing before the first test's result)."""
    left = float(os.environ.get(STOP_AT_VARIABLE, "inf")) - time.time()
    line = f"{COLLECTED} {len(session.items)} test(s) in {time.time() - _LOADED:.1f} s; {left:.0f} s of the step's bound left"
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(line)
    else:
        print(line, flush=True)


def pytest_runtest_logreport(report: Any) -> None:
    if report.when in _longest:
        _longest[report.when] = max(_longest[report.when], report.duration)


def _shares_its_fixtures(item: Any, nextitem: Any) -> bool:
    """Whether `nextitem` runs on the fixtures `item` set up (the same module
    and the same parameters: a module-scoped fixture such as a train_rl run
    is not made again), so that it costs a call, not a setup."""
    def params(test: Any) -> Any:
        return getattr(getattr(test, "callspec", None), "params", {})

    return bool(item.module is nextitem.module and params(item) == params(nextitem))


def pytest_runtest_teardown(item: Any, nextitem: Any) -> None:
    """Stop the session where the next test, as long as the longest so far
    (its call alone where it shares this one's fixtures), would run past the
    step's bound: killed there, pytest would write no record."""
    if nextitem is None:
        return
    now = time.time()
    estimate = _longest["call"] + (0.0 if _shares_its_fixtures(item, nextitem) else _longest["setup"])
    stop_at = float(os.environ.get(STOP_AT_VARIABLE, "inf"))
    if stop_at - now < estimate + STOP_MARGIN_SECONDS:
        item.session.shouldstop = f"{STOPPED}: {stop_at - now:.0f} s left, the next test could take {estimate:.0f} s"


def junit_counts(path: pathlib.Path) -> dict[str, int]:
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError:
        return counts
    for suite in root.iter("testsuite"):
        for key in counts:
            counts[key] += int(suite.get(key, 0))
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def _timed_out(step: CellStep) -> str:
    """A killed step's summary: with its collection line where pytest got that far (a bound spent
    collecting shows as such, not as a test that hung)."""
    collected = [line for line in step.get("tail") or [] if line.startswith(COLLECTED)]
    return "TIMED OUT" + (f" ({collected[-1].removeprefix('tpu-cell: ')})" if collected else "")


def render(report: CellDocument) -> str:
    host = report.get("host", {})
    devices = host.get("devices") or {}
    lines = ["# TPU cell", "", f"Release: {report.get('release', '?')}; bundle made for Python {report.get('bundle_python', '?')}, "
             f"JAX {report.get('bundle_jax', '?')}.", "",
             "## Host", "",
             f"- Python {host.get('python')}, glibc {host.get('glibc')}, {host.get('machine')}",
             f"- jax {host.get('jax')}, jaxlib {host.get('jaxlib')}, libtpu {host.get('libtpu')} (the host's own, first on PYTHONPATH)",
             f"- devices: {devices.get('count', '?')} x {devices.get('kind', devices.get('error', '?'))} ({devices.get('backend', '?')})",
             ""]
    bundle = report.get("bundle")
    if bundle:
        lines += ["## Bundle", "", f"- form: {bundle.get('form')}; {bundle.get('summary')}"]
        lines += [f"- left out: {n}: {why}" for n, why in sorted((bundle.get("left_out") or {}).items())]
        lines += [""]
    lines += ["## Deviations from the release's closure", ""]
    lines += [f"- {d}" for d in report.get("deviations", [])] or ["- (not read yet: run a step after install)"]
    lines += ["", "## Steps", "", "| step | when | rc | seconds | tests | host stand-ins | summary |", "|---|---|---|---|---|---|---|"]
    ordered = sorted(report.get("steps", {}).items(), key=lambda item: (STEPS.index(step_of(item[0])), item[1].get("when", "")))
    for name, s in ordered:
        t = s.get("tests")
        tests = f"{t['passed']} passed, {t['failures']} failed, {t['errors']} errors, {t['skipped']} skipped" if t else "-"
        summary = s.get("summary") or (_timed_out(s) if s.get("timed_out") else (s.get("cannot_run") or "; ".join(s.get("failed") or [])
                                                                              or (s.get("tail") or [""])[-1]))
        stand_ins = ", ".join(s.get("stand_ins") or []) or "none"
        lines.append(f"| {name} | {s.get('when', '')} | {s.get('rc')} | {s.get('seconds')} | {tests} | {stand_ins} | {summary.replace('|', '/')} |")
    lines += ["", "Host stand-ins (docs/tpu-cell.md): active only where a step names them; none is in any wheel of the overlay.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run.sh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", type=pathlib.Path, required=True, help=argparse.SUPPRESS)
    parser.add_argument("--report", type=pathlib.Path, required=True, metavar="DIR", help="where cell.json and cell.md go (and are added to)")
    parser.add_argument("--steps", default=",".join(STEPS), help=f"comma-separated, in this order: {','.join(STEPS)} (default: all)")
    parser.add_argument("--host-stand-ins", default="", metavar="NAME,...",
                        help=f"the stand-ins to activate, by name (the bundle's {STAND_INS_FILE} lists them: NAMES)")
    parser.add_argument("--target", type=pathlib.Path, metavar="DIR", help="where the bundle installs (default: BUNDLE/../site)")
    parser.add_argument("--timeout", type=float, metavar="SECONDS", help="each step's bound (default: its own, under 10 minutes)")
    parser.add_argument("--budget", type=float, metavar="SECONDS",
                        help="the whole call's bound: each step's is cut to what is left of it, and a step with less than "
                             f"{MIN_STEP_SECONDS} s left is not run (the report says so)")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="run the steps N times in a row (smoke's consecutive runs); a step's K-th run in the report, "
                             f"in this call or an earlier one, is kept as STEP{RERUN}K")
    parser.add_argument("passthrough", nargs="*", help="after --: more arguments for the (single) step named")
    args = parser.parse_args(argv)
    steps = [s for s in args.steps.split(",") if s]
    wrong = [s for s in steps if s not in STEPS]
    stand_ins = [s for s in args.host_stand_ins.split(",") if s]
    carried = carried_stand_ins(args.bundle) if stand_ins else ()
    unknown = [s for s in stand_ins if s not in carried]
    if wrong or unknown:
        parser.error(f"unknown step(s) {wrong}" if wrong else f"unknown stand-in(s) {unknown}; the bundle carries {', '.join(carried)}")
    if args.passthrough and len(steps) != 1:
        parser.error("arguments after -- go to one step: name only that one with --steps")
    args.host_stand_ins = stand_ins
    cell = Cell(args)
    cell.report["host"] = cell.host_facts(devices=any(s != "install" for s in steps))
    cell.report["bundle"] = cell.bundle_facts()
    worst = 0
    for _ in range(max(args.repeat, 1)):
        for name in steps:
            label = cell.current[name] = cell.next_label(name)
            result = cell.step(name, args.passthrough)
            result["when"] = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            result["stand_ins"] = stand_ins
            cell.report["steps"][label] = cast("CellStep", result)
            if (cell.target / INSTALLED).is_file():
                cell.report["deviations"] = cell.deviations()
            cell.write()
            print(f"[tpu-cell] {label}: rc {result['rc']}, {result['seconds']} s: {result.get('summary') or (result.get('tail') or [''])[-1]}",
                  flush=True)
            worst = max(worst, result["rc"] if isinstance(result["rc"], int) and result["rc"] > 0 else 0)
            if name == "install" and result["rc"] != 0:
                return worst
    print(f"[tpu-cell] report: {cell.report_dir / 'cell.md'}")
    return worst


if __name__ == "__main__":
    sys.exit(main())
