"""What a rebase remembers between its start, a stop at a conflict and
--continue or --abort, and the backup of every project file it may write,
taken before the first change.

A run is a folder below build/rebase/ and the record in it (RunFolder):
the per-distribution rebase's, build/rebase/state/state.json
(RebaseState), and `--maxtext`'s, build/rebase/release/release.json
(ReleaseState), which wraps the distributions' runs. Both records are a
Record: JSON of the dataclass, read back typed, written and read only by
their RunFolder; a run is in progress when its record exists
(RunFolder.in_progress), and nothing else asks.

The record is the commit point of every step, so that a rebase killed at
any instant (SIGKILL, the OOM killer, a lost machine: no cleanup runs) is
taken up where the record says, never from a guess:
- it is written whole or not at all (write_atomically);
- it is written last when a step begins (after the backup and the work
  clone at the start; after each patch's outcome; before the series is
  written), so the work it names is done; a step cut short is redone from
  the record (--continue rewinds the work clone to the last patch it names,
  and writes the series again: every file of it whole, write_atomically);
- it is removed first when a run ends (finish): a folder without its record
  is what a run killed before its start was recorded, or after its end was,
  left. The project is then as before that run or as after it, and the next
  start clears the folder, saying so (clear_stale);
- --abort marks it first (`aborting`), and restoring is idempotent: an abort
  cut short is finished by --abort again, and --continue or a fresh start
  says so rather than building on a half-restored project."""

from __future__ import annotations

import dataclasses
import enum
import json
import pathlib
import shutil
import types
import typing
from typing import Any, Generic, Literal, Self, TypeVar

from ..core import output
from ..core.errors import OverlayError
from ..core.staging import recover, remove_file, remove_tree, write_atomically


class Outcome(enum.StrEnum):
    """What became of one patch; the value is what the table shows."""
    APPLIED_CLEANLY = "applied cleanly"
    APPLIED_3WAY = "applied with 3-way merge"
    DROPPED = "dropped: already upstream"
    DROPPED_BY_HAND = "dropped: resolved to upstream's version by hand"
    CONFLICT = "CONFLICT"
    RESOLVED = "conflict resolved by hand"
    PENDING = "not reached"

    @property
    def dropped(self) -> bool:
        return self in (Outcome.DROPPED, Outcome.DROPPED_BY_HAND)


#: "applying": the series, patch by patch (a conflict stops here); "write":
#: every patch has an outcome, the project is not changed yet; "written": the
#: series and the pins are, only the build and the fast tests remain.
Phase = Literal["applying", "write", "written"]


class Record:
    """A run's record (a dataclass): its JSON, and the dataclass read back
    from it with every field of its declared type (nested records, enums,
    lists, optional values). A field added later has a default, so that an
    older record still loads."""

    def to_json(self) -> str:
        assert dataclasses.is_dataclass(self)
        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> Self:
        made: Self = _typed(cls, json.loads(text))
        return made


def _typed(hint: Any, value: Any) -> Any:
    """`value` (parsed JSON) as the type `hint` says: a dataclass from its
    fields (TypeError, KeyError or ValueError when they do not fit)."""
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        if not isinstance(value, dict):
            raise TypeError(f"{hint.__name__}: not an object")
        hints = typing.get_type_hints(hint)
        return hint(**{name: _typed(hints[name], v) for name, v in value.items()})
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        return None if value is None else _typed(next(a for a in args if a is not type(None)), value)
    if origin is list:
        return [_typed(args[0], v) for v in value]
    if origin is dict:
        return {k: _typed(args[1], v) for k, v in value.items()}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(value)
    return value


@dataclasses.dataclass(frozen=True)
class PinValues:
    """The values of a pin the rebase moves; only the commit is known until
    the series is written."""
    commit: str
    tree: str = ""
    date: str = ""
    version: str = ""


@dataclasses.dataclass
class PatchEntry:
    name: str
    subject: str
    outcome: Outcome = Outcome.PENDING
    detail: str = ""  # conflicted files, where upstream has it, ...
    commit: str = ""  # the work clone's HEAD before the patch, then the patch's own commit


