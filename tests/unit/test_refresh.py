"""The scheduled refresh's logic (scripts/refresh.py), offline: what it moves
and the pull request it writes, from recorded inputs; and that the workflow
only runs the script."""

from __future__ import annotations

import dataclasses
import datetime
import importlib.util
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator

import pytest
import yaml

from maxtext_rl_overlay.config.pins import load_project, set_pin_values
from maxtext_rl_overlay.core.errors import OverlayError
from support import ROOT
from unit.unit_support import GIT_ENV, PackageIndex, commit_files, fake_wheel, git, maxtext_version, patch_of, pin_series

_SPEC = importlib.util.spec_from_file_location("refresh", ROOT / "scripts" / "refresh.py")
assert _SPEC and _SPEC.loader
refresh = importlib.util.module_from_spec(_SPEC)
sys.modules["refresh"] = refresh  # its dataclasses look their module up
_SPEC.loader.exec_module(refresh)

PINS = {"google-tunix": "0.1.8", "tpu-inference": "0.25.0.dev20260727", "vllm": "0.23.1rc1.dev1474"}
TODAY = datetime.date(2026, 12, 7)
#: A rebase report as scripts/rebase.sh prints it (onto upstream's main of 2026-08-22).
REPORT = """rebase tpu-inference: 7ecc401e6fae -> b8692ff01fa1   version 0.25.0.dev20260727 -> 0.27.0.dev20260822

  patch                                                                         outcome
  backport-984b29c49-Use-raw-Mesh-constructor-when-device_indexes-is-set.patch  dropped: already upstream  (Applied-Upstream: b8692ff01fa1)
  0001-Reshard-logprobs-in-gather_logprobs-for-Explicit-mes.patch               applied cleanly
  0003-Constrain-shardings-and-search-top-k-top-p-under-Exp.patch               applied with 3-way merge

  time: 1.2s
"""
P0003 = "0003-Constrain-shardings-and-search-top-k-top-p-under-Exp.patch"
CONFLICT = REPORT.replace(f"{P0003}               applied with 3-way merge",
                          f"{P0003}               CONFLICT  (tpu_inference/layers/jax/sample/sampling.py)")


def test_a_newer_maxtext_release_moves_every_pin_in_one_rebase():
    moves = refresh.plan("0.2.4", ["0.2.3", "0.2.4", "0.2.5", "0.2.6rc1", "0.3.0.dev1"], PINS, {"tpu-inference": ["v0.32.0"]})
    assert moves == [refresh.Move("maxtext-0.2.5", ("--maxtext", "0.2.5"), ("google-tunix", "tpu-inference", "vllm"))]


def test_without_one_each_upstream_with_a_newer_release_tag_moves():
    tags = {"tpu-inference": ["v0.24.0", "v0.25.0", "v0.27.0", "v0.32.0", "v0.33.0rc1", "nightly"], "google-tunix": ["v0.1.7", "v0.1.8"]}
    moves = refresh.plan("0.2.5", ["0.2.4", "0.2.5"], PINS, tags)
    assert moves == [refresh.Move("tpu-inference-v0.32.0", ("tpu-inference", "v0.32.0"), ("tpu-inference",))]
    assert refresh.plan("0.2.5", ["0.2.5"], PINS, {"google-tunix": ["v0.1.8"], "tpu-inference": ["v0.25.0"]}) == [], \
        "the tag a pin is named after is not newer than the pin"


