"""constraints.txt as the build writes it: how it was made, why each package
is there (`# via`), which uv it needs, and a closure that is the registry's
as of the project's resolution cutoff, whatever the caches hold, whatever
the registry got since, whatever file was there before. The uv runs here
are real (the tool venv's), offline, on wheels made here and a registry
served here (PEP 700 upload times, as the real one serves them)."""

from __future__ import annotations

import hashlib
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
from packaging.version import Version

from maxtext_rl_overlay.config.pins import load_project
from maxtext_rl_overlay.config.target import Target, Torch
from maxtext_rl_overlay.core import manifest
from maxtext_rl_overlay.core.errors import OverlayError
from maxtext_rl_overlay.stages import closures, constraintsfile, inputdigests, overlayfiles
from maxtext_rl_overlay.stages import run as build
from support import ROOT
from unit.unit_support import UV, PackageIndex, installable_wheel, uv_offline_env


def test_this_uv_refuses_a_wheel_whose_hash_the_constraints_contradict(tmp_path):
    """What the header's `Needs uv >= X` promises, with the uv the tool runs
    (that older ones do not is measured once: constraintsfile.UV_CHECKS_CONSTRAINT_HASHES)."""
    version = subprocess.run([UV, "--version"], capture_output=True, text=True, check=True).stdout.split()[1]
    assert Version(version) >= Version(constraintsfile.UV_CHECKS_CONSTRAINT_HASHES)
    links = tmp_path / "links"
    links.mkdir()
    wheel = installable_wheel(links, "mrl-probe", "1.0")
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()
    env = uv_offline_env(tmp_path)
    results = {}
    for name, digest in (("right", sha), ("tampered", "0" * 64)):
        constraints = tmp_path / f"{name}.txt"
        constraints.write_text(f"--find-links {links}\nmrl-probe==1.0 \\\n    --hash=sha256:{digest}\n")
        venv = tmp_path / f"venv-{name}"
        subprocess.run([UV, "venv", "--quiet", "-p", sys.executable, str(venv)], check=True, env=env)
        results[name] = subprocess.run([UV, "pip", "install", "-p", str(venv / "bin" / "python"), "-c", str(constraints), "mrl-probe"],
                                       capture_output=True, text=True, env=env)
    assert results["right"].returncode == 0, results["right"].stderr
    assert results["tampered"].returncode != 0 and "Hash mismatch" in results["tampered"].stderr, results["tampered"].stderr


def _env(find_links: tuple[str, ...]) -> Target:
    torch = Torch("2.11.0", "2.11.0", "0.26.0", "0.26.0", find_links, False)
    return Target("maxtext[tpu-post-train]==0.2.4", "maxtext", (), "maxtext.whl:overrides.txt", torch, pathlib.Path("maxtext.whl"), "")


CUTOFF = "2026-11-30T20:00:00Z"
#: When the registry got each file (PEP 700 upload-time): mrl-probe 1.1 after the cutoff.
UPLOADED = {"mrl_probe-1.0-py3-none-any.whl": "2026-11-01T00:00:00Z", "mrl_probe-1.1-py3-none-any.whl": "2026-12-05T09:00:00Z",
            "torch-2.11.0-py3-none-any.whl": "2026-06-01T00:00:00Z", "torchvision-0.26.0-py3-none-any.whl": "2026-06-01T00:00:00Z"}
REQUIREMENT = "maxtext-rl-overlay==0.1.0+mrl.2.abc"


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """(index folder, served folder, the registry): the overlay's wheel, in
    the index folder (find-links: no upload time), needs mrl-probe, of which
    the registry serves 1.0 and, uploaded after CUTOFF, 1.1; and the
    closure's torch."""
    monkeypatch.delenv("MRL_REFRESH", raising=False)
    for key, value in uv_offline_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    idx, served = tmp_path / "index", tmp_path / "served"
    idx.mkdir()
    served.mkdir()
    installable_wheel(idx, "maxtext-rl-overlay", "0.1.0+mrl.2.abc", ("mrl-probe", "torch", "torchvision"))
    for name, version in (("mrl-probe", "1.0"), ("mrl-probe", "1.1"), ("torch", "2.11.0"), ("torchvision", "0.26.0")):
        installable_wheel(served, name, version)
    with PackageIndex(served, dict(UPLOADED)) as index:
        monkeypatch.setenv("UV_DEFAULT_INDEX", index.url)
        yield idx, served, index


