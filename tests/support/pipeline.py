"""Helpers of the build-pipeline tests (tests/pipeline, tool venv): build the
stand-in sdists with the real tool (support.project runs it), and make
upstream-like trees and git repositories of them."""

from __future__ import annotations

import os
import pathlib
import subprocess
import tarfile

from maxtext_rl_overlay.config.pins import load_project
from support import ROOT
from support.project import run_tool

PROJECT = load_project(ROOT)
ALL = ",".join(PROJECT.pins)  # every upstream, vLLM included
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
    "GIT_AUTHOR_DATE": "2026-07-27T09:44:06-07:00", "GIT_COMMITTER_DATE": "2026-07-27T09:44:06-07:00",
}


def build_standins(project, out, standin, cache, *extra, only="google-tunix,tpu-inference", check=True, env=None):
    args = ["build", "--unpinned", "--torch-standin", "--only", only, "--out", str(out), "--constraints", str(out.parent / "constraints.txt")]
    for name in only.split(","):
        if name in standin:  # MaxText has none: its pin is a release wheel the build takes from the package index
            args += ["--source", f"{name}={standin[name]}"]
    return run_tool(project, *args, *extra, cache=cache, check=check, env=env)


#: A Rust toolchain that only says it was called: the build must not call it.
FAKE_RUST = """#!/bin/sh
echo "$(basename "$0") $*" >> "$FAKE_RUST_LOG"
[ "$1" = "-V" ] || [ "$1" = "-Vv" ] && { echo "rustc 1.90.0 (fake 2026-01-01)"; echo "host: x86_64-unknown-linux-gnu"; exit 0; }
exit 1
"""


def fake_rust_toolchain(folder: pathlib.Path) -> dict[str, str]:
    """cargo and rustc in `folder`, first on PATH; what they are run with
    goes to folder/calls.log. Returns the variables to run with."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("cargo", "rustc"):
        (folder / name).write_text(FAKE_RUST)
        (folder / name).chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}", "FAKE_RUST_LOG": str(folder / "calls.log")}


def unpack(sdist: pathlib.Path, dest: pathlib.Path) -> pathlib.Path:
    with tarfile.open(sdist) as tf:
        tf.extractall(dest, filter="data")
    (top,) = dest.iterdir()
    return top


def git_repo_of(tree: pathlib.Path) -> tuple[str, str, str]:
    """Commit `tree` as a git repository; returns (commit, tree id, date)."""
    env = dict(os.environ, **GIT_ENV)
    for args in (["init", "-q"], ["add", "-A", "-f"], ["commit", "-q", "-m", "stand-in upstream"]):
        subprocess.run(["git", *args], cwd=tree, env=env, check=True, capture_output=True)
    out = lambda *a: subprocess.run(["git", *a], cwd=tree, capture_output=True, text=True, check=True).stdout.strip()  # noqa: E731
    return out("rev-parse", "HEAD"), out("rev-parse", "HEAD^{tree}"), out("log", "-1", "--format=%cI")
