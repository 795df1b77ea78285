"""The warm-rebuild caches: the closure resolution (closures.resolve)
keyed by its inputs, and the MaxText release looked up once and then reused
by its recorded sha256 (registry.release_wheel). No network, no build: `uv`
is a fake that counts its resolutions, the index is a function."""

from __future__ import annotations

import json
import os
import pathlib
import stat
import sys
import tempfile

import pytest

from maxtext_rl_overlay.config import registry
from maxtext_rl_overlay.config.target import Target, Torch
from maxtext_rl_overlay.core.digest import sha256_file
from maxtext_rl_overlay.core.errors import OverlayError
from maxtext_rl_overlay.stages import closures, indexpages
from unit.unit_support import fake_wheel, installable_wheel, uv_offline_env

CLOSURE = (
    "jax==0.8.0 \\\n    --hash=sha256:" + "a" * 64 + "\n"
    "maxtext-rl-overlay==0.1.0\n"
    "torch==2.11.0 \\\n    --hash=sha256:" + "b" * 64 + "\n"
    "torchvision==0.26.0 \\\n    --hash=sha256:" + "c" * 64 + "\n"
)
FAKE_UV = """#!/bin/sh
if [ "$1" = "--version" ]; then echo "uv 0.0.0 (fake)"; exit 0; fi
cat > /dev/null
echo compile >> "$FAKE_UV_LOG"
out=""; prev=""
for a in "$@"; do [ "$prev" = "--output-file" ] && out="$a"; prev="$a"; done
echo "$@" > "$FAKE_UV_LOG.args"  # what it was given
[ -e "$out" ] && echo "an output file to keep pins of" >> "$FAKE_UV_LOG"
cat "$FAKE_UV_CLOSURE" > "$out"
"""


