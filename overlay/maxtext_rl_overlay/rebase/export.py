"""Writing a carried series into the project: the patches re-exported in
place, a comment in `series` for each dropped one, the pin moved, and the
last-known-good commit of another pin reported (or applied).

Each file is written whole or not at all (write_atomically), and the whole
writing may be done again: a run killed between two files leaves some new
and some old, and --continue (the state still says "write") writes every
one again from the work clone and the pin's old values in the state, to the
same bytes an unkilled run writes."""

from __future__ import annotations

import dataclasses
import pathlib
import re

from ..config.pins import Pin, load_project, set_pin_values
from ..core.git import git, out
from ..core.staging import recover, write_atomically
from . import versions
from .state import PatchEntry, PinValues, RebaseState

# Same file names; author, date and message come from the patch and the
# commit id is zeroed, so an unchanged patch exports byte for byte.
_FORMAT_PATCH = ("format-patch", "-1", "--stdout", "--full-index", "--zero-commit", "--no-signature", "--no-numbered")
_HEX40 = re.compile(r"[0-9a-f]{40}")


def write(root: pathlib.Path, state: RebaseState, work: pathlib.Path) -> None:
    _remove_dropped(root / "patches" / state.name, state)  # what a run killed after the series did not remove: else unreadable
    project = load_project(root)
    old = state.old  # not the pin file's: a killed run may have moved it already
    pin = dataclasses.replace(project.pins[state.name], commit=old.commit, tree=old.tree, date=old.date, version=old.version)
    lkg = pin.rebase.last_known_good
    # A run killed inside write_atomically left its staged file beside the
    # destination (NAME.<8 hex>): cleared, saying so, not left in patches/.
    others = [project.pins[lkg.pin].pin_file] if lkg else []
    for path in [*(pin.directory / e.name for e in state.patches), pin.directory / "series", pin.pin_file, *others]:
        recover(path)
    git_dir = pathlib.Path(state.git_dir)
    dropped = {}
    for entry in state.patches:
        if entry.outcome.dropped:
            dropped[entry.name] = entry
            continue
        text = git(*_FORMAT_PATCH, entry.commit, cwd=work, text=False).stdout
        write_atomically(pin.directory / entry.name, text)
    if dropped:
        _comment_out(pin.directory / "series", dropped, state.new_commit)
        _remove_dropped(pin.directory, state)
    new = _move_pin(pin, git_dir, state.new_commit, state.notes)
    state.new = new
    if lkg:
        target = project.pins[lkg.pin]
        state.notes.append(_last_known_good(git_dir, state, lkg.file, target))


def _remove_dropped(folder: pathlib.Path, state: RebaseState) -> None:
    """Remove the file of each dropped patch the series no longer names.
    Only then: a series naming a missing file is a project no command reads
    (load_project), and so is a file the series does not name, which a run
    killed between the two leaves; --continue calls this before reading it."""
    series = folder / "series"
    named = {line.split("#", 1)[0].split()[0] for line in series.read_text().splitlines() if line.split("#", 1)[0].strip()}
    for entry in state.patches:
        if entry.outcome.dropped and entry.name not in named:
            (folder / entry.name).unlink(missing_ok=True)


def _comment_out(series: pathlib.Path, dropped: dict[str, PatchEntry], new_commit: str) -> None:
    """Each dropped patch's line becomes a record of where upstream has it."""
    lines = []
    for line in series.read_text().splitlines():
        fields = line.split("#", 1)[0].split()
        entry = dropped.get(fields[0]) if fields else None
        if entry:
            where = entry.detail if _HEX40.fullmatch(entry.detail or "") else new_commit
            line = (f"# Applied-Upstream: {entry.name} in {where} (\"{entry.subject}\"); "
                    f"dropped by scripts/rebase.sh onto {new_commit}")
        lines.append(line)
    write_atomically(series, "\n".join(lines) + "\n")


def _move_pin(pin: Pin, git_dir: pathlib.Path, new_commit: str, notes: list[str]) -> PinValues:
    date = out("log", "-1", "--format=%cI", new_commit, git_dir=git_dir)
    version, why = versions.new_version(pin, git_dir, new_commit, date)
    new = PinValues(new_commit, out("rev-parse", f"{new_commit}^{{tree}}", git_dir=git_dir), date, version)
    set_pin_values(pin.pin_file, {"commit": new.commit, "tree": new.tree, "date": new.date, "version": new.version})
    notes.append(f"version {version}: {why}")
    return new


def _last_known_good(git_dir: pathlib.Path, state: RebaseState, file: str, target: Pin) -> str:
    """The commit of `target` that the upstream's CI verified at the new
    commit (`file`): moved to with --apply-vllm-lkg, else only reported."""
    new_commit, name, other = state.new_commit, state.name, target.distribution
    proc = git("show", f"{new_commit}:{file}", git_dir=git_dir, check=False)
    lkg = proc.stdout.strip() if proc.returncode == 0 else ""
    if not _HEX40.fullmatch(lkg):
        return f"{other}: no commit in {file} at {new_commit[:12]}; {target.pin_file} left as it is"
    if lkg == target.commit:
        return f"{other}: {name}'s CI verified {lkg[:12]} ({file}), the {other} pin already"
    if state.apply_vllm_lkg:
        set_pin_values(target.pin_file, {"commit": lkg})
        return (f"{other}: pin moved {target.commit[:12]} -> {lkg[:12]} ({file} at {new_commit[:12]}); its version and "
                f"comments in {target.pin_file} still describe the old commit: update them (git describe in a {other} clone)")
    return (f"{other}: {name}'s CI verified {other} {lkg} ({file} at {new_commit[:12]}); the {other} pin is "
            f"{target.commit[:12]}. Pass --apply-vllm-lkg to move it.")
