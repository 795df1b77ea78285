"""The scheduled refresh: follow MaxText's releases and the upstreams' release tags.

    python scripts/refresh.py [--work DIR] [--dry-run]

run in a checkout (the tool venv's python, on a machine that reaches GitHub
and the package index), by .github/workflows/refresh.yml, which holds no
logic of its own. It

1. plans: a MaxText release newer than the one the `maxtext` extra names
   (the package index), else, per upstream, a release tag newer than its pin
   (`git ls-remote --tags`);
2. moves the pins: `scripts/rebase.sh --maxtext VERSION` for a MaxText
   release, `scripts/rebase.sh NAME TAG` for a tag, each upstream from a
   blobless clone of its repository;
3. where every patch was carried, builds (`scripts/build-wheels.sh`) and runs
   the quick CPU matrix (`scripts/test-matrix.sh --platform cpu --quick`);
4. writes, in DIR, `pr.json` (branch `refresh/<date>-<what>`, title, draft)
   and `pr.md`, the pull request's body: the rebase report (each patch's
   outcome), what dropped as applied upstream, and the matrix's counts. A
   rebase that stopped at a conflict makes a draft naming the conflict.

It exits 0 when it wrote a pull request to open (or found nothing to do,
saying so, with no pr.json), 1 when a step failed before a pull request could
be made, 3 before any work when DIR holds a pr.md or pr.json it did not
write (each it writes is marked: pr.md's first line, pr.json's `written_by`). The logic (`plan`, `pull_request`) is tested offline in
tests/unit/test_refresh.py; the workflow only runs this file and `gh`."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import pathlib
import re
import subprocess
import sys
from collections.abc import Iterable, Mapping

from packaging.requirements import Requirement
from packaging.utils import parse_wheel_filename
from packaging.version import InvalidVersion, Version

from maxtext_rl_overlay.errors import OverlayError
from maxtext_rl_overlay.staging import FileOwner, check_replaceable_file, write_atomically

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: The upstreams whose release tags the refresh follows (vLLM's pin follows
#: tpu-inference's last-known-good, and MaxText's releases).
TAGGED = ("google-tunix", "tpu-inference")
_TAG = re.compile(r"^v(\d+\.\d+\.\d+)$")
#: What marks the files the refresh writes in --work, so that a later run
#: replaces them and nothing else (an HTML comment: GitHub does not show it).
MD_MARK = "<!-- maxtext-rl-overlay refresh: written by scripts/refresh.py -->"
JSON_MARK = "scripts/refresh.py (maxtext-rl-overlay)"


def _json_is_ours(head: bytes) -> bool:
    try:
        doc = json.loads(head)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("written_by") == JSON_MARK


OUTPUTS = {"pr.md": FileOwner.first_line("a pull request body", MD_MARK),
           "pr.json": FileOwner("a pull request record", f'"written_by": "{JSON_MARK}"', _json_is_ours)}


def check_outputs(work: pathlib.Path) -> None:
    """Refuse (OverlayError), before any work, a pr.md or pr.json in `work`
    that the refresh did not write."""
    for name, owner in OUTPUTS.items():
        check_replaceable_file(work / name, owner)


def write_pull_request(work: pathlib.Path, pr: Mapping[str, object]) -> None:
    """pr.md (the body) and pr.json (the rest), each marked as the refresh's
    and written whole (a rename), replacing only the refresh's own."""
    check_outputs(work)  # both, before either is written
    record = {k: v for k, v in pr.items() if k != "body"}
    write_atomically(work / "pr.md", f"{MD_MARK}\n{pr['body']}", owner=OUTPUTS["pr.md"])
    write_atomically(work / "pr.json", json.dumps(dict(record, written_by=JSON_MARK), indent=1), owner=OUTPUTS["pr.json"])


@dataclasses.dataclass(frozen=True)
class Move:
    """One rebase the refresh runs: `args` to scripts/rebase.sh, `what` for the branch name."""

    what: str
    args: tuple[str, ...]
    moves: tuple[str, ...]  # the distributions whose pins it moves


