"""Fixtures of the rebase tests: upstream git repositories built from real
PyPI releases (drift.toml), shared read-only by the session; each test copies
what it changes."""

from __future__ import annotations

import pathlib
import shutil

import pytest

from support import rebase as rebase_support


@pytest.fixture(scope="session")
def upstreams(tmp_path_factory) -> dict[str, tuple[pathlib.Path, dict[str, str]]]:
    base = tmp_path_factory.mktemp("upstreams")
    return {dist: (base / dist, rebase_support.make_upstream(dist, base / dist)) for dist in ("tpu-inference", "google-tunix")}


@pytest.fixture
def upstream(upstreams, tmp_path):
    """A private copy of the tpu-inference upstream that a test may add commits to."""
    src, commits = upstreams["tpu-inference"]
    dest = tmp_path / "upstream"
    shutil.copytree(src, dest, symlinks=True)
    return dest, commits