def test_a_file_uploaded_after_the_cutoff_is_never_picked(registry, tmp_path):
    idx, _, _ = registry
    closure = closures.resolve(idx, REQUIREMENT, sys.executable, _env(()), cutoff=CUTOFF, cache=tmp_path / "cache")
    assert "\nmrl-probe==1.0 " in closure and "mrl-probe==1.1" not in closure, closure
    assert closure.startswith("maxtext-rl-overlay==0.1.0+mrl.2.abc "), "the overlay's own wheel has no upload time, and is found all the same"
    assert re.search(r"\nmrl-probe==1\.0 \\\n(    --hash=\S+\n)+    # via maxtext-rl-overlay\n", closure), closure
    assert "#   -c maxtext-and-torch-constraints.txt\n" in closure and "mrl-resolve-" not in closure, "annotations name no temporary path"
    later = closures.resolve(idx, REQUIREMENT, sys.executable, _env(()), cutoff="2026-12-05T12:00:00Z", cache=tmp_path / "cache")
    assert "\nmrl-probe==1.1 " in later, "a later cutoff sees the later upload"


def test_one_cutoff_one_closure_whatever_the_caches_hold_and_the_registry_got_since(registry, tmp_path, monkeypatch):
    """The closure is the registry's as of the cutoff: from an empty uv cache
    or one filled before the registry changed, resolved afresh or reused,
    after a release (and another, with no upload time recorded as late as
    can be) is uploaded, it is the same text."""
    idx, served, index = registry
    first = closures.resolve(idx, REQUIREMENT, sys.executable, _env(()), cutoff=CUTOFF, cache=tmp_path / "tool-cache")
    installable_wheel(served, "mrl-probe", "1.2")  # uploaded while the next build runs
    index.uploaded["mrl_probe-1.2-py3-none-any.whl"] = "2026-12-06T01:00:00Z"
    again = {"the cached answer": closures.resolve(idx, REQUIREMENT, sys.executable, _env(()), cutoff=CUTOFF, cache=tmp_path / "tool-cache")}
    monkeypatch.setenv("MRL_REFRESH", "1")
    again["afresh, the uv cache of before"] = closures.resolve(idx, REQUIREMENT, sys.executable, _env(()), cutoff=CUTOFF, cache=tmp_path / "tool-cache")
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "empty-uv-cache"))
    again["afresh, an empty uv cache"] = closures.resolve(idx, REQUIREMENT, sys.executable, _env(()), cutoff=CUTOFF, cache=tmp_path / "empty")
    for how, closure in again.items():
        assert closure == first, how
    assert "mrl-probe==1.0 " in first


def test_a_release_listed_late_moves_no_pin_of_the_committed_file(registry, tmp_path, monkeypatch):
    """A registry (or a mirror of one) can list a release uploaded before
    the cutoff only after the project's constraints.txt was made: uv would
    then pick it at the same cutoff. The committed file resolved against
    that cutoff is the lock: its third-party pins, given as preferences,
    keep the closure; our own builds' pins are never preferences, and a
    file of another cutoff gives none (a moved cutoff resolves afresh)."""
    idx, served, index = registry
    monkeypatch.setenv("MRL_REFRESH", "1")
    committed = _constraints(closures.resolve(idx, REQUIREMENT, sys.executable, _env(()), cutoff=CUTOFF, cache=tmp_path / "cache"))
    installable_wheel(served, "mrl-probe", "1.0.1")  # listed now, uploaded before the cutoff
    index.uploaded["mrl_probe-1.0.1-py3-none-any.whl"] = "2026-11-30T17:12:33Z"
    fresh = closures.resolve(idx, REQUIREMENT, sys.executable, _env(()), cutoff=CUTOFF, cache=tmp_path / "cache")
    assert "\nmrl-probe==1.0.1 " in fresh, "without the lock the late listing moves the pin"
    prefer = constraintsfile.lock_preferences(committed, CUTOFF, {"maxtext-rl-overlay"})
    assert prefer == "mrl-probe==1.0\ntorch==2.11.0\ntorchvision==0.26.0\n", prefer
    kept = closures.resolve(idx, REQUIREMENT, sys.executable, _env(()), cutoff=CUTOFF, cache=tmp_path / "cache", prefer=prefer)
    assert closures.pins(kept) == closures.pins(committed), kept
    assert constraintsfile.lock_preferences(committed, "2026-12-05T12:00:00Z", set()) == "", "another cutoff's file is no lock"
    assert constraintsfile.lock_preferences(committed.replace(constraintsfile.CONSTRAINTS_HEADER, "# a file"), CUTOFF, set()) == ""