def test_a_carried_series_makes_a_ready_pull_request_with_the_report_and_the_counts():
    move = refresh.Move("tpu-inference-v0.32.0", ("tpu-inference", "v0.32.0"), ("tpu-inference",))
    pr = refresh.pull_request([move], [refresh.Step("scripts/rebase.sh tpu-inference v0.32.0", 0, REPORT)],
                              refresh.Step("scripts/build-wheels.sh", 0, ""),
                              refresh.Step("scripts/test-matrix.sh --platform cpu --quick", 0, "...\nmatrix: 385 passed, 0 failed, 68 skipped\n"),
                              TODAY, cutoff=("2026-11-30T20:00:00Z", "2026-12-07T06:00:00Z"), moved=["numpy 2.3.1 -> 2.3.2", "wcwidth 0.9.4 -> 0.9.5"])
    assert pr["branch"] == "refresh/2026-12-07-tpu-inference-v0.32.0" and pr["draft"] is False
    assert pr["title"] == "Refresh: tpu-inference-v0.32.0"
    body = pr["body"]
    assert REPORT.strip() in body, "the rebase report, whole"
    backport = "backport-984b29c49-Use-raw-Mesh-constructor-when-device_indexes-is-set.patch"
    assert f"- {backport} (dropped: already upstream  (Applied-Upstream: b8692ff01fa1))" in body
    assert "- 385 passed, 0 failed, 68 skipped" in body
    assert "### Resolution cutoff: `2026-11-30T20:00:00Z` -> `2026-12-07T06:00:00Z`\n" in body
    assert "\n- numpy 2.3.1 -> 2.3.2\n- wcwidth 0.9.4 -> 0.9.5\n" in body
    assert "conflict" not in body.lower()


def test_a_conflict_makes_a_draft_naming_it_and_nothing_is_built():
    move = refresh.Move("maxtext-0.2.5", ("--maxtext", "0.2.5"), ("google-tunix", "tpu-inference", "vllm"))
    pr = refresh.pull_request([move], [refresh.Step("scripts/rebase.sh --maxtext 0.2.5", 1, CONFLICT)], None, None, TODAY)
    assert pr["draft"] is True and pr["title"] == "Refresh: maxtext-0.2.5 (needs work)"
    assert pr["branch"] == "refresh/2026-12-07-maxtext-0.2.5"
    assert f"**Stopped at a conflict** in `scripts/rebase.sh --maxtext 0.2.5`: {P0003}. No move is committed on this branch" in pr["body"]
    assert "scripts/rebase.sh --maxtext 0.2.5   # stops at the same conflict" in pr["body"]
    assert "CPU matrix" not in pr["body"], "nothing was built after a stop"


def test_a_failed_matrix_is_a_draft_with_its_counts():
    move = refresh.Move("google-tunix-v0.1.9", ("google-tunix", "v0.1.9"), ("google-tunix",))
    pr = refresh.pull_request([move], [refresh.Step("scripts/rebase.sh google-tunix v0.1.9", 0, REPORT)], refresh.Step("b", 0, ""),
                              refresh.Step("m", 1, "matrix: 380 passed, 5 failed, 68 skipped\n"), TODAY)
    assert pr["draft"] is True and "- 380 passed, 5 failed, 68 skipped" in pr["body"]
    assert "**The CPU matrix failed** (`m`, exit 1): 380 passed, 5 failed, 68 skipped." in pr["body"]
    assert refresh.how_to_finish([move], [refresh.Step("scripts/rebase.sh google-tunix v0.1.9", 0, REPORT)], refresh.Step("b", 0, ""),
                                 refresh.Step("m", 1, ""), "B")[2:] == [
        "scripts/build-wheels.sh   # the wheels into dist/ (constraints.txt comes out as committed)",
        "scripts/test-matrix.sh --platform cpu --quick --wheels dist   # failed: its counts below",
        "git push origin B"]


