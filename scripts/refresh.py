"""The scheduled refresh: follow MaxText's releases and the upstreams' release tags.

    python scripts/refresh.py [--work DIR] [--dry-run] [--no-tests] [--today DATE] [--open [--dispatch-checks]]

run in a clean checkout (the tool venv's python, on a machine that reaches
GitHub and the package index), by .github/workflows/refresh.yml, which holds
no logic of its own. It

1. plans: a MaxText release newer than the one the `maxtext` extra names
   (the package index), else, per upstream, a release tag newer than its pin
   (`git ls-remote --tags`);
2. makes the branch `refresh/<date>-<what>` at the checkout's HEAD, moves
   pyproject.toml's resolution-cutoff to the refresh's time (a rebase
   --maxtext moves it itself), and moves the pins on it, one commit per move (a rebase refuses a checkout with
   uncommitted changes in patches/, so each move starts from the one before,
   committed): `scripts/rebase.sh --maxtext VERSION` for a MaxText release,
   `scripts/rebase.sh NAME TAG` for a tag, each upstream from a blobless
   clone of its repository. A move that stops (a conflict, or a step that
   could not be done) ends the moves; an empty commit records where, and how
   to go on (the rebase's work clone, in the ignored build/, is never pushed);
3. where every move was made, builds (`scripts/build-wheels.sh`), commits the
   regenerated constraints.txt and runs the quick CPU matrix on those wheels
   (`scripts/test-matrix.sh --platform cpu --quick --wheels dist`);
4. writes, in DIR, `pr.json` (branch, title, draft) and `pr.md`, the pull
   request's body: the cutoff's move and every pin it moved (name, old ->
   new), each move's report, what dropped as applied upstream, the
   build's and the matrix's outcome and, wherever it stopped, the commands
   that finish the work on a fresh checkout of the branch. Anything but a
   carried series, a build and a green matrix makes a draft;
5. with --open, pushes the branch and opens its pull request with `gh`, or
   updates the one open for the branch (a same-day re-run). The push is a
   force-with-lease over a branch only the refresh has committed to; a
   same-day branch that holds anyone else's commit is left alone, and the
   refresh takes the next free name (`…-2`). --dispatch-checks then starts
   checks.yml on the branch: a pull request opened with the workflow's
   GITHUB_TOKEN starts no workflow of its own.

It exits 0 when it wrote (and, with --open, opened) a pull request, or found
nothing to do (saying so, with no pr.json); 1 when a step failed before a
pull request could be made (the message says which); 3 before any work when
DIR holds a pr.md or pr.json it did not write (each it writes is marked:
pr.md's first line, pr.json's `written_by`). The logic (`plan`,
`pull_request`, `how_to_finish`) and `main` itself, on small upstreams made by
the tests with a fake `gh`, are tested offline in tests/unit/test_refresh.py;
the workflow only runs this file."""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import itertools
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
from collections.abc import Iterable, Mapping

from packaging.requirements import Requirement
from packaging.utils import parse_wheel_filename
from packaging.version import InvalidVersion, Version

from maxtext_rl_overlay.core import output
from maxtext_rl_overlay.core.errors import OverlayError
from maxtext_rl_overlay.core.staging import FileOwner, check_replaceable_file, write_atomically

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
    """A step the refresh ran: the command a person runs for it in a checkout
    (the sources the refresh cloned left out: the pins name the
    repositories), its status and what it printed."""

    command: str
    status: int
    output: str


#: What a move changes, committed after each one.
MOVED = ("patches", "pyproject.toml")
#: The quick CPU matrix on the wheels the build put in dist/.
MATRIX = ("scripts/test-matrix.sh", "--platform", "cpu", "--quick", "--wheels", "dist")
#: How much of a failed build's output the pull request shows.
TAIL = 40


def branch_name(moves: list[Move], today: datetime.date) -> str:
    return f"refresh/{today.isoformat()}-{'+'.join(m.what for m in moves)}"


def _rows(report: str) -> list[tuple[str, str]]:
    """(patch, outcome) of each row of a rebase report's table."""
    rows = []
    for line in report.splitlines():
        match = re.match(r"^  (\S+\.patch)  +(.+)$", line)
        if match:
            rows.append((match.group(1), match.group(2).strip()))
    return rows


def _conflicts(step: Step) -> list[str]:
    return [patch for patch, outcome in _rows(step.output) if outcome.startswith("CONFLICT")]


def _matrix_counts(output: str) -> str | None:
    found = re.findall(r"^matrix: (\d+ passed, \d+ failed, \d+ skipped)$", output, re.M)
    return found[-1] if found else None


