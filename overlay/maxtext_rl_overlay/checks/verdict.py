"""The skeleton every command that gives a verdict shares (verify, smoke,
test-matrix): its report (--json FILE) written first as a placeholder that
says the command did not finish, then the run, the table on stdout, the
report written whole, the verdict line (yes on stdout; NO on stderr, with
what to do, and under GitHub Actions an ::error:: annotation) and the exit
status. Each command gives its kind, its report's path, its run, its table
and its verdict; the report's document and its form are the command's and
reports.py's."""

from __future__ import annotations

import dataclasses
import pathlib
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ..core import output, staging
from ..core.errors import ExitCode, OverlayError
from . import reports

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Said:
    """A run's verdict: `line` led by the command's name (None: the command
    prints none, its table is its answer), and on a NO what to do (stderr,
    after the line)."""

    ok: bool
    line: str | None
    advice: tuple[str, ...] = ()


def write_report(kind: reports.Kind, path: pathlib.Path, document: reports.Document) -> None:
    """A command's --json FILE: the one place it is written, whole or not at
    all; an existing FILE only where it is empty or a report of that kind
    (a typo must not cost a file)."""
    staging.write_atomically(path, reports.dumps(document), owner=reports.owner(kind))


@dataclasses.dataclass(frozen=True)
class Command(Generic[T]):
    """One verdict command: `run` does the work; `render` is the table;
    `judge` the verdict; `document` the report for an outcome (None: not
    finished; one of `stops`: the run ended early, in its own words)."""

    kind: reports.Kind
    report: pathlib.Path | None
    run: Callable[[], T]
    render: Callable[[T], str]
    judge: Callable[[T], Said]
    document: Callable[[Any], reports.Document]
    stops: tuple[type[OverlayError], ...] = ()  # errors the run ends with that the report records
    stopped: Callable[[OverlayError], str] = str  # the verdict line of one of them (stderr; the status is the error's)

    def __call__(self) -> int:
        # Before any work: FILE must be writable and absent, empty or this
        # kind's own (else an OverlayError naming it: status 3); until the end
        # it says the command did not finish, never what an earlier run found.
        self._write(None)
        try:
            result = self.run()
        except self.stops as exc:
            self._write(exc)
            output.verdict(self.stopped(exc))
            output.annotate_error(self.stopped(exc))
            return exc.status
        print(self.render(result))
        self._write(result)
        said = self.judge(result)
        if said.line is not None and said.ok:
            print(f"\n{said.line}")
        elif said.line is not None:
            output.verdict(f"\n{said.line}")
            for line in said.advice:
                output.verdict(f"  {line}")
            output.annotate_error(said.line)
        return ExitCode.OK if said.ok else ExitCode.CHECK_FAILED

    def _write(self, outcome: object) -> None:
        if self.report:
            write_report(self.kind, self.report, self.document(outcome))
