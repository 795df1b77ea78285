"""support/fixes/unpatched.py's `unpatched_package`, the pin's copy of an
installed package that scripts/bench-decode.sh's upstream engine imports:
the whole series reverse-applied (a file the series adds is gone), a kept
patch left in, files outside the package ignored, and a copy that does not
carry a patch exactly refused."""

from __future__ import annotations

import pathlib
import subprocess

import pytest

from support.fixes.unpatched import unpatched_package


def _git(*args: str, cwd: pathlib.Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.fixture
def upstream(tmp_path):
    """A repository holding pkg/ and tests/, three commits as a series; the
    installed package is pkg/ at the last."""
    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / "tests").mkdir()
    _git("init", "-q", cwd=repo)
    (repo / "pkg" / "a.py").write_text("A = 1\n")
    (repo / "tests" / "t.py").write_text("T = 1\n")
    _git("add", ".", cwd=repo)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base", cwd=repo)
    patches = []
    for name, change in (("backport-1-mesh.patch", lambda: (repo / "pkg" / "a.py").write_text("A = 2\n")),
                         ("0001-new.patch", lambda: ((repo / "pkg" / "new.py").write_text("N = 1\n"),
                                                    (repo / "tests" / "t.py").write_text("T = 2\n"))),
                         ("0002-more.patch", lambda: (repo / "pkg" / "a.py").write_text("A = 3\n"))):
        change()
        _git("add", ".", cwd=repo)
        _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", name, cwd=repo)
        patch = tmp_path / name
        patch.write_text(_git("format-patch", "--full-index", "-1", "--stdout", "HEAD", cwd=repo))
        patches.append(patch)
    return repo / "pkg", patches


def test_the_whole_series_reversed(upstream, tmp_path):
    installed, patches = upstream
    reversed_ = unpatched_package("x", installed, tmp_path / "shadow", patches=patches)
    assert reversed_ == ["0002-more.patch", "0001-new.patch", "backport-1-mesh.patch"]
    assert (tmp_path / "shadow" / "pkg" / "a.py").read_text() == "A = 1\n"
    assert not (tmp_path / "shadow" / "pkg" / "new.py").exists()
    assert not (tmp_path / "shadow" / "tests").exists()
    assert (installed / "a.py").read_text() == "A = 3\n"  # the installed package untouched


def test_a_kept_patch_stays(upstream, tmp_path):
    installed, patches = upstream
    reversed_ = unpatched_package("x", installed, tmp_path / "shadow", keep=("backport-1",), patches=patches)
    assert reversed_ == ["0002-more.patch", "0001-new.patch"]
    assert (tmp_path / "shadow" / "pkg" / "a.py").read_text() == "A = 2\n"


def test_a_copy_that_does_not_carry_the_series_is_refused(upstream, tmp_path):
    installed, patches = upstream
    (installed / "a.py").write_text("A = 4\n")
    with pytest.raises(RuntimeError, match="does not carry 0002-more.patch exactly"):
        unpatched_package("x", installed, tmp_path / "shadow", patches=patches)