def _constraints(closure: str, cutoff: str = CUTOFF) -> str:
    inputs = {"maxtext-rl-overlay": "a" * 64, "google-tunix": "b" * 64}
    return constraintsfile.constraints_text(closure, {}, "./dist", notes=[], env=_env(()), made_by=MADE_BY, inputs=inputs, cutoff=cutoff)


def test_the_file_a_build_replaces_is_a_witness(tmp_path, capsys):
    """Made from the same inputs, its pins must be the new closure's, or the
    registry moved under the cutoff (a release yanked or deleted since): the
    build stops, naming each package. Made otherwise (another cutoff), the
    pins that moved are said."""
    closure = "deleted==1.0\ntorch==2.11.0\nwcwidth==0.9.4\n"
    path = tmp_path / "constraints.txt"
    path.write_text(_constraints(closure))
    build._compare_with_previous(path, _constraints(closure), set())
    assert f"against the file it replaces (resolution cutoff {CUTOFF}): no pin moved (the overlay's own aside)" in capsys.readouterr().err
    with pytest.raises(OverlayError, match=re.escape(f"the registry no longer gives, as of the resolution cutoff {CUTOFF}, the closure that {path} "
                                                     "was made with from these same inputs: deleted 1.0 (gone); wcwidth 0.9.4 -> 0.9.3."
                                                     " What the cutoff cannot pin has moved upstream (a file yanked or deleted since)")):
        build._compare_with_previous(path, _constraints("torch==2.11.0\nwcwidth==0.9.3\n"), set())
    build._compare_with_previous(path, _constraints("deleted==1.0\ntorch==2.11.0\nwcwidth==0.9.5\n", "2026-12-05T12:00:00Z"), set())
    assert ("against the file it replaces (resolution cutoff 2026-11-30T20:00:00Z -> 2026-12-05T12:00:00Z): 1 pins moved: wcwidth 0.9.4 -> 0.9.5"
            in capsys.readouterr().err)
    path.write_text(_constraints(closure).replace(constraintsfile.CUTOFF_LINE, "# a file from before the cutoff: "))
    build._compare_with_previous(path, _constraints("deleted==1.0\ntorch==2.11.0\nwcwidth==0.9.3\n"), set())  # no cutoff recorded: no witness
    assert "(resolution cutoff none -> 2026-11-30T20:00:00Z): 1 pins moved: wcwidth 0.9.4 -> 0.9.3" in capsys.readouterr().err


def test_header_says_how_it_was_made_and_ours_keep_their_annotations():
    closure = ("google-tunix==0.1.7+mrl.2 \\\n    --hash=sha256:" + "9" * 64 + "\n    # via maxtext-rl-overlay\n"
               "jax==0.11.0 \\\n    --hash=sha256:" + "a" * 64 + "\n    # via\n    #   flax\n    #   maxtext\n")
    text = constraintsfile.constraints_text(closure, {"google_tunix-0.1.7+mrl.2-py3-none-any.whl": "b" * 64}, "./dist", notes=["a note."],
                                            env=_env(()), made_by=("Made by: maxtext-rl-overlay build --unpinned", "  with uv 0.13.9"), cutoff=CUTOFF)
    assert (f"\n# Resolved against the package registry as of {CUTOFF} (pyproject.toml's resolution-cutoff, uv's --exclude-newer): "
            "nothing uploaded later is pinned.\n# Made by:") in text
    assert constraintsfile.recorded_cutoff(text) == CUTOFF and constraintsfile.recorded_cutoff(_header(None)) == ""
    assert f"# Needs uv >= {constraintsfile.UV_CHECKS_CONSTRAINT_HASHES}: " in text
    assert "\n# Made by: maxtext-rl-overlay build --unpinned\n#   with uv 0.13.9\n" in text
    assert "\ngoogle-tunix==0.1.7+mrl.2 \\\n    --hash=sha256:" + "b" * 64 + "\n    # via maxtext-rl-overlay\n" in text
    assert text.endswith("    # via\n    #   flax\n    #   maxtext\n")


# -- the inputs it was made from: a stale file is found offline ---------------

MADE_BY = ("Made by: maxtext-rl-overlay build --source google-tunix=PATH --source vllm=PATH --unpinned",
           "  google-tunix: --source a git repository, commit " + "1" * 40 + ", tree " + "2" * 40,
           "  vllm: --source vllm-0.25.0.tar.gz, tree " + "3" * 40 + " (NOT the pin)",
           "  with uv 0.13.9 (x86_64-unknown-linux-gnu), the tool's code sha256 " + "4" * 64)


