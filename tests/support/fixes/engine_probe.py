"""The engine probe: starts support/programs/engine_start.py (the tool's
smoke engine with the engine start test's recorders) in a process of its own,
and reads what it wrote (tests/fixes/tpu-inference/test_series_engine_start.py).

The result is the tool's engine `Result` as JSON (maxtext_rl_overlay.smoke.protocol),
with the program's recordings beside it (its docstring lists them) and
`log`, the process's stderr.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
from typing import Any

import pytest

from maxtext_rl_overlay.smoke import pallas_interpret
from maxtext_rl_overlay.smoke.protocol import progress_file
from support import TESTS
from support.fixes import kernel_mode
from support.fixes.matrix import PLATFORM

#: One engine process's bound (start, every generate; 1-2 minutes on 2 cores):
#: past it the test fails with the step the engine was in.
ENGINE_TIMEOUT = 1200


def start_engine(tmp_path: pathlib.Path, checkpoint: pathlib.Path, config: str, upstream: bool) -> dict[str, Any]:
    """engine_start.py's result for `config` on `checkpoint` (the pin's sampler where `upstream`)."""
    out = tmp_path / "result.json"
    # tests/ on the child's import path, as pytest's `pythonpath` puts it on this
    # process's: the program imports the support package.
    path = os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, MRL_PLATFORM=PLATFORM, PYTHONPATH=path)
    args = ["--checkpoint", str(checkpoint), "--config", config] + (["--upstream"] if upstream else [])
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "support.programs.engine_start", str(out), *args],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=ENGINE_TIMEOUT,
        )
    except subprocess.TimeoutExpired as error:
        progress = progress_file(out)
        where = json.loads(progress.read_text()) if progress.is_file() else {"step": "its imports"}
        log = error.stderr.decode(errors="replace") if isinstance(error.stderr, bytes) else (error.stderr or "")
        pytest.fail(f"engine_start.py --config {config}{' --upstream' if upstream else ''} timed out after {ENGINE_TIMEOUT} s in step "
                    f"{where['step']} (last event: {where.get('last_event')}):\n{log[-4000:]}")
    assert proc.returncode == 0 and out.is_file(), f"engine_start.py failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    result: dict[str, Any] = json.loads(out.read_text())
    result["log"] = proc.stderr
    return result


def started(result: dict[str, Any]) -> bool:
    return "engine_start" in result["seconds"]


def describe(result: dict[str, Any]) -> str:
    """The exception that stopped the engine, the step it was in, and the innermost frames."""
    stopped = result.get("error") or {}
    frames = "\n".join(f"    {f['file']} {f['function']}: {f['line']}" for f in stopped.get("frames", [])[-8:])
    return f"stopped: {stopped.get('type')} in {result['step']}: {stopped.get('message', '')[:400]}\n{frames}"


def events_of(result: dict[str, Any], step: str) -> list[dict[str, Any]]:
    return [e for e in result["events"] if e["step"] == step]


def sampler_programs(result: dict[str, Any]) -> dict[str, list[str]]:
    """Each precompiled sampling and logprobs program the engine compiled
    (engine_start.py compiles it again and reads its HLO): the collectives
    yielding a tensor with the vocab as a dimension."""
    programs = result["programs"]
    assert programs and not [p for p in programs if p.get("failed")], programs
    return {f"{p['name']}{p['shapes']}": p["vocab_collectives"] for p in programs}


def record_stand_in(record_property: Any, result: dict[str, Any]) -> None:
    """The engine's TPU kernels' stand-in (where one was active), in the JUnit record."""
    if any(s.startswith(f"{pallas_interpret.LABEL}: ") for s in result["stand_ins"]):
        record_property(kernel_mode.PROPERTY, pallas_interpret.LABEL)


def record_run(record_property: Any, result: dict[str, Any]) -> None:
    """The stand-ins and the seconds of the engine's start and generates, in the JUnit record."""
    record_stand_in(record_property, result)
    for name, seconds in result["seconds"].items():
        record_property(f"seconds_{name}", str(seconds))
