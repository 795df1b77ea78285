"""Running a program: the one way every stage does it.

`run` captures the program's output and, when it fails and the caller asked
for success, turns the failure into an OverlayError that names the program,
says what it was doing and ends with the tail of its output: the user sees
why, never a CalledProcessError traceback.

Each program runs in a process group of its own, and an interrupt, a time-out
or any other exception while it runs stops the whole group (SIGTERM, then
SIGKILL after STOP_GRACE seconds) and waits until no process of it is left:
a build backend that uv started must not go on writing into a folder the
tool is removing. A terminal's Ctrl-C reaches only the tool (the groups are
not in the foreground), which stops the program the same way.

`-v` (output.verbose) echoes each command line and streams the output of
the long steps (`log=True`: builds, installs, resolutions, test runs) as it
comes, through the output channel, while still capturing it for the error
message."""

from __future__ import annotations

import os
import pathlib
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any

from . import interrupts, output
from .errors import OverlayError, ProgramMissing, TimedOut

#: How many lines of a failed program's output an error message ends with.
TAIL_LINES = 15
#: Seconds a stopped program's group has between SIGTERM and SIGKILL.
STOP_GRACE = 5.0
#: Seconds to wait for the processes of a group to be gone after SIGKILL
#: (a process finishes the system call it is in first).
KILL_WAIT = 10.0

#: -v is held by the output channel; this name stays for the CLI's call.
set_verbose = output.set_verbose