@dataclasses.dataclass
class RebaseState(Record):
    """The per-distribution rebase's record (build/rebase/state/state.json)."""
    name: str
    new_ref: str
    new_commit: str
    git_dir: str  # the upstream repository the work clone borrows its objects from; the work clone's own once it stopped
    source: str | None
    build: bool
    build_sources: dict[str, str]
    standins: bool
    apply_vllm_lkg: bool
    run_tests: bool
    cache: str
    touched: list[str]  # what the backup holds and --abort restores (root-relative)
    old: PinValues
    patches: list[PatchEntry]
    phase: Phase = "applying"
    new: PinValues | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0
    base: str = ""  # the work clone's HEAD before the first patch (the new commit, or a stand-in on it)
    aborting: bool = False  # an --abort began: only --abort goes on from here

    def conflicted(self) -> PatchEntry | None:
        return next((p for p in self.patches if p.outcome == Outcome.CONFLICT), None)

    def head(self) -> str:
        """The work clone's HEAD after the last patch the record gives an
        outcome (its commit; a dropped one's is the HEAD it left)."""
        done = [p for p in self.patches if p.outcome != Outcome.PENDING]
        return done[-1].commit if done else (self.base or self.new_commit)


@dataclasses.dataclass(frozen=True)
class QueuedMove:
    """A move left to make, as release.json records it (its keys are the
    record's: a move stopped by one version of the tool is resumed by another)."""
    name: str
    commit: str  # the release's commit of `name`: where its pin goes
    source: str | None  # the --source holding it


@dataclasses.dataclass
class ReleaseState(Record):
    """`rebase --maxtext`'s record (build/rebase/release/release.json): what
    is left to do (release.py)."""
    version: str
    extra: list[str]  # [old, new] requirement of the `maxtext` extra
    queue: list[QueuedMove]  # the moves left, the head one in progress
    plan: list[str]  # the plan's lines, for the report
    tables: list[str] = dataclasses.field(default_factory=list)  # the finished moves' reports
    touched: list[str] = dataclasses.field(default_factory=list)
    sources: dict[str, str] = dataclasses.field(default_factory=dict)
    build: bool = False
    standins: bool = False
    run_tests: bool = True
    cache: str = ""
    seconds: float = 0.0
    clones: list[str] = dataclasses.field(default_factory=list)  # the distributions whose work clones the move makes
    aborting: bool = False  # an --abort began: only --abort goes on from here
    cutoff: list[str] = dataclasses.field(default_factory=list)  # [old, new] resolution-cutoff; [] in a record from before it
    before: dict[str, str] = dataclasses.field(default_factory=dict)  # constraints.txt's pins before the move


def _base(root: pathlib.Path) -> pathlib.Path:
    return root / "build" / "rebase"


#: The record a RunFolder keeps (a TypeVar, not 3.12's class syntax: the tool runs on Python 3.11).
R = TypeVar("R", "RebaseState", "ReleaseState")