def test_the_workflow_runs_the_script_weekly_and_on_demand_and_the_checks_run_on_its_pull_request():
    doc = yaml.safe_load((ROOT / ".github" / "workflows" / "refresh.yml").read_text())
    on = doc[True] if True in doc else doc["on"]  # YAML 1.1 reads the key `on` as true
    assert "workflow_dispatch" in on and on["schedule"][0]["cron"]
    (job,) = doc["jobs"].values()
    steps = job["steps"]
    runs = [step["run"] for step in steps if "run" in step]
    assert runs[0] == "bash scripts/setup.sh"
    python = next(i for i, s in enumerate(steps) if s.get("uses", "").startswith("actions/setup-python"))
    assert steps[python]["with"]["python-version"] == "3.12" and python < steps.index(next(s for s in steps if "run" in s)), \
        "setup.sh needs a Python 3.12 on the runner"
    (refresh_run,) = [shlex.split(run) for run in runs if "scripts/refresh.py" in run]
    assert refresh_run[:2] == [".venv/bin/python", "scripts/refresh.py"] and "--open" in refresh_run, "the script pushes and opens the PR"
    assert all(len(run.splitlines()) <= 2 for run in runs), "the logic lives in scripts/refresh.py, not the YAML"
    # A pull request opened, or a branch pushed, with GITHUB_TOKEN starts no workflow: with a token secret the push
    # (checkout's credentials) and gh use it; without, the refresh starts checks.yml itself, which that token may do.
    (checkout,) = [s for s in steps if s.get("uses", "").startswith("actions/checkout")]
    step = next(s for s in steps if "scripts/refresh.py" in s.get("run", ""))
    assert checkout["with"]["token"] == step["env"]["GH_TOKEN"] == "${{ secrets.REFRESH_TOKEN || github.token }}"
    assert step["env"]["DISPATCH_CHECKS"] == "${{ secrets.REFRESH_TOKEN == '' && '--dispatch-checks' || '' }}"
    assert refresh_run[-1] == "$DISPATCH_CHECKS"
    assert doc["permissions"] == {"contents": "write", "pull-requests": "write", "actions": "write"}
    checks = yaml.safe_load((ROOT / ".github" / "workflows" / "checks.yml").read_text())
    assert "workflow_dispatch" in checks.get("on", checks.get(True)), "checks.yml can be started on the refresh's branch"
    text = " ".join((ROOT / ".github" / "workflows" / "refresh.yml").read_text().replace("#", " ").split())
    assert "Allow GitHub Actions to create and approve pull requests" in text, "the repository setting gh pr create needs"


# -- main() itself, end to end: small upstreams made here, served from local
# git repositories, a project copy with an `origin` to push to, and a fake gh
# that records the pull requests it is asked to open. The build and the CPU
# matrix are stand-ins (scripts/ of the copy): what they do is tested
# elsewhere; here, what the refresh does with their outcome.

TUNIX_CODE, TPU_CODE = "tunix/__init__.py", "tpu_inference/__init__.py"
#: The tool venv running these tests (scripts/setup.sh's .venv).
VENV = pathlib.Path(sys.prefix)
DAY = "2026-12-07"
BRANCH = f"refresh/{DAY}-google-tunix-v0.1.9+tpu-inference-v0.26.0"
TUNIX_MOVE, TPU_MOVE = "scripts/rebase.sh google-tunix v0.1.9", "scripts/rebase.sh tpu-inference v0.26.0"

