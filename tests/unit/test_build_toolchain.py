"""vLLM's build toolchain pinned with hashes (buildenv.pinned_toolchain): the
committed file is used as it is while it records the tree's requirements,
and resolved again (its old versions preferred) when they change. Real uv,
offline, on wheels made here."""

from __future__ import annotations

import json
import sys

from maxtext_rl_overlay.stages import buildenv
from unit.unit_support import installable_wheel, uv_offline_env

CUTOFF = "2026-11-30T20:00:00Z"


def _setup(tmp_path, monkeypatch):
    links = tmp_path / "links"
    links.mkdir()
    for name, version in (("mrl-probe", "1.0"), ("mrl-probe", "1.1"), ("mrl-tool", "2.0")):
        installable_wheel(links, name, version)
    for key, value in uv_offline_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("UV_FIND_LINKS", str(links))
    return tmp_path / "build-requirements.txt"


def test_the_toolchain_file_is_made_then_kept_then_resolved_again_when_the_requirements_change(tmp_path, monkeypatch, capsys):
    path = _setup(tmp_path, monkeypatch)
    made = buildenv.pinned_toolchain("vllm", ["mrl-probe"], sys.executable, path, CUTOFF)
    assert path.read_text() == made
    assert "\nmrl-probe==1.1 \\\n    --hash=sha256:" in made
    assert ("\n# Made by: uv pip compile - --generate-hashes --no-header --quiet -c build-constraints.txt --exclude-newer 2026-11-30T20:00:00Z "
            "--python PYTHON ") in made, "the header names the cutoff it was resolved against"
    assert f"\n{buildenv._INPUT}{json.dumps(['mrl-probe'])}\n" in made
    assert "wrote the pinned build toolchain" in capsys.readouterr().err

    # The committed file, pinning 1.0: used as it is, whatever the index has since.
    old = made.replace("mrl-probe==1.1", "mrl-probe==1.0")
    path.write_text(old)
    assert buildenv.pinned_toolchain("vllm", ["mrl-probe"], sys.executable, path, CUTOFF) == old
    assert "build toolchain: 1 packages pinned with hashes by" in capsys.readouterr().err

    # The tree now asks for more: resolved again, keeping mrl-probe 1.0.
    again = buildenv.pinned_toolchain("vllm", ["mrl-probe", "mrl-tool"], sys.executable, path, CUTOFF)
    assert "\nmrl-probe==1.0 \\\n" in again and "\nmrl-tool==2.0 \\\n" in again
    assert "the tree's build requirements are not the ones it records" in capsys.readouterr().err


def test_the_environment_key_is_the_resolved_versions_and_hashes():
    a = "x==1.0 \\\n    --hash=sha256:aa \\\n    --hash=sha256:bb\n    # via y\n"
    assert buildenv._pins_and_hashes(a) == {"x": ("1.0", ("sha256:aa", "sha256:bb"))}
    assert buildenv._pins_and_hashes(a.replace("# via y", "# via z")) == buildenv._pins_and_hashes(a), "comments do not change the key"
    assert buildenv._pins_and_hashes(a.replace("1.0", "1.1")) != buildenv._pins_and_hashes(a)
