"""Running a program: the one way every stage does it.

`run` captures the program's output and, when it fails and the caller asked
for success, turns the failure into an OverlayError that names the program,
says what it was doing and ends with the tail of its output: the user sees
why, never a CalledProcessError traceback.

`-v` (set_verbose) echoes each command line to stderr and streams the output
of the long steps (`log=True`: builds, installs, resolutions, test runs) as it
comes, while still capturing it for the error message."""

from __future__ import annotations

import os
import pathlib
import shlex
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import OverlayError

#: How many lines of a failed program's output an error message ends with.
TAIL_LINES = 15

_verbose = False


def set_verbose(on: bool) -> None:
    global _verbose
    _verbose = on


def verbose() -> bool:
    return _verbose


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
    timeout: float | None = None,
    tail: int = TAIL_LINES,
) -> subprocess.CompletedProcess[Any]:
    """Run `cmd` to completion and return it with its output captured.

    `what` says what the command does ("making the build venv"), for the
    error message and the -v echo; `who` is the distribution or stage it
    runs for. `env` is added to this process's environment (or, without
    `inherit_env`, is the whole environment). With
    `check` a non-zero exit raises OverlayError; without, the caller reads
    the return code. `timeout` raises OverlayError either way."""
    args = [os.fspath(c) for c in cmd]
    full_env = (dict(os.environ, **env) if inherit_env else dict(env)) if env is not None else None
    prefix = f"[{who}] " if who else ""  # the progress lines' form, for the -v echo
    blame = f"{who}: " if who else ""  # the error messages' form
    if _verbose:
        print(f"{prefix}$ {shlex.join(args)}" + (f"   (in {cwd})" if cwd else ""), file=sys.stderr, flush=True)
    data = input.encode() if isinstance(input, str) and not text else input
    try:
        if _verbose and log:
            proc = _streamed(args, cwd, full_env, data, text, timeout, prefix)
        else:
            proc = subprocess.run(args, cwd=cwd, env=full_env, input=data, capture_output=True, text=text, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise OverlayError(f"{blame}{what}: {args[0]} did not finish within {timeout:.0f} s.") from None
    except FileNotFoundError:
        raise OverlayError(f"{blame}{what}: {args[0]} is not installed (or not on PATH).") from None
    if check and proc.returncode != 0:
        raise OverlayError(f"{blame}{what} failed ({_name(args)} exited with {proc.returncode}):\n    " + "\n    ".join(output_tail(proc, tail)))
    return proc


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


def _streamed(args: list[str], cwd: pathlib.Path | None, env: dict[str, str] | None, data: str | bytes | None,
              text: bool, timeout: float | None, prefix: str) -> subprocess.CompletedProcess[Any]:
    """Like subprocess.run with capture_output, echoing each line to stderr as it arrives."""
    popen = subprocess.Popen(args, cwd=cwd, env=env, stdin=subprocess.PIPE if data is not None else subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=text)
    captured: dict[str, list[Any]] = {"out": [], "err": []}

    def pump(stream: Any, key: str) -> None:
        for line in stream:
            captured[key].append(line)
            shown = line if isinstance(line, str) else line.decode(errors="replace")
            sys.stderr.write(f"{prefix}| {shown.rstrip()}\n")
            sys.stderr.flush()

    threads = [threading.Thread(target=pump, args=(popen.stdout, "out"), daemon=True),
               threading.Thread(target=pump, args=(popen.stderr, "err"), daemon=True)]
    for t in threads:
        t.start()
    if data is not None and popen.stdin is not None:
        popen.stdin.write(data)
        popen.stdin.close()
    try:
        code = popen.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait()
        raise
    for t in threads:
        t.join()
    out = "".join(captured["out"]) if text else b"".join(captured["out"])
    err = "".join(captured["err"]) if text else b"".join(captured["err"])
    return subprocess.CompletedProcess(args, code, out, err)
