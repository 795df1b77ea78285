"""The shared build cache: builds that share it wait for each other's
entries instead of breaking them, `clean` empties it but never under a
running build, and it is tagged as a cache (CACHEDIR.TAG). The tag is also
what makes a folder the tool's: a build starts a cache only in an empty
folder, and `clean` removes only what the tool keeps, only where it is tagged."""

from __future__ import annotations

import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest

from maxtext_rl_overlay.cache import buildcache, cachekeys
from maxtext_rl_overlay.core.errors import OverlayError
from maxtext_rl_overlay.stages import buildenv
from support import ROOT

#: One builder: buildenv.prepare of one entry, with the slow venv making
#: (uv, torch) replaced by a fake that takes its time filling the entry and
#: checks, before finishing, that nobody removed what it wrote.
BUILDER = textwrap.dedent("""
    import pathlib, sys, time
    from maxtext_rl_overlay.stages import buildenv
    from maxtext_rl_overlay.config.target import Torch

    cache, tree, log, toolchain = (pathlib.Path(a) for a in sys.argv[1:5])

    def slow_make(who, root, python, requires, torch, cutoff):
        root.mkdir(parents=True)
        (root / "filling").write_text("")
        with log.open("a") as f:
            f.write("make\\n")
        # Filling until the test has seen the other builder wait (not for a
        # fixed time: a loaded machine may start the other one later).
        deadline = time.monotonic() + 120
        while not (log.parent / "go").exists():
            if time.monotonic() > deadline:
                sys.exit("the test never said go")
            time.sleep(0.05)
        if not (root / "filling").is_file():
            sys.exit("another builder removed the build environment this one was filling")
        return {"version": torch.version, "cuda": ""}  # the record, which the entry writes last

    buildenv._make = slow_make
    env = buildenv.prepare("vllm", tree, Torch("2.11.0", "2.11.0", "0.26.0", "0.26.0", (), False), sys.executable, cache, toolchain,
                           "2026-11-30T20:00:00Z")
    print(env.root.name)
""")


def test_two_builders_of_one_build_environment(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "pyproject.toml").write_text('[build-system]\nrequires = ["torch == 2.11.0", "wheel"]\n')
    # The pinned toolchain of those requirements (torch aside), as committed.
    toolchain = tmp_path / "build-requirements.txt"
    toolchain.write_text(f"{buildenv._INPUT}[\"wheel\"]\nwheel==0.45.1 \\\n    --hash=sha256:{'0' * 64}\n")
    cache, log = tmp_path / "cache", tmp_path / "makes.log"
    args = [sys.executable, "-c", BUILDER, str(cache), str(tree), str(log), str(toolchain)]
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not log.exists():  # the first one is filling the entry
        assert first.poll() is None, first.communicate()
    second = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    assert second.stderr is not None
    for line in second.stderr:  # the first holds the entry until the second says it waits for it
        seen.append(line)
        if "waiting for another build to finish with the cache's buildenv/" in line:
            break
    (tmp_path / "go").write_text("")
    rest, second_err = second.communicate(timeout=120)
    second_err = "".join(seen) + second_err
    out, err = first.communicate(timeout=120)
    assert first.returncode == 0, err
    assert second.returncode == 0, second_err
    assert out == rest, "both use the same entry"
    assert log.read_text() == "make\n", "the second builder waited and reused the entry instead of making it again"
    assert "waiting for another build to finish with the cache's buildenv/" in second_err
    assert (cache / "buildenv" / out.strip() / buildcache.RECORD).is_file()


def test_clean_empties_the_cache_but_not_under_a_running_build(tmp_path):
    cache = tmp_path / "cache"
    with buildcache.using(cache):
        for kind in ("sources", "wheels", "buildenv"):
            (cache / kind / "entry").mkdir(parents=True)
            (cache / kind / "entry" / "data").write_bytes(b"x" * 1000)
        with pytest.raises(OverlayError, match="in use by a running build"):
            buildcache.clean(cache)
    assert (cache / "CACHEDIR.TAG").read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55\n")
    done = _cli("clean", env=dict(os.environ, MRL_CACHE_DIR=str(cache)))
    assert done.returncode == 0, done.stderr
    assert "buildenv, sources, wheels" in done.stdout
    assert sorted(p.name for p in cache.iterdir()) == ["CACHEDIR.TAG", "locks"]
    # A build that starts while clean holds the cache is refused, not let in.
    with buildcache.flock(cache / buildcache.LOCKS / buildcache.ROOT_LOCK, who="clean", what="the cache"):
        with pytest.raises(OverlayError, match="being cleaned"), buildcache.using(cache):
            pass


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "maxtext_rl_overlay", *args], capture_output=True, text=True, cwd=ROOT, env=env)


