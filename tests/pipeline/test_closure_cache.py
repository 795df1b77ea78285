"""A warm rebuild with unchanged inputs reuses the cached closure resolution
and the cached MaxText release, and publishes byte for byte what the cold
build did (the wheels' SHA256SUMS and constraints.txt)."""

from __future__ import annotations

import pytest
from pipeline_support import build_standins

pytestmark = pytest.mark.slow


def test_warm_rebuild_reuses_the_closure_byte_for_byte(tmp_path, standin, project):
    cache = tmp_path / "cache"  # its own: the first build resolves the closure for sure
    cold = build_standins(project, tmp_path / "cold" / "dist", standin, cache)
    assert "closure unchanged" not in cold.stderr
    assert "resolution cached as" in cold.stderr
    warm = build_standins(project, tmp_path / "warm" / "dist", standin, cache)
    assert "closure unchanged: reusing the resolution of" in warm.stderr, warm.stderr
    assert "resolving the closure" not in warm.stderr
    assert "downloading maxtext" not in warm.stderr
    for name in ("dist/SHA256SUMS", "constraints.txt"):
        assert (tmp_path / "warm" / name).read_bytes() == (tmp_path / "cold" / name).read_bytes(), name
    # The index's own copy names the index "." either way.
    assert (tmp_path / "warm" / "dist" / "constraints.txt").read_bytes() == (tmp_path / "cold" / "dist" / "constraints.txt").read_bytes()