def _commit_line(message: str, paths: Iterable[str]) -> str:
    return f"git add -A {' '.join(paths)} && git commit -m {shlex.quote(message)}"


def move_message(move: Move) -> str:
    return f"Refresh: rebase {' '.join(move.args)}"


BUILT = "Refresh: constraints.txt regenerated from the new pins"


def how_to_finish(moves: list[Move], rebases: list[Step], build: Step | None, matrix: Step | None, branch: str) -> list[str]:
    """The commands that finish a refresh that stopped, on a fresh checkout
    of its branch (nothing when it did not stop): the stopped move again
    from the pins (its work clone was not pushed), the moves not reached,
    the build, the matrix, the push."""
    stop = next((i for i, step in enumerate(rebases) if step.status != 0), None)
    if stop is None and build is not None and build.status == 0 and matrix is not None and matrix.status == 0:
        return []
    lines = [f"git fetch origin {branch} && git checkout {branch}", "bash scripts/setup.sh"]
    if stop is not None:
        move, step = moves[stop], rebases[stop]
        if _conflicts(step):
            lines += [f"{step.command}   # stops at the same conflict: resolve it in build/rebase/ as it says (git add each file there)",
                      "scripts/rebase.sh --continue"]
        else:
            lines += [f"{step.command}   # failed here (exit {step.status}): its output below says why; fix that first"]
        lines.append(_commit_line(move_message(move), MOVED))
        for later in moves[stop + 1:]:
            lines += [f"scripts/rebase.sh {shlex.join(later.args)}", _commit_line(move_message(later), MOVED)]
    if build is None or build.status != 0:
        lines += [f"scripts/build-wheels.sh{'   # failed here: its output below says why' if build is not None else ''}",
                  _commit_line(BUILT, ("constraints.txt",))]
    else:  # the matrix failed: it tests the wheels in dist/, which a fresh checkout has not
        lines.append("scripts/build-wheels.sh   # the wheels into dist/ (constraints.txt comes out as committed)")
    failed = "   # failed: its counts below" if matrix is not None and matrix.status != 0 else ""
    lines += [shlex.join(MATRIX) + failed, f"git push origin {branch}"]
    return lines


def pull_request(moves: list[Move], rebases: list[Step], build: Step | None, matrix: Step | None, today: datetime.date,
                 branch: str | None = None, cutoff: tuple[str, str] | None = None, moved: list[str] | None = None) -> dict[str, object]:
    """The pull request for what the refresh did: branch, title, draft, body.
    `cutoff`: the resolution cutoff (old, new); `moved`: the pins that moved
    in constraints.txt (closures.moved_pins), None where it was not rebuilt."""
    branch = branch or branch_name(moves, today)
    rows = [row for step in rebases for row in _rows(step.output)]
    dropped = [f"{patch} ({outcome})" for patch, outcome in rows if outcome.startswith("dropped")]
    stopped = next((step for step in rebases if step.status != 0), None)
    counts = _matrix_counts(matrix.output) if matrix else None
    lines = [f"Refresh onto {', '.join(m.what for m in moves)}, made by scripts/refresh.py.", ""]
    if stopped is not None:
        done = rebases[:-1]
        made = (f"The moves before it ({', '.join(f'`{s.command}`' for s in done)}) are committed on this branch; "
                if done else "No move is committed on this branch (only a record of the stop); ")
        rest = "this one and those after it are not." if len(rebases) < len(moves) else "this one is not."
        if conflicts := _conflicts(stopped):
            lines += [f"**Stopped at a conflict** in `{stopped.command}`: {', '.join(conflicts)}. {made}{rest}", ""]
        else:
            lines += [f"**`{stopped.command}` did not finish** (exit {stopped.status}; its output below says why). {made}{rest}", ""]
    elif build is not None and build.status != 0:
        lines += [f"**The build failed** (`{build.command}`, exit {build.status}): the moves are committed, constraints.txt is not "
                  "regenerated, and the CPU matrix did not run.", ""]
    elif matrix is not None and matrix.status != 0:
        lines += [f"**The CPU matrix failed** (`{matrix.command}`, exit {matrix.status}): {counts or 'no counts printed'}.", ""]
    finish = how_to_finish(moves, rebases, build, matrix, branch)
    if finish:
        lines += ["### How to finish", "",
                  "On a fresh checkout of this branch (the rebase's work clone, in the ignored `build/`, was not pushed: "
                  "the commands redo the stopped step from the pins this branch holds):", "", "```sh", *finish, "```", "",
                  "then mark this pull request ready for review.", ""]
    if cutoff is not None and cutoff[0] != cutoff[1]:
        lines += [f"### Resolution cutoff: `{cutoff[0]}` -> `{cutoff[1]}`", "",
                  "Every resolution sees the package registry as of the cutoff (pyproject.toml's `resolution-cutoff`): "
                  "the closure's pins below moved with it and the pins." if moved is not None
                  else "Every resolution sees the package registry as of the cutoff (pyproject.toml's `resolution-cutoff`); "
                       "constraints.txt is not rebuilt, so which pins move is not known yet.", ""]
        if moved is not None:
            lines += [f"- {m}" for m in moved] or ["- none"]
            lines.append("")
    for step in rebases:
        lines += [f"### `{step.command}` (exit {step.status})", "", "```", step.output.strip(), "```", ""]
    for move in moves[len(rebases):]:
        lines += [f"### `scripts/rebase.sh {shlex.join(move.args)}`", "", "- not run (a move before it stopped)", ""]
    lines += ["### Dropped as applied upstream", ""] + ([f"- {d}" for d in dropped] or ["- none"]) + [""]
    if build is not None:
        lines += [f"### Build: `{build.command}` (exit {build.status})", ""]
        if build.status != 0:
            tail = build.output.strip().splitlines()[-TAIL:]
            lines += [f"Its last {len(tail)} lines:", "", "```", *tail, "```", ""]
    if matrix is not None:
        lines += [f"### CPU matrix: `{matrix.command}` (exit {matrix.status})", "", f"- {counts or 'no counts printed'}", ""]
    elif stopped is None:
        lines += ["### CPU matrix", "", "- not run (the build failed)", ""]
    ok = not finish
    title = f"Refresh: {', '.join(m.what for m in moves)}" + ("" if ok else " (needs work)")
    return {"branch": branch, "title": title, "draft": not ok, "body": "\n".join(lines)}


