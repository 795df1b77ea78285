"""Interrupting the tool (SIGINT, SIGTERM): the programs it runs are stopped
as a whole process group and waited for, cleanup cannot raise over the
interrupt, and no signal is lost, wherever it lands: while a program runs,
while one starts, inside a finaliser that swallows the exception, between
the renames that put a result in place.

Each test sends a real signal to this process, inside interrupts.installed()
(the command's own handlers)."""

from __future__ import annotations

import errno
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest

from maxtext_rl_overlay import interrupts, proc, staging

# A program that starts a helper (its own child: the grandchild of the tool)
# which keeps writing files into a folder, as a build backend under uv does,
# and waits for it.
WRITER = """
import os, pathlib, signal, sys, time
out, ignore_term = pathlib.Path(sys.argv[1]), sys.argv[2] == "1"
if ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
(out / "pid").write_text(str(os.getpid()))
i = 0
while True:
    (out / f"f{i}").write_text("x")
    i += 1
    time.sleep(0.01)
"""
PARENT = "import subprocess, sys; subprocess.run([sys.executable, '-c', sys.argv[1], sys.argv[2], sys.argv[3]])"


def _running(pid: int) -> bool:
    """Whether `pid` is a process that still runs (a zombie does not)."""
    try:
        stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def _signal_self_when(ready: pathlib.Path, sig: int = signal.SIGTERM) -> threading.Thread:
    def send() -> None:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        os.kill(os.getpid(), sig)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def _spin() -> None:
    """Some bytecodes, during which Python runs a pending signal handler."""
    for _ in range(100_000):
        pass


@pytest.mark.parametrize("ignores_sigterm", [False, True], ids=["stops-on-sigterm", "needs-sigkill"])
def test_an_interrupt_stops_the_programs_whole_group_and_waits_for_it(tmp_path, monkeypatch, ignores_sigterm):
    monkeypatch.setattr(proc, "STOP_GRACE", 0.5)
    out = tmp_path / "out"
    out.mkdir()
    sender = _signal_self_when(out / "pid")
    with interrupts.installed(), pytest.raises(KeyboardInterrupt):
        proc.run([sys.executable, "-c", PARENT, WRITER, str(out), "1" if ignores_sigterm else "0"], what="a writer")
    sender.join()
    helper = int((out / "pid").read_text())
    assert not _running(helper), "the program's own child outlived the interrupt"
    files = len(list(out.iterdir()))
    time.sleep(0.3)
    assert len(list(out.iterdir())) == files, "something still writes into the folder"


def test_a_signal_while_a_program_starts_is_raised_once_it_can_be_stopped(tmp_path, monkeypatch):
    started: list[subprocess.Popen] = []
    real = subprocess.Popen

    def popen_then_signal(*args, **kw):  # the signal lands inside Popen, after the fork
        child = real(*args, **kw)
        started.append(child)
        os.kill(os.getpid(), signal.SIGTERM)
        _spin()
        return child

    monkeypatch.setattr(proc.subprocess, "Popen", popen_then_signal)
    with interrupts.installed(), pytest.raises(KeyboardInterrupt):
        proc.run([sys.executable, "-c", "import time; time.sleep(60)"], what="a sleeper")
    (child,) = started
    assert child.returncode is not None and not _running(child.pid), "the program started during the signal was left running"


class _SwallowsASignal:
    """A finaliser during which a signal arrives: Python prints the
    KeyboardInterrupt raised there ("Exception ignored in") and drops it."""

    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        _spin()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_signal_swallowed_by_a_finaliser_still_stops_the_run(tmp_path):
    marker = tmp_path / "ran"
    with interrupts.installed():
        obj = _SwallowsASignal()
        del obj  # the signal came, its exception is gone
        with pytest.raises(KeyboardInterrupt):
            proc.run([sys.executable, "-c", f"open({str(marker)!r}, 'w')"], what="the next step")
    assert not marker.exists(), "a program was started after the signal"


def test_a_scratch_folder_that_cannot_be_removed_does_not_hide_the_interrupt(monkeypatch, capsys):
    # What the issue saw: a process still writing into the folder while it
    # is removed ("Directory not empty"), made certain here.
    real = shutil.rmtree

    def rmtree_loses_the_race(path, ignore_errors=False, onerror=None, *, onexc=None, dir_fd=None):
        if ignore_errors:
            return
        try:  # as shutil.rmtree calls it: while handling the error
            raise OSError(errno.ENOTEMPTY, os.strerror(errno.ENOTEMPTY), str(path))
        except OSError as error:
            if onexc is None:
                raise
            onexc(os.rmdir, str(path), error)

    monkeypatch.setattr(shutil, "rmtree", rmtree_loses_the_race)
    with pytest.raises(KeyboardInterrupt), staging.scratch_dir("mrl-test-") as tmp:
        (tmp / "tree").mkdir()
        raise KeyboardInterrupt
    assert f"could not remove {tmp}" in capsys.readouterr().err
    monkeypatch.setattr(shutil, "rmtree", real)
    assert staging.remove_tree(tmp) and not tmp.exists()


def test_a_signal_between_the_renames_leaves_the_new_folder_in_place(tmp_path, monkeypatch):
    dest = tmp_path / "dist"
    dest.mkdir()
    (dest / "old").write_text("old")
    (dest / "MARK").write_text("")
    real = os.replace
    calls = []

    def replace_then_signal(src, dst):
        real(src, dst)
        calls.append(dst)
        if len(calls) == 1:  # `dest` moved aside, the new one not yet in place
            os.kill(os.getpid(), signal.SIGTERM)
            _spin()

    monkeypatch.setattr(staging.os, "replace", replace_then_signal)
    with interrupts.installed(), pytest.raises(KeyboardInterrupt), staging.staged_dir(dest, replace="MARK") as new:
        (new / "new").write_text("new")
    assert sorted(p.name for p in dest.iterdir()) == ["new"]
    assert [p.name for p in tmp_path.iterdir()] == ["dist"], "staging folders left behind"


def test_a_publication_is_whole_and_an_interrupt_before_it_publishes_nothing(tmp_path):
    published = tmp_path / "published"
    with interrupts.installed():
        with pytest.raises(KeyboardInterrupt), interrupts.publication() as publishing:
            publishing.begin()
            os.kill(os.getpid(), signal.SIGTERM)
            _spin()
            published.write_text("whole")
        assert published.read_text() == "whole" and interrupts.published()
    with interrupts.installed():
        with pytest.raises(KeyboardInterrupt), interrupts.publication() as publishing:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                _spin()
            except KeyboardInterrupt:
                pass  # swallowed on the way: the publication's start still sees it
            publishing.begin()
            published.write_text("should not be")
        assert published.read_text() == "whole" and not interrupts.published()
