"""What a rebase remembers between its start, a stop at a conflict and
--continue or --abort (build/rebase/state/state.json), and the backup of
every project file it may write, taken before the first change."""

from __future__ import annotations

import dataclasses
import enum
import json
import pathlib
import shutil
from typing import Any, Literal

from ..errors import OverlayError
from ..staging import write_atomically


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
class RebaseState:
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

    def conflicted(self) -> PatchEntry:
        return next(p for p in self.patches if p.outcome == Outcome.CONFLICT)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> RebaseState:
        data: dict[str, Any] = json.loads(text)
        data["old"] = PinValues(**data["old"])
        data["new"] = PinValues(**data["new"]) if data.get("new") else None
        data["patches"] = [PatchEntry(**{**p, "outcome": Outcome(p["outcome"])}) for p in data["patches"]]
        return cls(**data)


@dataclasses.dataclass(frozen=True)
class Paths:
    """Where a rebase of `name` keeps its things, all below build/rebase/ (gitignored)."""
    root: pathlib.Path
    name: str

    @property
    def base(self) -> pathlib.Path:
        return self.root / "build" / "rebase"

    @property
    def state(self) -> pathlib.Path:
        return self.base / "state"

    @property
    def state_file(self) -> pathlib.Path:
        return self.state / "state.json"

    @property
    def backup(self) -> pathlib.Path:
        return self.state / "backup"

    @property
    def work(self) -> pathlib.Path:
        return self.base / self.name

    @property
    def find(self) -> pathlib.Path:
        return self.base / f"{self.name}.find-base"


def save(root: pathlib.Path, state: RebaseState) -> None:
    write_atomically(Paths(root, state.name).state_file, state.to_json())


def load(root: pathlib.Path) -> RebaseState:
    f = Paths(root, "").state_file
    if not f.is_file():
        raise OverlayError(f"no rebase is in progress ({f} does not exist): start one with scripts/rebase.sh NAME NEW_REF.")
    try:
        return RebaseState.from_json(f.read_text())
    except (ValueError, KeyError, TypeError) as exc:
        # Only a different version of this tool writes another shape; the
        # checkout was clean when the rebase began, so git can put it back.
        raise OverlayError(
            f"{f} is not a rebase state this version of the tool reads ({exc}). Undo the rebase by hand: "
            f"`git checkout -- patches constraints.txt` in {root}, then remove {f.parent.parent}."
        ) from None


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
    saved_root = state_dir / "backup"
    for rel in touched:
        dest, saved = root / rel, saved_root / rel
        if dest.is_dir():
            shutil.rmtree(dest)
        elif dest.exists() or dest.is_symlink():
            dest.unlink()
        if saved.is_dir():
            shutil.copytree(saved, dest, symlinks=True)
        elif saved.exists():
            shutil.copy2(saved, dest)