# -- what reaches the network, git and gh, and runs the tools ----------------
# (tested end to end in tests/unit/test_refresh.py, on upstreams made there)

#: Who the refresh's commits are by: a branch only it committed to is its own to update.
NAME, EMAIL = "maxtext-rl-overlay refresh", "refresh@users.noreply.github.com"
IDENTITY = {"GIT_AUTHOR_NAME": NAME, "GIT_AUTHOR_EMAIL": EMAIL, "GIT_COMMITTER_NAME": NAME, "GIT_COMMITTER_EMAIL": EMAIL}


#: The refresh's lines on the tool's output channel: `[refresh] ...`.
WHO = "refresh"


def _say(text: str) -> None:
    output.note(WHO, text)


def _failed(text: str) -> None:
    """Why the refresh stopped: said, and under GitHub Actions (where the
    refresh runs) an error annotation too."""
    _say(text)
    output.annotate_error(f"refresh: {text}")


class Failed(Exception):
    """A step failed before a pull request could be made."""


def _run(cmd: list[str], shown: str) -> Step:
    _say(f"$ {shlex.join(cmd)}")
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    output.relay(done.stdout + done.stderr, who=WHO)
    return Step(shown, done.returncode, done.stdout + done.stderr)


def _call(program: str, *args: str, check: bool = True) -> str:
    """`program ARGS` in the checkout (git with the refresh's identity): its output."""
    done = subprocess.run([program, *args], cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, **IDENTITY))
    if check and done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip()).splitlines()
        raise Failed(f"`{program} {shlex.join(args)}` failed (exit {done.returncode}): {said[-1] if said else 'it said nothing'}")
    return done.stdout.strip()


def _git(*args: str, check: bool = True) -> str:
    return _call("git", *args, check=check)


def _commit(message: str, paths: Iterable[str] = (), empty: bool = False) -> None:
    """Commit `paths` (if they changed), or nothing (`empty`: a commit all the same)."""
    if paths:
        _git("add", "-A", "--", *paths)
    staged = subprocess.run(["git", "diff", "--cached", "--quiet"], cwd=ROOT).returncode != 0
    if staged or empty:
        _git("commit", "-q", "--no-verify", *(["--allow-empty"] if empty else []), "-m", message)


def _cutoff() -> str:
    from maxtext_rl_overlay.config.pins import load_project

    return load_project(ROOT).resolution_cutoff


