"""Every wheel the build makes carries its source's licence files
(wheels.check_licences); the project has its own LICENSE, the one pyproject
names. tests/pipeline/test_build.py checks the real wheels."""

from __future__ import annotations

import pathlib
import tomllib
import zipfile

import pytest

from maxtext_rl_overlay.core.errors import OverlayError
from maxtext_rl_overlay.stages import wheels
from support import ROOT


def test_the_project_is_licensed_as_pyproject_says():
    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text


def _wheel(path: pathlib.Path, licences: dict[str, bytes]) -> pathlib.Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("pkg/__init__.py", "")
        for name, data in licences.items():
            zf.writestr(f"pkg-1.0.dist-info/licenses/{name}", data)
    return path


def test_a_wheel_without_its_trees_licence_files_is_refused(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "LICENSE").write_bytes(b"the licence")
    (tree / "NOTICE").write_bytes(b"the notice")
    wheels.check_licences(tree, _wheel(tmp_path / "a.whl", {"LICENSE": b"the licence", "NOTICE": b"the notice"}), "x")
    with pytest.raises(OverlayError, match="does not carry the licence file.s. NOTICE"):
        wheels.check_licences(tree, _wheel(tmp_path / "b.whl", {"LICENSE": b"the licence"}), "x")
    with pytest.raises(OverlayError, match="LICENSE"):
        wheels.check_licences(tree, _wheel(tmp_path / "c.whl", {"LICENSE": b"another licence", "NOTICE": b"the notice"}), "x")
    bare = tmp_path / "bare"
    bare.mkdir()
    with pytest.raises(OverlayError, match="none at all"):
        wheels.check_licences(bare, _wheel(tmp_path / "d.whl", {}), "x")
