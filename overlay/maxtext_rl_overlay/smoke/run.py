"""`smoke`: make a tiny model here, start the installed engine on it in each
configuration the install supports, generate, and check the result against
references no one here wrote. Runs where the stack is installed (it starts
the engine with this interpreter)."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import pathlib
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from .. import probes
from ..config.reader import host_stand_ins
from ..core import proc
from ..core.errors import CheckFailed, ExitCode, OverlayError, TimedOut
from ..core.output import step
from . import checks, configurations, maxtext_model, tiny_llama
from .checks import CheckResult
from .configurations import EngineConfiguration
from .cpu_simulation import NOTICE
from .protocol import Request, Result, SecondModel, step_of

#: What smoke needs: the engine, Tunix (the weight sync) and the reference (transformers on CPU torch).
NEEDED = {"jax": "jax", "vllm": "vllm", "tpu_inference": "tpu-inference", "tunix": "google-tunix", "torch": "torch",
          "transformers": "transformers"}

#: What a broken install shows first, imported each alone in a fresh process
#: before any work: the reference's torch and transformers, and jax.
PROBED = ("jax", "torch", "transformers")
#: What libtpu says when another process holds the chips: either of the
#: first two, or (libtpu 0.0.42 on a v5e, measured when the holder was
#: another pytest's child) that it could not take its multi-process lockfile.
TPU_HELD = ("already in use", "Device or resource busy", "libtpu multi-process lockfile")


class CannotRun(OverlayError):
    """This machine cannot run the smoke: the message says why."""

    status = ExitCode.ERROR


class BrokenStack(CheckFailed):
    """The installed stack is broken (a failed check): a package smoke needs
    fails to import. The message names it and its error."""


@dataclasses.dataclass(frozen=True)
class SmokeOptions:
    cpu_simulation: bool = False
    timeout: float = 900.0  # one engine process's bound, start and every generate (the CLI's default too)
    python: str = sys.executable
    json: pathlib.Path | None = None  # where the report goes (smoke/report.py, docs/reports.md)
    #: The configurations to run, by name (configurations.SMOKE); empty: every one.
    configurations: tuple[str, ...] = ()

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SmokeOptions:
        return cls(cpu_simulation=args.cpu_simulation, timeout=args.timeout, json=args.json, configurations=tuple(args.configuration))

    def runs(self, configuration: EngineConfiguration) -> bool:
        return not self.configurations or configuration.name in self.configurations


@dataclasses.dataclass
class Configuration:
    name: str
    chips: int = 0
    precision: str = ""  # the matmul precision of the gate's generates (checks.GATE_PRECISION on a TPU)
    mesh: dict[str, int] = dataclasses.field(default_factory=dict)
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    checks: list[CheckResult] = dataclasses.field(default_factory=list)
    stand_ins: list[str] = dataclasses.field(default_factory=list)
    sync_path: str = ""  # the code that synced the second model, in words
    compiles: dict[str, tuple[int, float]] = dataclasses.field(default_factory=dict)  # step -> (programs, seconds)
    # What the checks compared, kept in the JSON: a failed check can be read again without a rerun.
    evidence: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class SmokeReport:
    cpu_simulation: bool
    configurations: list[Configuration]
    skipped: dict[str, str] = dataclasses.field(default_factory=dict)  # configuration -> why it cannot run here

    @property
    def failed(self) -> list[str]:
        return [f"{c.name}: {k.name}" for c in self.configurations for k in c.checks if not k.ok]


def smoke(opts: SmokeOptions) -> SmokeReport:
    missing = [dist for module, dist in NEEDED.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise CannotRun(
            f"smoke needs {', '.join(missing)} in this environment (the engine, and transformers on "
            "CPU torch for the reference); install the overlay's closure: uv pip install -c constraints.txt "
            "maxtext-rl-overlay transformers."
        )
    backend = _probe(opts.python, ask_backend=not opts.cpu_simulation)
    if not opts.cpu_simulation and backend != "tpu":
        raise CannotRun(
            f"no TPU here (jax's backend is {backend}): smoke qualifies a TPU VM. --cpu-simulation runs the same checks on 8 CPU devices ({NOTICE})."
        )
    if not opts.cpu_simulation:
        _check_inet_sockets()
    report = SmokeReport(opts.cpu_simulation, [])
    with tempfile.TemporaryDirectory(prefix="mrl-smoke-") as tmp:
        work = pathlib.Path(tmp)
        # MaxText's models and references are made on the host CPU while the
        # Llama's engine holds the chips: off the critical path.
        for configuration in configurations.SMOKE:
            if not opts.runs(configuration):
                report.skipped[configuration.name] = "not selected (--configuration)"
        references: list[_MaxTextReference] = []
        for configuration in configurations.SMOKE:
            if configuration.maxtext is None or not opts.runs(configuration):
                continue
            if importlib.util.find_spec("maxtext") is not None:
                references.append(_MaxTextReference(opts, work, configuration))
            else:
                report.skipped[configuration.name] = "maxtext not installed"
        try:
            if opts.runs(configurations.LLAMA):
                report.configurations.append(_llama_configuration(opts, work))
            for reference in references:
                report.configurations.append(_maxtext_configuration(opts, work, reference))
        finally:
            for reference in references:
                reference.stop()
    return report


def _llama_configuration(opts: SmokeOptions, work: pathlib.Path) -> Configuration:
    with step("smoke", "making two tiny Llamas here (the engine's, the one synced into it) and transformers' greedy reference on each"):
        first = tiny_llama.write_checkpoint(work / "tiny-llama-first", tiny_llama.SEEDS[0])
        second = tiny_llama.write_checkpoint(work / "tiny-llama-second", tiny_llama.SEEDS[1], tiny_llama.CONSTANTS_SPREAD)
        first_reference, second_reference = (
            tiny_llama.reference_greedy(c, tiny_llama.REFERENCE_PROMPTS, tiny_llama.REFERENCE_TOKENS) for c in (first, second)
        )
    return _configuration(opts, configurations.LLAMA, work, (first, first_reference), (second, second_reference),
                          lambda rows: tiny_llama.reference_logits(first, checks.SAMPLED_PROMPT, rows))


#: The TPU cell's stand-in for a host that refuses inet sockets (docs/tpu-cell.md), by name.
SOCKETS_STAND_IN = "no-inet-sockets"


def _check_inet_sockets() -> None:
    """vLLM's engine asks for a free inet port and makes a gloo group: on a
    host that refuses inet sockets it would die in a traceback."""
    try:
        socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
    except OSError as error:
        if SOCKETS_STAND_IN in host_stand_ins():  # active in this process, so in the engine's too (it inherits what asked for it)
            return
        raise CannotRun(f"this host refuses inet sockets ({error}): vLLM's engine binds a port and makes a gloo group with them. "
                        f"The TPU cell's stand-in {SOCKETS_STAND_IN!r} replaces both (docs/tpu-cell.md: run.sh --host-stand-ins "
                        f"{SOCKETS_STAND_IN}).") from None


class _MaxTextReference:
    """A MaxText configuration's tiny model, the second one (train_rl's
    actor) and MaxText's own greedy decoding of each (maxtext_model.py),
    made in a process of its own on the host CPU (it needs no chip), started
    at once and read when the configuration comes; the same process then
    gives MaxText's logits at the engine's sampled draws (`logits`)."""

    def __init__(self, opts: SmokeOptions, work: pathlib.Path, configuration: EngineConfiguration) -> None:
        assert configuration.maxtext is not None  # (a MaxText configuration)
        self.configuration, self.name = configuration, configuration.name
        self.folder, self.log = work / f"tiny-{self.name}", work / f"{self.name}-reference.log"
        self.began = time.monotonic()
        model = configuration.maxtext.model_name
        step.note("smoke", f"{self.name}: making MaxText's tiny {model}s and MaxText's own greedy references on the host CPU, in the background")
        # It waits for the sampled rows for at most every engine's timeout, and not past smoke.
        waits = opts.timeout * (len(configurations.SMOKE) + 1)
        self.child = proc.start([opts.python, "-m", "maxtext_rl_overlay.smoke.maxtext_model", str(self.folder), str(waits), model],
                                what=f"{self.name}: making MaxText's references", output=self.log)

    def wait(self, timeout: float) -> str | None:
        """None once both references are written, else what went wrong."""
        done = self.folder / maxtext_model.SECOND / "reference.json"
        while not done.is_file():
            if self.child.poll() is not None:
                return self._failed("MaxText's reference")
            if time.monotonic() - self.began > timeout:
                self.stop()
                return f"MaxText's reference took over {timeout:.0f} s"
            time.sleep(0.5)
        return None

    def logits(self, prompt: list[int], rows: list[list[int]], timeout: float) -> list[list[list[float]]] | str:
        """MaxText's logits at each drawn position of `rows` (drawn after
        `prompt` by the engine from the first model), or what went wrong."""
        maxtext_model.write_json(self.folder / maxtext_model.ROWS_FILE, {"prompt": prompt, "rows": rows})
        try:
            status = self.child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            return f"MaxText's forward of the sampled rows took over {timeout:.0f} s"
        answer = self.folder / maxtext_model.LOGITS_FILE
        if status != 0 or not answer.is_file():
            return self._failed("MaxText's forward of the sampled rows")
        logits: list[list[list[float]]] = json.loads(answer.read_text())
        return logits

    def _failed(self, what: str) -> str:
        status = self.child.poll()
        tail = (self.log.read_text(errors="replace").strip().splitlines() or [f"exit status {status}"])[-1]
        return f"{what} failed: {tail}"

    def stop(self) -> None:
        if self.child.poll() is None:  # (a reaped child's number may be another's by now)
            proc.stop(self.child)


def _maxtext_configuration(opts: SmokeOptions, work: pathlib.Path, maxtext: _MaxTextReference) -> Configuration:
    """A MaxText configuration: its references (made in the background), then the engine."""
    name, folder = maxtext.name, maxtext.folder
    with step("smoke", f"{name}: waiting for MaxText's references"):
        failed = maxtext.wait(opts.timeout)
    if failed:
        return Configuration(name, checks=[CheckResult("reference made", False, failed)])
    second = folder / maxtext_model.SECOND
    first, synced = ((where, json.loads((where / "reference.json").read_text())) for where in (folder, second))
    return _configuration(opts, maxtext.configuration, work, first, synced,
                          lambda rows: maxtext.logits(checks.SAMPLED_PROMPT, rows, opts.timeout))


def _probe(python: str, ask_backend: bool) -> str | None:
    """Imports each of PROBED in a fresh process (jax picks its backend once,
    and a package that fails to import must be named, not mistaken for a
    missing TPU); returns jax's backend when asked. Raises BrokenStack for a
    package that fails to import, CannotRun where another process holds the TPU."""
    done = proc.run(probes.command(python, "backend", "1" if ask_backend else "0", *PROBED), check=False, timeout=300,
                    what="importing jax, torch and transformers in a fresh process")
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1])
    except (IndexError, ValueError):
        said = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        raise BrokenStack(f"importing {', '.join(PROBED)} killed the process: {said}") from None
    if answer["errors"]:
        raise BrokenStack("; ".join(f"{name} fails to import: {error}" for name, error in answer["errors"].items()))
    # Where another process holds the chip, jax either falls back to the CPU
    # and warns on stderr, or (libtpu 0.0.42 on a v5e, measured) raises.
    refusal = answer.get("backend_error")
    said = [refusal] if refusal else []
    held = [line.strip() for line in [*said, *done.stderr.splitlines()] if any(sign in line for sign in TPU_HELD)]
    if ask_backend and answer["backend"] != "tpu" and held:
        raise CannotRun(f"the TPU is held by another process, so jax could not open it: {held[0][:300]}. Stop that process, then run "
                        "smoke again (where libtpu names its lockfile and no process holds the chips, the file is a dead one's: remove it).")
    if refusal:
        raise BrokenStack(f"jax imports but cannot open a backend: {refusal}")
    backend: str | None = answer["backend"]
    return backend


Model = tuple[pathlib.Path, list[dict[str, Any]]]  # a checkpoint and its greedy reference
#: The reference's logits at each drawn position of the sampled rows (or what went wrong).
Scorer = Callable[[list[list[int]]], "list[list[list[float]]] | str"]


def _configuration(opts: SmokeOptions, configuration: EngineConfiguration, work: pathlib.Path, first: Model, second: Model,
                   score: Scorer) -> Configuration:
    """The engine started on `first`, its generates checked against `first`'s
    reference (`score` gives the reference's logits at the sampled draws);
    then `second` synced into it and checked against its own."""
    (checkpoint, reference), (second_checkpoint, second_reference) = first, second
    name, by = configuration.name, configuration.reference
    config = Configuration(name)
    request = work / f"{name}.request.json"
    result_path = work / f"{name}.result.json"
    # On a chip the gate's generates run at checks.GATE_PRECISION and jax's
    # default precision is measured last (checks.py's error model), where the
    # engine can switch to it; the CPU computes float32 matmuls in float32 at either.
    on_chip = not opts.cpu_simulation
    at_default = on_chip and not configuration.precision_at_build
    request.write_text(
        Request(name, str(checkpoint), opts.cpu_simulation, checks.generates(), SecondModel(str(second_checkpoint), checks.after_sync()),
                precision=checks.GATE_PRECISION if on_chip else None,
                at_default_precision=checks.at_default_precision() if at_default else []).to_json()
    )
    with step("smoke", f"{name}: starting the engine on all chips, generating, syncing the second model, generating"):
        try:
            done = proc.run(
                [opts.python, "-m", "maxtext_rl_overlay.smoke.engine", str(request), str(result_path)],
                check=False,
                timeout=opts.timeout,
                what=f"the {name} engine",
            )
        except TimedOut:  # past the timeout: the process is stopped
            config.checks.append(CheckResult("engine ran", False, f"no result within {opts.timeout:.0f} s; it was in: {step_of(result_path)}"))
            return config
    if not result_path.is_file():
        tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        config.checks.append(CheckResult("engine ran", False, f"the engine process died in: {step_of(result_path)} ({tail})"))
        return config
    result = Result.from_json(result_path.read_text())
    config.chips, config.mesh, config.stand_ins, config.precision = result.chips, result.mesh, result.stand_ins, result.precision
    config.seconds, config.compiles = result.seconds, result.compiles
    if result.stopped is not None and not {"greedy", "sampled"} <= set(result.generates):
        config.checks.append(CheckResult("engine ran", False, f"stopped in {result.step}: {result.stopped}"))
        return config
    config.evidence = {"engine": result.generates, "reference": reference, "second_reference": second_reference}
    config.checks.append(CheckResult("engine ran", True, f"mesh {config.mesh}"))
    config.checks += checks.greedy(result.generates["greedy"], reference, result.platform, by)
    config.sync_path = result.sync_path or ""
    greedy_rows, rows = checks.split_sampled(result.generates["sampled"])
    config.checks += checks.greedy(greedy_rows, reference, result.platform, by, what="sampled batch's greedy")
    with step("smoke", f"{name}: {by} at each sampled draw"):
        logits = score([r["tokens"] for r in rows])
    if isinstance(logits, str):
        config.checks += [*checks.sampled(rows, None, result.platform, by), CheckResult("sampled reference", False, logits)]
    else:
        config.checks += checks.sampled(rows, logits, result.platform, by)
    if "synced" not in result.generates:  # it stopped in the sync, or in the generate after it
        config.checks.append(CheckResult("weight sync", False, f"stopped in {result.step}: {result.stopped}"))
        return config
    config.checks += checks.synced(result.generates["synced"], second_reference, reference, result.platform, by)
    if at_default:
        measured = result.generates.get(checks.DEFAULT_PRECISION)
        compiled, _ = result.compiles.get(f"generate {checks.DEFAULT_PRECISION}", (0, 0.0))
        config.checks += checks.default_precision(measured, second_reference, compiled, by) if measured is not None else [
            CheckResult(f"{checks.DEFAULT_PRECISION} tokens", False, f"stopped in {result.step}: {result.stopped}")]
    return config
