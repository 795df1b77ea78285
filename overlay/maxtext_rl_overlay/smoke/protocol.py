"""What `smoke`'s parent (run.py) and its engine process (engine.py) say to
each other, typed: the `Request` the parent writes as REQUEST.json, the
`Result` the engine writes as RESULT.json, and the progress file beside it
that says which step the engine is in while it runs."""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

#: The step a run that ended well ends in.
DONE = "done"


@dataclasses.dataclass(frozen=True)
class Generate:
    """One `llm.generate`: its name, its prompts (token ids) and its
    SamplingParams arguments: one dict, or one per prompt (one batch then
    holds greedy rows beside sampled ones)."""

    name: str
    prompts: list[list[int]]
    params: dict[str, Any] | list[dict[str, Any]]


@dataclasses.dataclass(frozen=True)
class SecondModel:
    """The model synced into the running engine, and the generates after it."""

    checkpoint: str
    generates: list[Generate]


@dataclasses.dataclass(frozen=True)
class Request:
    """What the parent asks of one engine process (REQUEST.json)."""

    config: str
    checkpoint: str
    cpu_simulation: bool
    generates: list[Generate]
    sync: SecondModel | None = None
    #: The matmul precision the engine runs the generates above at
    #: (jax_default_matmul_precision); None: jax's default.
    precision: str | None = None
    #: Generates run last, after switching back to jax's default precision
    #: (what train_rl runs at): measured against a bound of their own.
    at_default_precision: list[Generate] = dataclasses.field(default_factory=list)

    def to_json(self) -> str:
        def wire(generates: list[Generate]) -> list[Any]:
            return [[g.name, g.prompts, g.params] for g in generates]

        sync = {"checkpoint": self.sync.checkpoint, "generates": wire(self.sync.generates)} if self.sync else None
        return json.dumps({"config": self.config, "checkpoint": self.checkpoint, "cpu_simulation": self.cpu_simulation,
                           "generates": wire(self.generates), "sync": sync, "precision": self.precision,
                           "at_default_precision": wire(self.at_default_precision)})

    @classmethod
    def from_json(cls, text: str) -> Request:
        doc = json.loads(text)
        sync = doc.get("sync")
        return cls(doc["config"], doc["checkpoint"], doc["cpu_simulation"], [Generate(*g) for g in doc["generates"]],
                   SecondModel(sync["checkpoint"], [Generate(*g) for g in sync["generates"]]) if sync else None,
                   doc.get("precision"), [Generate(*g) for g in doc.get("at_default_precision", [])])


@dataclasses.dataclass
class Result:
    """What one engine process did (RESULT.json)."""

    config: str
    step: str = ""  # the step it is in, or ended in (DONE, or where it stopped)
    chips: int = 0
    platform: str = ""  # jax's backend
    precision: str = ""  # the matmul precision of the request's generates: "highest", or "default" (jax's)
    mesh: dict[str, int] = dataclasses.field(default_factory=dict)  # the runner's: axis -> size
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)  # "engine_start", each generate, "sync"
    #: Each generate's rows: {"tokens": [...], "logprobs": [...]}.
    generates: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)
    stand_ins: list[str] = dataclasses.field(default_factory=list)  # what stood in for the TPU
    compiles: dict[str, tuple[int, float]] = dataclasses.field(default_factory=dict)  # step -> (programs, seconds)
    sync_path: str | None = None  # the code that synced the second model, in words, once it has
    stopped: str | None = None  # the exception that stopped the engine

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    @classmethod
    def from_json(cls, text: str) -> Result:
        doc = json.loads(text)
        doc["compiles"] = {step: (count, seconds) for step, (count, seconds) in doc.get("compiles", {}).items()}
        return cls(**doc)


def progress_file(result: pathlib.Path) -> pathlib.Path:
    """Where a run keeps the step it is in, beside its result."""
    return result.with_name(result.stem + ".progress.json")


def step_of(result: pathlib.Path) -> str:
    """The step the run writing `result` was in last, as its progress file says."""
    try:
        return str(json.loads(progress_file(result).read_text())["step"])
    except (OSError, ValueError, KeyError):
        return "the start of the process"
