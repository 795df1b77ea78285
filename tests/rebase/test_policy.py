"""patches/<dist>/pin.toml [rebase]: what differs between distributions in
a rebase is data, checked when the pins are read."""

from __future__ import annotations

import pathlib
import shutil

import pytest

from maxtext_rl_overlay.config.pins import VERSION_RULES, LastKnownGood, RebasePolicy, load_project, read_pin
from maxtext_rl_overlay.core.errors import OverlayError
from maxtext_rl_overlay.rebase import versions
from support import ROOT


def _pin_with(tmp_path: pathlib.Path, table: str, dist: str = "tpu-inference") -> pathlib.Path:
    """A copy of a real pin folder whose [rebase] table is `table` (a
    top-level key when it is no table: TOML puts those first)."""
    folder = tmp_path / dist
    shutil.copytree(ROOT / "patches" / dist, folder)
    text = (folder / "pin.toml").read_text()
    text = text[: text.index("\n[rebase]")] + "\n"
    (folder / "pin.toml").write_text(text + table if table.startswith("[") or not table else table + text)
    return folder


def test_the_real_pins_say_how_they_rebase():
    pins = load_project(ROOT).pins
    assert pins["tpu-inference"].rebase == RebasePolicy("release-tag-dev-date", LastKnownGood(".buildkite/vllm_lkg.version", "vllm"))
    assert pins["google-tunix"].rebase == RebasePolicy("pyproject")
    assert pins["vllm"].rebase == RebasePolicy("kept")


def test_touched_files_follow_the_policy():
    pins = load_project(ROOT).pins
    assert pins["tpu-inference"].rebase.touched("tpu-inference") == ("patches/tpu-inference", "patches/vllm/pin.toml", "constraints.txt")
    assert pins["google-tunix"].rebase.touched("google-tunix") == ("patches/google-tunix", "constraints.txt")


def test_every_version_rule_has_its_function():
    assert tuple(versions.RULES) == VERSION_RULES


def test_no_table_keeps_the_version(tmp_path):
    assert read_pin(_pin_with(tmp_path, "")).rebase == RebasePolicy("kept", None)


@pytest.mark.parametrize(("table", "message"), [
    ('[rebase]\nversoin = "kept"\n', "unknown key(s) 'versoin' (did you mean 'version'?)"),
    ('[rebase]\nversion = "daily"\n', "version = 'daily' is not a version rule; choose from 'release-tag-dev-date', 'pyproject', 'kept'"),
    ('[rebase]\nlast-known-good = { file = "x", pin = "vllm", pinn = "vllm" }\n', "unknown key(s) 'pinn' (did you mean 'pin'?)"),
    ('[rebase]\nlast-known-good = { file = "x" }\n', "last-known-good lacks 'pin'"),
    ('[rebase]\nlast-known-good = { file = "x", pin = "torch" }\n', "pin = 'torch' must name another distribution: one of google-tunix, vllm"),
    ('[rebase]\nlast-known-good = { file = "x", pin = "tpu-inference" }\n', "must name another distribution"),
    ('[rebase]\nlast-known-good = { file = "../x", pin = "vllm" }\n', "must be a path inside the upstream tree"),
    ('[rebase]\nlast-known-good = ".buildkite/vllm_lkg.version"\n', "last-known-good must be a table"),
    ('rebase = "kept"\n', "[rebase] must be a table"),
])
def test_a_wrong_table_is_refused_with_what_to_write(tmp_path, table, message):
    with pytest.raises(OverlayError) as exc:
        read_pin(_pin_with(tmp_path, table))
    assert message in str(exc.value)
