"""scripts/rebase.sh on real upstream drift (PyPI releases committed as git
history, tests/rebase/drift.toml), and on the cases a person meets: a
conflict (--continue, --abort), a patch upstream already took, a dirty
checkout, a mirror lacking blobs, --find-base. Every test works on a
git-tracked copy of the project; the real checkout is never changed."""

from __future__ import annotations

import difflib
import os
import pathlib
import subprocess
import tomllib

import pytest

from maxtext_rl_overlay.stages import patchfile
from support import ROOT
from support.rebase import (
    commit_all,
    git,
    make_project,
    pin_of,
    rebase,
    row,
    snapshot,
)

SAMPLING = "tpu_inference/layers/jax/sample/sampling.py"
TPU = pathlib.Path("patches/tpu-inference")
PATCH = "0001-Reshard-logprobs-in-gather_logprobs-for-Explicit-mes.patch"
LKG = "d626108b1841888ec90aced33367149a6bbc7e4b"
OLD_COMMENT = "    # Find the topK values.\n"
STALE_CONSTRAINTS_TEST = "tests/unit/test_pins_and_patches.py::test_constraints_pin_exactly_what_the_pins_and_revision_build"
NEW_COMMENT = "    # Find the top-k values and their vocabulary ids.\n"


def _project(tmp_path, repo, commit, **extra) -> pathlib.Path:
    """The project pinned to `commit` of the tpu-inference upstream `repo`,
    with the series this file's cases are written for (patch 0001)."""
    return make_project(tmp_path / "project", {"tpu-inference": {**pin_of(repo, commit), **extra}}, keep={"tpu-inference": ("0001-",)})


def _branch(repo, name, base) -> None:
    git(repo, "checkout", "-q", "-f", "-b", name, base)


def _conflicting_commit(repo, base) -> str:
    """Upstream rewords the line the patch inserts its code before."""
    _branch(repo, "conflict", base)
    path = repo / SAMPLING
    text = path.read_text()
    assert text.count(OLD_COMMENT) == 1
    path.write_text(text.replace(OLD_COMMENT, NEW_COMMENT))
    return commit_all(repo, "Reword a comment in gather_logprobs", "2026-08-01T12:00:00+00:00")


def _pin(project, dist="tpu-inference") -> dict:
    return tomllib.loads((project / "patches" / dist / "pin.toml").read_text())


def _status(project) -> list[tuple[str, ...]]:
    """What changed in the project's checkout: (status, path) pairs."""
    return [tuple(line.split(None, 1)) for line in git(project, "status", "--porcelain").splitlines()]


def _added_lines(patch_text: str) -> str:
    return "".join(line[1:] + "\n" for line in patch_text.split("\n@@", 1)[1].splitlines() if line.startswith("+"))


def _head(patch_text: str) -> str:
    return patch_text.split("\n---\n", 1)[0]


def test_tpu_inference_moves_to_a_later_release(upstreams, tmp_path):
    """0.25.0.dev20260728 -> 0.32.0: the patch applies, is re-exported for the
    new tree with its author, date and message, and the pin moves (values
    edited in place, comments kept); the vLLM tpu-inference's CI verified is
    applied on request."""
    repo, commits = upstreams["tpu-inference"]
    project = _project(tmp_path, repo, commits["old"])
    pin_before = (project / TPU / "pin.toml").read_text()
    patch_before = (project / TPU / PATCH).read_text()
    proc = rebase(project, "tpu-inference", "v0.32.0", "--source", str(repo), "--no-tests", "--apply-vllm-lkg")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert row(proc.stdout, "0001-") == "applied cleanly"
    pin = _pin(project)
    assert pin["commit"] == commits["new"]
    assert pin["tree"] == git(repo, "rev-parse", f"{commits['new']}^{{tree}}")
    assert pin["date"] == "2026-10-22T07:50:26+00:00"
    assert pin["version"] == "0.32.0.dev20261022", "daily-build naming: newest release tag, commit date"
    changed = [line for line in difflib.ndiff(pin_before.splitlines(), (project / TPU / "pin.toml").read_text().splitlines()) if line[:2] in ("+ ", "- ")]
    assert sorted(line[2:].split(" =")[0] for line in changed) == ["commit", "commit", "date", "date", "tree", "tree", "version", "version"]
    patch_after = (project / TPU / PATCH).read_text()
    assert _head(patch_after) == _head(patch_before), "author, date and message are kept"
    assert _added_lines(patch_after) == _added_lines(patch_before)
    (change,) = patchfile.parse(project / TPU / PATCH).files
    assert change.pre == git(repo, "rev-parse", f"{commits['new']}:{SAMPLING}"), "re-exported against the new upstream"
    assert patchfile.lint(patchfile.parse(project / TPU / PATCH)) == []
    assert _pin(project, "vllm")["commit"] == LKG
    assert f"-> {LKG[:12]}" in proc.stdout
    assert not (project / "build" / "rebase" / "state").exists()
    assert _status(project) == [("M", str(TPU / PATCH)), ("M", str(TPU / "pin.toml")), ("M", "patches/vllm/pin.toml")]