def test_clean_refuses_a_folder_the_tool_did_not_make(tmp_path):
    """MRL_CACHE_DIR may name anything (a typo, ~/.cache): without the
    tool's own CACHEDIR.TAG, clean removes nothing."""
    folder = tmp_path / "not-a-cache"
    (folder / ".ssh").mkdir(parents=True)
    (folder / ".ssh" / "id_ed25519").write_text("key")
    (folder / "notes.txt").write_text("mine")
    (folder / "wheels").mkdir()  # even where a name is one the tool uses
    for tag in (None, "Signature: 8a477f597d28d172789f06886806bc55\n# another program's cache\n"):
        if tag:
            (folder / "CACHEDIR.TAG").write_text(tag)
        done = _cli("clean", env=dict(os.environ, MRL_CACHE_DIR=str(folder)))
        assert done.returncode == 3, done.stderr
        assert f"{folder} (MRL_CACHE_DIR) does not carry maxtext-rl-overlay's CACHEDIR.TAG" in done.stderr
        assert sorted(p.name for p in folder.iterdir()) == sorted([".ssh", "notes.txt", "wheels", *(["CACHEDIR.TAG"] if tag else [])])
        assert (folder / ".ssh" / "id_ed25519").read_text() == "key"


def test_clean_removes_only_what_the_tool_keeps_and_names_the_rest(tmp_path):
    cache = tmp_path / "cache"
    kinds = ("buildenv", "closures", "git", "patched", "releases", "sources", "standins", "wheels")
    with buildcache.using(cache):
        for kind in kinds:
            (cache / kind / "entry").mkdir(parents=True)
    (cache / "notes.txt").write_text("mine")
    (cache / "mine").mkdir()
    (cache / "sources-link").symlink_to(tmp_path)
    done = _cli("clean", env=dict(os.environ, MRL_CACHE_DIR=str(cache)))
    assert done.returncode == 0, done.stderr
    assert f"removed {', '.join(kinds)};" in done.stdout
    assert "clean: left mine, notes.txt, sources-link: not the tool's" in done.stdout
    assert sorted(p.name for p in cache.iterdir()) == ["CACHEDIR.TAG", "locks", "mine", "notes.txt", "sources-link"]


