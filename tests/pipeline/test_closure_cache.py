"""A warm rebuild with unchanged inputs reuses the cached closure resolution,
the cached MaxText release, the patched trees and the wheels kept by their
inputs, and publishes byte for byte what the cold build did (the wheels'
SHA256SUMS and constraints.txt); a changed input is built again."""

from __future__ import annotations

import pathlib
import re

import pytest

from maxtext_rl_overlay.config.pins import load_project
from maxtext_rl_overlay.stages import constraintsfile
from support.pipeline import build_standins

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
    # The patched trees kept by their inputs (nothing applied again), and every
    # wheel (the two upstreams, MaxText's adapter, the overlay) by its tree: none built again.
    assert warm.stderr.count("series unchanged: reusing the patched tree") == 2, warm.stderr
    assert "applying 0001" not in warm.stderr
    assert warm.stderr.count("unchanged: reusing the wheel") == 4, warm.stderr
    assert "building the wheel" not in warm.stderr
    for name in ("dist/SHA256SUMS", "constraints.txt"):
        assert (tmp_path / "warm" / name).read_bytes() == (tmp_path / "cold" / name).read_bytes(), name
    # The index's own copy names the index "." either way.
    assert (tmp_path / "warm" / "dist" / "constraints.txt").read_bytes() == (tmp_path / "cold" / "dist" / "constraints.txt").read_bytes()


def test_a_changed_tree_is_built_again(tmp_path, standin, project):
    cache = tmp_path / "cache"
    build_standins(project, tmp_path / "one" / "dist", standin, cache, only="google-tunix")
    patch = next((project / "patches" / "google-tunix").glob("0001-*.patch"))
    # A different patch file with the same change (its message only): the
    # tree is the same, so the wheel is reused; the overlay's manifest
    # records the patch file's sha256, so the overlay wheel is built again.
    patch.write_text(patch.read_text().replace("\n\n", "\n\nReworded.\n\n", 1))
    again = build_standins(project, tmp_path / "two" / "dist", standin, cache, only="google-tunix")
    assert "[google-tunix] applying 0001" in again.stderr  # another patch file: patched again
    assert "[google-tunix] tree " in again.stderr and "[google-tunix] building the wheel" not in again.stderr, again.stderr
    assert "[maxtext-rl-overlay] building the wheel" in again.stderr


def test_one_commit_one_closure_whatever_the_caches_and_the_file_it_replaces(tmp_path, standin, project):
    """The closure is the registry's as of the project's resolution cutoff:
    resolved afresh from an empty uv cache, afresh from the uv cache of
    before, and onto an older constraints file (another cutoff's, older
    pins: at --constraints and as the project's own), a build gives the same
    constraints.txt byte for byte; the one onto the older file lists the pins
    that moved since it."""
    cache = tmp_path / "cache"
    build_standins(project, tmp_path / "first" / "dist", standin, cache)
    want = (tmp_path / "first" / "constraints.txt").read_text()
    cutoff = constraintsfile.recorded_cutoff(want)
    assert cutoff == load_project(project).resolution_cutoff, "the header names the project's cutoff"
    found = re.search(r"(?m)^(wcwidth)==(\S+) ", want)
    assert found, "the closure holds wcwidth"
    older = (want.replace(constraintsfile.CUTOFF_LINE + cutoff, constraintsfile.CUTOFF_LINE + "2026-11-01T00:00:00Z")
             .replace(f"\nwcwidth=={found.group(2)} ", "\nwcwidth==0.9.3 "))
    (tmp_path / "older").mkdir()
    (tmp_path / "older" / "constraints.txt").write_text(older)
    (project / "constraints.txt").write_text(older)  # the project's own file: an earlier tool preferred its pins
    runs = {
        "afresh, an empty uv cache": build_standins(project, tmp_path / "empty-uv" / "dist", standin, cache,
                                                    env={"MRL_REFRESH": "1", "UV_CACHE_DIR": str(tmp_path / "uv-cache")}),
        "afresh, the uv cache of before": build_standins(project, tmp_path / "stale-uv" / "dist", standin, cache, env={"MRL_REFRESH": "1"}),
        "onto an older file": build_standins(project, tmp_path / "older" / "dist", standin, cache, env={"MRL_REFRESH": "1"}),
    }
    for how, proc in runs.items():
        assert f"the registry as of {cutoff}" in proc.stderr, (how, proc.stderr)
        top = proc.args[proc.args.index("--out") + 1].rsplit("/", 1)[0]
        assert pathlib.Path(top, "constraints.txt").read_text() == want, how
    assert (f"against the file it replaces (resolution cutoff 2026-11-01T00:00:00Z -> {cutoff}): 1 pins moved: "
            f"wcwidth 0.9.3 -> {found.group(2)}") in runs["onto an older file"].stderr