FAKE_GH = f"""#!{sys.executable}
# A stand-in for gh: the pull requests it was asked to open, in $FAKE_GH/prs.json, each call in $FAKE_GH/calls.json.
import json, os, pathlib, sys
top = pathlib.Path(os.environ["FAKE_GH"])
prs = json.loads((top / "prs.json").read_text()) if (top / "prs.json").exists() else []
calls = json.loads((top / "calls.json").read_text()) if (top / "calls.json").exists() else []
args = sys.argv[1:]
calls.append(args)
opt = lambda name: args[args.index(name) + 1]
if args[:2] == ["pr", "list"]:
    print(json.dumps([{{"number": p["number"], "isDraft": p["draft"]}} for p in prs if p["head"] == opt("--head") and p["state"] == "open"]))
elif args[:2] == ["pr", "create"]:
    prs.append({{"number": len(prs) + 1, "head": opt("--head"), "base": opt("--base") if "--base" in args else None, "title": opt("--title"),
                "body": pathlib.Path(opt("--body-file")).read_text(), "draft": "--draft" in args, "state": "open"}})
    print(f"https://github.invalid/pull/{{len(prs)}}")
elif args[:2] == ["pr", "edit"]:
    prs[int(args[2]) - 1].update(title=opt("--title"), body=pathlib.Path(opt("--body-file")).read_text())
elif args[:2] == ["pr", "ready"]:
    prs[int(args[2]) - 1]["draft"] = "--undo" in args
elif args[:2] != ["workflow", "run"]:
    sys.exit(f"fake gh: not a call the refresh makes: {{args}}")
(top / "prs.json").write_text(json.dumps(prs))
(top / "calls.json").write_text(json.dumps(calls))
"""
#: The build's stand-in: records its arguments, regenerates constraints.txt,
#: or fails as a build does ($FAKE_BUILD=fail).
FAKE_BUILD = """#!/usr/bin/env bash
echo "$*" >> "$FAKE_LOG/build"
if [ "${FAKE_BUILD:-}" = fail ]; then
  echo "[tpu-inference] building the wheel ..." >&2
  echo "maxtext-rl-overlay: error: tpu-inference: uv build failed (exit 1): setup.py: no such file" >&2
  exit 3
fi
# A pin the new cutoff moved:
sed -i -E 's/^absl-py==[^ ]+ /absl-py==9.9.9 /' "$(dirname "$0")/../constraints.txt"
echo "# regenerated from the new pins" >> "$(dirname "$0")/../constraints.txt"
"""
FAKE_MATRIX = """#!/usr/bin/env bash
echo "$*" >> "$FAKE_LOG/matrix"
echo "matrix: 12 passed, 0 failed, 3 skipped"
"""


@dataclasses.dataclass
class World:
    project: pathlib.Path
    origin: pathlib.Path
    upstreams: dict[str, pathlib.Path]
    moved: dict[str, str]  # the commit each upstream's new tag names
    env: dict[str, str]
    top: pathlib.Path

    def refresh(self, *args: str, build: str = "ok") -> subprocess.CompletedProcess:
        env = dict(self.env, FAKE_BUILD=build)
        return subprocess.run([str(self.project / ".venv" / "bin" / "python"), "scripts/refresh.py", "--no-tests", "--today", DAY, "--open",
                               "--dispatch-checks", *args], cwd=self.project, env=env, capture_output=True, text=True, timeout=300)

    def prs(self) -> list[dict]:
        return json.loads((self.top / "gh" / "prs.json").read_text())

    def calls(self) -> list[list[str]]:
        return json.loads((self.top / "gh" / "calls.json").read_text())

    def pushed(self, branch: str = BRANCH) -> list[tuple[str, str, str]]:
        """(committer email, subject, files changed) of each commit of `branch` on origin after main, oldest first."""
        log = git(self.origin, "log", "--reverse", "--format=%H %ce %s", f"main..{branch}")
        return [(sha_email_subject.split(" ", 2)[1], sha_email_subject.split(" ", 2)[2],
                 git(self.origin, "show", "--format=", "--name-only", sha_email_subject.split(" ", 1)[0]).replace("\n", " "))
                for sha_email_subject in log.splitlines()]

    def pin(self, dist: str, branch: str = BRANCH) -> str:
        return tomllib.loads(git(self.origin, "show", f"{branch}:patches/{dist}/pin.toml"))["commit"]


def _upstream(repo: pathlib.Path, code: str, pin_files: dict[str, str], moved_files: dict[str, str], tag: str,
              patch: pathlib.Path) -> tuple[str, str, pathlib.Path]:
    """An upstream: the pin, a release tagged `tag` after it, and the series' patch (A = 3 in `code`) made on the pin."""
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    pin = commit_files(repo, {code: "A = 1\n", "README.md": "upstream\n", **pin_files}, "the pin", "2026-07-27T09:44:06+00:00")
    moved = commit_files(repo, moved_files, f"release {tag}", "2026-09-01T00:00:00+00:00")
    git(repo, "tag", tag)
    return pin, moved, patch_of(repo, pin, {code: "A = 3\n"}, "Set A to 3", patch)


