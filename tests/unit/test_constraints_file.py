"""constraints.txt as the build writes it: how it was made, why each package
is there (`# via`), which uv it needs, and a resolution that prefers the
committed file's versions. The uv runs here are real (the tool venv's),
offline, on wheels made here."""

from __future__ import annotations

import hashlib
import pathlib
import re
import subprocess
import sys

import pytest
from packaging.version import Version

from maxtext_rl_overlay import publish
from maxtext_rl_overlay.environment import Environment, Torch
from unit.unit_support import UV, installable_wheel, uv_offline_env


def test_this_uv_refuses_a_wheel_whose_hash_the_constraints_contradict(tmp_path):
    """What the header's `Needs uv >= X` promises, with the uv the tool runs
    (that older ones do not is measured once: publish.UV_CHECKS_CONSTRAINT_HASHES)."""
    version = subprocess.run([UV, "--version"], capture_output=True, text=True, check=True).stdout.split()[1]
    assert Version(version) >= Version(publish.UV_CHECKS_CONSTRAINT_HASHES)
    links = tmp_path / "links"
    links.mkdir()
    wheel = installable_wheel(links, "mrl-probe", "1.0")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    env = uv_offline_env(tmp_path)
    results = {}
    for name, digest in (("right", sha), ("tampered", "0" * 64)):
        constraints = tmp_path / f"{name}.txt"
        constraints.write_text(f"--find-links {links}\nmrl-probe==1.0 \\\n    --hash=sha256:{digest}\n")
        venv = tmp_path / f"venv-{name}"
        subprocess.run([UV, "venv", "--quiet", "-p", sys.executable, str(venv)], check=True, env=env)
        results[name] = subprocess.run([UV, "pip", "install", "-p", str(venv / "bin" / "python"), "-c", str(constraints), "mrl-probe"],
                                       capture_output=True, text=True, env=env)
    assert results["right"].returncode == 0, results["right"].stderr
    assert results["tampered"].returncode != 0 and "Hash mismatch" in results["tampered"].stderr, results["tampered"].stderr


def _env(find_links: tuple[str, ...]) -> Environment:
    torch = Torch("2.11.0", "2.11.0", "0.26.0", "0.26.0", find_links, False)
    return Environment("maxtext[tpu-post-train]==0.2.4", "maxtext", (), "maxtext.whl:overrides.txt", torch, pathlib.Path("maxtext.whl"), "")


@pytest.fixture
def index(tmp_path, monkeypatch):
    """(index folder, find-links folder): the overlay wheel needs mrl-probe,
    of which 1.0 and 1.1 are there, and the closure's torch."""
    monkeypatch.delenv("MRL_REFRESH", raising=False)
    for key, value in uv_offline_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    idx, links = tmp_path / "index", tmp_path / "links"
    idx.mkdir()
    links.mkdir()
    installable_wheel(idx, "maxtext-rl-overlay", "0.1.0+mrl.2.abc", ("mrl-probe", "torch", "torchvision"))
    for version in ("1.0", "1.1"):
        installable_wheel(links, "mrl-probe", version)
    installable_wheel(links, "torch", "2.11.0")
    installable_wheel(links, "torchvision", "0.26.0")
    return idx, links


def test_a_fresh_resolution_keeps_the_committed_versions(index, tmp_path, capsys):
    idx, links = index
    env = _env((str(links),))
    requirement = "maxtext-rl-overlay==0.1.0+mrl.2.abc"
    fresh = publish.resolve_closure(idx, requirement, sys.executable, env, cache=tmp_path / "cache1")
    assert "\nmrl-probe==1.1 " in fresh, "without preferences: the newest"
    assert re.search(r"\nmrl-probe==1\.1 \\\n(    --hash=\S+\n)+    # via maxtext-rl-overlay\n", fresh), fresh
    assert "#   -c maxtext-and-torch-constraints.txt\n" in fresh and "mrl-resolve-" not in fresh, "annotations name no temporary path"
    committed = tmp_path / "constraints.txt"
    committed.write_text("# a committed file\n--find-links ./dist\nmaxtext-rl-overlay==0.1.0+mrl.1.old \\\n    --hash=sha256:" + "0" * 64
                         + "\nmrl-probe==1.0 \\\n    --hash=sha256:" + "1" * 64 + "\nsix==1.0\ntorch==2.11.0\n")
    kept = publish.resolve_closure(idx, requirement, sys.executable, env, cache=tmp_path / "cache2", preferences=committed)
    assert "\nmrl-probe==1.0 " in kept and kept.startswith("maxtext-rl-overlay==0.1.0+mrl.2.abc ")
    err = capsys.readouterr().err
    # The overlay's own line is not a preference: the index has its new build.
    assert "preferring the 3 versions pinned in constraints.txt" in err
    assert "kept 2 of the 3 preferred versions; new: maxtext-rl-overlay 0.1.0+mrl.2.abc, torchvision 0.26.0; no longer needed: six" in err


def test_header_says_how_it_was_made_and_ours_keep_their_annotations():
    closure = ("google-tunix==0.1.7+mrl.2 \\\n    --hash=sha256:" + "9" * 64 + "\n    # via maxtext-rl-overlay\n"
               "jax==0.11.0 \\\n    --hash=sha256:" + "a" * 64 + "\n    # via\n    #   flax\n    #   maxtext\n")
    text = publish.constraints_text(closure, {"google_tunix-0.1.7+mrl.2-py3-none-any.whl": "b" * 64}, "./dist", notes=["a note."],
                                    env=_env(()), made_by=("Made by: maxtext-rl-overlay build --unpinned", "  with uv 0.13.9"))
    assert f"# Needs uv >= {publish.UV_CHECKS_CONSTRAINT_HASHES}: " in text
    assert "\n# Made by: maxtext-rl-overlay build --unpinned\n#   with uv 0.13.9\n" in text
    assert "\ngoogle-tunix==0.1.7+mrl.2 \\\n    --hash=sha256:" + "b" * 64 + "\n    # via maxtext-rl-overlay\n" in text
    assert text.endswith("    # via\n    #   flax\n    #   maxtext\n")