def test_tunix_fetched_from_the_pin_repository_and_fast_tests_run(upstreams, tmp_path):
    """0.1.6 -> 0.1.7 without --source (git fetch from the pin's repository):
    the version is pyproject's. The whole series carried, the command exits
    0: the fast tests pass but for the constraints.txt check, stale by
    construction without --build (left out, said so), and the output says
    the next step is to rebuild constraints.txt."""
    repo, commits = upstreams["google-tunix"]
    project = make_project(tmp_path / "project", {"google-tunix": {**pin_of(repo, commits["old"]), "repository": str(repo)}}, keep={"google-tunix": ("0001-",)})
    proc = rebase(project, "google-tunix", "main")
    assert row(proc.stdout, "0001-") == "applied cleanly", proc.stdout + proc.stderr
    assert _pin(project, "google-tunix")["commit"] == commits["new"]
    assert _pin(project, "google-tunix")["version"] == "0.1.7"
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fast tests (tests/unit): passed: " in proc.stdout and "1 deselected" in proc.stdout
    assert f"{STALE_CONSTRAINTS_TEST} left out: constraints.txt is stale until rebuilt" in proc.stdout
    assert "Next: constraints.txt still pins the wheels of the old pin" in proc.stdout
    assert "\n  scripts/build-wheels.sh\n" in proc.stdout and "run the rebase again with --build" in proc.stdout
    assert _status(project) == [("M", "patches/google-tunix/0001-Handle-Flax-NNX-rng-count-leaves-in-transfer_state_d.patch"),
                                ("M", "patches/google-tunix/pin.toml")]


def test_a_failing_fast_test_still_fails_the_rebase(upstreams, tmp_path):
    """Only the constraints.txt check is left out: any other fast test that
    fails makes the command exit 1, and the next step names the sources."""
    repo, commits = upstreams["tpu-inference"]
    project = _project(tmp_path, repo, commits["old"])
    (project / "tests" / "unit" / "test_broken_by_the_move.py").write_text("def test_broken():\n    assert False\n")
    commit_all(project, "a fast test the move breaks", "2026-11-02T00:00:00+00:00")
    proc = rebase(project, "tpu-inference", "v0.32.0", "--source", str(repo))
    assert row(proc.stdout, "0001-") == "applied cleanly", proc.stdout + proc.stderr
    assert proc.returncode == 1
    assert "fast tests (tests/unit): FAILED: 1 failed" in proc.stdout
    assert "FAILED tests/unit/test_broken_by_the_move.py::test_broken" in proc.stdout
    assert STALE_CONSTRAINTS_TEST not in proc.stdout.split("fast tests (tests/unit):", 1)[1].split("\n  time:", 1)[0]
    assert f"scripts/build-wheels.sh --source tpu-inference={repo}" in proc.stdout


