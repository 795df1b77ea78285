"""The inputs a constraints file was made from, and whether it is stale.

Its header records a digest of every input it was made from (input_digests:
the overlay's own files, each pin and series), and stale_constraints
recomputes them from a checkout, offline: tests/unit fails on a committed
file that the checkout no longer builds, with the command that makes it
again."""

from __future__ import annotations

import hashlib
import pathlib
import re
import shlex
from collections.abc import Iterable, Mapping

from ..config.pins import Project
from ..core.digest import sha256_file
from ..core.manifest import ProjectRecord
from . import buildenv, overlayfiles

#: The part of input_digests() that is the overlay's own wheel.
OVERLAY = "maxtext-rl-overlay"
INPUTS_TITLE = "Inputs, sha256 of the files each is made from (tests/unit recomputes them from the checkout):"
#: The header's line naming the project commit the overlay's own wheel
#: records (its manifest does, so the wheel's sha256 depends on it).
MADE_FROM = "The overlay's own wheel records the project commit "


def input_digests(project: Project, names: Iterable[str], overlay_files: Iterable[str] | None = None) -> dict[str, str]:
    """{part: sha256} of every input a build reads from the project: the
    overlay's own wheel (OVERLAY: pyproject.toml, README.md, LICENSE, the
    tool's code and resources) and, for each distribution in `names`, its pin
    file, series file, patches and build toolchain file. Each part is the
    sha256 of its files' project-relative paths and contents, so it is the
    same on every machine, wherever the checkout is. `overlay_files`: the
    overlay wheel's files as the build took them (default: as
    overlayfiles.overlay_inputs lists them now)."""
    if overlay_files is None:
        overlay_files = overlayfiles.overlay_inputs(project.root, say=False).files
    parts = {OVERLAY: _files_digest(project.root, [project.root / f for f in overlay_files])}
    for name in names:
        pin = project.pins[name]
        files = [pin.pin_file, pin.directory / "series", *pin.series, pin.directory / buildenv.TOOLCHAIN_FILE]
        parts[name] = _files_digest(project.root, [f for f in files if f.is_file()])
    return parts


def _files_digest(root: pathlib.Path, files: Iterable[pathlib.Path]) -> str:
    rows = sorted(f"{f.relative_to(root).as_posix()}\0{sha256_file(f)}\n" for f in files)
    return hashlib.sha256("".join(rows).encode()).hexdigest()


def header_lines(inputs: Mapping[str, str], made_from: ProjectRecord | None = None) -> list[str]:
    """The lines of a constraints file's header that record `inputs`
    (input_digests()) and the project commit the overlay's wheel records
    (`made_from`, overlayfiles.overlay_inputs' `project`), as
    recorded_inputs and recorded_commit read them back."""
    own = "its own wheel: " + ", ".join(f"{n}/" if n == "overlay" else n for n in overlayfiles.OVERLAY_INPUTS)
    lines = [INPUTS_TITLE]
    for part, sha in inputs.items():
        what = own if part == OVERLAY else f"patches/{part}/: pin.toml, series, patches, {buildenv.TOOLCHAIN_FILE} if any"
        lines.append(f"  {part}: {sha} ({what})")
    if made_from:
        dirty = f", with uncommitted changes to {' '.join(made_from.dirty)}" if made_from.dirty else ""
        lines.append(f"{MADE_FROM}{made_from.commit}{dirty}")
    return lines


def recorded_commit(text: str) -> ProjectRecord | None:
    """The project commit a constraints file's header says the overlay's wheel records (None where it names none)."""
    for line in text.splitlines():
        m = re.fullmatch(rf"# {re.escape(MADE_FROM)}([0-9a-f]{{40}})(?:, with uncommitted changes to (.+))?", line)
        if m:
            return ProjectRecord(m.group(1), tuple(m.group(2).split()) if m.group(2) else ())
    return None


def recorded_inputs(text: str) -> dict[str, str]:
    """{part: sha256} that a constraints file's header records ({} for none)."""
    lines = text.splitlines()
    try:
        at = lines.index(f"# {INPUTS_TITLE}")
    except ValueError:
        return {}
    recorded = {}
    for line in lines[at + 1:]:
        m = re.match(r"#   ([\w.-]+): ([0-9a-f]{64}) \(", line)
        if not m:
            break
        recorded[m.group(1)] = m.group(2)
    return recorded


def stale_constraints(text: str, project: Project) -> str:
    """Why a constraints file is stale for `project` as it is now, with the
    command that makes it again as it was made; "" when every input it
    records (all the project's pins and the overlay) is unchanged."""
    recorded = recorded_inputs(text)
    overlay = overlayfiles.overlay_inputs(project.root, say=False)  # read once: its files and its commit
    now = input_digests(project, project.pins, overlay.files)
    if not recorded:
        why = ["its header records no digest of its inputs (it was made by an older tool)"]
    else:
        why = [f"{part} is not among its inputs" for part in now if part not in recorded]
        why += [f"{part} changed since it was made" for part in now if recorded.get(part, now[part]) != now[part]]
        why += [f"it records {part}, which the project does not have" for part in recorded if part not in now]
        why += _commit_moved(recorded_commit(text), overlay.project)
    if not why:
        return ""
    return f"constraints.txt is stale: {'; '.join(why)}. Make it again, from the checkout, as it was made:\n" + regenerate_command(text)


def _commit_moved(made_from: ProjectRecord | None, now: ProjectRecord | None) -> list[str]:
    """Why the overlay's wheel would differ from the one a constraints file
    pins though its files have not changed: the wheel records the project
    commit (and the files uncommitted then), so a file made before its
    overlay files were committed, or at another of their commits, pins a
    wheel the checkout no longer builds. `now`: the checkout's record
    (overlayfiles.overlay_inputs); where it cannot say (no git, a shallow
    clone), nothing."""
    if made_from is None or now is None or not now.commit or now == made_from:
        return []
    if made_from.dirty and not now.dirty:
        return [f"it was made before the changes to {', '.join(made_from.dirty)} were committed (the overlay's wheel records the commit it was made from)"]
    said = [f"{r.commit[:12]}" + (f" with {', '.join(r.dirty)} uncommitted" if r.dirty else "") for r in (now, made_from)]
    return [f"the overlay's wheel records the project commit: it is {said[0]} now, not {said[1]}"]


def regenerate_command(text: str) -> str:
    """The build command of a constraints file's `Made by:` line, as run in
    the checkout (scripts/build-wheels.sh), and what each PATH was."""
    lines = text.splitlines()
    made = next((i for i, line in enumerate(lines) if line.startswith("# Made by: maxtext-rl-overlay build")), None)
    if made is None:
        return "  scripts/build-wheels.sh  (its header does not say how it was made: give the sources and flags it needs)"
    args = lines[made].removeprefix("# Made by: maxtext-rl-overlay build").split()
    said = [line.removeprefix("#   ") for line in lines[made + 1:] if line.startswith("#   ") and not line.startswith("#   with ")]
    where = [s for s in said if re.match(r"[\w.-]+: --source |[\w.-]+: fetched ", s)]
    return "  " + shlex.join(["scripts/build-wheels.sh", *args]) + "".join(f"\n    {s}" for s in where)