def test_a_build_does_not_start_a_cache_in_a_folder_holding_other_files(tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    with pytest.raises(OverlayError, match=r"holds notes.txt and no CACHEDIR.TAG of maxtext-rl-overlay"):
        with buildcache.using(folder):
            pass
    assert sorted(p.name for p in folder.iterdir()) == ["notes.txt"], "not tagged (which would hide it from backups), nothing made"
    empty = tmp_path / "empty"
    empty.mkdir()
    with buildcache.using(empty):  # an empty folder, or an absent one, becomes the cache
        pass
    with buildcache.using(tmp_path / "absent"), buildcache.using(empty):  # and stays it
        pass
    assert (empty / "CACHEDIR.TAG").read_text() == (tmp_path / "absent" / "CACHEDIR.TAG").read_text()
    assert (empty / "CACHEDIR.TAG").stat().st_mode & 0o777 == 0o666 & ~_umask()


def test_a_build_refuses_a_cache_folder_it_did_not_make(tmp_path):
    folder = tmp_path / "home"
    (folder / ".ssh").mkdir(parents=True)
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md"):
        (project / name).write_bytes((ROOT / name).read_bytes())
    shutil.copytree(ROOT / "patches", project / "patches")
    done = _cli("build", "--only", "google-tunix", "--project", str(project),
                env=dict(os.environ, MRL_CACHE_DIR=str(folder), UV_DEFAULT_INDEX=(tmp_path / "no-index").as_uri()))  # offline
    assert done.returncode == 3, done.stderr
    assert f"the cache folder {folder} (MRL_CACHE_DIR) holds .ssh and no CACHEDIR.TAG" in done.stderr
    assert [p.name for p in folder.iterdir()] == [".ssh"]


def test_every_kind_of_entry_the_code_keeps_is_one_clean_knows():
    """KINDS is what clean removes: a folder some code keeps in the cache
    (`cache / "name"`, or the kind asked for its entry: `KINDS["name"]`) that
    it does not list would outlive every clean, and one it lists that nothing
    keeps is a stale entry."""
    pattern = re.compile(r'cache(?:_dir(?:\(\))?)?\)? / "([^"]+)"|KINDS\["([^"]+)"\]')
    files = [*(ROOT / "overlay").rglob("*.py"), ROOT / "tests" / "standins.py", *(ROOT / "tests" / "support").glob("*.py")]
    kept = {m.group(1) or m.group(2): path.relative_to(ROOT).as_posix() for path in files for m in pattern.finditer(path.read_text())}
    assert set(kept) == set(buildcache.KINDS), kept


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _git(repo: pathlib.Path, *args: str) -> str:
    env = dict(os.environ, GIT_AUTHOR_NAME="u", GIT_AUTHOR_EMAIL="u@u", GIT_COMMITTER_NAME="u", GIT_COMMITTER_EMAIL="u@u",
               GIT_AUTHOR_DATE="2026-07-27T09:44:06-07:00", GIT_COMMITTER_DATE="2026-07-27T09:44:06-07:00",
               GIT_CONFIG_NOSYSTEM="1", GIT_CONFIG_GLOBAL=os.devnull)
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True).stdout.strip()


@pytest.mark.parametrize("given", ["git", "tree"])
def test_a_cached_source_tree_edited_in_the_cache_is_made_again(tmp_path, capsys, given):
    """The cached tree is checked against its tree id whenever it is reused:
    a file edited there must not go into the next wheel as the pin; from a
    git repository (checked out file by file) and from a source tree (copied)."""
    import dataclasses

    from maxtext_rl_overlay.config.pins import load_project
    from maxtext_rl_overlay.core import gittree
    from maxtext_rl_overlay.stages import sources

    repo = tmp_path / "upstream"
    (repo / "tpu_inference").mkdir(parents=True)
    (repo / "tpu_inference" / "__init__.py").write_text("PINNED = True\n")
    (repo / "run.sh").write_text("#!/bin/sh\n")
    (repo / "run.sh").chmod(0o755)
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "upstream")
    pin = dataclasses.replace(load_project(ROOT).pins["tpu-inference"], commit=_git(repo, "rev-parse", "HEAD"),
                              tree=_git(repo, "rev-parse", "HEAD^{tree}"), date=_git(repo, "log", "-1", "--format=%cI"))
    cache = tmp_path / "cache"
    if given == "tree":
        shutil.rmtree(repo / ".git")
    first = sources.obtain(pin, str(repo), allow_unpinned=False, cache=cache)
    assert first.from_pin and first.tree == pin.tree
    assert sources.obtain(pin, str(repo), allow_unpinned=False, cache=cache).path == first.path
    assert "making it again" not in capsys.readouterr().err, "an unchanged tree is reused"

    (first.path / "tpu_inference" / "__init__.py").write_text("PINNED = False  # edited in the cache\n")
    (first.path / "run.sh").chmod(0o644)
    again = sources.obtain(pin, str(repo), allow_unpinned=False, cache=cache)
    assert (again.path / "tpu_inference" / "__init__.py").read_text() == "PINNED = True\n"
    assert (again.path / "run.sh").stat().st_mode & 0o100
    assert gittree.tree_id(again.path) == pin.tree
    assert f"[tpu-inference] ignoring a damaged kept source tree {pin.tree[:12]}: making it again" in capsys.readouterr().err


def _wheel(path: pathlib.Path, files: dict[str, str]) -> pathlib.Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in {**files, "maxtext-0.2.4.dist-info/METADATA": "Name: maxtext\nVersion: 0.2.4\n"}.items():
            zf.writestr(name, text)
    return path