def _header(inputs: dict[str, str] | None, made_by: tuple[str, ...] = MADE_BY) -> str:
    return constraintsfile.constraints_text("", {}, "./dist", notes=[], env=_env(()), made_by=made_by, inputs=inputs)


@pytest.fixture
def checkout(tmp_path) -> pathlib.Path:
    """A copy of the project's files at another path, with what a checkout
    also holds but the overlay's wheel does not take: caches, build metadata,
    a manifest, constraints.txt."""
    dest = tmp_path / "elsewhere" / "project"
    dest.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md", "LICENSE", "constraints.txt"):
        shutil.copy2(ROOT / name, dest / name)
    for name in ("overlay", "patches"):
        shutil.copytree(ROOT / name, dest / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "manifest.json"))
    package = dest / "overlay" / "maxtext_rl_overlay"
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "build.cpython-312.pyc").write_bytes(b"\0")
    (package / "manifest.json").write_text("{}\n")
    (dest / "overlay" / "maxtext_rl_overlay.egg-info").mkdir()
    (dest / "overlay" / "maxtext_rl_overlay.egg-info" / "PKG-INFO").write_text("Name: x\n")
    return dest


def test_the_header_records_the_digest_of_each_input():
    inputs = {"maxtext-rl-overlay": "a" * 64, "google-tunix": "b" * 64, "vllm": "c" * 64}
    text = _header(inputs)
    assert ("\n#   with uv 0.13.9 (x86_64-unknown-linux-gnu), the tool's code sha256 " + "4" * 64 + "\n"
            f"# {inputdigests.INPUTS_TITLE}\n"
            "#   maxtext-rl-overlay: " + "a" * 64 + " (its own wheel: README.md, LICENSE, pyproject.toml, overlay/)\n"
            "#   google-tunix: " + "b" * 64 + " (patches/google-tunix/: pin.toml, series, patches, build-requirements.txt if any)\n"
            "#   vllm: " + "c" * 64 + " (patches/vllm/: pin.toml, series, patches, build-requirements.txt if any)\n"
            "--find-links ./dist\n") in text
    assert inputdigests.recorded_inputs(text) == inputs
    assert inputdigests.recorded_inputs(_header(None)) == {} and inputdigests.INPUTS_TITLE not in _header(None)


def test_the_digests_are_the_checkouts_wherever_it_is_and_each_names_its_part(checkout):
    """The same files give the same digests at any path, whatever the
    checkout holds besides them (caches, build metadata, the manifest,
    constraints.txt itself); a change to any input changes its part alone."""
    here, there = load_project(ROOT), load_project(checkout)
    before = inputdigests.input_digests(there, there.pins)
    assert before == inputdigests.input_digests(here, here.pins)
    assert list(before) == ["maxtext-rl-overlay", "google-tunix", "tpu-inference", "vllm", "maxtext"]
    assert list(inputdigests.input_digests(there, ["vllm"])) == ["maxtext-rl-overlay", "vllm"]
    (checkout / "constraints.txt").write_text("anything\n")
    assert inputdigests.input_digests(there, there.pins) == before, "constraints.txt is not an input of itself"
    tpu = there.pins["tpu-inference"]
    for path, part in ((checkout / "README.md", "maxtext-rl-overlay"),  # the wheel's long description
                       (checkout / "LICENSE", "maxtext-rl-overlay"),
                       (checkout / "overlay" / "maxtext_rl_overlay" / "resources" / "build-constraints.txt", "maxtext-rl-overlay"),
                       (tpu.series[-1], "tpu-inference"),
                       (tpu.pin_file, "tpu-inference"),
                       (checkout / "patches" / "vllm" / "build-requirements.txt", "vllm")):
        saved = path.read_bytes()
        path.write_bytes(saved + b"\n")
        after = inputdigests.input_digests(load_project(checkout), there.pins)
        assert [p for p in before if after[p] != before[p]] == [part], path
        path.write_bytes(saved)
    (checkout / "overlay" / "maxtext_rl_overlay" / "new_module.py").write_text("")
    assert inputdigests.input_digests(there, there.pins)["maxtext-rl-overlay"] != before["maxtext-rl-overlay"], "a new file is an input"


