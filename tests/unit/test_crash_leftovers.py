"""What a run killed with no cleanup (SIGKILL, the OOM killer) leaves in the
cache is cleared by the next run that writes there, saying so, and never
taken for a result: a download of the package index's file, a MaxText
release's record, the cache's CACHEDIR.TAG. A scratch folder in TMPDIR
(`mrl-*`) is left as it is, and never read again. git's own lock file in the
rebase's fetched repository is named, with what to do, and left to the user.

Each kill is a child (the real code, SIGKILLing itself at one instant);
the next run is this process."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest

from maxtext_rl_overlay.cache import buildcache
from maxtext_rl_overlay.config import registry
from maxtext_rl_overlay.config.pins import Pin
from maxtext_rl_overlay.core import staging
from maxtext_rl_overlay.core.digest import sha256_file
from maxtext_rl_overlay.core.errors import OverlayError
from maxtext_rl_overlay.rebase import upstream
from support import ROOT
from unit.unit_support import commit_files, default_signals, fake_wheel, git

CLEARED = "cleared what a stopped run left beside"

#: Kills itself (SIGKILL) at argv[1], then runs argv[2] (Python) with argv[3:] as `args`.
CHILD = textwrap.dedent('''
    import os, pathlib, signal, sys
    from maxtext_rl_overlay.cache import buildcache
    from maxtext_rl_overlay.config import registry
    from maxtext_rl_overlay.core import staging
    point, code, args = sys.argv[1], sys.argv[2], sys.argv[3:]
    def die():
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace = os.replace
    def replace(src, dst):
        if point == f"before rename {pathlib.Path(dst).name}":
            die()
        real_replace(src, dst)
    os.replace = replace
    exec(code)
''')


def _killed(point: str, code: str, *args: str, env: dict[str, str] | None = None) -> None:
    done = subprocess.run([sys.executable, "-c", CHILD, point, textwrap.dedent(code), *args], capture_output=True, text=True,
                          timeout=60, preexec_fn=default_signals, env=env)
    assert done.returncode == -signal.SIGKILL, (done.returncode, done.stderr)


def _staged(folder: pathlib.Path, name: str) -> list[str]:
    """The staged files `NAME.<8 hex>` in `folder`."""
    return [p.name for p in folder.iterdir() if re.fullmatch(re.escape(name) + r"\.[0-9a-f]{8}", p.name)]


# -- 1. a download into the cache ------------------------------------------

#: The child's download: the served wheel (by file:// URL) into argv[4]'s
#: releases/, its response cut after the first 100 bytes at "mid-download".
DOWNLOAD = '''
    served, dest = pathlib.Path(args[0]), pathlib.Path(args[1])
    wheel = next(served.glob("*.whl"))
    registry.files = lambda project: [{"filename": wheel.name, "url": wheel.as_uri(), "hashes": {"sha256": registry.sha256_file(wheel)}}]
    real_urlopen = registry.urllib.request.urlopen
    class Cut:
        def __init__(self, response):
            self.response, self.reads = response, 0
        def __enter__(self):
            return self
        def __exit__(self, *exc):
            self.response.close()
        def read(self, size):
            self.reads += 1
            if self.reads == 2 and point == "mid-download":
                die()
            return self.response.read(100)
    registry.urllib.request.urlopen = lambda url, **kw: Cut(real_urlopen(url))
    registry.release_wheel("maxtext", "0.2.4", dest)
'''


@pytest.mark.parametrize("point", ["mid-download", "before rename maxtext-0.2.4-py3-none-any.whl",
                                   "before rename maxtext-0.2.4.release.json"])
def test_a_download_killed_into_the_cache_is_cleared_by_the_next_one(tmp_path, monkeypatch, capsys, point):
    served = tmp_path / "served"
    served.mkdir()
    wheel = fake_wheel(served, "maxtext", "0.2.4", extra="x = 1\n" * 200)
    dest = tmp_path / "cache" / "releases"
    for var in ("UV_DEFAULT_INDEX", "UV_INDEX_URL", "PIP_INDEX_URL"):
        monkeypatch.delenv(var, raising=False)
    _killed(point, DOWNLOAD, str(served), str(dest))
    name = wheel.name if "release.json" not in point else "maxtext-0.2.4.release.json"
    left = _staged(dest, name)
    assert len(left) == 1, sorted(p.name for p in dest.iterdir())
    assert not (dest / "maxtext-0.2.4.release.json").exists(), "no record of a release that was not whole"

    monkeypatch.setattr(registry, "files", lambda project: [
        {"filename": wheel.name, "url": wheel.as_uri(), "hashes": {"sha256": sha256_file(wheel)}}])
    got = registry.release_wheel("maxtext", "0.2.4", dest)
    assert got.read_bytes() == wheel.read_bytes()
    assert sorted(p.name for p in dest.iterdir()) == sorted([wheel.name, "maxtext-0.2.4.release.json"])
    assert f"{CLEARED} {dest / name}: {left[0]}" in capsys.readouterr().err


def test_a_download_that_fails_its_check_leaves_nothing(tmp_path, monkeypatch):
    served = tmp_path / "served"
    served.mkdir()
    wheel = fake_wheel(served, "maxtext", "0.2.4")
    dest = tmp_path / "cache" / "releases"
    monkeypatch.setattr(registry, "files", lambda project: [{"filename": wheel.name, "url": wheel.as_uri(), "hashes": {"sha256": "0" * 64}}])
    with pytest.raises(OverlayError, match="downloaded sha256 .* is not the 0+ the index lists"):
        registry.release_wheel("maxtext", "0.2.4", dest)
    assert list(dest.iterdir()) == []


# -- 2. the cache's tag --------------------------------------------------------

TAG = '''
    buildcache.claim(pathlib.Path(args[0]))
'''


@pytest.mark.parametrize("tagged", [False, True], ids=["a new cache", "a tagged cache"])
def test_a_tag_killed_mid_write_is_cleared_by_the_next_run(tmp_path, capsys, tagged):
    cache = tmp_path / "cache"
    _killed(f"before rename {buildcache.CACHEDIR_TAG}", TAG, str(cache))
    left = _staged(cache, buildcache.CACHEDIR_TAG)
    assert sorted(p.name for p in cache.iterdir()) == left and len(left) == 1
    if tagged:  # a build tagged it since, or one killed tagging it alongside another
        (cache / buildcache.CACHEDIR_TAG).write_text(buildcache.TAG_TEXT)
    buildcache.claim(cache)
    assert [p.name for p in cache.iterdir()] == [buildcache.CACHEDIR_TAG]
    assert buildcache.own_tag(cache)
    assert f"{CLEARED} {cache / buildcache.CACHEDIR_TAG}: {left[0]}" in capsys.readouterr().err
    buildcache.claim(cache)
    assert capsys.readouterr().err == ""


def test_a_staged_tag_of_a_live_run_is_left_to_it(tmp_path):
    """A run tagging the cache holds the folder's lock: the staged tag is
    its own until it lets go, and the next run waits rather than remove it."""
    cache = tmp_path / "cache"
    cache.mkdir()
    staged = cache / f"{buildcache.CACHEDIR_TAG}.0badcafe"
    with buildcache.folder_lock(cache) as held:
        assert held
        staged.write_text("being written")
        other = threading.Thread(target=buildcache.claim, args=(cache,))
        other.start()
        time.sleep(0.3)
        assert other.is_alive() and staged.exists()
        staged.unlink()  # the live run's rename
        (cache / buildcache.CACHEDIR_TAG).write_text(buildcache.TAG_TEXT)
    other.join(10)
    assert not other.is_alive()
    assert [p.name for p in cache.iterdir()] == [buildcache.CACHEDIR_TAG]


# -- 3. scratch folders in TMPDIR ----------------------------------------------

SCRATCH = '''
    with staging.scratch_dir("mrl-test-") as tmp:
        (tmp / "half").write_text("half")
        os.replace(tmp / "half", tmp / "x")
'''


def test_a_killed_runs_scratch_folder_is_left_in_tmpdir_and_never_read(tmp_path, monkeypatch):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    _killed("before rename x", SCRATCH, env=dict(os.environ, TMPDIR=str(tmpdir)))
    (left,) = tmpdir.iterdir()
    assert left.name.startswith("mrl-test-") and [p.name for p in left.iterdir()] == ["half"]
    monkeypatch.setattr(tempfile, "tempdir", str(tmpdir))
    with staging.scratch_dir("mrl-test-") as fresh:
        assert fresh != left and not any(fresh.iterdir()), "a new run starts from an empty folder of its own"
    assert list(tmpdir.iterdir()) == [left], "another run's scratch folder (live or not) is not the next run's to remove"


def test_every_scratch_folder_the_tool_makes_is_named_mrl():
    """docs/failures.md's table names them `mrl-*` in TMPDIR: so is each one made
    outside a destination's folder (no dir=)."""
    made = re.compile(r"(mkdtemp|mkstemp|TemporaryDirectory|NamedTemporaryFile|scratch_dir)\((.*)")
    found = []
    for path in sorted((ROOT / "overlay").rglob("*.py")):
        for line in path.read_text().splitlines():
            call = made.search(line)
            if call is None or line.lstrip().startswith(("def ", "#")) or "dir=" in call.group(2) or call.group(2).startswith("prefix=prefix"):
                continue
            prefix = re.match(r'(?:prefix=)?f?"([^"]*)"', call.group(2))
            found.append(prefix.group(1) if prefix else line.strip())
    assert found and all(p.startswith("mrl-") for p in found), found