def run(
    cmd: Sequence[str | os.PathLike[str]],
    *,
    what: str,
    who: str = "",
    cwd: pathlib.Path | None = None,
    env: Mapping[str, str] | None = None,
    inherit_env: bool = True,
    input: str | bytes | None = None,
    text: bool = True,
    check: bool = True,
    log: bool = False,
    capture: bool = True,
    timeout: float | None = None,
    tail: int = TAIL_LINES,
) -> subprocess.CompletedProcess[Any]:
    """Run `cmd` to completion and return it with its output captured.

    `what` says what the command does ("making the build venv"), for the
    error message and the -v echo; `who` is the distribution or stage it
    runs for. `env` is added to this process's environment (or, without
    `inherit_env`, is the whole environment). With
    `check` a non-zero exit raises OverlayError; without, the caller reads
    the return code. Without `capture` the output goes to this process's
    stdout and stderr (a test run the user watches). Past `timeout` the
    program is stopped and TimedOut is raised, with or without `check`; a
    program not installed is ProgramMissing."""
    args = [os.fspath(c) for c in cmd]
    full_env = (dict(os.environ, **env) if inherit_env else dict(env)) if env is not None else None
    blame = f"{who}: " if who else ""  # the error messages' form
    data = input.encode() if isinstance(input, str) and not text else input
    streamed = output.verbose() and log and capture
    child = _spawn(args, what=what, blame=blame, who=who, echo=shlex.join(args) + (f"   (in {cwd})" if cwd else ""),
                   cwd=cwd, env=full_env, stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
                   stdout=subprocess.PIPE if capture else None, stderr=subprocess.PIPE if capture else None, text=text)
    try:
        out, err = _streamed(child, data, text, timeout, who) if streamed else child.communicate(data, timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(child)
        assert timeout is not None  # (only a timeout expires)
        raise TimedOut(args[0], timeout, what=what, blame=blame) from None
    except BaseException:
        stop(child)
        if not streamed:  # (the pumping threads end at the pipes' end of file)
            _close_pipes(child)
        raise
    interrupts.check()  # a signal that came while it ran, whose exception was swallowed
    done = subprocess.CompletedProcess(args, child.returncode, out, err)
    if check and done.returncode != 0:
        raise OverlayError(f"{blame}{what} failed ({_name(args)} exited with {done.returncode}):\n    " + "\n    ".join(output_tail(done, tail)))
    return done


def start(cmd: Sequence[str | os.PathLike[str]], *, what: str, output: pathlib.Path) -> subprocess.Popen[Any]:
    """Start `cmd` in the background, in a process group of its own, with
    its output (stdout and stderr) written to the file `output`, and return
    it. `run`'s rules for the start (`_spawn`). The caller owns the child
    from then on: it waits for it and, whatever happens, stops it with
    `stop` while it runs."""
    args = [os.fspath(c) for c in cmd]
    with output.open("w") as log:  # the child has its own copy of the file from here
        return _spawn(args, what=what, blame="", who="", echo=f"{shlex.join(args)} > {output}   (in the background)",
                      stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)


def _spawn(args: list[str], *, what: str, blame: str, who: str, echo: str, **popen: Any) -> subprocess.Popen[Any]:
    """Start `args` in a process group of its own, with Popen's `popen`
    arguments: `run`'s and `start`'s one way to start a program. `echo` is
    the -v echo of the command line (said only under -v); a signal whose exception was swallowed
    on the way starts nothing; a signal during the start stops the child
    before it is raised; a program not installed is ProgramMissing naming
    `what` (after `blame`, the distribution or stage); `who` is whose
    line the echo is."""
    output.command(echo, who=who)
    interrupts.check()  # a signal whose exception was swallowed on the way: start nothing more
    child: subprocess.Popen[Any] | None = None
    try:
        # Held: a signal during the start is raised once `child` is known,
        # so that the except clauses below can stop it.
        with interrupts.held():
            child = subprocess.Popen(args, process_group=0, **popen)
    except FileNotFoundError:
        if child is not None:
            stop(child)
            _close_pipes(child)
            raise
        raise ProgramMissing(args[0], what=what, blame=blame) from None
    except BaseException:
        if child is not None:
            stop(child)
            _close_pipes(child)
        raise
    return child


def stop(child: subprocess.Popen[Any]) -> None:
    """Stop `child`'s process group and wait until no process of it is left
    (SIGKILL after STOP_GRACE seconds). Never raises, and a second signal
    does not cut it short."""
    with interrupts.held(raise_after=False):
        group = child.pid  # process_group=0: the child leads a group of its own
        _signal_group(group, signal.SIGTERM)
        if not _wait_group(child, group, STOP_GRACE):
            _signal_group(group, signal.SIGKILL)
            if not _wait_group(child, group, KILL_WAIT):
                output.warn(f"process group {group} was still there {STOP_GRACE + KILL_WAIT:.0f} s after it was stopped.")


def _close_pipes(child: subprocess.Popen[Any]) -> None:
    for stream in (child.stdin, child.stdout, child.stderr):
        if stream is not None:
            try:
                stream.close()
            except OSError:  # stdin's unwritten input to a program that is gone
                pass


def _signal_group(group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except (ProcessLookupError, PermissionError):  # gone already; a member we may not signal (set-uid)
        pass


def _wait_group(child: subprocess.Popen[Any], group: int, seconds: float) -> bool:
    """Wait until the child has exited (and is reaped) and no live process is
    left in its group; False if some still are after `seconds`."""
    deadline = time.monotonic() + seconds
    while True:
        child.poll()
        if child.returncode is not None and not _group_alive(group):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)


def _group_alive(group: int) -> bool:
    """Whether a process of the group is still running. kill(0) also counts
    zombies, which do nothing more (an orphan's stays until its new parent
    reaps it): on Linux, /proc tells them apart."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        pids = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return True  # no /proc: a zombie counts as alive, and the wait is bounded
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()  # state, ppid, pgrp, ...
        if int(fields[2]) == group and fields[0] not in ("Z", "X"):
            return True
    return False


def output_tail(proc: subprocess.CompletedProcess[Any], lines: int = TAIL_LINES) -> list[str]:
    """The last non-empty lines of what a finished program printed."""
    out = "".join(s if isinstance(s, str) else s.decode(errors="replace") for s in (proc.stdout, proc.stderr) if s)
    kept = [line for line in out.strip().splitlines() if line.strip()]
    return kept[-lines:] or ["(no output)"]


def _name(args: list[str]) -> str:
    """`git am`, `uv pip compile`: the program and its subcommand words."""
    words = [pathlib.Path(args[0]).name]
    for arg in args[1:3]:
        if arg.startswith("-") or "/" in arg or "=" in arg:
            break
        words.append(arg)
    return " ".join(words)


def _streamed(child: subprocess.Popen[Any], data: str | bytes | None, text: bool, timeout: float | None, who: str) -> tuple[Any, Any]:
    """Like communicate, relaying each line to the output channel as it arrives."""
    captured: dict[str, list[Any]] = {"out": [], "err": []}

    def pump(stream: IO[Any], key: str) -> None:
        for line in stream:
            captured[key].append(line)
            shown = line if isinstance(line, str) else line.decode(errors="replace")
            output.relay(shown, who=who)

    assert child.stdout is not None and child.stderr is not None
    # In the caller's context: the pumps write to its sink (a test's capture).
    threads = [threading.Thread(target=output.in_this_context(pump), args=(child.stdout, "out"), daemon=True),
               threading.Thread(target=output.in_this_context(pump), args=(child.stderr, "err"), daemon=True)]
    for t in threads:
        t.start()
    if data is not None and child.stdin is not None:
        child.stdin.write(data)
        child.stdin.close()
    child.wait(timeout=timeout)
    for t in threads:
        t.join()
    joined = "" if text else b""
    return joined.join(captured["out"]), joined.join(captured["err"])