def test_unchanged_patch_reexports_without_a_diff(upstream, tmp_path):
    repo, commits = upstream
    _branch(repo, "unrelated", commits["old"])
    (repo / "README.md").write_text((repo / "README.md").read_text() + "\nA change elsewhere.\n")
    new = commit_all(repo, "Touch the README", "2026-07-29T10:00:00+00:00")
    project = _project(tmp_path, repo, commits["old"])
    proc = rebase(project, "tpu-inference", "unrelated", "--source", str(repo), "--no-tests")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _status(project) == [("M", str(TPU / "pin.toml"))]
    assert _pin(project)["commit"] == new
    assert _pin(project)["version"] == "0.25.0.dev20260729", "no release tag before it: the previous pin's base"


def test_conflict_stops_then_continue(upstream, tmp_path):
    repo, commits = upstream
    new = _conflicting_commit(repo, commits["old"])
    project = _project(tmp_path, repo, commits["old"])
    proc = rebase(project, "tpu-inference", "conflict", "--source", str(repo), "--no-tests")
    assert proc.returncode == 1
    assert row(proc.stdout, "0001-").startswith("CONFLICT") and SAMPLING in proc.stdout
    assert "scripts/rebase.sh --continue" in proc.stdout and "scripts/rebase.sh --abort" in proc.stdout
    work = project / "build" / "rebase" / "tpu-inference"
    assert "<<<<<<<" in (work / SAMPLING).read_text()
    assert git(work, "diff", "--name-only", "--diff-filter=U") == SAMPLING
    assert git(project, "status", "--porcelain", "--", "patches", "constraints.txt") == "", "nothing written yet"
    # Resolving is the person's job; --continue refuses while files are unmerged.
    early = rebase(project, "--continue")
    assert early.returncode == 3 and "still unmerged" in early.stderr and SAMPLING in early.stderr
    block = _added_lines((ROOT / TPU / PATCH).read_text())
    upstream_text = git(repo, "show", f"{new}:{SAMPLING}") + "\n"
    (work / SAMPLING).write_text(upstream_text.replace(NEW_COMMENT, block + NEW_COMMENT))
    git(work, "add", SAMPLING)
    proc = rebase(project, "--continue")
    assert row(proc.stdout, "0001-").startswith("conflict resolved by hand"), proc.stdout + proc.stderr
    exported = (project / TPU / PATCH).read_text()
    assert NEW_COMMENT.strip() in exported and _head(exported) == _head((ROOT / TPU / PATCH).read_text())
    assert _pin(project)["commit"] == new
    assert not (project / "build" / "rebase" / "state").exists()
    assert rebase(project, "--continue").returncode == 3  # nothing in progress any more


def test_abort_restores_every_file_byte_for_byte(upstream, tmp_path):
    """--abort at a conflict, and --abort after the series and pins were
    written but the --build step failed."""
    repo, commits = upstream
    _conflicting_commit(repo, commits["old"])
    project = _project(tmp_path, repo, commits["old"])
    before = snapshot(project)
    assert rebase(project, "tpu-inference", "conflict", "--source", str(repo), "--no-tests").returncode == 1
    again = rebase(project, "tpu-inference", "conflict", "--source", str(repo))
    assert again.returncode == 3 and "in progress" in again.stderr
    proc = rebase(project, "--abort")
    assert proc.returncode == 0, proc.stderr
    assert snapshot(project) == before
    assert not (project / "build" / "rebase" / "state").exists() and not (project / "build" / "rebase" / "tpu-inference").exists()

    proc = rebase(project, "tpu-inference", "v0.32.0", "--source", str(repo), "--apply-vllm-lkg",
                  "--build", "--source", f"google-tunix={tmp_path / 'no-such-source'}")
    assert proc.returncode == 3 and "build failed" in proc.stderr and "--abort" in proc.stderr, proc.stdout + proc.stderr
    assert snapshot(project) != before, "the series and pins were written before the build"
    assert rebase(project, "--abort").returncode == 0
    assert snapshot(project) == before
    assert git(project, "status", "--porcelain") == ""