def newer_release(current: str, released: Iterable[str]) -> str | None:
    """The newest final release after `current`, if any."""
    versions = []
    for text in released:
        try:
            version = Version(text)
        except InvalidVersion:
            continue
        if not version.is_prerelease and not version.is_devrelease and version > Version(current):
            versions.append(version)
    return str(max(versions)) if versions else None


def newer_tag(pin_version: str, tags: Iterable[str]) -> str | None:
    """The newest release tag `vX.Y.Z` after the release the pin is built as
    (0.25.0.dev20260727 and 0.25.0 both count as 0.25.0: the rebase names a
    pin after the newest tag not after it)."""
    base = Version(Version(pin_version).base_version)
    found = [(Version(m.group(1)), tag) for tag in tags if (m := _TAG.match(tag))]
    newer = [item for item in found if item[0] > base]
    return max(newer)[1] if newer else None


def plan(maxtext: str, maxtext_released: Iterable[str], pins: Mapping[str, str], tags: Mapping[str, Iterable[str]]) -> list[Move]:
    """What to move: a newer MaxText release moves every pin it names (one
    rebase); without one, each upstream with a newer release tag."""
    release = newer_release(maxtext, maxtext_released)
    if release:
        return [Move(f"maxtext-{release}", ("--maxtext", release), ("google-tunix", "tpu-inference", "vllm"))]
    moves = []
    for name in TAGGED:
        tag = newer_tag(pins[name], tags.get(name, ()))
        if tag:
            moves.append(Move(f"{name}-{tag}", (name, tag), (name,)))
    return moves


@dataclasses.dataclass(frozen=True)
class Step:
    """A step the refresh ran: its command, status and what it printed."""

    command: str
    status: int
    output: str


def _rows(report: str) -> list[tuple[str, str]]:
    """(patch, outcome) of each row of a rebase report's table."""
    rows = []
    for line in report.splitlines():
        match = re.match(r"^  (\S+\.patch)  +(.+)$", line)
        if match:
            rows.append((match.group(1), match.group(2).strip()))
    return rows


def _matrix_counts(output: str) -> str | None:
    found = re.findall(r"^matrix: (\d+ passed, \d+ failed, \d+ skipped)$", output, re.M)
    return found[-1] if found else None


def pull_request(moves: list[Move], rebases: list[Step], build: Step | None, matrix: Step | None, today: datetime.date) -> dict[str, object]:
    """The pull request for what the refresh did: branch, title, draft, body."""
    what = "+".join(m.what for m in moves)
    rows = [row for step in rebases for row in _rows(step.output)]
    conflicts = [patch for patch, outcome in rows if outcome.startswith("CONFLICT")]
    dropped = [f"{patch} ({outcome})" for patch, outcome in rows if outcome.startswith("dropped")]
    stopped = bool(conflicts) or any(step.status != 0 for step in rebases)
    counts = _matrix_counts(matrix.output) if matrix else None
    lines = [f"Refresh onto {', '.join(m.what for m in moves)}, made by scripts/refresh.py.", ""]
    if conflicts:
        lines += [f"**Stopped at a conflict** in {', '.join(conflicts)}: resolve it in `build/rebase/` of a checkout of this branch, "
                  "then `scripts/rebase.sh --continue` (the report below names the files).", ""]
    elif stopped:
        lines += ["**The rebase did not finish** (its report below says why).", ""]
    for step in rebases:
        lines += [f"### `{step.command}` (exit {step.status})", "", "```", step.output.strip(), "```", ""]
    lines += ["### Dropped as applied upstream", ""] + ([f"- {d}" for d in dropped] or ["- none"]) + [""]
    if build is not None:
        lines += [f"### Build: `{build.command}` (exit {build.status})", ""]
    if matrix is not None:
        lines += [f"### CPU matrix: `{matrix.command}` (exit {matrix.status})", "", f"- {counts or 'no counts printed'}", ""]
    elif not stopped:
        lines += ["### CPU matrix", "", "- not run (the build failed)", ""]
    ok = not stopped and build is not None and build.status == 0 and matrix is not None and matrix.status == 0
    title = f"Refresh: {', '.join(m.what for m in moves)}" + ("" if ok else " (needs work)")
    return {"branch": f"refresh/{today.isoformat()}-{what}", "title": title, "draft": not ok, "body": "\n".join(lines)}