def _moved_pins(base: str) -> list[str]:
    """The pins of constraints.txt that moved since `base`: name, old -> new (the overlay's own left out)."""
    from maxtext_rl_overlay.stages.closures import moved_pins

    old = subprocess.run(["git", "show", f"{base}:constraints.txt"], cwd=ROOT, capture_output=True, text=True).stdout
    return moved_pins(old, (ROOT / "constraints.txt").read_text(), ours=OURS)


#: The overlay's own distributions, whose versions the pins and the revision set.
OURS = ("maxtext-rl-overlay", "google-tunix", "tpu-inference", "vllm", "maxtext", "maxtext-vllm-adapter")


def _project_state() -> tuple[str, dict[str, str], dict[str, str]]:
    from maxtext_rl_overlay.config.pins import load_project

    project = load_project(ROOT)
    extra = project.options.maxtext.extra
    (spec,) = project.metadata["optional-dependencies"][extra]
    (current,) = [s.version for s in Requirement(spec).specifier]
    return current, {n: p.version for n, p in project.pins.items()}, {n: p.repository for n, p in project.pins.items()}


def _released_maxtext() -> list[str]:
    from maxtext_rl_overlay.config import registry

    return [str(parse_wheel_filename(f["filename"])[1]) for f in registry.files("maxtext") if f["filename"].endswith(".whl")]


def _tags(repository: str) -> list[str]:
    done = subprocess.run(["git", "ls-remote", "--tags", "--refs", repository], capture_output=True, text=True)
    if done.returncode != 0:
        said = done.stderr.strip().splitlines()
        raise Failed(f"cannot list the release tags of {repository}: {said[-1] if said else f'git exited {done.returncode}'}")
    return [line.split("refs/tags/", 1)[1] for line in done.stdout.splitlines() if "refs/tags/" in line]


def _own_branch(name: str, base: str) -> tuple[str, str]:
    """The branch to push to and the commit it holds on origin now ("" for
    none): `name`, or `name-2`, `name-3`… where `name` holds a commit the
    refresh did not make (someone has worked on it: left alone)."""
    for n in itertools.count(1):
        branch = name if n == 1 else f"{name}-{n}"
        listed = _git("ls-remote", "origin", f"refs/heads/{branch}")
        if not listed:
            return branch, ""
        remote = listed.split()[0]
        _git("fetch", "-q", "origin", f"refs/heads/{branch}")
        others = sorted({e for e in _git("log", "--format=%ce", f"{base}..{remote}").split() if e != EMAIL})
        if not others:
            _say(f"{branch} exists on origin with the refresh's commits only: it is updated")
            return branch, remote
        _say(f"{branch} on origin holds commits by {', '.join(others)}: left alone")
    raise AssertionError("unreachable")


def _publish(pr: dict[str, object], body: pathlib.Path, branch: str, lease: str, base_branch: str, dispatch: bool) -> None:
    """Push the branch, open its pull request or update the open one, and start checks.yml on it if asked."""
    _git("push", "-q", f"--force-with-lease=refs/heads/{branch}:{lease}", "origin", f"HEAD:refs/heads/{branch}")
    title, draft = str(pr["title"]), bool(pr["draft"])
    found = json.loads(_call("gh", "pr", "list", "--head", branch, "--state", "open", "--json", "number,isDraft") or "[]")
    if found:
        number = str(found[0]["number"])
        _call("gh", "pr", "edit", number, "--title", title, "--body-file", str(body))
        if bool(found[0]["isDraft"]) != draft:
            _call("gh", "pr", "ready", number, *(["--undo"] if draft else []))
        _say(f"pull request #{number} updated")
    else:
        base = ["--base", base_branch] if base_branch != "HEAD" else []
        said = _call("gh", "pr", "create", "--head", branch, *base, "--title", title, "--body-file", str(body), *(["--draft"] if draft else []))
        _say(f"pull request opened: {said}")
    if dispatch:
        _call("gh", "workflow", "run", "checks.yml", "--ref", branch)
        _say(f"checks.yml started on {branch}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=pathlib.Path, default=ROOT / "build" / "refresh", help="where pr.json, pr.md and the clones go")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and stop")
    parser.add_argument("--no-tests", action="store_true", help="each rebase without its fast tests (checks.yml runs them on the pull request)")
    parser.add_argument("--today", type=datetime.date.fromisoformat, default=datetime.datetime.now(datetime.UTC).date(),
                        metavar="YYYY-MM-DD", help="the date in the branch's name (default: today, UTC)")
    parser.add_argument("--open", action="store_true", help="push the branch and open (or update) its pull request with gh")
    parser.add_argument("--dispatch-checks", action="store_true", help="with --open: start checks.yml on the branch")
    args = parser.parse_args(argv)
    try:
        return _refresh(args)
    except Failed as exc:
        _failed(str(exc))
        return 1