def _dropped_as_applied_upstream(proc: subprocess.CompletedProcess[str], project: pathlib.Path, commit: str) -> str:
    """The rebase passed and dropped the patch as upstream's `commit`: gone from
    the series' folder and recorded in the series (returned)."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert row(proc.stdout, "0001-") == f"dropped: already upstream  (Applied-Upstream: {commit[:12]})"
    assert not (project / TPU / PATCH).exists()
    series = (project / TPU / "series").read_text()
    assert f"# Applied-Upstream: {PATCH} in {commit}" in series
    return series


def test_patch_already_upstream_is_dropped_and_recorded(upstream, tmp_path):
    repo, commits = upstream
    _branch(repo, "taken", commits["old"])
    git(repo, "apply", str(ROOT / TPU / PATCH))
    taken = commit_all(repo, "gather_logprobs: reshard for Explicit axes (#123)", "2026-08-02T12:00:00+00:00")
    (repo / "README.md").write_text((repo / "README.md").read_text() + "\nlater\n")
    new = commit_all(repo, "A later commit", "2026-08-03T12:00:00+00:00")
    project = _project(tmp_path, repo, commits["old"])
    proc = rebase(project, "tpu-inference", "taken", "--source", str(repo), "--no-tests")
    assert f"onto {new}" in _dropped_as_applied_upstream(proc, project, taken)
    assert _pin(project)["commit"] == new
    assert _status(project) == [("D", str(TPU / PATCH)), ("M", str(TPU / "pin.toml")), ("M", str(TPU / "series"))]


def test_patch_upstream_took_with_changes_applies_as_empty_and_is_dropped(upstream, tmp_path):
    """Upstream took the change and reworded a nearby docstring line: the
    patch no longer reverse-applies, its 3-way merge changes nothing."""
    repo, commits = upstream
    _branch(repo, "taken-changed", commits["old"])
    git(repo, "apply", str(ROOT / TPU / PATCH))
    path = repo / SAMPLING
    path.write_text(path.read_text().replace("        Top-k float logprobs tensor, (num tokens)", "        Top-k float logprobs, (num tokens)", 1))
    new = commit_all(repo, "Reshard logprobs (reworked)", "2026-08-02T12:00:00+00:00")
    project = _project(tmp_path, repo, commits["old"])
    proc = rebase(project, "tpu-inference", "taken-changed", "--source", str(repo), "--no-tests")
    _dropped_as_applied_upstream(proc, project, new)


REWRITTEN = "    # part of the array types: top_k and take_along_axis reject an operand\n"


def _fixed_then_rewritten(repo, base) -> tuple[str, str]:
    """Upstream takes 0001's change (the commit a backport would carry),
    then rewrites a line it added: the patch no longer reverse-applies, and
    its 3-way merge conflicts with upstream's own later version."""
    _branch(repo, "fixed", base)
    git(repo, "apply", str(ROOT / TPU / PATCH))
    fixed = commit_all(repo, "gather_logprobs: reshard for Explicit axes (#123)", "2026-08-02T12:00:00+00:00")
    path = repo / SAMPLING
    assert path.read_text().count(REWRITTEN) == 1
    path.write_text(path.read_text().replace(REWRITTEN, "    # part of the array types (reworded upstream later)\n"))
    later = commit_all(repo, "Reword a comment of the fix", "2026-08-04T12:00:00+00:00")
    return fixed, later


def _as_backport(project, fixed: str, release: str) -> str:
    """Make the project's 0001 a backport of upstream's `fixed`, first in `release`."""
    name = f"backport-{fixed[:9]}-Reshard-logprobs.patch"
    old = project / TPU / PATCH
    text = old.read_text().replace(
        "Upstream-Status: Pending",
        f"Applied-Upstream: {release}, https://example.invalid/commit/{fixed}\nUpstream-Status: Backport [{fixed}]", 1)
    old.unlink()
    (project / TPU / name).write_text(text)
    series = project / TPU / "series"
    series.write_text(series.read_text().replace(PATCH, name))
    commit_all(project, "0001 as a backport", "2026-11-01T00:00:00+00:00")
    return name


def test_backport_drops_where_the_new_ref_descends_from_its_commit(upstream, tmp_path):
    """Neither reverse-apply nor a 3-way merge would tell: upstream changed
    the backported lines since. The history does: the new ref descends from
    the commit the backport carries."""
    repo, commits = upstream
    fixed, later = _fixed_then_rewritten(repo, commits["old"])
    project = _project(tmp_path, repo, commits["old"])
    name = _as_backport(project, fixed, "v9.9.9")
    proc = rebase(project, "tpu-inference", "fixed", "--source", str(repo), "--no-tests")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert row(proc.stdout, "backport-") == f"dropped: already upstream  (Applied-Upstream: {fixed[:12]})", proc.stdout
    assert f"# Applied-Upstream: {name} in {fixed}" in (project / TPU / "series").read_text()
    assert _pin(project)["commit"] == later


