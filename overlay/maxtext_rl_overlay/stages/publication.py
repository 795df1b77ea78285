"""A folder and a file published together: an index and its constraints file.

They are two names, in two folders: no single operation replaces both. The
file is renamed right after the folder's swap (staging.staged_dir's `then`),
and a record written before the swap (begin_pair) lets the next build finish
a publication a kill cut between the two (finish_pair); until then a reader
can see the new index with the old constraints file, for a window of two
system calls (staging's docstring says what is atomic, and where)."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib

from ..core import interrupts, output
from ..core.staging import sync_dir, write_atomically

#: The record of a publication in progress, beside its file: `.NAME.publishing`.
_JOURNAL = ".publishing"


def _journal(path: pathlib.Path) -> pathlib.Path:
    return path.parent / f".{path.name}{_JOURNAL}"


def begin_pair(folder: pathlib.Path, mark: str, digest: str, staged: pathlib.Path, path: pathlib.Path) -> None:
    """Record, before a folder is swapped in and the file `staged` renamed
    to `path` after it, what the new folder is: its file `mark` has the
    sha256 `digest`. The two renames cannot be one; a run killed between
    them leaves this record, and the next run (finish_pair) moves the file
    into place if the folder is the new one, so that the pair is whole
    again before anything else is written."""
    record = {"folder": str(folder), "mark": mark, "sha256": digest, "staged": staged.name}
    write_atomically(_journal(path), json.dumps(record, sort_keys=True) + "\n")


def end_pair(path: pathlib.Path) -> None:
    """The publication begun by begin_pair is whole: its record goes."""
    with interrupts.held(raise_after=False):
        _journal(path).unlink(missing_ok=True)
        sync_dir(path.parent)


def finish_pair(folder: pathlib.Path, path: pathlib.Path) -> str | None:
    """Complete a publication of `folder` and `path` that a killed run
    began (begin_pair) and did not end: if `folder` is the new one, the
    staged file is moved to `path`; otherwise the folder is still the old
    one, and so is the file. Returns what was done (None: nothing was
    pending). Only for a caller holding the lock of `path` (no other run
    can be publishing to it)."""
    journal = _journal(path)
    try:
        record = json.loads(journal.read_text())
        staged = path.parent / str(record["staged"])
        folder = pathlib.Path(str(record["folder"]))  # the run's own (this one's --out may be another)
        new = _sha256(folder / str(record["mark"])) == record["sha256"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        new = False  # a record cut short: written before anything was moved
        staged = path.parent / "-"
    if new and staged.is_file():
        os.replace(staged, path)
        sync_dir(path.parent)
        done = f"{path} moved into place after the index {folder}: a run was stopped between the two"
    else:
        done = f"{folder} and {path} are the previous run's, whole"
    journal.unlink(missing_ok=True)
    output.say(f"a stopped publication was completed: {done}.")
    return done


def _sha256(path: pathlib.Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None