def test_a_release_wheel_unpacked_before_is_not_unpacked_again(tmp_path, monkeypatch, capsys):
    """A pin with [release] is built from its wheel unpacked (MaxText's: 36
    MiB, some 650 files): a build of a wheel of the same sha256 reuses the
    cached tree its first build made, without unpacking it again, still
    checked against the pin's tree; a wheel of another sha256, or a cached
    tree that is damaged or gone, is unpacked."""
    import dataclasses

    from maxtext_rl_overlay.config.pins import Release, load_project
    from maxtext_rl_overlay.core import gittree
    from maxtext_rl_overlay.core.digest import sha256_file
    from maxtext_rl_overlay.stages import sources

    wheel = _wheel(tmp_path / "maxtext-0.2.4-py3-none-any.whl", {"maxtext/__init__.py": "PINNED = True\n"})
    sources.unpack_wheel(wheel, tmp_path / "pinned")
    sha = sha256_file(wheel)
    pin = dataclasses.replace(load_project(ROOT).pins["maxtext"], release=Release(wheel.name, sha), tree=gittree.tree_id(tmp_path / "pinned"))
    unpacked: list[str] = []
    unpack = sources.unpack_wheel

    def counted(w: pathlib.Path, dest: pathlib.Path) -> None:
        unpacked.append(sha256_file(w))
        unpack(w, dest)

    monkeypatch.setattr(sources, "unpack_wheel", counted)
    cache = tmp_path / "cache"

    first = sources.obtain(pin, str(wheel), allow_unpinned=False, cache=cache)
    assert first.from_pin and first.tree == pin.tree and first.upstream_version == "0.2.4"
    assert unpacked == [sha]
    assert "unpacking" in capsys.readouterr().err
    again = sources.obtain(pin, str(wheel), allow_unpinned=False, cache=cache)
    assert again == first, "the same tree, from the same entry"
    assert unpacked == [sha], "the same wheel is not unpacked again"
    assert "unpacking" not in capsys.readouterr().err
    with pytest.raises(OverlayError, match="unpacks to tree .* records tree 0{40}"):
        sources.obtain(dataclasses.replace(pin, tree="0" * 40), str(wheel), allow_unpinned=False, cache=cache)
    assert len(unpacked) == 1, "the pin's tree is checked against the recorded one"

    (tmp_path / "other").mkdir()  # a stand-in: the pinned wheel's name, other files
    other = _wheel(tmp_path / "other" / wheel.name, {"maxtext/__init__.py": "PINNED = False\n"})
    stand_in = sources.obtain(pin, str(other), allow_unpinned=True, cache=cache)
    assert not stand_in.from_pin and stand_in.tree != pin.tree
    assert unpacked == [sha, sha256_file(other)], "a wheel of another sha256 is unpacked"
    assert sources.obtain(pin, str(other), allow_unpinned=True, cache=cache).path == stand_in.path
    assert len(unpacked) == 2

    (first.path / "maxtext" / "__init__.py").write_text("PINNED = False  # edited in the cache\n")
    assert sources.obtain(pin, str(wheel), allow_unpinned=False, cache=cache) == first
    assert (first.path / "maxtext" / "__init__.py").read_text() == "PINNED = True\n"
    assert len(unpacked) == 3, "a damaged cached tree is unpacked again"
    shutil.rmtree(first.path.parent)
    assert sources.obtain(pin, str(wheel), allow_unpinned=False, cache=cache) == first
    assert len(unpacked) == 4, "and so is a missing one"
    assert sources.obtain(pin, str(wheel), allow_unpinned=False, cache=cache) == first
    assert len(unpacked) == 4
    capsys.readouterr()
    (cache / "sources" / f"maxtext-wheel-{sha}.json").write_text(json.dumps({"key": sha, "tree": "../elsewhere"}))
    assert sources.obtain(pin, str(wheel), allow_unpinned=False, cache=cache) == first
    assert len(unpacked) == 5, "as is a wheel whose record is damaged"
    assert f"[maxtext] ignoring a damaged kept source tree {sha[:12]}: making it again" in capsys.readouterr().err
    assert sources.obtain(pin, str(wheel), allow_unpinned=False, cache=cache) == first
    assert len(unpacked) == 5


