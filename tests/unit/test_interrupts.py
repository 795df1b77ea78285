"""Interrupting the tool (SIGINT, SIGTERM): the programs it runs are stopped
as a whole process group and waited for, cleanup cannot raise over the
interrupt, and no signal is lost, wherever it lands: while a program runs,
while one starts, inside a finaliser that swallows the exception, between
the renames that put a result in place.

Each test sends a real signal to this process, inside interrupts.installed()
(the command's own handlers), or to the command started in a child process.
Neither may depend on how the suite was started: a background job of a
non-interactive shell starts its children with SIGINT and SIGQUIT ignored,
and the tool keeps an ignored signal ignored. So the signals are at their
defaults during each test here (`_signals_at_their_defaults`), and in every
child the tests start and signal (`default_signals`, its preexec_fn)."""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from maxtext_rl_overlay.core import interrupts, proc, staging
from maxtext_rl_overlay.core.errors import OverlayError
from support import ROOT
from unit.unit_support import default_signals

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


@pytest.fixture(autouse=True)
def _signals_at_their_defaults() -> Iterator[None]:
    """The signals the tool stops on that this process was started with
    ignored are at their defaults for the test, and ignored again after it."""
    ignored = [sig for sig in interrupts.SIGNALS if signal.getsignal(sig) == signal.SIG_IGN]
    for sig in ignored:
        signal.signal(sig, signal.SIG_DFL)
    yield
    for sig in ignored:
        signal.signal(sig, signal.SIG_IGN)


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


@pytest.mark.parametrize("how", ["run", "start"], ids=["in-the-foreground", "in-the-background"])
def test_a_signal_while_a_program_starts_is_raised_once_it_can_be_stopped(tmp_path, monkeypatch, how):
    started: list[subprocess.Popen] = []
    real = subprocess.Popen

    def popen_then_signal(*args, **kw):  # the signal lands inside Popen, after the fork
        child = real(*args, **kw)
        started.append(child)
        os.kill(os.getpid(), signal.SIGTERM)
        _spin()
        return child

    monkeypatch.setattr(subprocess, "Popen", popen_then_signal)  # as proc calls it
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    with interrupts.installed(), pytest.raises(KeyboardInterrupt):
        if how == "run":
            proc.run(sleeper, what="a sleeper")
        else:
            proc.start(sleeper, what="a sleeper", output=tmp_path / "log")
    (child,) = started
    assert child.returncode is not None and not _running(child.pid), "the program started during the signal was left running"


def test_a_background_program_writes_its_output_to_the_file_and_stops_with_its_group(tmp_path, monkeypatch):
    monkeypatch.setattr(proc, "STOP_GRACE", 0.5)
    out = tmp_path / "out"
    out.mkdir()
    child = proc.start([sys.executable, "-c", "print('begun', flush=True); " + PARENT, WRITER, str(out), "1"],
                       what="a writer", output=tmp_path / "log")
    deadline = time.monotonic() + 30
    while not (out / "pid").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert child.poll() is None, "it runs in the background"
    proc.stop(child)
    assert not _running(int((out / "pid").read_text())), "its own child, which ignores SIGTERM, outlived the stop"
    assert (tmp_path / "log").read_text() == "begun\n"


def test_a_background_program_not_installed_is_named(tmp_path):
    with pytest.raises(OverlayError, match="making references: no-such-program-here is not installed"):
        proc.start(["no-such-program-here"], what="making references", output=tmp_path / "log")


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

    monkeypatch.setattr(os, "replace", replace_then_signal)  # as staging calls it
    monkeypatch.setattr(staging, "_exchange", lambda a, b: False)  # the two renames: a filesystem without an atomic exchange
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


# -- the command itself, stopped in the middle of a build --------------------

