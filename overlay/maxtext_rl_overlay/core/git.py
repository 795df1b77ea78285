"""Git, run one way by every stage: without the user's or the system's git
configuration (so that what git writes, and whether it asks anything, is the
same on every machine), never prompting, with a fixed identity for the
commits the tool makes itself; and the tree queries two stages share."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import subprocess
from typing import Any

from . import proc

IDENTITY = "maxtext-rl-overlay"
EMAIL = "maxtext-rl-overlay@localhost"
#: The environment every git command runs with. Patches applied with git am
#: keep their own author; the identity is the committer's, and the author of
#: the tool's own commits (a stand-in base, the unpatched tree's import).
HERMETIC = {
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_TERMINAL_PROMPT": "0",
    "GIT_EDITOR": "true",
    "GIT_AUTHOR_NAME": IDENTITY,
    "GIT_AUTHOR_EMAIL": EMAIL,
    "GIT_COMMITTER_NAME": IDENTITY,
    "GIT_COMMITTER_EMAIL": EMAIL,
    # Hooks of a repository the user points us at must not run.
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "core.hooksPath",
    "GIT_CONFIG_VALUE_0": os.devnull,
}


def git(*args: str, cwd: pathlib.Path | None = None, git_dir: pathlib.Path | None = None, check: bool = True,
        input: str | bytes | None = None, text: bool = True, env: dict[str, str] | None = None, who: str = "",
        what: str = "", timeout: float | None = None) -> subprocess.CompletedProcess[Any]:
    """Run git; with `check`, a failure is an OverlayError with git's own words."""
    cmd = ["git"] + ([f"--git-dir={git_dir}"] if git_dir else []) + list(args)
    where = cwd or git_dir
    return proc.run(cmd, cwd=cwd, env=dict(HERMETIC, **(env or {})), input=input, text=text, check=check, who=who,
                    what=what or f"git {' '.join(args[:2])}" + (f" in {where}" if where else ""), timeout=timeout)


def reason(stderr: str, default: str) -> str:
    """Why git failed, in one line: its first fatal: or error: line (what
    follows is advice, such as "Please make sure you have the correct access
    rights"), else its last line, else `default`."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    said = [line for line in lines if line.startswith(("fatal:", "error:"))]
    return (said or lines or [default])[0 if said else -1]


#: How git says it could not take one of its lock files: "Unable to create '/x/refs/tags/v1.lock': File exists."
_LOCK_EXISTS = re.compile(r"Unable to create '([^']+\.lock)': File exists")


def lock_file(stderr: str) -> str | None:
    """The lock file git could not create because it exists (a git command
    killed in that repository left it, or one is running there now), from
    git's error output; None for any other failure."""
    found = _LOCK_EXISTS.search(stderr)
    return found.group(1) if found else None


def out(*args: str, **kw: Any) -> str:
    """git's stdout, stripped: for the commands that answer with one value."""
    return str(git(*args, **kw).stdout).strip()


@dataclasses.dataclass(frozen=True)
class TreeEntry:
    mode: str  # "100644", "100755", "120000", "160000"
    kind: str  # "blob", "commit" (a submodule)
    oid: str
    path: str


def tree_entries(git_dir: pathlib.Path, commit: str) -> list[TreeEntry]:
    """Every file of `commit`'s tree, recursively (git ls-tree -r)."""
    listing = git("ls-tree", "-r", "-z", commit, git_dir=git_dir, text=False).stdout.split(b"\0")
    entries = []
    for item in filter(None, listing):
        meta, name = item.split(b"\t", 1)
        mode, kind, oid = meta.decode().split()
        entries.append(TreeEntry(mode, kind, oid, name.decode()))
    return entries


def missing_blobs(git_dir: pathlib.Path, commit: str) -> list[str]:
    """The files of `commit` whose blobs the repository lacks. A mirror may
    lack some large blobs (the tunix mirror: docs images and notebooks);
    git can neither check out nor commit on a tree that names one."""
    blobs = [e for e in tree_entries(git_dir, commit) if e.kind == "blob"]
    answer = git("cat-file", "--batch-check", git_dir=git_dir, input="".join(e.oid + "\n" for e in blobs)).stdout
    return [e.path for e, line in zip(blobs, str(answer).splitlines(), strict=True) if line.endswith(" missing")]


def inside_package(missing: list[str], import_package: str) -> list[str]:
    """The missing files inside the import package: those may not be missing."""
    return [m for m in missing if m.split("/", 1)[0] == import_package]