# -- what reaches the network and runs the tools (not unit-tested) ------------

def _run(cmd: list[str], cwd: pathlib.Path = ROOT) -> Step:
    print(f"refresh: $ {' '.join(cmd)}", file=sys.stderr, flush=True)
    done = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    print(done.stdout + done.stderr, file=sys.stderr, flush=True)
    return Step(" ".join(cmd[:1] + [a for a in cmd[1:] if not a.startswith("/")]), done.returncode, done.stdout + done.stderr)


def _project_state() -> tuple[str, dict[str, str], dict[str, str]]:
    sys.path.insert(0, str(ROOT / "overlay"))
    from maxtext_rl_overlay.pins import load_project

    project = load_project(ROOT)
    extra = project.options.maxtext.extra
    (spec,) = project.metadata["optional-dependencies"][extra]
    (current,) = [s.version for s in Requirement(spec).specifier]
    return current, {n: p.version for n, p in project.pins.items()}, {n: p.repository for n, p in project.pins.items()}


def _released_maxtext() -> list[str]:
    from maxtext_rl_overlay import registry

    return [str(parse_wheel_filename(f["filename"])[1]) for f in registry.files("maxtext") if f["filename"].endswith(".whl")]


def _tags(repository: str) -> list[str]:
    done = subprocess.run(["git", "ls-remote", "--tags", "--refs", repository], capture_output=True, text=True)
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        raise SystemExit(f"refresh: cannot list the release tags of {repository}: {said[-1] if said else f'git exited {done.returncode}'}")
    return [line.split("refs/tags/", 1)[1] for line in done.stdout.splitlines() if "refs/tags/" in line]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=pathlib.Path, default=ROOT / "build" / "refresh", help="where pr.json, pr.md and the clones go")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    args = parser.parse_args()
    if not args.dry_run:
        try:
            check_outputs(args.work)
        except OverlayError as exc:
            print(f"refresh: error: {exc}", file=sys.stderr)
            return 3
    current, versions, repositories = _project_state()
    released = _released_maxtext()
    # A MaxText release names every pin: the tags are read only without one.
    tags = {} if newer_release(current, released) else {n: _tags(repositories[n]) for n in TAGGED}
    moves = plan(current, released, versions, tags)
    if not moves:
        print(f"refresh: nothing to do: MaxText {current} is the newest release, and no upstream has a release tag after its pin.")
        return 0
    print("refresh: plan: " + "; ".join(f"rebase {' '.join(m.args)}" for m in moves))
    if args.dry_run:
        return 0
    args.work.mkdir(parents=True, exist_ok=True)
    rebases = []
    for move in moves:
        sources = []
        for name in move.moves:
            clone = args.work / f"{name}.git"
            if not clone.exists():  # blobless: the tool fetches the blobs of the commits it checks out
                _run(["git", "clone", "--quiet", "--bare", "--filter=blob:none", repositories[name], str(clone)])
            sources += ["--source", f"{name}={clone}"] if move.args[0] == "--maxtext" else ["--source", str(clone)]
        rebases.append(_run(["scripts/rebase.sh", *move.args, *sources]))
        if rebases[-1].status != 0:
            break
    build = matrix = None
    if all(step.status == 0 for step in rebases):
        build = _run(["scripts/build-wheels.sh", *[a for m in moves for n in m.moves for a in ("--source", f"{n}={args.work / (n + '.git')}")]])
        if build.status == 0:
            matrix = _run(["scripts/test-matrix.sh", "--platform", "cpu", "--quick"])
    pr = pull_request(moves, rebases, build, matrix, datetime.date.today())
    try:
        write_pull_request(args.work, pr)
    except OverlayError as exc:
        print(f"refresh: error: {exc}", file=sys.stderr)
        return 3
    print(f"refresh: pull request {pr['title']!r} on {pr['branch']} ({'draft' if pr['draft'] else 'ready'}): {args.work / 'pr.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