#: uv, as far as a build that is stopped in its wheel build needs it: its
#: version, and a `uv build` that starts a helper of its own (as uv starts a
#: build backend) and never ends.
HANGING_UV = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "uv 0.0.0 (fake)"; exit 0; fi
sh -c 'echo $$ > "$HANGING_UV_DIR/helper.pid"; exec sleep 600' &
echo $$ > "$HANGING_UV_DIR/uv.pid"
wait
"""


def _maxtext_release(folder: pathlib.Path) -> pathlib.Path:
    """A stand-in for the wheel of the MaxText release the extra names: what
    the build reads of it (its torch pins, its overrides file, its vLLM plugin
    folder, a licence)."""
    import zipfile

    from unit.unit_support import maxtext_version

    version = maxtext_version(ROOT)
    wheel = folder / f"maxtext-{version}-py3-none-any.whl"
    info = f"maxtext-{version}.dist-info"
    meta = (f"Metadata-Version: 2.1\nName: maxtext\nVersion: {version}\nProvides-Extra: tpu-post-train\n"
            'Requires-Dist: torch==2.11.0+cpu; extra == "tpu-post-train"\n'
            'Requires-Dist: torchvision==0.26.0+cpu; extra == "tpu-post-train"\n')
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(f"{info}/METADATA", meta)
        zf.writestr(f"{info}/licenses/LICENSE", "Apache-2.0\n")
        zf.writestr("dependencies/extra_deps/tpu_post_train_overrides.txt", "jax==0.11.0\n")
        zf.writestr("maxtext/integration/vllm/setup.py", "from setuptools import setup\nsetup(name='maxtext-vllm-adapter')\n")
    return wheel


def _stop_leftovers(top: pathlib.Path) -> None:
    """Kill what a failed test left running (by the pids the fake uv wrote)."""
    for name in ("uv.pid", "helper.pid"):
        if (top / name).exists() and _running(pid := int((top / name).read_text())):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture
def stalled_build(tmp_path):
    """The arguments and environment of a real `build --only google-tunix`
    that stops in `uv build` for good: the MaxText release from a package
    index on 127.0.0.1, Tunix from a small tree (the project copy's series
    emptied), uv a fake that hangs."""
    import hashlib
    import json

    from support.project import project_copy
    from unit.unit_support import served as serve
    from unit.unit_support import uv_offline_env

    served = tmp_path / "index"
    (served / "maxtext").mkdir(parents=True)
    wheel = _maxtext_release(served)
    listing = {"files": [{"filename": wheel.name, "url": f"../{wheel.name}", "hashes": {"sha256": hashlib.sha256(wheel.read_bytes()).hexdigest()}}]}
    (served / "maxtext" / "index.html").write_text(json.dumps(listing))
    server = contextlib.ExitStack()
    url = server.enter_context(serve(served))

    project = project_copy(tmp_path / "project", licence=True)
    tunix = project / "patches" / "google-tunix"
    for patch in tunix.glob("*.patch"):
        patch.unlink()
    (tunix / "series").write_text("")
    tree = tmp_path / "tunix"
    (tree / "tunix").mkdir(parents=True)
    (tree / "tunix" / "__init__.py").write_text("")
    (tree / "pyproject.toml").write_text('[project]\nname = "google-tunix"\nversion = "0.1.8"\ndependencies = [\n  "jax>=0.6.0",\n]\n')

    bin_dir, tmp = tmp_path / "bin", tmp_path / "tmp"
    bin_dir.mkdir()
    tmp.mkdir()
    (bin_dir / "uv").write_text(HANGING_UV)
    (bin_dir / "uv").chmod(0o755)
    out = tmp_path / "rel" / "dist"
    env = dict(uv_offline_env(tmp_path), UV_DEFAULT_INDEX=url, MRL_CACHE_DIR=str(tmp_path / "cache"),
               PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", HANGING_UV_DIR=str(tmp_path), TMPDIR=str(tmp), PYTHONPATH=str(ROOT / "overlay"))
    args = [sys.executable, "-m", "maxtext_rl_overlay", "build", "--project", str(project), "--only", "google-tunix", "--unpinned", "--torch-standin",
            "--source", f"google-tunix={tree}", "--out", str(out), "--constraints", str(out.parent / "constraints.txt")]
    yield args, env, tmp_path
    server.close()
    _stop_leftovers(tmp_path)


def _wait_for(path: pathlib.Path, tool: subprocess.Popen, master: int | None = None) -> bytes:
    """Wait until `path` exists (reading the tool's terminal meanwhile); what the terminal showed."""
    import select

    shown, deadline = b"", time.monotonic() + 120
    while not path.exists():
        assert tool.poll() is None and time.monotonic() < deadline, shown.decode(errors="replace")
        if master is not None and select.select([master], [], [], 0.05)[0]:
            shown += _read_some(master)
        else:
            time.sleep(0.05)
    return shown


def _read_some(master: int) -> bytes:
    try:
        return os.read(master, 65536)
    except OSError:  # EIO: every writer has closed the terminal
        return b""


def _read_to_end(master: int) -> bytes:
    shown = b""
    while chunk := _read_some(master):
        shown += chunk
    return shown


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT], ids=lambda s: s.name)
def test_a_hang_up_or_quit_stops_a_build_as_an_interrupt_does(stalled_build, sig):
    """The issue's case: the terminal (or SSH connection) the build runs in
    drops. The kernel hangs the terminal up (every write to it fails from then
    on) and sends SIGHUP; Ctrl-\\ sends SIGQUIT. Either way the build stops
    like an interrupted one: status 130, uv and its helper stopped, no staging
    or scratch folder left."""
    import pty

    args, env, top = stalled_build
    master: int | None
    master, terminal = pty.openpty()
    tool = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal, env=env, start_new_session=True,
                            preexec_fn=default_signals)
    os.close(terminal)
    try:
        shown = _wait_for(top / "helper.pid", tool, master)
        if sig == signal.SIGHUP:
            os.close(master)  # the terminal is gone
            master = None
        tool.send_signal(sig)
        code = tool.wait(timeout=60)
        if master is not None:
            shown += _read_to_end(master)
    finally:
        if tool.poll() is None:
            tool.kill()
        if master is not None:
            os.close(master)
    said = shown.decode(errors="replace")
    assert code == 130, said
    if sig == signal.SIGQUIT:
        assert "interrupted; nothing was published" in said, said
    for name in ("uv.pid", "helper.pid"):
        assert not _running(int((top / name).read_text())), f"{name[:-4]} outlived the {sig.name}"
    left = [p.name for p in (top / "rel").iterdir()] if (top / "rel").exists() else []
    assert not [n for n in left if ".partial-" in n], left
    assert list((top / "tmp").iterdir()) == [], "scratch folders left behind"


def test_a_build_started_with_hang_ups_ignored_keeps_running_through_one(stalled_build):
    """nohup: the tool leaves an ignored SIGHUP ignored (nohup ignores it,
    over the defaults the child starts with)."""
    args, env, top = stalled_build
    tool = subprocess.Popen(["nohup", *args], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                            start_new_session=True, preexec_fn=default_signals)
    try:
        _wait_for(top / "helper.pid", tool)
        tool.send_signal(signal.SIGHUP)
        time.sleep(1)
        assert tool.poll() is None, "a hang-up stopped a build started under nohup"
        tool.send_signal(signal.SIGTERM)
        assert tool.wait(timeout=60) == 130
    finally:
        if tool.poll() is None:
            tool.kill()
        assert tool.stderr is not None
        tool.stderr.close()