# -- 4. git's lock files in the rebase's fetched repository --------------------

def _pin(tmp_path: pathlib.Path, repository: str, commit: str) -> Pin:
    return Pin(distribution="x", import_package="x", repository=repository, commit=commit, tree="", date="2026-07-27T09:44:06+00:00",
               version="1", build_env={}, requirement_overrides={}, requirement_files=(), directory=tmp_path / "patches" / "x", series=())


def test_a_git_lock_file_left_in_the_rebase_repository_is_named_not_removed(tmp_path):
    repo = tmp_path / "upstream"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    commit = commit_files(repo, {"x/__init__.py": "A = 1\n"}, "the pin", "2026-07-27T09:44:06+00:00")
    git(repo, "tag", "v1")
    pin = _pin(tmp_path, str(repo), commit)
    cache = tmp_path / "cache"
    buildcache.claim(cache)
    git_dir = cache / "git" / "x-rebase.git"
    git_dir.mkdir(parents=True)
    git(git_dir, "init", "-q", "--bare")
    lock = git_dir / "refs" / "tags" / "v1.lock"
    lock.write_text("")  # a fetch killed while it updated the tags
    with pytest.raises(OverlayError) as raised:
        upstream._fetch(pin, "main", cache)
    said = str(raised.value)
    assert f"git's lock file {lock} exists" in said and f"If no other rebase is running, remove {lock}" in said, said
    assert "--source" not in said
    assert lock.exists(), "git's lock file is the user's to remove"
    lock.unlink()
    assert upstream._fetch(pin, "main", cache) == git_dir


def test_other_fetch_failures_still_suggest_a_source(tmp_path):
    pin = _pin(tmp_path, str(tmp_path / "absent"), "0" * 40)
    with pytest.raises(OverlayError, match="Pass --source PATH"):
        upstream._fetch(pin, "main", tmp_path / "cache")