def _world(tmp_path: pathlib.Path, conflict: str | None = None) -> World:
    """Both upstreams with a release after the pin (a conflict with the
    series in the `conflict` one), and the project copy pinned to them."""
    top = tmp_path
    (top / "patches").mkdir()
    pyproject = '[project]\nname = "google-tunix"\nversion = "{}"\n'
    tunix = _upstream(top / "google-tunix", TUNIX_CODE, {"pyproject.toml": pyproject.format("0.1.8")},
                      {"pyproject.toml": pyproject.format("0.1.9"), **({TUNIX_CODE: "A = 2\n"} if conflict == "google-tunix" else {})},
                      "v0.1.9", top / "patches" / "0001-Set-A-to-3.patch")
    (top / "patches" / "tpu").mkdir()
    tpu = _upstream(top / "tpu-inference", TPU_CODE, {},
                    {"README.md": "upstream, later\n", **({TPU_CODE: "A = 2\n"} if conflict == "tpu-inference" else {})},
                    "v0.26.0", top / "patches" / "tpu" / "0001-Set-A-to-3.patch")
    project = top / "project"
    project.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE", "constraints.txt", ".gitignore"):
        shutil.copy2(ROOT / name, project / name)
    for name in ("overlay", "patches", "scripts"):
        shutil.copytree(ROOT / name, project / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "manifest.json"))
    for dist, (pin, _, patch) in {"google-tunix": tunix, "tpu-inference": tpu}.items():
        pin_series(project, dist, top / dist, pin, [patch])
        # The versions the tags come after, whatever this checkout's pins are (a rebase's fast tests run this file
        # in a copy whose pins it moved).
        set_pin_values(project / "patches" / dist / "pin.toml", {"version": PINS[dist]})
    for name, text in {"build-wheels.sh": FAKE_BUILD, "test-matrix.sh": FAKE_MATRIX}.items():
        (project / "scripts" / name).write_text(text)
    git(project, "init", "-q", "-b", "main")
    commit_files(project, {}, "project copy", "2026-11-01T00:00:00+00:00")
    origin = top / "origin.git"
    git(top, "init", "-q", "--bare", str(origin))
    git(project, "remote", "add", "origin", str(origin))
    git(project, "push", "-q", "origin", "main")
    # The tool venv these tests run in, as the checkout's (after the commit: a link is no folder to .gitignore). Not
    # ROOT's own .venv: the rebase's fast tests run this file in a project copy that has none.
    (project / ".venv").symlink_to(VENV)
    bin_dir = top / "bin"
    bin_dir.mkdir()
    (bin_dir / "gh").write_text(FAKE_GH)
    (bin_dir / "gh").chmod(0o755)
    for name in ("gh", "log"):
        (top / name).mkdir()
    index = top / "index"
    index.mkdir()
    fake_wheel(index, "maxtext", maxtext_version(ROOT))  # the release the extra names, and no newer one
    env = dict(os.environ, **GIT_ENV, MRL_CACHE_DIR=str(top / "cache"), PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               FAKE_GH=str(top / "gh"), FAKE_LOG=str(top / "log"))
    env.pop("GIT_AUTHOR_DATE", None)
    return World(project, origin, {"google-tunix": top / "google-tunix", "tpu-inference": top / "tpu-inference"},
                 {"google-tunix": tunix[1], "tpu-inference": tpu[1]}, env, top)


@pytest.fixture
def world(tmp_path, request) -> Iterator[World]:
    made = _world(tmp_path, getattr(request, "param", None))
    with PackageIndex(tmp_path / "index") as index:
        made.env["UV_DEFAULT_INDEX"] = index.url
        yield made