def _shallow_source(repo, dest, *refs) -> pathlib.Path:
    """A bare repository holding only the named commits (as ../shared/upstream's)."""
    git(dest.parent, "init", "-q", "--bare", str(dest))
    git(dest, "fetch", "-q", "--depth", "1", f"file://{repo}", *refs)
    return dest


def test_backport_drops_by_its_release_where_the_source_holds_no_history(upstream, tmp_path):
    """A source with the named commits alone: the release that the
    Applied-Upstream trailer names is tagged before the new ref, so the
    backport drops, and the report says it was read from dates. A release
    tagged after the new ref leaves it to the conflict."""
    repo, commits = upstream
    fixed, later = _fixed_then_rewritten(repo, commits["old"])
    # Releases are tagged on release branches, as upstream's are.
    _branch(repo, "release-9.9.9", fixed)
    git(repo, "tag", "v9.9.9", commit_all(repo, "Docs for v9.9.9", "2026-08-03T12:00:00+00:00"))
    _branch(repo, "release-9.9.10", later)
    git(repo, "tag", "v9.9.10", commit_all(repo, "Docs for v9.9.10", "2026-08-09T12:00:00+00:00"))
    source = _shallow_source(repo, tmp_path / "shallow.git", f"{commits['old']}:refs/tags/pin", "refs/heads/fixed:refs/heads/fixed",
                             "refs/tags/v9.9.9:refs/tags/v9.9.9", "refs/tags/v9.9.10:refs/tags/v9.9.10")
    assert subprocess.run(["git", "cat-file", "-e", f"{fixed}^{{commit}}"], cwd=source, capture_output=True).returncode != 0
    project = _project(tmp_path, repo, commits["old"])
    _as_backport(project, fixed, "v9.9.9")
    proc = rebase(project, "tpu-inference", "fixed", "--source", str(source), "--no-tests")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert row(proc.stdout, "backport-") == (
        "dropped: already upstream  (in v9.9.9 (its Applied-Upstream), tagged 2026-08-03, not after the new pin's commit of "
        "2026-08-04; the repository holds no history to check ancestry)"), proc.stdout
    assert _pin(project)["commit"] == later

    git(project, "checkout", "-q", "--", ".")
    git(project, "clean", "-q", "-f", "-d")
    later_release = pathlib.Path(project / TPU / "series").read_text()
    _as_backport_release(project, "v9.9.10")
    proc = rebase(project, "tpu-inference", "fixed", "--source", str(source), "--no-tests")
    assert proc.returncode == 1 and row(proc.stdout, "backport-").startswith("CONFLICT"), proc.stdout + proc.stderr
    assert rebase(project, "--abort").returncode == 0
    assert later_release == (project / TPU / "series").read_text()


def _as_backport_release(project, release: str) -> None:
    """The project's backport now names a later first release."""
    [patch] = (project / TPU).glob("backport-*.patch")
    patch.write_text(patch.read_text().replace("Applied-Upstream: v9.9.9,", f"Applied-Upstream: {release},", 1))
    commit_all(project, f"first released in {release}", "2026-11-01T00:00:00+00:00")


GATHER = "\n\n\ndef gather_logprobs("
UPSTREAMS_HELPER = "def _upstreams_earlier_helper():\n    return 0\n"
BACKPORTED_HELPER = "def _backported_helper():\n    return 1\n"


def _insert_before_gather(repo, block: str) -> None:
    path = repo / SAMPLING
    text = path.read_text()
    assert text.count(GATHER) == 1
    path.write_text(text.replace(GATHER, f"\n\n\n{block}{GATHER}"))