def _refresh(args: argparse.Namespace) -> int:
    sys.path.insert(0, str(ROOT / "overlay"))  # this checkout's tool

    if not args.dry_run:
        try:
            check_outputs(args.work)  # before any work: pr.md and pr.json are replaced only where they are the refresh's
        except OverlayError as exc:
            _failed(f"error: {exc}")
            return 3
    try:
        current, versions, repositories = _project_state()
        released = _released_maxtext()
    except OverlayError as exc:
        raise Failed(str(exc)) from None
    # A MaxText release names every pin: the tags are read only without one.
    tags = {} if newer_release(current, released) else {n: _tags(repositories[n]) for n in TAGGED}
    moves = plan(current, released, versions, tags)
    if not moves:
        print(f"refresh: nothing to do: MaxText {current} is the newest release, and no upstream has a release tag after its pin.")
        return 0
    print("refresh: plan: " + "; ".join(f"rebase {' '.join(m.args)}" for m in moves))
    if args.dry_run:
        return 0
    if changed := _git("status", "--porcelain", "--untracked-files=no"):
        raise Failed(f"the checkout {ROOT} has uncommitted changes:\n  " + "\n  ".join(changed.splitlines())
                     + "\nCommit or stash them first: the refresh commits each move on a branch of its own.")
    base, base_branch = _git("rev-parse", "HEAD"), _git("rev-parse", "--abbrev-ref", "HEAD")
    branch, lease = _own_branch(branch_name(moves, args.today), base) if args.open else (branch_name(moves, args.today), "")
    _git("checkout", "-q", "-B", branch)
    args.work.mkdir(parents=True, exist_ok=True)
    old_cutoff = _cutoff()
    if not any(m.args[0] == "--maxtext" for m in moves):  # a rebase --maxtext moves the cutoff itself
        from maxtext_rl_overlay.config.pins import set_resolution_cutoff
        from maxtext_rl_overlay.config.reader import cutoff_now

        set_resolution_cutoff(ROOT, cutoff_now())
        _commit(f"Refresh: resolution-cutoff {old_cutoff} -> {_cutoff()}", ("pyproject.toml",))
    rebases: list[Step] = []
    for move in moves:
        sources = []
        for name in move.moves:
            clone = args.work / f"{name}.git"
            if not clone.exists():  # blobless: the tool fetches the blobs of the commits it checks out
                _git("clone", "--quiet", "--bare", "--filter=blob:none", repositories[name], str(clone))
            sources += ["--source", f"{name}={clone}"] if move.args[0] == "--maxtext" else ["--source", str(clone)]
        shown = f"scripts/rebase.sh {shlex.join(move.args)}"
        rebases.append(_run(["scripts/rebase.sh", *move.args, *sources, *(["--no-tests"] if args.no_tests else [])], shown))
        if rebases[-1].status != 0:
            break
        _commit(move_message(move), MOVED)
    build = matrix = None
    if all(step.status == 0 for step in rebases):
        build = _run(["scripts/build-wheels.sh", *[a for m in moves for n in m.moves for a in ("--source", f"{n}={args.work / (n + '.git')}")]],
                     "scripts/build-wheels.sh")
        if build.status == 0:
            _commit(BUILT, ("constraints.txt",))
            matrix = _run(list(MATRIX), shlex.join(MATRIX))
    moved = _moved_pins(base) if build is not None and build.status == 0 else None
    pr = pull_request(moves, rebases, build, matrix, args.today, branch, cutoff=(old_cutoff, _cutoff()), moved=moved)
    body = str(pr.pop("body"))
    if rebases[-1].status != 0:
        finish = how_to_finish(moves, rebases, build, matrix, branch)
        _commit(f"Refresh stopped at {rebases[-1].command}\n\nTo finish, on a checkout of this branch:\n\n"
                + "\n".join(f"    {line}" for line in finish) + "\n", empty=True)
    try:
        write_pull_request(args.work, dict(pr, body=body))
    except OverlayError as exc:
        _failed(f"error: {exc}")
        return 3
    print(f"refresh: pull request {pr['title']!r} on {branch} ({'draft' if pr['draft'] else 'ready'}): {args.work / 'pr.md'}")
    if args.open:
        _publish(pr, args.work / "pr.md", branch, lease, base_branch, args.dispatch_checks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
