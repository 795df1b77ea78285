"""Helpers of the rebase tests: upstream git repositories made of PyPI sdists
(tests/rebase/drift.toml), a git-tracked copy of the project pinned to them,
and the real tool run on that copy."""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib

import standins  # tests/standins.py: tests/ is on sys.path (pyproject's pythonpath)
from support import TESTS
from support.project import project_copy, run_tool, set_pin

DRIFT = TESTS / "rebase" / "drift.toml"
IDENT = {"GIT_AUTHOR_NAME": "upstream", "GIT_AUTHOR_EMAIL": "u@u", "GIT_COMMITTER_NAME": "upstream", "GIT_COMMITTER_EMAIL": "u@u",
         "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
#: What a rebase's project copy holds besides the tool's inputs and LICENSE:
#: enough to run the tool and its fast tests.
PROJECT_FILES = ("docs", "constraints.txt", ".gitignore", ".ci", ".github", "scripts", "overlay", "image", "tests/README.md", "tests/unit",
                 "tests/bench",  # tests/unit/test_bench_sizes.py reads the sync benchmark's sizes
                 "tests/conftest.py", "tests/standins.py", "tests/support")


def fetch(spec: dict) -> pathlib.Path:
    """The sdist of a drift.toml entry, downloaded once into the cache."""
    dest = standins.cache_dir() / spec["sdist"]
    if dest.is_file() and hashlib.sha256(dest.read_bytes()).hexdigest() == spec["sha256"]:
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest.parent) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
                        "--disable-pip-version-check", "-d", tmp, spec["requirement"]],
                       env=dict(os.environ, **spec.get("env", {})), check=True)
        got = pathlib.Path(tmp) / spec["sdist"]
        digest = hashlib.sha256(got.read_bytes()).hexdigest()
        assert digest == spec["sha256"], f"{spec['sdist']}: sha256 {digest}, not the one in {DRIFT}"
        os.replace(got, dest)
    return dest


def git(repo: pathlib.Path, *args: str, date: str | None = None, **kw) -> str:
    env = dict(os.environ, **IDENT)
    if date:
        env.update(GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True, **kw).stdout.strip()


def commit_all(repo: pathlib.Path, message: str, date: str) -> str:
    git(repo, "add", "-A", "-f")
    git(repo, "commit", "-q", "--allow-empty", "-m", message, date=date)
    return git(repo, "rev-parse", "HEAD")


def replace_tree(repo: pathlib.Path, sdist: pathlib.Path) -> None:
    """Make the work tree of `repo` the content of `sdist` (its top folder)."""
    for entry in repo.iterdir():
        if entry.name != ".git":
            shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    with tempfile.TemporaryDirectory() as tmp, tarfile.open(sdist) as tf:
        tf.extractall(tmp, filter="data")
        (top,) = pathlib.Path(tmp).iterdir()
        for entry in top.iterdir():
            shutil.move(str(entry), repo / entry.name)


def make_upstream(dist: str, dest: pathlib.Path) -> dict[str, str]:
    """A git repository: the old release as the pin commit, the new one on
    top (tagged as upstream tags releases). Returns old and new commit ids."""
    spec = tomllib.loads(DRIFT.read_text())[dist]
    dest.mkdir(parents=True)
    git(dest, "init", "-q", "-b", "main")
    commits = {}
    for which in ("old", "new"):
        replace_tree(dest, fetch(spec[which]))
        if which == "new" and dist == "tpu-inference":
            # tpu-inference's CI records the vLLM it verified (the sdist lacks .buildkite/).
            (dest / ".buildkite").mkdir()
            (dest / ".buildkite" / "vllm_lkg.version").write_text("d626108b1841888ec90aced33367149a6bbc7e4b\n")
        commits[which] = commit_all(dest, f"{spec[which]['requirement']}", spec[which]["date"])
        if "tag" in spec[which]:
            git(dest, "tag", spec[which]["tag"])
    return commits


def make_project(dest: pathlib.Path, pins: dict[str, dict[str, str]], keep: dict[str, tuple[str, ...]] | None = None) -> pathlib.Path:
    """A git-tracked copy of this project, `pins` moved (commit, tree, date,
    ... per distribution), each series cut to the patches whose names start
    with one of `keep[dist]` (in series order)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    project_copy(dest, *PROJECT_FILES, licence=True)
    for dist, values in pins.items():
        set_pin(dest, dist, **values)
    for dist, prefixes in (keep or {}).items():
        folder = dest / "patches" / dist
        names = [line for line in (folder / "series").read_text().splitlines() if line and not line.startswith("#")]
        kept = [n for n in names if n.startswith(prefixes)]
        assert len(kept) == len(prefixes), f"{prefixes} name {kept} of {names}"
        for name in set(names) - set(kept):
            (folder / name).unlink()
        (folder / "series").write_text("# quilt-compatible series: one patch file name a line, applied in order.\n"
                                       + "".join(n + "\n" for n in kept))
    git(dest, "init", "-q", "-b", "main")
    commit_all(dest, "project copy", "2026-11-01T00:00:00+00:00")
    return dest


def pin_of(repo: pathlib.Path, commit: str) -> dict[str, str]:
    return {"commit": commit, "tree": git(repo, "rev-parse", f"{commit}^{{tree}}"), "date": git(repo, "log", "-1", "--format=%cI", commit)}


def rebase(project: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    """`python -m maxtext_rl_overlay rebase ARGS` on `project` (the copy's own code)."""
    return run_tool(project, "rebase", *args, own_code=True)


def snapshot(project: pathlib.Path) -> dict[str, bytes]:
    """Every file a rebase may touch, by content."""
    files = {str(p.relative_to(project)): p.read_bytes() for p in (project / "patches").rglob("*") if p.is_file()}
    files["constraints.txt"] = (project / "constraints.txt").read_bytes()
    return files


def row(stdout: str, patch_prefix: str) -> str:
    """The outcome column of a patch's row in the printed table."""
    for line in stdout.splitlines():
        fields = line.split(None, 1)
        if fields and fields[0].startswith(patch_prefix):
            return fields[1]
    raise AssertionError(f"no row for {patch_prefix} in:\n{stdout}")