def test_backport_drops_by_its_lines_where_upstream_wrote_it_in_other_surroundings(upstream, tmp_path):
    """As Tunix's 9a17c3714 at main-2026-08-21, a snapshot without history:
    upstream first added a helper where the backport's function goes, then
    its own commit put that function after it; the backport, fitted to the
    pin, neither reverse-applies with its full context nor merges (both
    sides insert at one place). Its lines stand at the new ref with the two
    lines around each, so it drops, and the report says how that was read.
    Upstream's later rewrite of one of its lines leaves it to the conflict."""
    repo, commits = upstream
    _branch(repo, "main2", commits["old"])
    _insert_before_gather(repo, UPSTREAMS_HELPER)
    commit_all(repo, "Add an earlier helper", "2026-08-02T12:00:00+00:00")
    _insert_before_gather(repo, BACKPORTED_HELPER)
    carried = commit_all(repo, "Add the helper the backport carries", "2026-08-03T12:00:00+00:00")
    (repo / "NOTE").write_text("later\n")
    later = commit_all(repo, "Unrelated later", "2026-08-04T12:00:00+00:00")
    source = _shallow_source(repo, tmp_path / "shallow.git", f"{commits['old']}:refs/tags/pin", "refs/heads/main2:refs/heads/main2")
    assert subprocess.run(["git", "cat-file", "-e", f"{carried}^{{commit}}"], cwd=source, capture_output=True).returncode != 0

    fitted = tmp_path / "fitted"
    git(tmp_path, "clone", "-q", str(repo), str(fitted))
    git(fitted, "checkout", "-q", commits["old"])
    _insert_before_gather(fitted, BACKPORTED_HELPER)
    commit_all(fitted, f"Add the backported helper\n\nOrigin: upstream, https://example.invalid/commit/{carried}\n"
               f"Applied-Upstream: https://example.invalid/commit/{carried}\nUpstream-Status: Backport [{carried}]",
               "2026-08-03T12:00:00+00:00")
    text = git(fitted, "format-patch", "-1", "--stdout", "--full-index", "--zero-commit") + "\n"
    assert git(fitted, "apply", "--check", "-R", "-", input=text) == ""  # and at the pin's surroundings it does

    project = _project(tmp_path, repo, commits["old"])
    name = f"backport-{carried[:9]}-Add-the-backported-helper.patch"
    (project / TPU / name).write_text(text)
    series = project / TPU / "series"
    series.write_text(series.read_text().replace(PATCH, f"{name}\n{PATCH}"))
    commit_all(project, "the backport", "2026-11-01T00:00:00+00:00")
    proc = rebase(project, "tpu-inference", "main2", "--source", str(source), "--no-tests")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert row(proc.stdout, "backport-") == (
        f"dropped: already upstream  ({later[:12]}: its lines stand there with 2 lines of context each (fitted to the pin, "
        "upstream's own commit has other surroundings); the repository holds no history to check ancestry)"), proc.stdout
    assert row(proc.stdout, "0001-").startswith("applied"), proc.stdout
    assert _pin(project)["commit"] == later

    git(project, "checkout", "-q", "--", ".")
    git(project, "clean", "-q", "-f", "-d")
    rewritten = tmp_path / "rewritten"
    git(tmp_path, "clone", "-q", str(repo), str(rewritten))
    git(rewritten, "checkout", "-q", "-b", "main3", later)
    path = rewritten / SAMPLING
    path.write_text(path.read_text().replace("    return 1\n", "    return 2  # rewritten upstream later\n"))
    commit_all(rewritten, "Rewrite the helper", "2026-08-05T12:00:00+00:00")
    source3 = _shallow_source(rewritten, tmp_path / "shallow3.git", f"{commits['old']}:refs/tags/pin", "refs/heads/main3:refs/heads/main3")
    proc = rebase(project, "tpu-inference", "main3", "--source", str(source3), "--no-tests")
    assert proc.returncode == 1 and row(proc.stdout, "backport-").startswith("CONFLICT"), proc.stdout + proc.stderr
    assert rebase(project, "--abort").returncode == 0


