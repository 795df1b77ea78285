"""SIGINT, SIGTERM, SIGHUP and SIGQUIT: one way out, and never lost.

`installed` (around the command's whole run) makes each of them raise
KeyboardInterrupt in the main thread, so that a terminated run, or one whose
terminal or SSH connection dropped (SIGHUP), cleans up like an interrupted
one, and records that a signal came. A signal the tool was started with
ignored stays ignored: under `nohup` a hang-up does not stop the build. The record matters
because Python runs a signal handler between any two bytecodes of the main
thread, a finaliser's included, and an exception raised in a finaliser is
printed and dropped: the points where a lost signal would do harm (before a
program starts, after it ends, before a result is published) call `check`,
which raises again for a signal that came and was swallowed.

Inside `held()` a signal is only recorded, and raised when the block ends:
around starting a child (so that the tool always holds the child it has to
stop), around stopping children and removing folders (so that a second
signal does not cut the cleanup short), and around the renames that publish
a result (so that the old result or the new one is in place, never neither,
nor half of each)."""

from __future__ import annotations

import contextlib
import os
import signal
import types
from collections.abc import Iterator

#: The signals that stop a run, each the same way (the command then exits 130).
SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
#: The signal that came, if one did (the first one).
_pending: int | None = None
#: How many `held` blocks the main thread is in.
_holding = 0
#: Whether a `publication` has ended: what an interrupt from then on leaves.
_published = False
#: Which of stdout and stderr were a terminal when the run began.
_terminal: tuple[int, ...] = ()


@contextlib.contextmanager
def installed() -> Iterator[None]:
    """The handlers of SIGNALS for the block (the command's whole run), with
    no signal recorded; after it, the previous handlers again, and the
    record forgotten. A signal ignored when the block begins (nohup's
    SIGHUP, a background job's SIGINT) is left ignored."""
    global _pending, _published, _terminal
    _pending, _published = None, False
    # Asked now: once the terminal has hung up, isatty says no.
    _terminal = tuple(fd for fd in (1, 2) if os.isatty(fd))
    previous = {sig: signal.signal(sig, _handler) for sig in SIGNALS if signal.getsignal(sig) != signal.SIG_IGN}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _pending, _published = None, False


def _handler(signum: int, frame: types.FrameType | None) -> None:
    global _pending
    if signum == signal.SIGHUP:
        _leave_the_terminal()
    if _pending is None:
        _pending = signum
    if _holding == 0:
        raise KeyboardInterrupt


def _leave_the_terminal() -> None:
    """After a hang-up every write to the terminal fails (EIO), and an
    error printing a progress line would cut the cleanup short, or turn the
    exit status into Python's 120: what went to the terminal goes to
    /dev/null from now on (no one is left to read it)."""
    if not _terminal:
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in _terminal:
            os.dup2(null, fd)
    finally:
        os.close(null)


def published() -> bool:
    """Whether the run's results were published (a `publication` ended):
    an interrupt from then on leaves them in place."""
    return _published


def check() -> None:
    """Raise KeyboardInterrupt if a signal came (even one whose exception
    was swallowed on the way); inside `held` the block's end raises it."""
    if _pending is not None and _holding == 0:
        raise KeyboardInterrupt


class held:
    """A block a signal does not cut: the signal is recorded and raised
    when the block ends (`raise_after=False`: only recorded, for cleanup
    that runs while an exception is already on its way out)."""

    def __init__(self, *, raise_after: bool = True) -> None:
        self._raise_after = raise_after
        self._active = False

    def _hold(self) -> None:
        global _holding
        _holding += 1
        self._active = True

    def __enter__(self) -> held:
        self._hold()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: types.TracebackType | None) -> None:
        global _holding
        if not self._active:
            return
        _holding -= 1
        self._active = False
        if exc_type is None:
            self._done()
            if self._raise_after and _holding == 0 and _pending is not None:
                raise KeyboardInterrupt

    def _done(self) -> None:
        pass


class publication(held):
    """The end of a run that publishes its results: `begin()` is the last
    point where a signal leaves everything as it was; from there to the end
    of the block a signal waits, and is raised once all is published
    (`published()` then says so)."""

    def __enter__(self) -> publication:
        return self

    def begin(self) -> None:
        check()
        self._hold()

    def _done(self) -> None:
        global _published
        _published = True
