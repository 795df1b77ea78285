"""Fixtures of the build-pipeline tests: the real tool, on real upstream code.

CI has no GitHub, so the upstream trees are the PyPI sdists that stand in for
the pins (tests/standins.toml); a test that wants a *pinned* git source makes
a git repository of a stand-in tree and pins a copy of the project to it."""

from __future__ import annotations

import pathlib

import pytest

import standins  # tests/standins.py: tests/ is on sys.path (pyproject's pythonpath)
from support.pipeline import ALL, ROOT, build_standins, fake_rust_toolchain
from support.project import project_copy

#: A pipeline test's bound: it builds wheels (vLLM's compiles) and venvs, and
#: the first one in a session makes the build environments (minutes, cold).
BUILD_TIMEOUT = 1800


def pytest_collection_modifyitems(items):
    here = pathlib.Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(BUILD_TIMEOUT))


@pytest.fixture(scope="session")
def standin() -> dict[str, pathlib.Path]:
    return {name: standins.fetch(name) for name in ("google-tunix", "tpu-inference", "vllm")}


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("mrl-cache")


@pytest.fixture
def project(tmp_path) -> pathlib.Path:
    """A copy of this project that a test may change (pins, patches)."""
    return project_copy(tmp_path / "project", "overlay", licence=True)


@pytest.fixture(scope="session")
def built(tmp_path_factory, standin, cache_dir):
    """One stand-in build of the real project, vLLM included, shared by the
    read-only tests. A Rust toolchain is on its PATH (a fake that logs its
    calls to ../rust/calls.log): the build must give the wheel of a machine without one."""
    top = tmp_path_factory.mktemp("built")
    out = top / "dist"
    proc = build_standins(ROOT, out, standin, cache_dir, only=ALL, env=fake_rust_toolchain(top / "rust"))
    return out, proc