def test_dirty_checkout_is_refused_before_anything_starts(upstreams, tmp_path):
    repo, commits = upstreams["tpu-inference"]
    project = _project(tmp_path, repo, commits["old"])
    with (project / TPU / "series").open("a") as f:
        f.write("# a local edit\n")
    proc = rebase(project, "tpu-inference", "v0.32.0", "--source", str(repo))
    assert proc.returncode == 3 and "uncommitted changes" in proc.stderr and "patches/tpu-inference/series" in proc.stderr
    assert not (project / "build").exists()
    git(project, "checkout", "--", "patches")
    (project / TPU / "0009-stray.patch").write_text("untracked\n")
    assert rebase(project, "tpu-inference", "v0.32.0", "--source", str(repo)).returncode == 3


def test_mirror_lacking_blobs_outside_the_package(upstream, tmp_path):
    """Like the tunix mirror: the work clone leaves the absent files out and
    says so; the pin's tree id is still the upstream commit's."""
    repo, commits = upstream
    _branch(repo, "docs", commits["old"])
    (repo / "docs").mkdir(exist_ok=True)
    (repo / "docs" / "big.png").write_bytes(b"\x89PNG not really" * 1000)
    new = commit_all(repo, "Add a large image", "2026-07-30T10:00:00+00:00")
    blob = git(repo, "rev-parse", f"{new}:docs/big.png")
    (repo / ".git" / "objects" / blob[:2] / blob[2:]).unlink()
    project = _project(tmp_path, repo, commits["old"])
    proc = rebase(project, "tpu-inference", "docs", "--source", str(repo), "--no-tests")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "lacks 1 file(s) outside the package" in proc.stdout and "docs/big.png" in proc.stdout
    assert _pin(project)["tree"] == git(repo, "rev-parse", f"{new}^{{tree}}")


def test_find_base_bisects_first_parent_history(upstream, tmp_path):
    repo, commits = upstream
    _branch(repo, "drift", commits["old"])
    fine = []
    for i in range(3):
        (repo / f"NOTE{i}").write_text(f"{i}\n")
        fine.append(commit_all(repo, f"Unrelated {i}", f"2026-07-29T1{i}:00:00+00:00"))
    text = (repo / SAMPLING).read_text()
    (repo / SAMPLING).write_text(text.replace(OLD_COMMENT, NEW_COMMENT))
    breaking = commit_all(repo, "Reword a comment in gather_logprobs", "2026-07-30T10:00:00+00:00")
    (repo / "NOTE9").write_text("9\n")
    commit_all(repo, "Unrelated after", "2026-07-30T11:00:00+00:00")
    project = _project(tmp_path, repo, commits["old"])
    before = snapshot(project)
    proc = rebase(project, "tpu-inference", "drift", "--find-base", "--source", str(repo))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"\n  {fine[-1]} " in proc.stdout
    assert f"the next one conflicts: {breaking} " in proc.stdout
    assert snapshot(project) == before and not (project / "build" / "rebase" / "state").exists()


BACKPORT = "backport-984b29c49-Use-raw-Mesh-constructor-when-device_indexes-is-set.patch"
BACKPORTED = "984b29c49369360daa2b498fc527d61b6ec18874"
#: Every tpu-inference backport (its name's prefix) and the upstream commit
#: it carries, which the rebase names where it drops it when the repository
#: holds the history.
BACKPORTS = {
    "backport-984b29c49-": BACKPORTED,
    "backport-995930220-": "995930220390933ce734b74e1c60ff389096e6c9",
    "backport-e27319786-": "e27319786db9bb69061ea6b7135215fc4ea16854",
    "backport-9cfd2bd29-": "9cfd2bd29739f3f16e2d0a8fb117bcb0aa8b18fe",
}
#: Without the history, where its lines no longer reverse-apply (995930220
#: was resolved by hand at the pin), a backport drops by the release its
#: Applied-Upstream trailer names, whose tag precedes the new pin.
BY_RELEASE = {"backport-995930220-": "in v0.27.0 (its Applied-Upstream), tagged 2026-08-20, not after the new pin's commit of "
              "2026-08-22; the repository holds no history to check ancestry"}
