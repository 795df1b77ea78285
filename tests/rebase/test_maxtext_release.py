"""`rebase --maxtext VERSION` on a real move: a MaxText-shaped release (the
real 0.2.4 wheel, its deps file rewritten to name upstream's mains that
../shared/upstream holds: Tunix main-2026-08-21, tpu-inference
main-2026-08-22, vLLM's pin unchanged), served as a package index on
127.0.0.1; the real rebase with --source for both repositories, then the
fast tests on the result."""

from __future__ import annotations

import os
import tomllib

import pytest

from maxtext_rl_overlay.config import registry
from support.rebase import git, make_project, rebase, row
from unit.unit_support import PackageIndex, maxtext_release

SOURCES = dict(s.split("=", 1) for s in os.environ.get("MRL_SOURCES", "").split())
MAINS = {"google-tunix": "c7d8950f12a9c55a976bf2e1a0d8b447d71c20b3", "tpu-inference": "b8692ff01fa191343836996c27a39dc95f008b88"}
VERSION = "0.2.5.dev20260822"


@pytest.mark.github
@pytest.mark.skipif(
    not {"google-tunix", "tpu-inference"} <= set(SOURCES),
    reason="needs google-tunix and tpu-inference git repositories holding the pins and upstream's mains (MRL_SOURCES="
    "'google-tunix=PATH tpu-inference=PATH': mirrors, or ../shared/upstream's, which scripts/test.sh names when present): "
    f"would have moved every pin with `rebase --maxtext {VERSION}` (a release naming those mains) and the maxtext extra, "
    "and run the fast tests on the result",
)
def test_a_release_naming_upstreams_mains_moves_both_pins_and_the_extra(tmp_path, monkeypatch):
    served = tmp_path / "index"
    served.mkdir()
    real = registry.release_wheel("maxtext", "0.2.4", tmp_path / "real")  # from the package index, checked
    project = make_project(tmp_path / "project", {})
    vllm = tomllib.loads((project / "patches" / "vllm" / "pin.toml").read_text())["commit"]
    maxtext_release(served, VERSION, {**MAINS, "vllm": vllm}, base=real)
    with PackageIndex(served) as index:
        monkeypatch.setenv("UV_DEFAULT_INDEX", index.url)
        proc = rebase(project, "--maxtext", VERSION, *(a for n in MAINS for a in ("--source", f"{n}={SOURCES[n]}")))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "vllm           0ba2aa35a81d -> 0ba2aa35a81d  (already the release's)" in out, out
    for name, commit in MAINS.items():
        assert tomllib.loads((project / "patches" / name / "pin.toml").read_text())["commit"] == commit
        assert f"rebase {name}: " in out and f" -> {commit[:12]}" in out
    # Every backport is upstream at those mains (rows by name prefix).
    for backport in ("backport-984b29c49-", "backport-995930220-", "backport-e27319786-", "backport-9cfd2bd29-", "backport-b9ff349c8-",
                     "backport-9a17c3714-"):
        assert row(out, backport).startswith("dropped: already upstream"), out
    extra = tomllib.loads((project / "pyproject.toml").read_text())["project"]["optional-dependencies"]["maxtext"]
    assert extra == [f"maxtext[tpu-post-train]=={VERSION}"]
    assert "fast tests (tests/unit): passed" in out, out
    changed = {line[3:] for line in git(project, "status", "--porcelain").splitlines()}
    assert "pyproject.toml" in changed and "patches/google-tunix/pin.toml" in changed and "patches/tpu-inference/pin.toml" in changed
    assert not (project / "build" / "rebase" / "release").exists()
    print(out)