def test_a_compiled_wheel_is_kept_by_its_compiler_too(tmp_path, monkeypatch):
    """vLLM's wheel (built in a build environment: it compiles) is keyed by
    the compilers it finds, so a warm rebuild after a compiler upgrade
    compiles again, as a cold one would; a pure-Python wheel's key is not."""
    from maxtext_rl_overlay.stages import wheels

    monkeypatch.setattr(cachekeys, "uv_version", lambda: "uv 0.0.0 (fake)")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "setup.py").write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()

    def compilers(version: str) -> None:
        for name in ("cc", "c++", "gcc-13"):
            (bin_dir / name).write_text(f"#!/bin/sh\necho '{name} (fake) {version}'\n")
            (bin_dir / name).chmod(0o755)
        cachekeys.compiler_version.cache_clear()  # a new run of the tool

    build_env = buildenv.BuildEnv(tmp_path / "buildenv" / "k", pathlib.Path(sys.executable), {"PATH": str(bin_dir)}, "2.11.0", "")
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.delenv("CXX", raising=False)

    def key(with_env: buildenv.BuildEnv | None = build_env) -> str:
        return cachekeys.key(wheels.wheel_inputs(tree, {}, "0", sys.executable, with_env))

    compilers("12.2.0")
    before, pure = key(), key(None)
    assert key() == before, "the same compilers, the same key"
    compilers("13.1.0")
    assert key() != before, "an upgraded cc/c++ must not reuse the wheel it did not compile"
    assert key(None) == pure, "a pure-Python wheel does not depend on the compiler"
    upgraded = key()
    monkeypatch.setenv("CC", "gcc-13")
    assert key() != upgraded, "CC names the compiler the build uses"


# -- a kept result (buildcache.Entry): the wheels, the patched trees, the resolutions --

@pytest.mark.parametrize("damage", ["wheel bytes", "wheel gone", "record", "another key's"])
def test_a_damaged_kept_wheel_is_said_removed_and_built_afresh(tmp_path, capsys, damage):
    from maxtext_rl_overlay.stages import wheels

    cache, inputs = tmp_path / "cache", {"tree": "a" * 40}
    wheel = tmp_path / "x-1.0-py3-none-any.whl"
    wheel.write_bytes(b"the wheel")
    assert wheels.kept_wheel(cache, inputs, tmp_path / "out", "x") is None
    assert capsys.readouterr().err == "", "no entry: nothing to say"
    wheels.keep_wheel(cache, inputs, wheel, "x")
    kept = wheels.kept_wheel(cache, inputs, tmp_path / "out", "x")
    assert kept is not None and kept.read_bytes() == b"the wheel"
    (entry,) = (cache / "wheels").iterdir()
    record = entry / "record.json"
    if damage == "wheel bytes":
        (entry / wheel.name).write_bytes(b"another wheel")
    elif damage == "wheel gone":
        (entry / wheel.name).unlink()
    elif damage == "record":
        record.write_text(record.read_text()[:20])
    else:
        record.write_text(record.read_text().replace(entry.name, "0" * 64))
    capsys.readouterr()
    assert wheels.kept_wheel(cache, inputs, tmp_path / "again", "x") is None
    assert f"[x] ignoring a damaged kept wheel {entry.name[:12]}: building afresh" in capsys.readouterr().err
    assert not entry.exists(), "removed: the build keeps its new wheel there"


def test_every_kind_is_an_entry_and_only_a_kind_with_records_keeps_them(tmp_path):
    """A git mirror and a download are Entries (their lock is an entry's)
    without records: they are checked by what names them, so the
    record-keeping refuses them; a folder that is no kind is refused."""
    said = buildcache.Said("thing", "making it again")
    mirror = buildcache.Entry(tmp_path / "git" / "x.git", "x.git", who="x", kind="git")
    assert mirror.lock_path == tmp_path / buildcache.LOCKS / "git" / "x.git.lock"
    with mirror.locked():
        assert mirror.lock_path.exists()
    with pytest.raises(ValueError, match="records"):
        mirror.reuse(lambda record: record)
    with pytest.raises(ValueError, match="records"):
        mirror.store({})
    with pytest.raises(ValueError, match="not a kind"):
        buildcache.Entry(tmp_path / "other" / "x", "x", who="x", kind="other")
    assert said.damaged("k" * 64) == "ignoring a damaged kept thing kkkkkkkkkkkk: making it again"
