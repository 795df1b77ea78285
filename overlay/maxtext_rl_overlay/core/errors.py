"""The tool's exit statuses, and its exceptions: every failure the user can
act on, each carrying the status the command exits with when it ends there
(the CLI reads it from the error, as it prints the message)."""

from __future__ import annotations

import enum
from typing import ClassVar


class ExitCode(enum.IntEnum):
    """The same for every subcommand; --help and docs/command.md list them."""
    OK = 0
    #: The command ran and its answer is no: verify found a difference or a
    #: failed import, lint found problems, the matrix or the rebase's fast
    #: tests failed, or the rebase stopped at a conflict.
    CHECK_FAILED = 1
    #: The command line was wrong (argparse's own status).
    USAGE = 2
    #: The command could not do its work; the message says why and what to do.
    ERROR = 3
    #: An error the tool did not expect: a bug, to be reported (the
    #: traceback is shown with -v).
    INTERNAL = 4
    INTERRUPTED = 130


class OverlayError(Exception):
    """A failure with a message that says what went wrong and what to do next.

    The CLI prints the message alone (no traceback) and exits with `status`.
    """

    status: ClassVar[ExitCode] = ExitCode.ERROR


class UsageError(OverlayError):
    """The command line was wrong in a way argparse cannot see (a flag that
    excludes another, an argument given twice): the CLI prints the usage."""

    status = ExitCode.USAGE


class CheckFailed(OverlayError):
    """A check the command exists to make said no in a way that stops it
    (smoke's stack fails to import): the answer, not a failure to answer."""

    status = ExitCode.CHECK_FAILED


class TimedOut(OverlayError):
    """A program did not finish within the seconds it was given (`proc.run`'s
    `timeout`); it was stopped, its whole process group with it. Callers that
    report a time-out as an answer ("timed out after N s") catch this, and
    only this."""

    def __init__(self, program: str, seconds: float, *, what: str, blame: str = "") -> None:
        self.program, self.seconds = program, seconds
        super().__init__(f"{blame}{what}: {program} did not finish within {seconds:.0f} s.")


class ProgramMissing(OverlayError):
    """A program to run is not installed, or not on PATH: nothing was
    started."""

    def __init__(self, program: str, *, what: str, blame: str = "") -> None:
        self.program = program
        super().__init__(f"{blame}{what}: {program} is not installed (or not on PATH).")
