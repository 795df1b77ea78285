"""Marker policy for the whole suite: a test that needs what CI cannot have
(a TPU, the upstream git repositories) is selected by a marker and, where that
is absent, skipped with a reason that says what it would have checked
(pytest's -ra lists every reason at the end of the run)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _outside_github_actions(monkeypatch):
    """Every test sees the tool's lines as a terminal shows them, also where
    the suite itself runs under GitHub Actions (and so do the programs a test
    starts, which inherit this environment): there output.py adds workflow
    commands, which tests/unit/test_output.py checks on its own."""
    monkeypatch.delenv("GITHUB_ACTIONS", raising=False)