def _subjects(world: World, branch: str = BRANCH) -> list[str]:
    """The subjects of the branch's commits after the first, which moves the cutoff."""
    (first, *rest) = [subject for _, subject, _ in world.pushed(branch)]
    assert first.startswith("Refresh: resolution-cutoff "), first
    return rest


def _finish(body: str) -> list[str]:
    """The commands of the body's "How to finish"."""
    return body.split("### How to finish", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0].splitlines()


def test_both_pins_move_in_one_run_one_commit_each_and_one_ready_pull_request(world):
    old_cutoff = load_project(world.project).resolution_cutoff
    old_absl = re.search(r"(?m)^absl-py==(\S+) ", (world.project / "constraints.txt").read_text())
    assert old_absl, "the project's constraints.txt pins absl-py"
    done = world.refresh()
    assert done.returncode == 0, done.stderr
    new_cutoff = tomllib.loads(git(world.origin, "show", f"{BRANCH}:pyproject.toml"))["tool"]["maxtext-rl-overlay"]["resolution-cutoff"]
    assert new_cutoff > old_cutoff, "the refresh moves the cutoff to its own time"
    assert world.pushed() == [
        (refresh.EMAIL, f"Refresh: resolution-cutoff {old_cutoff} -> {new_cutoff}", "pyproject.toml"),
        (refresh.EMAIL, "Refresh: rebase google-tunix v0.1.9", "patches/google-tunix/0001-Set-A-to-3.patch patches/google-tunix/pin.toml"),
        (refresh.EMAIL, "Refresh: rebase tpu-inference v0.26.0", "patches/tpu-inference/0001-Set-A-to-3.patch patches/tpu-inference/pin.toml"),
        (refresh.EMAIL, refresh.BUILT, "constraints.txt")]
    assert {d: world.pin(d) for d in world.moved} == world.moved
    (pr,) = world.prs()
    assert pr["head"] == BRANCH and pr["base"] == "main" and pr["draft"] is False
    assert pr["title"] == "Refresh: google-tunix-v0.1.9, tpu-inference-v0.26.0"
    body = pr["body"]
    for move in (TUNIX_MOVE, TPU_MOVE):
        assert f"### `{move}` (exit 0)" in body
    assert body.count("0001-Set-A-to-3.patch  ") == 2 and "How to finish" not in body
    assert "- 12 passed, 0 failed, 3 skipped" in body
    assert f"### Resolution cutoff: `{old_cutoff}` -> `{new_cutoff}`\n\nEvery resolution sees the package registry as of the cutoff" in body
    assert f"\n- absl-py {old_absl.group(1)} -> 9.9.9\n" in body, "every pin that moved, old -> new"
    assert (world.top / "log" / "matrix").read_text().split() == ["--platform", "cpu", "--quick", "--wheels", "dist"]
    (built,) = (world.top / "log" / "build").read_text().splitlines()
    assert "--source google-tunix=" in built and "--source tpu-inference=" in built
    assert ["workflow", "run", "checks.yml", "--ref", BRANCH] in world.calls()