SOURCES = dict(s.split("=", 1) for s in os.environ.get("MRL_SOURCES", "").split())
#: Upstream commits past the backported one that a source of the pins holds
#: (../shared/upstream's tpu-inference.git tags them, as does a full mirror
#: by these ids): its release v0.27.0 and its main of 2026-08-22.
PAST_THE_BACKPORT = {"v0.27.0": "e1c03382a5b2d8e296648ead8e4199a324026890", "main-2026-08-22": "b8692ff01fa191343836996c27a39dc95f008b88"}
NEEDS_TPU_INFERENCE = pytest.mark.skipif(
    "tpu-inference" not in SOURCES,
    reason="needs a tpu-inference git repository holding the pin and the upstream commits past it (MRL_SOURCES="
    "'tpu-inference=PATH': a mirror, or ../shared/upstream/tpu-inference.git, which scripts/test.sh names when present): "
    f"would have rebased the real pin onto v0.27.0 and main-2026-08-22, past upstream's {BACKPORTED[:9]}, and checked "
    "that the backport drops, recorded as Applied-Upstream, while the local patches apply",
)


def where_the_backport_is(repo: pathlib.Path, new: str, upstream: str = BACKPORTED) -> str:
    """Where the rebase records a backport as applied upstream: in
    upstream's own commit where the repository holds the history between the
    pins (a mirror), else in the new pin, which contains it (a repository
    holding only the pinned commits, as ../shared/upstream's does)."""
    has_history = subprocess.run(["git", "cat-file", "-e", f"{upstream}^{{commit}}"], cwd=repo, capture_output=True).returncode == 0
    return upstream if has_history else new


@pytest.mark.github
@NEEDS_TPU_INFERENCE
def test_backport_drops_on_a_rebase_past_its_upstream_commit(tmp_path):
    repo = pathlib.Path(SOURCES["tpu-inference"])
    project = make_project(tmp_path / "project", {}, keep={"tpu-inference": ("backport-984b29c49-", "0001-")})
    proc = rebase(project, "tpu-inference", "v0.27.0", "--source", str(repo), "--no-tests")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    where = where_the_backport_is(repo, PAST_THE_BACKPORT["v0.27.0"])
    assert row(proc.stdout, "backport-984b29c49-") == f"dropped: already upstream  (Applied-Upstream: {where[:12]})", proc.stdout
    assert row(proc.stdout, "0001-") == "applied cleanly", proc.stdout
    series = (project / TPU / "series").read_text()
    assert f"# Applied-Upstream: {BACKPORT} in {where} " in series, series
    assert not (project / TPU / BACKPORT).exists()
    assert _pin(project)["commit"] == PAST_THE_BACKPORT["v0.27.0"]


@pytest.mark.github
@NEEDS_TPU_INFERENCE
def test_the_whole_series_onto_upstreams_main(tmp_path):
    """The real series, every patch, onto upstream's main of 2026-08-22 (170
    commits past the pin): every backport drops as applied upstream (each
    commit is there), every local patch applies (0003 needs git's 3-way
    merge there, from the blobs the series makes at the old pin), and the
    pin moves to that commit."""
    repo = pathlib.Path(SOURCES["tpu-inference"])
    new = PAST_THE_BACKPORT["main-2026-08-22"]
    project = make_project(tmp_path / "project", {})
    local = [n for n in (project / TPU / "series").read_text().split() if n.startswith("0")]
    proc = rebase(project, "tpu-inference", new, "--source", str(repo), "--no-tests")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    series = (project / TPU / "series").read_text()
    for prefix, upstream in BACKPORTS.items():
        where = where_the_backport_is(repo, new, upstream)
        detail = BY_RELEASE[prefix] if where == new and prefix in BY_RELEASE else f"Applied-Upstream: {where[:12]}"
        assert row(proc.stdout, prefix) == f"dropped: already upstream  ({detail})", proc.stdout
        assert f"# Applied-Upstream: {prefix}" in series and not list((project / TPU).glob(prefix + "*")), series
    for name in local:
        assert row(proc.stdout, name).startswith("applied"), proc.stdout
        assert (project / TPU / name).is_file()
    assert _pin(project)["commit"] == new
    assert [n for n in (project / TPU / "series").read_text().split() if n.startswith("0")] == local