@dataclasses.dataclass(frozen=True)
class RunFolder(Generic[R]):
    """A resumable run's folder below build/rebase/ (gitignored), and the
    record in it that makes it one: the commit point of each of its steps,
    a `kind` (Record), written and read here only. `undo` is what
    `git checkout --` puts back when the record cannot be read."""
    root: pathlib.Path
    folder: pathlib.Path
    record: pathlib.Path
    kind: type[R]
    undo: str

    @classmethod
    def below(cls, root: pathlib.Path, folder: str, record: str, kind: type[R], undo: str) -> RunFolder[R]:
        return cls(root, _base(root) / folder, _base(root) / folder / record, kind, undo)

    def in_progress(self) -> bool:
        """Whether the run is in progress: its record exists. (The one way
        the tool asks.)"""
        return self.record.is_file()

    def save(self, run: R) -> None:
        """Write the record, whole (the commit point of a step)."""
        write_atomically(self.record, run.to_json())

    def load(self) -> R:
        """The record of the run in progress; an OverlayError, saying what
        to do, where there is none or it cannot be read."""
        if not self.in_progress():
            stale = [str(run.folder) for run in (distribution_run(self.root), release_run(self.root)) if run.stale()]
            left = (f"; {' and '.join(stale)} {'is' if len(stale) == 1 else 'are'} left over from a rebase stopped before its start "
                    "was recorded or after its end was (the project is as before it or as after it: see git status), and the "
                    "next start clears it" if stale else "")
            raise OverlayError(f"no rebase is in progress ({self.record} does not exist{left}): start one with "
                               "scripts/rebase.sh NAME NEW_REF.")
        try:
            return self.kind.from_json(self.record.read_text())
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # Only a different version of this tool writes another shape; the
            # checkout was clean when the rebase began, so git can put it back.
            raise OverlayError(
                f"{self.record} is not a rebase record this version of the tool reads ({exc}). Undo the rebase by hand: "
                f"`git checkout -- {self.undo}` in {self.root}, then remove {_base(self.root)}."
            ) from None

    def in_progress_error(self, aborting: bool, what: str = "a rebase") -> OverlayError:
        """What a start, or --continue, says of `what` (a rebase) whose record exists."""
        if aborting:
            return OverlayError(f"an --abort of {what} ({self.folder}) was stopped before it finished, so the project may be half "
                                "restored: finish it with scripts/rebase.sh --abort.")
        return OverlayError(f"{what} is in progress ({self.folder}): finish it with scripts/rebase.sh --continue "
                            "or undo it with scripts/rebase.sh --abort.")

    def stale(self) -> bool:
        """The folder without its record: what a run killed before its start
        was recorded, or after its end was, left."""
        return self.folder.exists() and not self.record.exists()

    def clear_stale(self) -> None:
        """Remove the folder when it is stale, saying what it was: the project
        is as before that run or as after it. (With the record, the run is in
        progress: the caller refuses to start.)"""
        if self.stale():
            output.say(f"cleared {self.folder}: left over from a rebase stopped before its start was recorded or after "
                       "its end was (it held no record); the project is as before that rebase or as after it.")
            if not remove_tree(self.folder):
                raise OverlayError(f"{self.folder} could not be removed: remove it by hand, then start again.")

    def finish(self) -> None:
        """End the run: its record first (the commit point: from here no
        command takes the run up), then the rest of the folder (the backup),
        which a kill may cut short harmlessly."""
        remove_file(self.record)
        remove_tree(self.folder)


def distribution_run(root: pathlib.Path) -> RunFolder[RebaseState]:
    """The per-distribution rebase's (machine.py): build/rebase/state/state.json."""
    return RunFolder.below(root, "state", "state.json", RebaseState, "patches constraints.txt")


def release_run(root: pathlib.Path) -> RunFolder[ReleaseState]:
    """`rebase --maxtext`'s own (release.py), wrapping the distributions' runs."""
    return RunFolder.below(root, "release", "release.json", ReleaseState, "patches pyproject.toml constraints.txt")


@dataclasses.dataclass(frozen=True)
class Paths:
    """Where a rebase of `name` keeps its things, all below build/rebase/ (gitignored)."""
    root: pathlib.Path
    name: str

    @property
    def run(self) -> RunFolder[RebaseState]:
        return distribution_run(self.root)

    @property
    def backup(self) -> pathlib.Path:
        return self.run.folder / "backup"

    @property
    def work(self) -> pathlib.Path:
        return _base(self.root) / self.name

    @property
    def find(self) -> pathlib.Path:
        return _base(self.root) / f"{self.name}.find-base"


def backup(root: pathlib.Path, state_dir: pathlib.Path, touched: list[str]) -> None:
    dest = state_dir / "backup"
    for rel in touched:
        src = root / rel
        if src.is_dir():
            shutil.copytree(src, dest / rel, symlinks=True)
        elif src.exists():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def restore(root: pathlib.Path, state_dir: pathlib.Path, touched: list[str]) -> None:
    """Put every touched path back from the backup. Idempotent, so that an
    --abort killed midway (a path removed and not yet copied back) is
    finished by --abort again: the record stays until the end (finish)."""
    saved_root = state_dir / "backup"
    for rel in touched:
        dest, saved = root / rel, saved_root / rel
        if rel != "constraints.txt":  # its staged files are the build's, cleared under the build's lock
            recover(dest)  # the staged file of a rebase killed writing it (a patch folder's own go with it)
        if dest.is_dir():
            shutil.rmtree(dest)
        elif dest.exists() or dest.is_symlink():
            dest.unlink()
        if saved.is_dir():
            shutil.copytree(saved, dest, symlinks=True)
        elif saved.exists():
            shutil.copy2(saved, dest)
