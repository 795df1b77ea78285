"""A process killed at any instant (SIGKILL, the OOM killer, a lost
machine: no cleanup runs) leaves each destination the old one or the new
one, and the next run clears what it left, never taking it for a result.

Each case runs the real staging code in a child process that SIGKILLs
itself at one instant, then checks what is on disk, then runs again."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

from maxtext_rl_overlay.core import staging
from maxtext_rl_overlay.stages import publication

MARK = "MARK"

#: The child: stage a new `dist` (replacing a marked one) and a constraints
#: file beside it, as a build publishes them, and SIGKILL itself at `point`.
CHILD = textwrap.dedent('''
    import contextlib, os, pathlib, signal, sys
    from maxtext_rl_overlay.stages import publication
    from maxtext_rl_overlay.core import staging
    top, point, exchange = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
    def die(at):
        if at == point:
            os.kill(os.getpid(), signal.SIGKILL)
    if not exchange:
        staging._exchange = lambda a, b: False
    real = os.replace
    def replace(src, dst):
        die(f"before rename {pathlib.Path(dst).name}")
        real(src, dst)
        die(f"after rename {pathlib.Path(dst).name}")
    staging.os.replace = replace
    real_remove = staging.remove_tree
    def remove(path):
        old = any((pathlib.Path(path) / where / "old").exists() for where in (".", "x"))
        die(f"before removing {'the old index' if old else pathlib.Path(path).name}")
        return real_remove(path)
    staging.remove_tree = remove
    # As stages/run.py publishes an index and its constraints file:
    publication.finish_pair(top / "dist", top / "constraints.txt")
    staging.recover(top / "constraints.txt")
    with contextlib.ExitStack() as after:
        with staging.staged_dir(top / "dist", replace="MARK", then=after.close) as new:
            (new / "MARK").write_text("")
            (new / "new").write_text("new")
            (new / "SHA256SUMS").write_text("new")
            die("staging")
            after.callback(publication.end_pair, top / "constraints.txt")
            staged = after.enter_context(staging.staged_file(top / "constraints.txt", "new"))
            die("staged")
            publication.begin_pair(top / "dist", "SHA256SUMS", publication._sha256(new / "SHA256SUMS"), staged, top / "constraints.txt")
            die("recorded")
''')

#: The instants, by name, in the order they come.
POINTS = ["staging", "staged", "recorded", "before rename x", "after rename x", "before rename dist", "after rename dist",
          "before rename constraints.txt", "after rename constraints.txt", "before removing the old index"]


def _old(top: pathlib.Path) -> None:
    (top / "dist").mkdir(parents=True)
    (top / "dist" / MARK).write_text("")
    (top / "dist" / "old").write_text("old")
    (top / "dist" / "SHA256SUMS").write_text("old")
    (top / "constraints.txt").write_text("old")


def _state(top: pathlib.Path) -> tuple[list[str], str]:
    dist = sorted(p.name for p in (top / "dist").iterdir()) if (top / "dist").is_dir() else []
    text = (top / "constraints.txt").read_text() if (top / "constraints.txt").exists() else ""
    return dist, text


OLD, NEW = ([MARK, "SHA256SUMS", "old"], "old"), ([MARK, "SHA256SUMS", "new"], "new")


def _run(top: pathlib.Path, point: str, exchange: bool) -> int:
    return subprocess.run([sys.executable, "-c", CHILD, str(top), point, "1" if exchange else "0"], capture_output=True, text=True,
                          timeout=60).returncode


@pytest.mark.parametrize("exchange", [True, False], ids=["atomic-exchange", "two-renames"])
@pytest.mark.parametrize("point", POINTS)
def test_a_kill_at_any_instant_leaves_old_or_new_and_the_next_run_clears_the_rest(tmp_path, point, exchange):
    if exchange and not staging._exchange(*_pair(tmp_path)):
        pytest.skip(f"{tmp_path}'s filesystem cannot exchange two folders atomically (renameat2 RENAME_EXCHANGE): the two-renames case runs")
    top = tmp_path / "rel"
    _old(top)
    code = _run(top, point, exchange)
    reached = code == -signal.SIGKILL
    if not reached:  # an instant this path never passes (a rename the exchange does not make)
        assert code == 0 and point in ("before rename x", "after rename x", "before rename dist", "after rename dist"), (point, code)
        assert _state(top) == NEW
        return
    dist, text = _state(top)
    # Each is the old one or the new one at every instant, but between the
    # two renames of the index where no atomic exchange is had (the index is
    # missing: put back by the next run), and between the index's swap and the
    # constraints file's rename (new index, old file: the next run moves the
    # staged file into place).
    missing = not exchange and point in ("after rename x", "before rename dist")
    swapped = ["after rename dist", "before rename constraints.txt"] if not exchange else ["before rename constraints.txt"]
    if missing:
        assert dist == [] and text == "old"
    elif point in swapped:
        assert (dist, text) == (NEW[0], "old")
    else:
        assert (dist, text) in (OLD, NEW), (dist, text)
    # What the next run does first, under the same locks: the pair whole again, the leftovers cleared.
    publication.finish_pair(top / "dist", top / "constraints.txt")
    staging.recover(top / "dist")
    staging.recover(top / "constraints.txt")
    assert _state(top) in (OLD, NEW)
    if point in swapped:
        assert _state(top) == NEW
    assert sorted(p.name for p in top.iterdir()) == ["constraints.txt", "dist"]
    assert _run(top, "never", exchange) == 0
    assert _state(top) == NEW
    assert sorted(p.name for p in top.iterdir()) == ["constraints.txt", "dist"]


def _pair(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "in-a").write_text("")
    return a, b


def test_the_exchange_swaps_two_folders_in_one_step(tmp_path):
    a, b = _pair(tmp_path)
    if not staging._exchange(a, b):
        pytest.skip(f"{tmp_path}'s filesystem cannot exchange two folders atomically (renameat2 RENAME_EXCHANGE)")
    assert [p.name for p in b.iterdir()] == ["in-a"] and not any(a.iterdir())


def test_recover_touches_only_what_a_run_stages_beside_its_destination(tmp_path, capsys):
    dest = tmp_path / "constraints.txt"
    dest.write_text("mine")
    keep = ["constraints.txt", "constraints.txt.orig", "constraints.txt.0123456789", "constraints.txt.notes", "constraints.txt.ABCDEF01"]
    for name in keep[1:]:
        (tmp_path / name).write_text("a user's")
    (tmp_path / "constraints.txt.0badcafe").write_text("half")
    (tmp_path / "constraints.txt.partial-xyz").mkdir()
    assert staging.recover(dest) == ["constraints.txt.0badcafe", "constraints.txt.partial-xyz"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep)
    assert "cleared what a stopped run left beside" in capsys.readouterr().err
    assert staging.recover(dest) == []
    os.remove(dest)
    assert staging.recover(tmp_path / "absent" / "x") == []


def test_copy_atomically_gives_a_whole_copy_and_nothing_beside_it(tmp_path):
    src, dest = tmp_path / "src", tmp_path / "out" / "dest"
    src.write_bytes(b"x" * 100_000)
    dest.parent.mkdir()
    staging.copy_atomically(src, dest)
    assert dest.read_bytes() == src.read_bytes()
    assert [p.name for p in dest.parent.iterdir()] == ["dest"]
    with pytest.raises(FileNotFoundError):
        staging.copy_atomically(tmp_path / "absent", tmp_path / "out" / "other")
    assert [p.name for p in dest.parent.iterdir()] == ["dest"], "a failed copy leaves no staged file"
