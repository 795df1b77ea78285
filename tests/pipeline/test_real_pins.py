"""Builds from the real pins: needs the upstream git repositories, which CI
cannot reach. Give them as MRL_SOURCES="google-tunix=PATH tpu-inference=PATH"
(clones or mirrors holding the pinned commits). vLLM's pin and the CPU torch
are out of reach on our machines: the committed constraints carry their
stand-ins (tests/standins.toml, PyPI's torch), and so does this rebuild."""

from __future__ import annotations

import os
import re

import pytest

import standins
from support.pipeline import ROOT
from support.project import run_tool

SOURCES = dict(s.split("=", 1) for s in os.environ.get("MRL_SOURCES", "").split())

pytestmark = [
    pytest.mark.github,
    pytest.mark.slow,
    pytest.mark.skipif(
        not {"google-tunix", "tpu-inference"} <= set(SOURCES),
        reason="needs the upstream git repositories (MRL_SOURCES='google-tunix=PATH tpu-inference=PATH'): would have "
        "rebuilt the wheels from the pinned commits (vLLM and torch from their stand-ins) and checked them against "
        "the sha256 in the committed constraints.txt, and the whole file",
    ),
]


def test_committed_constraints_carry_the_hashes_of_a_build_from_the_pins(tmp_path, cache_dir):
    out = tmp_path / "dist"
    args = ["build", "--unpinned", "--torch-standin", "--out", str(out), "--constraints", str(tmp_path / "constraints.txt")]
    for name in ("google-tunix", "tpu-inference"):
        args += ["--source", f"{name}={SOURCES[name]}"]
    args += ["--source", f"vllm={SOURCES.get('vllm') or standins.fetch('vllm')}"]
    proc = run_tool(ROOT, *args, cache=cache_dir)
    assert proc.returncode == 0, proc.stderr
    committed = (ROOT / "constraints.txt").read_text()
    # The committed file is the lock: a release the registry lists late, uploaded before the cutoff, moves no pin.
    assert f"[constraints] keeping the pins of {ROOT / 'constraints.txt'} where they resolve" in proc.stderr, proc.stderr
    for line in (out / "SHA256SUMS").read_text().splitlines():
        sha, wheel = line.split()
        assert f"--hash=sha256:{sha}" in committed, f"{wheel}: the committed constraints.txt does not carry {sha}"
        assert ("unpinned" in wheel) == wheel.startswith("vllm-"), wheel
    assert re.search(r"^# NOT built from the pins: stand-in sources for vllm ", committed, re.M)
    # The whole file, byte for byte but the build command's line (this build names its --out and --constraints):
    # the closure is the registry's as of the committed resolution cutoff, whatever day this runs.
    made = (tmp_path / "constraints.txt").read_text()
    assert _but_the_command(made) == _but_the_command(committed), "a clean build of this commit does not give the committed constraints.txt"


def _but_the_command(text: str) -> str:
    return re.sub(r"(?m)^# Made by: maxtext-rl-overlay build .*$", "# Made by: ...", text)
