"""The one channel for what the tool tells a person on stderr.

stdout is for results (tables, paths, JSON, the verdicts `__main__` prints);
every line meant for a person watching a run goes through here instead, so
that it has one form, one switch for -v, and one place a test can catch it.

The rule for a line's form: its prefix says whose it is, then an optional
marker, then the text.

- A line of one stage or distribution (`who`: "tpu-inference", "build",
  "constraints") starts with `[who] `: the progress of a step
  (`step(who, what)`: "[who] what ...", then "[who] what: done in 1.2s" or
  "... failed after 1.2s") and its notes (`note(who, text)`).
- A line about the run as a whole, of no one stage (what a stopped run left
  and this one cleared, a lock file it could not remove), starts with
  `maxtext-rl-overlay: `, as the command line's own error lines do.
- A warning (something to act on that does not stop the run) has the marker
  `warning: ` after either prefix (`warn(text, who=...)`).
- A command's NO verdict and what to do about it (`verify: NO - ...`,
  `smoke: NO - ...`), said on stderr so that a script sees the failure
  beside the status, starts with the command's name: `verdict(line)`. The
  command line's own errors are lines about the run (`say("error: ...")`).
- Another program's output relayed to the person (the -v stream of a long
  step, a cell's verify report) is the prefix then `| ` before each of its
  lines, and under -v each command is echoed as the prefix then `$ `.

Where the lines go is the sink held in a context variable (as pypa/build
holds its logger): stderr, looked up at each write (so pytest's capsys sees
it), unless a test swaps it with `captured()`. The -v switch (`verbose`,
`set_verbose`) is held beside it. A thread started to pump a child's output
runs in a copy of its starter's context (`in_this_context`), so its lines go
to the same sink.

Under GitHub Actions (GITHUB_ACTIONS=true, where the release and the refresh
run) the lines are the same, and two workflow commands are added: a long
step's lines are folded between `::group::` and `::endgroup::` (its end,
done or failed, after the fold, so it shows), and a NO verdict is also an
`::error::` annotation (`annotate_error`)."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

#: The prefix of a line about the run as a whole (and of the CLI's errors).
TOOL = "maxtext-rl-overlay"

Sink = Callable[[str], None]


def _stderr(line: str) -> None:
    # sys.stderr looked up at each write: a test's capsys, or a redirected stream, is the one in place now.
    print(line, file=sys.stderr, flush=True)


_sink: contextvars.ContextVar[Sink] = contextvars.ContextVar("maxtext_rl_overlay.core.output.sink", default=_stderr)
_verbose: contextvars.ContextVar[bool] = contextvars.ContextVar("maxtext_rl_overlay.core.output.verbose", default=False)


def prefix(who: str = "") -> str:
    """A line's prefix: `[who] ` for a stage's, the tool's name for the run's."""
    return f"[{who}] " if who else f"{TOOL}: "


def emit(line: str) -> None:
    """Write one whole line, already in its form, to the sink."""
    _sink.get()(line)


def note(who: str, text: str) -> None:
    """A stage's note: `[who] text`."""
    emit(f"{prefix(who)}{text}")


def say(text: str) -> None:
    """A line about the run as a whole: `maxtext-rl-overlay: text`."""
    emit(f"{prefix()}{text}")


def verdict(line: str) -> None:
    """A command's verdict for the person (a NO and what to do), already led
    by the command's name (`verify: NO - ...`): written as it is."""
    emit(line)


def github_actions() -> bool:
    """Whether this runs under GitHub Actions (looked up at each call)."""
    return os.environ.get("GITHUB_ACTIONS") == "true"


def _workflow_text(text: str) -> str:
    # A workflow command's value is one line: GitHub's own escapes.
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def annotate_error(line: str) -> None:
    """Under GitHub Actions, `line` (a NO verdict, already said) as an
    `::error::` annotation too; elsewhere nothing."""
    if github_actions():
        emit(f"::error::{_workflow_text(line.strip())}")


def warn(text: str, *, who: str = "") -> None:
    """A warning: the prefix (the stage's, or the tool's), then `warning: text`."""
    emit(f"{prefix(who)}warning: {text}")


def relay(text: str, *, who: str = "") -> None:
    """Another program's output, line by line: the prefix, then `| line`."""
    for line in text.splitlines():
        emit(f"{prefix(who)}| {line.rstrip()}")


def command(text: str, *, who: str = "") -> None:
    """The -v echo of a command line (only under -v): the prefix, then `$ text`."""
    if verbose():
        emit(f"{prefix(who)}$ {text}")


def verbose() -> bool:
    """Whether -v was given: commands are echoed and long steps' output streamed."""
    return _verbose.get()


def set_verbose(on: bool) -> None:
    """Set -v for the rest of the run (the CLI calls it once, before any work)."""
    _verbose.set(on)


def in_this_context(target: Callable[..., Any]) -> Callable[..., Any]:
    """`target`, to run in a copy of the current context: a thread started
    with it writes to this sink, under this -v (a new thread otherwise
    starts with the variables' defaults)."""
    context = contextvars.copy_context()
    return lambda *args, **kwargs: context.run(target, *args, **kwargs)


@dataclasses.dataclass
class Captured:
    """The lines written while `captured()` held the sink, in order."""

    lines: list[str] = dataclasses.field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(line + "\n" for line in self.lines)


@contextlib.contextmanager
def captured(*, verbose: bool | None = None) -> Iterator[Captured]:
    """Collect every line written in the block instead of writing it (for
    tests); with `verbose`, -v is that for the block. Both are put back
    after it."""
    got = Captured()
    sink = _sink.set(got.lines.append)
    switch = _verbose.set(verbose) if verbose is not None else None
    try:
        yield got
    finally:
        if switch is not None:
            _verbose.reset(switch)
        _sink.reset(sink)


class _Step:
    """`step(who, what)`: a timed step, said when it starts and when it ends;
    `step.note(who, text)`: a note of that stage (the same as `note`)."""

    def __call__(self, who: str, what: str) -> contextlib.AbstractContextManager[None]:
        return self._timed(who, what)

    @contextlib.contextmanager
    def _timed(self, who: str, what: str) -> Iterator[None]:
        start = time.monotonic()
        grouped = github_actions()
        if grouped:
            emit(f"::group::{_workflow_text(prefix(who) + what)}")
        note(who, f"{what} ...")
        try:
            yield
        except BaseException:
            if grouped:
                emit("::endgroup::")
            note(who, f"{what}: failed after {time.monotonic() - start:.1f}s")
            raise
        if grouped:
            emit("::endgroup::")
        note(who, f"{what}: done in {time.monotonic() - start:.1f}s")

    @staticmethod
    def note(who: str, text: str) -> None:
        note(who, text)


step = _Step()
