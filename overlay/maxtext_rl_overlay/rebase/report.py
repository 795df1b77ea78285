"""What a rebase run did, for render() and for the command's exit code."""

from __future__ import annotations

import dataclasses

from .state import PatchEntry, PinValues


@dataclasses.dataclass
class Report:
    name: str
    old: PinValues  # the pin before
    new: PinValues  # the pin after (only the commit while the series is not written)
    patches: list[PatchEntry]
    stopped: bool = False  # at a conflict: --continue or --abort
    message: str = ""  # what to do next
    notes: list[str] = dataclasses.field(default_factory=list)
    tests: str = ""  # the fast tests' summary line
    tests_ok: bool = True
    seconds: float = 0.0

    @property
    def needs_action(self) -> bool:
        """The person has to act before the result is usable: a conflict, or
        a failing fast test (the command then exits CHECK_FAILED)."""
        return self.stopped or not self.tests_ok
