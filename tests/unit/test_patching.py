"""The two apply engines on small synthetic upstreams: the same answers, the
checks of the pinned tree, and what patch-ng must refuse rather than fake."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import subprocess

import pytest

from maxtext_rl_overlay.config.pins import Pin
from maxtext_rl_overlay.core import gittree
from maxtext_rl_overlay.core.errors import OverlayError
from maxtext_rl_overlay.stages.patching import apply_series
from maxtext_rl_overlay.stages.sources import Source

ENGINES = ["git", "patch-ng"]
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
    "GIT_AUTHOR_DATE": "2026-01-01T00:00:00Z", "GIT_COMMITTER_DATE": "2026-01-01T00:00:00Z",
}
BASE = "".join(f"line {i}\n" for i in range(1, 40))


def _git(cwd, *args):
    return subprocess.run(["git", *args], cwd=cwd, env=dict(os.environ, **GIT_ENV), check=True, capture_output=True, text=True).stdout


@dataclasses.dataclass
class Upstream:
    tree: pathlib.Path
    patches: pathlib.Path

    def pin(self, names: list[str]) -> Pin:
        (self.patches / "series").write_text("".join(n + "\n" for n in names))
        return Pin("demo", "demo", "file:///nowhere", "0" * 40, gittree.tree_id(self.tree), "", "1.0", {}, {}, (), self.patches,
                   tuple(self.patches / n for n in names))

    def source(self, from_pin: bool = True) -> Source:
        return Source("demo", self.tree, gittree.tree_id(self.tree), None, from_pin, "test", None)


class SeriesRepo:
    """An upstream repository where each patch is a commit on the previous
    one, exported as git format-patch does for a real series."""

    def __init__(self, tmp: pathlib.Path):
        self.repo = tmp / "series-repo"
        (self.repo / "pkg").mkdir(parents=True)
        (self.repo / "pkg" / "mod.py").write_text(BASE)
        (self.repo / "pkg" / "run.sh").write_text("#!/bin/sh\n")
        _git(self.repo, "init", "-q")
        _git(self.repo, "add", "-A")
        _git(self.repo, "commit", "-q", "-m", "base")
        self.out = tmp / "patches"
        self.out.mkdir(exist_ok=True)

    def add(self, change, name: str, *, onto_base: bool = False, trailers: str = "") -> pathlib.Path:
        if onto_base:  # a patch made against the base, not on the previous ones
            _git(self.repo, "checkout", "-q", "-B", name, "HEAD~0")
            _git(self.repo, "reset", "-q", "--hard", _git(self.repo, "rev-list", "--max-parents=0", "HEAD").strip())
        change(self.repo)
        _git(self.repo, "add", "-A")
        _git(self.repo, "commit", "-q", "-m", f"{name}\n\n{trailers}Upstream-Status: Pending")
        produced = _git(self.repo, "format-patch", "--full-index", "--no-signature", "--zero-commit", "-1", "-o", str(self.out), "HEAD").strip()
        final = self.out / name
        pathlib.Path(produced).rename(final)
        return final


@pytest.fixture
def upstream(tmp_path) -> Upstream:
    tree = tmp_path / "upstream"
    (tree / "pkg").mkdir(parents=True)
    (tree / "pkg" / "mod.py").write_text(BASE)
    (tree / "pkg" / "run.sh").write_text("#!/bin/sh\n")
    return Upstream(tree, tmp_path / "patches")


@pytest.fixture
def series(tmp_path) -> SeriesRepo:
    return SeriesRepo(tmp_path)


def edit_line(n: int, text: str):
    def change(repo):
        f = repo / "pkg" / "mod.py"
        f.write_text(f.read_text().replace(f"line {n}\n", text))
    return change


@pytest.mark.parametrize("engine", ENGINES)
def test_both_engines_give_the_same_tree(upstream, series, tmp_path, engine):
    series.add(edit_line(10, "line ten\n"), "0001-ten.patch")
    series.add(edit_line(30, "line thirty\n"), "0002-thirty.patch")
    pin = upstream.pin(["0001-ten.patch", "0002-thirty.patch"])
    applied = apply_series(pin, upstream.source(), tmp_path / f"out-{engine}", engine=engine)
    assert [a.name for a in applied] == ["0001-ten.patch", "0002-thirty.patch"] and all(a.blobs_checked for a in applied)
    assert (tmp_path / f"out-{engine}" / "pkg" / "mod.py").read_text() == BASE.replace("line 10\n", "line ten\n").replace("line 30\n", "line thirty\n")
    assert not (tmp_path / f"out-{engine}" / ".git").exists()


@pytest.mark.parametrize("engine", ENGINES)
def test_offset_hunks_apply_on_an_unpinned_tree_but_fuzz_never(upstream, series, tmp_path, engine):
    series.add(edit_line(30, "line thirty\n"), "0001-thirty.patch")
    pin = upstream.pin(["0001-thirty.patch"])
    mod = upstream.tree / "pkg" / "mod.py"
    mod.write_text("new first line\nanother\n" + BASE)  # the hunk now sits 2 lines lower
    apply_series(pin, upstream.source(from_pin=False), tmp_path / "shifted", engine=engine)
    assert "line thirty\n" in (tmp_path / "shifted" / "pkg" / "mod.py").read_text()
    mod.write_text(BASE.replace("line 29\n", "line 29 (changed context)\n"))
    with pytest.raises(OverlayError, match="0001-thirty.patch does not apply"):
        apply_series(pin, upstream.source(from_pin=False), tmp_path / "fuzzy", engine=engine)
    assert not (tmp_path / "fuzzy").exists()


LEFT_OUT = "Unpinned-Source: left out [the stand-in release predates line thirty's code]\n"


@pytest.mark.parametrize("engine", ENGINES)
def test_a_patch_of_code_a_stand_in_lacks_is_left_out_of_it_alone(upstream, series, tmp_path, engine, capsys):
    """`Unpinned-Source: left out [why]`: applied to the pinned tree as any
    patch; left out of an unpinned one, which the build says, naming it and why."""
    series.add(edit_line(10, "line ten\n"), "0001-ten.patch")
    series.add(edit_line(30, "line thirty\n"), "backport-0a1b2c3d4-thirty.patch", trailers=LEFT_OUT)
    series.add(edit_line(20, "line twenty\n"), "0002-twenty.patch")
    names = ["0001-ten.patch", "backport-0a1b2c3d4-thirty.patch", "0002-twenty.patch"]
    pin = upstream.pin(names)
    assert [a.name for a in apply_series(pin, upstream.source(from_pin=True), tmp_path / "pinned", engine=engine)] == names
    assert "line thirty\n" in (tmp_path / "pinned" / "pkg" / "mod.py").read_text()
    capsys.readouterr()
    applied = apply_series(pin, upstream.source(from_pin=False), tmp_path / "stand-in", engine=engine)
    assert [a.name for a in applied] == ["0001-ten.patch", "0002-twenty.patch"]
    text = (tmp_path / "stand-in" / "pkg" / "mod.py").read_text()
    assert "line ten\n" in text and "line twenty\n" in text and "line 30\n" in text
    said = capsys.readouterr().err
    assert "backport-0a1b2c3d4-thirty.patch LEFT OUT of this unpinned source: the stand-in release predates line thirty's code" in said


def test_the_left_out_trailer_is_linted(series):
    from maxtext_rl_overlay.stages import patchfile

    good = patchfile.parse(series.add(edit_line(10, "line ten\n"), "0001-ten.patch", trailers=LEFT_OUT))
    assert patchfile.lint(good) == [] and patchfile.left_out_of_unpinned(good) == "the stand-in release predates line thirty's code"
    bad = patchfile.parse(series.add(edit_line(20, "line twenty\n"), "0002-twenty.patch", trailers="Unpinned-Source: skip it\n"))
    assert patchfile.left_out_of_unpinned(bad) is None
    assert any("trailer 'Unpinned-Source:' must be 'left out [" in problem for problem in patchfile.lint(bad)), patchfile.lint(bad)


@pytest.mark.parametrize("engine", ENGINES)
def test_pinned_tree_checks_pre_image_blob(upstream, series, tmp_path, engine):
    """On the pinned tree even an applicable patch is refused when the file is
    not the blob it was made against: the series no longer fits the pin."""
    series.add(edit_line(30, "line thirty\n"), "0001-thirty.patch")
    pin = upstream.pin(["0001-thirty.patch"])
    (upstream.tree / "pkg" / "mod.py").write_text(BASE + "appended far away\n")
    with pytest.raises(OverlayError, match=r"expects pkg/mod.py at blob [0-9a-f]{12} but the tree has blob"):
        apply_series(pin, upstream.source(from_pin=True), tmp_path / "out", engine=engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_failure_half_way_leaves_nothing(upstream, series, tmp_path, engine):
    series.add(edit_line(10, "line ten\n"), "0001-ten.patch")
    # Made against the base with 0001's line in its context: fails after 0001.
    series.add(edit_line(11, "line eleven\n"), "0002-eleven.patch", onto_base=True)
    pin = upstream.pin(["0001-ten.patch", "0002-eleven.patch"])
    with pytest.raises(OverlayError, match="0002-eleven.patch"):
        apply_series(pin, upstream.source(from_pin=False), tmp_path / "out", engine=engine)
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("out")] == []
    assert (upstream.tree / "pkg" / "mod.py").read_text() == BASE, "the source tree itself is never changed"


@pytest.mark.parametrize("engine", ENGINES)
def test_already_applied_is_an_error(upstream, series, tmp_path, engine):
    series.add(edit_line(10, "line ten\n"), "0001-ten.patch")
    pin = upstream.pin(["0001-ten.patch"])
    (upstream.tree / "pkg" / "mod.py").write_text(BASE.replace("line 10\n", "line ten\n"))
    for from_pin in (True, False):
        with pytest.raises(OverlayError, match="already applied"):
            apply_series(pin, upstream.source(from_pin=from_pin), tmp_path / f"out{from_pin}", engine=engine)


def test_patch_ng_refuses_a_mode_change_that_git_applies(upstream, series, tmp_path):
    series.add(lambda repo: os.chmod(repo / "pkg" / "run.sh", 0o755), "0001-exec.patch")
    pin = upstream.pin(["0001-exec.patch"])
    with pytest.raises(OverlayError, match="mode-only change to pkg/run.sh cannot be applied without git"):
        apply_series(pin, upstream.source(), tmp_path / "ng", engine="patch-ng")
    apply_series(pin, upstream.source(), tmp_path / "git", engine="git")
    assert os.stat(tmp_path / "git" / "pkg" / "run.sh").st_mode & 0o111


def test_patch_ng_refuses_a_binary_change_that_git_applies(upstream, series, tmp_path):
    (upstream.tree / "pkg" / "blob.bin").write_bytes(b"\0\1\2")

    def change(repo):
        (repo / "pkg" / "blob.bin").write_bytes(b"\0\1\2\3")

    def base_with_blob(repo):
        (repo / "pkg" / "blob.bin").write_bytes(b"\0\1\2")
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", "blob")
        change(repo)

    series.add(base_with_blob, "0001-bin.patch")
    # The exported patch holds only the last commit's change: the binary edit.
    pin = upstream.pin(["0001-bin.patch"])
    with pytest.raises(OverlayError, match="binary change to pkg/blob.bin cannot be applied without git"):
        apply_series(pin, upstream.source(), tmp_path / "ng", engine="patch-ng")
    apply_series(pin, upstream.source(), tmp_path / "git", engine="git")
    assert (tmp_path / "git" / "pkg" / "blob.bin").read_bytes() == b"\0\1\2\3"


@pytest.mark.parametrize("engine", ENGINES)
def test_created_and_deleted_files(upstream, series, tmp_path, engine):
    """patch-ng skips a file created from /dev/null and still says success:
    the engine must create it (and delete files) itself, exactly."""
    def change(repo):
        (repo / "pkg" / "new.py").write_text("def f():\n    return 1\n")
        (repo / "pkg" / "tool.sh").write_text("#!/bin/sh\necho no newline at the end")
        os.chmod(repo / "pkg" / "tool.sh", 0o755)
        (repo / "pkg" / "run.sh").unlink()

    series.add(change, "0001-files.patch")
    pin = upstream.pin(["0001-files.patch"])
    for from_pin in (True, False):
        out = tmp_path / f"out-{from_pin}"
        apply_series(pin, upstream.source(from_pin=from_pin), out, engine=engine)
        assert (out / "pkg" / "new.py").read_text() == "def f():\n    return 1\n"
        assert (out / "pkg" / "tool.sh").read_bytes() == b"#!/bin/sh\necho no newline at the end"
        assert os.stat(out / "pkg" / "tool.sh").st_mode & 0o111
        assert not (out / "pkg" / "run.sh").exists()
    (upstream.tree / "pkg" / "new.py").write_text("someone else's\n")
    with pytest.raises(OverlayError, match="new.py"):
        apply_series(pin, upstream.source(from_pin=False), tmp_path / "clash", engine=engine)