def test_a_stale_constraints_file_names_what_changed_and_the_command_that_makes_it_again(checkout):
    project = load_project(checkout)
    now = inputdigests.input_digests(project, project.pins)
    assert inputdigests.stale_constraints(_header(now), project) == ""
    command = ("  scripts/build-wheels.sh --source google-tunix=PATH --source vllm=PATH --unpinned\n"
               "    google-tunix: --source a git repository, commit " + "1" * 40 + ", tree " + "2" * 40 + "\n"
               "    vllm: --source vllm-0.25.0.tar.gz, tree " + "3" * 40 + " (NOT the pin)")
    readme = checkout / "README.md"
    readme.write_text(readme.read_text() + "\nOne more line.\n")
    said = inputdigests.stale_constraints(_header(now), project)
    assert said == "constraints.txt is stale: maxtext-rl-overlay changed since it was made. Make it again, from the checkout, as it was made:\n" + command
    fresh = inputdigests.input_digests(project, project.pins)
    assert inputdigests.stale_constraints(_header(fresh), project) == ""
    only = {k: v for k, v in fresh.items() if k != "vllm"}  # a build --only leaves a pin out
    assert inputdigests.stale_constraints(_header(only), project).startswith("constraints.txt is stale: vllm is not among its inputs. ")
    # Made before the header recorded its inputs (the committed file until it is regenerated):
    assert inputdigests.stale_constraints(_header(None), project) == (
        "constraints.txt is stale: its header records no digest of its inputs (it was made by an older tool). "
        "Make it again, from the checkout, as it was made:\n" + command)
    assert inputdigests.stale_constraints(_header(None, made_by=()), project).endswith(
        "\n  scripts/build-wheels.sh  (its header does not say how it was made: give the sources and flags it needs)")


def test_a_constraints_file_made_before_the_overlays_files_were_committed_is_stale(checkout):
    """The overlay's wheel records the project commit that last changed its
    files (its manifest), so its sha256 moves with that commit even where
    no file's content does: a file made from uncommitted files, or at
    another commit, pins a wheel the checkout no longer builds."""
    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=checkout, check=True, capture_output=True)

    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "one")
    project = load_project(checkout)
    made_from = overlayfiles.overlay_inputs(checkout, say=False).project
    assert made_from is not None and not made_from.dirty
    header = constraintsfile.constraints_text("", {}, "./dist", notes=[], env=_env(()), made_by=MADE_BY,
                                              inputs=inputdigests.input_digests(project, project.pins), made_from=made_from)
    assert f"\n# {inputdigests.MADE_FROM}{made_from.commit}\n" in header
    assert inputdigests.recorded_commit(header) == made_from
    assert inputdigests.stale_constraints(header, project) == ""
    dirty = header.replace(made_from.commit, made_from.commit + ", with uncommitted changes to README.md overlay/x.py")
    assert inputdigests.recorded_commit(dirty) == manifest.ProjectRecord(made_from.commit, ("README.md", "overlay/x.py"))
    assert inputdigests.stale_constraints(dirty, project).startswith(
        "constraints.txt is stale: it was made before the changes to README.md, overlay/x.py were committed "
        "(the overlay's wheel records the commit it was made from). Make it again")
    readme = checkout / "README.md"
    saved = readme.read_text()
    readme.write_text(saved + "x\n")
    git("commit", "-qam", "two")
    readme.write_text(saved)
    git("commit", "-qam", "three: the files as they were, at a new commit")
    now = overlayfiles.overlay_inputs(checkout, say=False).project
    assert now is not None and now.commit != made_from.commit
    assert inputdigests.stale_constraints(header, project).startswith(
        f"constraints.txt is stale: the overlay's wheel records the project commit: it is {now.commit[:12]} now, "
        f"not {made_from.commit[:12]}. Make it again")
    git("commit", "-q", "--allow-empty", "-m", "four: changes none of them")
    assert inputdigests.stale_constraints(header.replace(made_from.commit, now.commit), project) == ""
    # Made from uncommitted files and read before they are committed (a
    # rebase --build's fast tests): the wheel the checkout builds now is the one it pins.
    (checkout / "LICENSE").write_text((checkout / "LICENSE").read_text() + "x\n")
    while_dirty = overlayfiles.overlay_inputs(checkout, say=False).project
    assert while_dirty == manifest.ProjectRecord(now.commit, ("LICENSE",))
    made_dirty = constraintsfile.constraints_text("", {}, "./dist", notes=[], env=_env(()), made_by=MADE_BY,
                                                  inputs=inputdigests.input_digests(project, project.pins), made_from=while_dirty)
    assert inputdigests.stale_constraints(made_dirty, project) == ""
    git("commit", "-qam", "five: LICENSE committed")
    assert inputdigests.stale_constraints(made_dirty, project).startswith(
        "constraints.txt is stale: it was made before the changes to LICENSE were committed (the overlay's wheel records the commit it was made from). ")