@pytest.mark.parametrize("world", ["google-tunix"], indirect=True)
def test_a_conflict_in_the_first_move_opens_a_draft_whose_commands_finish_it_on_a_fresh_checkout(world, tmp_path):
    done = world.refresh()
    assert done.returncode == 0, done.stderr
    (pr,) = world.prs()
    assert pr["draft"] is True and pr["title"].endswith("(needs work)")
    body = pr["body"]
    assert (f"**Stopped at a conflict** in `{TUNIX_MOVE}`: 0001-Set-A-to-3.patch. No move is committed on this branch (only a record of the stop); "
            "this one and those after it are not.") in body
    assert f"### `{TPU_MOVE}`\n\n- not run (a move before it stopped)" in body
    (cutoff, stop) = world.pushed()
    assert cutoff[1].startswith("Refresh: resolution-cutoff ") and cutoff[2] == "pyproject.toml", "the cutoff moved first"
    assert stop[:2] == (refresh.EMAIL, f"Refresh stopped at {TUNIX_MOVE}") and stop[2] == "", "an empty commit: the pull request has one"
    finish = _finish(body)
    assert finish[0] == f"git fetch origin {BRANCH} && git checkout {BRANCH}"
    said = git(world.origin, "log", "-1", "--format=%b", BRANCH).splitlines()
    assert said[0] == "To finish, on a checkout of this branch:" and [line.strip() for line in said[2:]] == finish, "the stop's commit says it too"

    # The body's commands, line by line, on a fresh clone (setup.sh: the venv linked; the rebases without their fast tests,
    # which the copy does not hold), the conflict resolved where the rebase says.
    fresh = tmp_path / "fresh"
    git(tmp_path, "clone", "-q", str(world.origin), str(fresh))
    (fresh / ".venv").symlink_to(VENV)
    for line in finish:
        command = line.split("   #", 1)[0]
        if command == "bash scripts/setup.sh":
            continue
        if command.startswith("scripts/rebase.sh"):
            command += " --no-tests"
        ran = subprocess.run(["bash", "-c", command], cwd=fresh, env=world.env, capture_output=True, text=True, timeout=300)
        if "stops at the same conflict" in line:
            assert ran.returncode == 1 and "STOPPED at 0001-Set-A-to-3.patch" in ran.stdout, ran.stdout + ran.stderr
            work = fresh / "build" / "rebase" / "google-tunix"
            (work / TUNIX_CODE).write_text("A = 3\n")
            git(work, "add", TUNIX_CODE)
        else:
            assert ran.returncode == 0, f"{command}:\n{ran.stdout}{ran.stderr}"
    assert _subjects(world) == [
        f"Refresh stopped at {TUNIX_MOVE}", "Refresh: rebase google-tunix v0.1.9", "Refresh: rebase tpu-inference v0.26.0", refresh.BUILT]
    assert {d: world.pin(d) for d in world.moved} == world.moved


@pytest.mark.parametrize("world", ["tpu-inference"], indirect=True)
def test_a_conflict_in_the_second_move_keeps_the_first_committed(world):
    done = world.refresh()
    assert done.returncode == 0, done.stderr
    assert _subjects(world) == ["Refresh: rebase google-tunix v0.1.9", f"Refresh stopped at {TPU_MOVE}"]
    assert world.pin("google-tunix") == world.moved["google-tunix"] and world.pin("tpu-inference") != world.moved["tpu-inference"]
    (pr,) = world.prs()
    body = pr["body"]
    assert pr["draft"] is True
    assert (f"**Stopped at a conflict** in `{TPU_MOVE}`: 0001-Set-A-to-3.patch. The moves before it (`{TUNIX_MOVE}`) are committed "
            "on this branch; this one is not.") in body
    assert _finish(body)[2:] == [
        f"{TPU_MOVE}   # stops at the same conflict: resolve it in build/rebase/ as it says (git add each file there)",
        "scripts/rebase.sh --continue",
        "git add -A patches pyproject.toml && git commit -m 'Refresh: rebase tpu-inference v0.26.0'",
        "scripts/build-wheels.sh",
        f"git add -A constraints.txt && git commit -m '{refresh.BUILT}'",
        "scripts/test-matrix.sh --platform cpu --quick --wheels dist",
        f"git push origin {BRANCH}"]
    assert not (world.top / "log" / "build").exists(), "nothing is built after a stop"


