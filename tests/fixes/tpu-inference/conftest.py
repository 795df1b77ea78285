"""Fixtures shared by the tests of tpu-inference's patches (pytest takes a
test file's own fixture of the same name over these: some files' `upstream`
is another module of the pin)."""

from __future__ import annotations

import importlib

import pytest

from support.fixes.runner import overlay_sampler, upstream_sampler
from support.fixes.sampling import SAMPLING


@pytest.fixture(scope="module")
def patched():
    """The installed sampling.py: the overlay's (0001-0004)."""
    return importlib.import_module(SAMPLING)


@pytest.fixture(scope="module")
def upstream():
    """The pin's sampler modules (sampling, rejection), wired to the pin's binary_search.py (0005, precompile)."""
    return upstream_sampler()


@pytest.fixture(scope="module")
def overlay():
    """The installed overlay's sampler modules (sampling, rejection) (0005, precompile)."""
    return overlay_sampler()
