"""`smoke`: make a tiny model here, start the installed engine on it in each
configuration the install supports, generate, and check the result against
references no one here wrote. Runs where the stack is installed (it starts
the engine with this interpreter)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import pathlib
import sys
import tempfile
from typing import Any

from .. import proc
from ..errors import OverlayError
from ..progress import step
from . import checks, engine, tiny_llama
from .checks import Check
from .cpu_simulation import NOTICE

#: What the checks need besides the stack: the reference (transformers on CPU torch).
NEEDED = {"jax": "jax", "vllm": "vllm", "tpu_inference": "tpu-inference", "torch": "torch", "transformers": "transformers"}
#: The configurations smoke runs: name -> what it is (engine.configuration).
CONFIGURATIONS = {
    "llama-device-indexes": "vLLM's Llama on Tunix's device_indexes 2D mesh",
    "maxtext-new-model-design": "MaxText's model (MaxTextForCausalLM, NEW_MODEL_DESIGN=1), where maxtext is installed",
}


class CannotRun(OverlayError):
    """This machine cannot run the smoke (exit status 3): the message says why."""


@dataclasses.dataclass(frozen=True)
class SmokeOptions:
    cpu_simulation: bool = False
    timeout: float = 900.0  # one engine process: start and every generate
    python: str = sys.executable


@dataclasses.dataclass
class Configuration:
    name: str
    chips: int = 0
    mesh: dict[str, int] = dataclasses.field(default_factory=dict)
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    checks: list[Check] = dataclasses.field(default_factory=list)
    stand_ins: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class SmokeReport:
    cpu_simulation: bool
    configurations: list[Configuration]

    @property
    def failed(self) -> list[str]:
        return [f"{c.name}: {k.name}" for c in self.configurations for k in c.checks if not k.ok]

    def as_json(self) -> dict[str, Any]:
        return {"cpu_simulation": self.cpu_simulation, "notice": NOTICE if self.cpu_simulation else None,
                "ok": not self.failed, "failed": self.failed,
                "configurations": [dataclasses.asdict(c) for c in self.configurations]}


def smoke(opts: SmokeOptions) -> SmokeReport:
    missing = [dist for module, dist in NEEDED.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise CannotRun(f"smoke needs {', '.join(missing)} in this environment (the engine, and transformers on "
                        "CPU torch for the reference); install the overlay's closure: uv pip install -c constraints.txt "
                        "maxtext-rl-overlay transformers.")
    if not opts.cpu_simulation:
        backend = _backend(opts.python)
        if backend != "tpu":
            raise CannotRun(f"no TPU here (jax's backend is {backend}): smoke qualifies a TPU VM. "
                            f"--cpu-simulation runs the same checks on 8 CPU devices ({NOTICE}).")
    report = SmokeReport(opts.cpu_simulation, [])
    with tempfile.TemporaryDirectory(prefix="mrl-smoke-") as tmp:
        work = pathlib.Path(tmp)
        with step("smoke", "making a tiny Llama here and transformers' greedy reference on it"):
            checkpoint = tiny_llama.write_checkpoint(work / "tiny-llama")
            reference = tiny_llama.reference_greedy(checkpoint, tiny_llama.REFERENCE_PROMPTS, tiny_llama.REFERENCE_TOKENS)
        report.configurations.append(_configuration(opts, "llama-device-indexes", work, checkpoint, reference, "transformers"))
        if importlib.util.find_spec("maxtext") is not None:
            report.configurations.append(_maxtext_configuration(opts, work))
    return report


def _maxtext_configuration(opts: SmokeOptions, work: pathlib.Path) -> Configuration:
    """MaxText's tiny qwen3 and MaxText's own greedy decoding of it, made in a
    process of its own (it holds the chips while it runs), then the engine."""
    name, folder = "maxtext-new-model-design", work / "tiny-maxtext"
    with step("smoke", f"{name}: making MaxText's tiny qwen3 here and MaxText's own greedy reference on it"):
        try:
            done = proc.run([opts.python, "-m", "maxtext_rl_overlay.smoke.maxtext_model", str(folder),
                             *(["--cpu-simulation"] if opts.cpu_simulation else [])],
                            check=False, timeout=opts.timeout, what="MaxText's reference")
        except OverlayError:
            return Configuration(name, checks=[Check("reference made", False, f"MaxText's reference took over {opts.timeout:.0f} s")])
    if done.returncode != 0 or not (folder / "reference.json").is_file():
        tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return Configuration(name, checks=[Check("reference made", False, f"MaxText's reference failed: {tail}")])
    reference = json.loads((folder / "reference.json").read_text())
    return _configuration(opts, name, work, folder, reference, "MaxText's own forward")


def _backend(python: str) -> str:
    """jax's default backend, asked in a fresh process (jax picks it once)."""
    done = proc.run([python, "-c", "import jax; print(jax.default_backend())"], check=False, timeout=300,
                    what="asking jax which backend it has")
    lines = done.stdout.strip().splitlines()
    return lines[-1] if done.returncode == 0 and lines else f"none (jax failed: {(done.stderr.strip().splitlines() or ['?'])[-1]})"


def _configuration(opts: SmokeOptions, name: str, work: pathlib.Path, checkpoint: pathlib.Path,
                   reference: list[dict[str, Any]], by: str) -> Configuration:
    config = Configuration(name)
    request = work / f"{name}.request.json"
    result_path = work / f"{name}.result.json"
    request.write_text(json.dumps({"config": name, "checkpoint": str(checkpoint), "cpu_simulation": opts.cpu_simulation,
                                   "generates": checks.generates()}))
    with step("smoke", f"{name}: starting the engine on all chips and generating"):
        try:
            done = proc.run([opts.python, "-m", "maxtext_rl_overlay.smoke.engine", str(request), str(result_path)],
                            check=False, timeout=opts.timeout, what=f"the {name} engine")
        except OverlayError:  # past the timeout: the process is stopped
            config.checks.append(Check("engine ran", False, f"no result within {opts.timeout:.0f} s; it was in: {_step(result_path)}"))
            return config
    if not result_path.is_file():
        tail = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        config.checks.append(Check("engine ran", False, f"the engine process died in: {_step(result_path)} ({tail})"))
        return config
    result = json.loads(result_path.read_text())
    config.chips, config.mesh, config.stand_ins = result.get("chips", 0), result.get("mesh", {}), result.get("stand_ins", [])
    config.seconds = result["seconds"]
    if "stopped" in result:
        config.checks.append(Check("engine ran", False, f"stopped in {result['step']}: {result['stopped']}"))
        return config
    config.checks.append(Check("engine ran", True, f"mesh {config.mesh}"))
    config.checks += checks.greedy(result["generates"]["greedy"], reference, result["platform"], by)
    rows = result["generates"]["sampled"]
    ranks = None
    if by == "transformers":  # transformers ranks on the CPU, beside the engine; MaxText's forward would need the chips
        with step("smoke", f"{name}: ranking the sampled tokens with transformers"):
            ranks = tiny_llama.reference_ranks(checkpoint, checks.SAMPLED_PROMPT, [r["tokens"] for r in rows])
    config.checks += checks.sampled(rows, ranks)
    return config


def _step(result_path: pathlib.Path) -> str:
    progress = engine.progress_file(result_path)
    try:
        return str(json.loads(progress.read_text())["step"])
    except (OSError, ValueError, KeyError):
        return "the start of the process"