def test_a_failed_build_opens_a_draft_with_the_build_s_error(world):
    done = world.refresh(build="fail")
    assert done.returncode == 0, done.stderr
    assert _subjects(world) == ["Refresh: rebase google-tunix v0.1.9", "Refresh: rebase tpu-inference v0.26.0"]
    (pr,) = world.prs()
    body = pr["body"]
    assert pr["draft"] is True
    assert "**The build failed** (`scripts/build-wheels.sh`, exit 3)" in body
    assert "maxtext-rl-overlay: error: tpu-inference: uv build failed (exit 1): setup.py: no such file" in body
    assert _finish(body)[2:4] == ["scripts/build-wheels.sh   # failed here: its output below says why",
                                  f"git add -A constraints.txt && git commit -m '{refresh.BUILT}'"]
    assert "- not run (the build failed)" in body and not (world.top / "log" / "matrix").exists()


def test_a_same_day_rerun_updates_its_branch_and_pull_request_and_leaves_a_person_s_branch_alone(world, tmp_path):
    assert world.refresh().returncode == 0
    first = git(world.origin, "rev-parse", BRANCH)
    git(world.project, "checkout", "-q", "main")  # a new run starts from main
    again = world.refresh(build="fail")
    assert again.returncode == 0, again.stderr
    assert git(world.origin, "rev-parse", BRANCH) != first, "the branch was updated"
    assert _subjects(world) == ["Refresh: rebase google-tunix v0.1.9", "Refresh: rebase tpu-inference v0.26.0"]
    (pr,) = world.prs()
    assert pr["draft"] is True and pr["title"].endswith("(needs work)") and "**The build failed**" in pr["body"], "the open one, updated"
    assert ["pr", "ready", "1", "--undo"] in world.calls()

    # Someone pushes a commit of their own onto the branch: the next run leaves it alone.
    person = tmp_path / "person"
    git(tmp_path, "clone", "-q", "-b", BRANCH, str(world.origin), str(person))
    commit_files(person, {"NOTES.md": "mine\n"}, "a person's work", "2026-12-07T12:00:00+00:00")
    git(person, "push", "-q", "origin", BRANCH)
    theirs = git(world.origin, "rev-parse", BRANCH)
    git(world.project, "checkout", "-q", "main")
    third = world.refresh()
    assert third.returncode == 0, third.stderr
    assert git(world.origin, "rev-parse", BRANCH) == theirs
    assert "holds commits by u@u: left alone" in third.stderr
    assert [(p["head"], p["draft"]) for p in world.prs()] == [(BRANCH, True), (f"{BRANCH}-2", False)]
    assert len(_subjects(world, f"{BRANCH}-2")) == 3


def test_the_refresh_replaces_only_its_own_outputs(tmp_path):
    """pr.md and pr.json in --work: a user's file of that name is refused
    before any work (status 3 in main), the refresh's own is replaced."""
    pr = {"branch": "refresh/x", "title": "Refresh: x", "draft": False, "body": "the body\n"}
    refresh.check_outputs(tmp_path)  # absent
    refresh.write_pull_request(tmp_path, pr)
    assert (tmp_path / "pr.md").read_text() == refresh.MD_MARK + "\nthe body\n"
    assert json.loads((tmp_path / "pr.json").read_text()) == {"branch": "refresh/x", "title": "Refresh: x", "draft": False,
                                                             "written_by": refresh.JSON_MARK}
    refresh.check_outputs(tmp_path)  # its own
    refresh.write_pull_request(tmp_path, dict(pr, body="again\n"))
    assert (tmp_path / "pr.md").read_text() == refresh.MD_MARK + "\nagain\n"
    for name, foreign in (("pr.md", "my notes\n"), ("pr.json", '{"branch": "mine"}')):
        (tmp_path / name).write_text(foreign)
        with pytest.raises(OverlayError, match=f"{tmp_path / name} is not a pull request (body|record) the tool wrote"):
            refresh.check_outputs(tmp_path)
        with pytest.raises(OverlayError):
            refresh.write_pull_request(tmp_path, pr)
        assert (tmp_path / name).read_text() == foreign
        (tmp_path / name).write_text("")  # empty: replaced
    refresh.check_outputs(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pr.json", "pr.md"]