@pytest.fixture
def resolver(tmp_path, monkeypatch):
    """(index folder, cache folder, number of `uv pip compile` runs so far)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    uv = bin_dir / "uv"
    uv.write_text(FAKE_UV)
    uv.chmod(uv.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "closure.txt").write_text(CLOSURE)
    log = tmp_path / "uv.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_UV_LOG", str(log))
    monkeypatch.setenv("FAKE_UV_CLOSURE", str(tmp_path / "closure.txt"))
    monkeypatch.delenv("MRL_REFRESH", raising=False)
    work = tmp_path / "work"  # no uv.toml or pyproject.toml above the resolver's folder but the system's
    work.mkdir()
    monkeypatch.chdir(work)
    index = tmp_path / "index"
    index.mkdir()
    fake_wheel(index, "maxtext-rl-overlay", "0.1.0")
    fake_wheel(index, "google-tunix", "0.1.7+mrl")
    indexpages.write_index(index)
    runs = lambda: len(log.read_text().splitlines()) if log.exists() else 0  # noqa: E731
    return index, tmp_path / "cache", runs


def _env(constraints=("jax==0.8.0",)) -> Target:
    torch = Torch("2.11.0+cpu", "2.11.0", "0.26.0+cpu", "0.26.0", (), True)
    return Target("maxtext[tpu-post-train]==0.2.4", "maxtext", tuple(constraints), "maxtext.whl:overrides.txt",
                       torch, pathlib.Path("maxtext.whl"), "")


CUTOFF = "2026-11-30T20:00:00Z"


def _resolve(index, cache, env=None, requirement="maxtext-rl-overlay[maxtext]==0.1.0", cutoff=CUTOFF):
    return closures.resolve(index, requirement, "python3", env or _env(), cutoff=cutoff, cache=cache)


def test_same_inputs_reuse_the_resolution(resolver, capsys):
    index, cache, runs = resolver
    first = _resolve(index, cache)
    assert runs() == 1 and first == CLOSURE
    (entry,) = (cache / "closures").iterdir()
    second = _resolve(index, cache)
    assert runs() == 1, "the same inputs resolved again"
    assert second == first
    assert f"closure unchanged: reusing the resolution of {entry.stem[:12]}" in capsys.readouterr().err


def test_the_index_is_keyed_by_content_not_folder(resolver, tmp_path):
    index, cache, runs = resolver
    _resolve(index, cache)
    moved = tmp_path / "another-staging-folder"
    index.rename(moved)
    assert _resolve(moved, cache) == CLOSURE
    assert runs() == 1


@pytest.mark.parametrize("change", ["wheel bytes", "new wheel", "constraint", "requirement", "torch", "cutoff", "uv setting", "uv.toml"])
def test_a_changed_input_is_a_miss(resolver, change, monkeypatch):
    index, cache, runs = resolver
    _resolve(index, cache)
    env, requirement, cutoff = _env(), "maxtext-rl-overlay[maxtext]==0.1.0", CUTOFF
    if change == "wheel bytes":
        fake_wheel(index, "google-tunix", "0.1.7+mrl", extra="# patched\n")
    elif change == "new wheel":
        fake_wheel(index, "tpu-inference", "0.25.0+mrl")
    elif change == "constraint":
        env = _env(("jax==0.8.1",))
    elif change == "requirement":
        requirement = "maxtext-rl-overlay[maxtext]==0.1.1"
    elif change == "torch":
        env = Target(**{**env.__dict__, "torch": Torch("2.11.0+cpu", "2.11.0+cpu", "0.26.0+cpu", "0.26.0+cpu", ("https://example.invalid/cpu",), False)})
        (pathlib.Path(os.environ["FAKE_UV_CLOSURE"])).write_text(CLOSURE.replace("==2.11.0", "==2.11.0+cpu").replace("==0.26.0", "==0.26.0+cpu"))
    elif change == "cutoff":
        cutoff = "2026-12-05T12:00:00Z"
    elif change == "uv setting":
        monkeypatch.setenv("UV_EXCLUDE_NEWER", "2026-01-01T00:00:00Z")
    elif change == "uv.toml":
        pathlib.Path("uv.toml").write_text('prerelease = "allow"\n')
    _resolve(index, cache, env, requirement, cutoff)
    assert runs() == 2, f"a changed {change} reused the old resolution"
    assert len(list((cache / "closures").iterdir())) == 2


@pytest.mark.parametrize("damage", ["truncated", "not json", "edited closure", "empty"])
def test_a_damaged_entry_is_ignored_and_rewritten(resolver, damage, capsys):
    index, cache, runs = resolver
    _resolve(index, cache)
    (entry,) = (cache / "closures").iterdir()
    text = entry.read_text()
    entry.write_text({"truncated": text[: len(text) // 2], "not json": "[]", "empty": "",
                      "edited closure": text.replace("jax==0.8.0", "jax==0.7.0")}[damage])
    assert _resolve(index, cache) == CLOSURE
    assert runs() == 2
    assert "ignoring a damaged cached resolution" in capsys.readouterr().err
    assert json.loads(entry.read_text())["closure"] == CLOSURE  # rewritten whole
    _resolve(index, cache)
    assert runs() == 2


def test_the_torch_check_runs_on_a_cached_answer(resolver):
    index, cache, runs = resolver
    _resolve(index, cache)
    (entry,) = (cache / "closures").iterdir()
    data = json.loads(entry.read_text())
    data["closure"] = CLOSURE.replace("torch==2.11.0", "torch==2.10.0")
    data["sha256"] = closures.closure_sha256(data["closure"])  # a whole entry, with a wrong answer
    entry.write_text(json.dumps(data))
    with pytest.raises(OverlayError, match="the closure pins torch 2.10.0, not 2.11.0"):
        _resolve(index, cache)
    assert runs() == 1


def test_the_cutoff_reaches_uv_and_no_output_file_is_there_to_prefer(resolver):
    index, cache, runs = resolver
    _resolve(index, cache)
    log = pathlib.Path(os.environ["FAKE_UV_LOG"])
    assert f" --exclude-newer {CUTOFF} " in f" {(log.parent / (log.name + '.args')).read_text().strip()} "
    assert log.read_text() == "compile\n", "uv was given an existing output file: its pins would be preferences"


def test_the_lock_is_uvs_output_file_and_part_of_the_key(resolver):
    """The committed file's pins (closures.resolve's `prefer`) reach uv as
    the output file it keeps pins of; other preferences, another answer."""
    index, cache, _ = resolver
    closures.resolve(index, "maxtext-rl-overlay[maxtext]==0.1.0", "python3", _env(), cutoff=CUTOFF, cache=cache, prefer="jax==0.8.0\n")
    log = pathlib.Path(os.environ["FAKE_UV_LOG"])
    assert log.read_text() == "compile\nan output file to keep pins of\n"
    closures.resolve(index, "maxtext-rl-overlay[maxtext]==0.1.0", "python3", _env(), cutoff=CUTOFF, cache=cache, prefer="jax==0.7.0\n")
    _resolve(index, cache)
    _resolve(index, cache)
    assert log.read_text().count("compile") == 3, "each set of preferences is its own resolution, and none is another's"


def test_refresh_resolves_afresh_and_a_cached_answer_has_no_age(resolver, monkeypatch, capsys):
    """With the cutoff in the key, a cached answer is what a fresh resolution
    gives on any day: it is reused however old (a day-old one was resolved
    afresh before); MRL_REFRESH=1 still resolves afresh."""
    index, cache, runs = resolver
    _resolve(index, cache)
    (entry,) = (cache / "closures").iterdir()
    data = json.loads(entry.read_text())
    assert data["inputs"]["exclude_newer"] == CUTOFF and "created" not in data
    os.utime(entry, (0, 0))  # as old as can be
    _resolve(index, cache)
    assert runs() == 1
    assert f"(the registry as of {CUTOFF}; MRL_REFRESH=1 resolves afresh)" in capsys.readouterr().err
    monkeypatch.setenv("MRL_REFRESH", "1")
    _resolve(index, cache)
    assert runs() == 2
    monkeypatch.setenv("MRL_REFRESH", "0")  # off, as an empty value
    _resolve(index, cache)
    assert runs() == 2


def test_a_failed_resolution_is_not_cached(resolver):
    index, cache, runs = resolver
    pathlib.Path(os.environ["FAKE_UV_CLOSURE"]).unlink()  # the fake's `cat` fails
    with pytest.raises(OverlayError, match="resolving the stack's closure failed"):
        _resolve(index, cache)
    assert not (cache / "closures").exists() or not list((cache / "closures").iterdir())


def test_a_resolution_the_cache_cannot_take_is_said_and_used(resolver, capsys):
    """As for a wheel or a patched tree (buildcache.Entry): a cache that
    cannot take the entry costs only its reuse."""
    index, cache, runs = resolver
    cache.mkdir()
    (cache / "closures").write_text("a file where the entries' folder would be")
    assert _resolve(index, cache) == CLOSURE
    assert "[constraints] the resolution was not kept for reuse (" in capsys.readouterr().err
    assert _resolve(index, cache) == CLOSURE
    assert runs() == 2



def test_the_resolution_names_its_inputs_by_file_name_wherever_the_tool_runs(tmp_path, monkeypatch):
    """uv names an input file by its path relative to the folder it runs
    in: the real uv, run from the folder above the resolver's temporary one
    (a build started in /tmp), wrote `-c mrl-resolve-XXXX/...` into the
    closure, and so into constraints.txt (and the cache, for a day)."""
    for name, value in uv_offline_env(tmp_path).items():
        monkeypatch.setenv(name, value)
    index = tmp_path / "index"
    index.mkdir()
    installable_wheel(index, "maxtext-rl-overlay", "0.1.0", requires=("jax",))
    installable_wheel(index, "jax", "0.8.0")
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.chdir(temp)
    closure = closures.uv_compile(index, "maxtext-rl-overlay", sys.executable, _env(), CUTOFF)
    assert "#   -c maxtext-and-torch-constraints.txt\n" in closure, closure
    assert "mrl-resolve-" not in closure, closure


# -- the MaxText release: one file-list read, then none ----------------------

@pytest.fixture
def index_of(tmp_path, monkeypatch):
    """A fake package index serving one wheel by file:// URL; returns the
    list of projects whose file list was read."""
    served = tmp_path / "served"
    served.mkdir()
    wheel = fake_wheel(served, "maxtext", "0.2.4")
    reads = []

    def files(project):
        reads.append(project)
        return [{"filename": "maxtext-0.2.4.tar.gz", "url": (served / "none").as_uri(), "hashes": {"sha256": "0" * 64}},
                {"filename": wheel.name, "url": wheel.as_uri(), "hashes": {"sha256": sha256_file(wheel)}}]

    monkeypatch.setattr(registry, "files", files)
    for var in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
        monkeypatch.delenv(var, raising=False)
    return reads


def test_release_is_looked_up_once_then_reused_offline(index_of, tmp_path, monkeypatch):
    dest = tmp_path / "releases"
    wheel = registry.release_wheel("maxtext", "0.2.4", dest)
    assert wheel == dest / "maxtext-0.2.4-py3-none-any.whl" and wheel.is_file()
    assert index_of == ["maxtext"]
    assert registry.release_wheel("maxtext", "0.2.4", dest) == wheel
    assert index_of == ["maxtext"], "a cached, checked release read the index again"
    monkeypatch.setenv("UV_DEFAULT_INDEX", "https://mirror.invalid/simple")  # another index: ask it
    registry.release_wheel("maxtext", "0.2.4", dest)
    assert index_of == ["maxtext", "maxtext"]


@pytest.mark.parametrize("damage", ["wheel", "record"])
def test_a_changed_cached_release_is_checked_again(index_of, tmp_path, damage):
    dest = tmp_path / "releases"
    wheel = registry.release_wheel("maxtext", "0.2.4", dest)
    good = wheel.read_bytes()
    if damage == "wheel":
        wheel.write_bytes(b"not the wheel")
    else:
        (dest / "maxtext-0.2.4.release.json").write_text("{")
    assert registry.release_wheel("maxtext", "0.2.4", dest).read_bytes() == good
    assert index_of == ["maxtext", "maxtext"]


def test_a_missing_release_keeps_its_message(index_of, tmp_path):
    with pytest.raises(OverlayError, match="the package index has no pure-Python wheel of maxtext 9.9"):
        registry.release_wheel("maxtext", "9.9", tmp_path / "releases")
