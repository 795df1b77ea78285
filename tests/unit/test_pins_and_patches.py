"""Fast checks of the project's own data: the pins, the series, and that no
fact is kept in two places that could drift apart."""

from __future__ import annotations

import os
import re
import shlex
import subprocess

import pytest
from packaging.specifiers import SpecifierSet

from maxtext_rl_overlay.config.pins import DISTRIBUTIONS, load_project, read_series
from maxtext_rl_overlay.core import gittree
from maxtext_rl_overlay.core.errors import OverlayError
from maxtext_rl_overlay.stages import constraintsfile, inputdigests, patchfile
from support import ROOT

PROJECT = load_project(ROOT)


def test_every_distribution_has_a_pin_and_a_series():
    assert set(PROJECT.pins) == set(DISTRIBUTIONS)
    assert PROJECT.pins["tpu-inference"].series, "the tpu-inference fix is missing from its series"
    assert PROJECT.pins["google-tunix"].series, "the tunix fix is missing from its series"
    assert PROJECT.pins["vllm"].series == (), "vLLM is pinned, not patched"
    maxtext = PROJECT.pins["maxtext"]
    assert maxtext.series and maxtext.release is not None, "MaxText's series is carried on its release wheel"
    assert maxtext.version == maxtext.release.version, "built as the release it is carried on"


@pytest.mark.parametrize("path", [p for pin in PROJECT.pins.values() for p in pin.series], ids=lambda p: p.name)
def test_patches_are_full_index_format_patches_with_upstream_status(path):
    patch = patchfile.parse(path)
    assert patchfile.lint(patch) == []
    assert patch.files and all(len(f.pre) == 40 and len(f.post) == 40 for f in patch.files)
    text = path.read_text()
    assert text.startswith("From 0000000000000000000000000000000000000000 "), "export with --zero-commit"
    assert not text.rstrip().endswith("-- \n2."), "export with --no-signature"
    commit = patchfile.backport_commit(patch)
    release = patchfile.backport_release(patch)
    if commit:  # named by the upstream commit, so local patches keep their numbers when it drops on a rebase
        assert path.name.startswith(f"backport-{commit[:9]}-"), "a backport is named backport-<upstream commit>-*.patch"
    elif release:  # a change known by the release that carries it (MaxText's after 0.2.4)
        assert path.name.startswith(f"backport-v{release}-"), "a release's backport is named backport-v<release>-*.patch"
    else:
        assert re.match(r"^\d{4}-", path.name), "a local patch is numbered NNNN-*.patch"


@pytest.mark.parametrize("name", sorted(PROJECT.pins))
def test_backports_come_first_in_each_series(name):
    """Upstream's own commits are the base the local patches are written on
    (Debian's practice: backports first, then local changes)."""
    kinds = ["backport" if patchfile.backport_commit(patchfile.parse(p)) or patchfile.backport_release(patchfile.parse(p)) else "local"
             for p in PROJECT.pins[name].series]
    assert kinds == sorted(kinds, key=lambda kind: kind != "backport"), kinds


def test_backport_lint_wants_the_upstream_commit(tmp_path):
    text = (ROOT / "patches" / "tpu-inference" / "0001-Reshard-logprobs-in-gather_logprobs-for-Explicit-mes.patch").read_text()
    for status, ok in (("Backport [https://github.com/o/r/commit/984b29c49369]", True), ("Backport [984b29c49]", True),
                       ("Backport", False), ("Backport [upstream]", False), ("Backport [release 0.2.5]", True),
                       ("Backport [release]", False)):
        path = tmp_path / "x.patch"
        path.write_text(text.replace("Upstream-Status: Pending", f"Upstream-Status: {status}"))
        problems = patchfile.lint(patchfile.parse(path))
        assert (problems == []) == ok, (status, problems)


def test_the_fixes_touch_what_the_reports_name():
    touched = {f.path for pin in PROJECT.pins.values() for p in pin.series for f in patchfile.parse(p).files}
    assert "tpu_inference/layers/jax/sample/sampling.py" in touched
    assert "tunix/generate/utils.py" in touched


def test_series_refuses_strays_and_missing_files(tmp_path):
    (tmp_path / "series").write_text("0001-a.patch\n")
    with pytest.raises(OverlayError, match="not in"):
        read_series(tmp_path)
    (tmp_path / "0001-a.patch").write_text("x")
    (tmp_path / "0002-b.patch").write_text("x")
    with pytest.raises(OverlayError, match="outside its series: 0002-b.patch"):
        read_series(tmp_path)
    (tmp_path / "series").write_text("0001-a.patch -p0\n")
    with pytest.raises(OverlayError, match="-p1"):
        read_series(tmp_path)


def test_tree_id_matches_git(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.py").write_text("print(1)\n")
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(tmp_path / "run.sh", 0o755)
    (tmp_path / "link").symlink_to("a/x.py")
    (tmp_path / "empty").mkdir()
    (tmp_path / "a-b").write_text("sorts before a/ in git's order\n")
    env = dict(os.environ, GIT_DIR=str(tmp_path / ".git"), GIT_WORK_TREE=str(tmp_path))
    subprocess.run(["git", "init", "-q"], env=env, check=True, cwd=tmp_path)
    subprocess.run(["git", "add", "-A"], env=env, check=True, cwd=tmp_path)
    want = subprocess.run(["git", "write-tree"], env=env, check=True, cwd=tmp_path, capture_output=True, text=True).stdout.strip()
    assert gittree.tree_id(tmp_path) == want


def test_constraints_pin_exactly_what_the_pins_and_revision_build():
    """constraints.txt is generated: its overlay lines must say what the pins
    and the overlay revision say now (regenerate it when they change). It is
    built from the real pins of google-tunix and tpu-inference; vLLM's pin and
    the CPU torch are out of reach here, so their stand-ins must be labelled.
    Its header records a digest of every input it was made from (the
    overlay's own files, each pin and series): a change to any of them, such
    as README.md, the overlay wheel's long description, makes it stale, and
    the failure says the command that makes it again. (A rebase without
    --build leaves this test out: rebase.fasttests.STALE_UNTIL_REBUILT.)"""
    text = (ROOT / "constraints.txt").read_text()
    stale = inputdigests.stale_constraints(text, PROJECT)
    assert not stale, stale
    assert text.startswith(constraintsfile.CONSTRAINTS_HEADER), text[:200]
    assert "\n--find-links ./dist\n" in text
    for name in ("google-tunix", "tpu-inference"):
        pin = PROJECT.pins[name]
        want = f"\n{name}=={pin.version}+{PROJECT.local_label} \\\n    --hash=sha256:"
        assert want in text, f"constraints.txt does not pin {name} as the pin builds it: run scripts/build-wheels.sh"
    overlay_version = re.escape(f"{PROJECT.metadata['version']}+{PROJECT.local_label}.")
    assert re.search(rf"\nmaxtext-rl-overlay=={overlay_version}[0-9a-f]{{12}} \\\n", text), "the overlay's wheel carries its local label"
    assert "\n# Made by: maxtext-rl-overlay build " in text and "\n    # via " in text, "the header says how it was made; annotations kept"
    vllm = re.search(r"^vllm==(\S+) ", text, re.M)
    assert vllm and f"+{PROJECT.local_label}.unpinned." in vllm.group(1), "the vLLM line must be our build, labelled unpinned"
    assert "# NOT built from the pins: stand-in sources for vllm " in text, "vllm must be the only stand-in source, said so"
    assert "# STAND-IN torch " in text
    assert constraintsfile.recorded_cutoff(text) == PROJECT.resolution_cutoff, "the header names the cutoff it was resolved against"


def test_readme_commands_are_the_ones_ci_runs():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "uv pip install -c constraints.txt maxtext-rl-overlay" in readme
    found = re.search(r"<!-- test-command -->\n```sh\n(.+)\n```", readme)
    assert found, "the README shows the test command"
    test_command = found.group(1)
    assert test_command in ci


def test_every_matrix_cell_is_made_by_a_readme_install_command():
    """The matrix installs each cell with the command the README shows users
    (marked <!-- install --> and <!-- maxtext-install -->): the two cannot drift."""
    from maxtext_rl_overlay.maintain import testmatrix

    cells = testmatrix.load_cells(ROOT, quick=False)
    assert {c.name for c in cells} >= {"py312", "maxtext-0.2.4"}
    for cell in cells:
        command = testmatrix.readme_command(ROOT, cell.install)
        assert command[:5] == ["uv", "pip", "install", "-c", "constraints.txt"], (cell.name, command)
    assert testmatrix.readme_command(ROOT, "install")[5:] == ["maxtext-rl-overlay"]
    assert testmatrix.readme_command(ROOT, "maxtext-install")[5:] == ["maxtext-rl-overlay[maxtext]"]


def test_the_readme_shows_the_stand_in_form_the_committed_constraints_need(tmp_path):
    """The committed constraints.txt is a stand-in build: its MaxText install
    needs --override, and the README's marked stand-in block says so, the same
    command as the file's own header; the matrix runs that block on such an
    index and refuses the plain MaxText form there."""
    from maxtext_rl_overlay.maintain import testmatrix

    standin = testmatrix.readme_command(ROOT, "maxtext-install-standin")
    assert standin == ["uv", "pip", "install", "-c", "constraints.txt", "--override", "./dist/torch-standin-overrides.txt", "maxtext-rl-overlay[maxtext]"]
    header = (ROOT / "constraints.txt").read_text()
    assert "#   with MaxText: uv pip install -c constraints.txt --override ./dist/torch-standin-overrides.txt \"maxtext-rl-overlay[maxtext]\"" in header
    index = tmp_path / "index"
    index.mkdir()
    (index / "constraints.txt").write_text("")
    (index / "torch-standin-overrides.txt").write_text("torch==2.11.0\n")
    command, note = testmatrix.cell_command(ROOT, "maxtext-install", index)
    assert command == standin and "stand-in form" in note
    (cmd, _) = testmatrix.install_commands(command, index / "constraints.txt", "PY")
    assert cmd[cmd.index("--override") + 1] == str(index / "torch-standin-overrides.txt")
    with pytest.raises(OverlayError, match="must show the MaxText command with --override"):
        testmatrix.install_commands(testmatrix.readme_command(ROOT, "maxtext-install"), index / "constraints.txt", "PY")
    assert testmatrix.cell_command(ROOT, "install", index) == (testmatrix.readme_command(ROOT, "install"), "")
    (index / "torch-standin-overrides.txt").unlink()  # a CPU-torch index: the plain form
    assert testmatrix.cell_command(ROOT, "maxtext-install", index)[0] == testmatrix.readme_command(ROOT, "maxtext-install")


def test_the_cells_bound_their_tests_with_the_tool_suites_plugin():
    """The matrix's cells install the pytest-timeout the tool's test extra
    pins, and pyproject bounds every test (a hang fails with its stack); and
    the property tests' hypothesis at the test extra's pin, which the
    constraints file (the closure: tpu-inference pins it) must hold too, or
    the cells' install fails."""
    import tomllib

    from maxtext_rl_overlay.maintain import testmatrix

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    for plugin_pin in (testmatrix.TIMEOUT_PLUGIN, testmatrix.HYPOTHESIS):
        assert plugin_pin in pyproject["project"]["optional-dependencies"]["test"]
    (_, plugin) = testmatrix.install_commands(["uv", "pip", "install", "-c", "constraints.txt", "maxtext-rl-overlay"], ROOT / "c.txt", "PY")
    assert plugin[-3:] == ["pytest", testmatrix.HYPOTHESIS, testmatrix.TIMEOUT_PLUGIN]
    # pytest's own requirements are not in the closure: resolved against the registry as of the index's cutoff.
    (cmd, plugin) = testmatrix.install_commands(["uv", "pip", "install", "-c", "constraints.txt", "maxtext-rl-overlay"], ROOT / "constraints.txt", "PY")
    recorded = constraintsfile.recorded_cutoff((ROOT / "constraints.txt").read_text())  # the project's once rebuilt: the staleness test's
    assert recorded and plugin[plugin.index("--exclude-newer") + 1] == recorded and "--exclude-newer" not in cmd, plugin
    assert isinstance(pyproject["tool"]["pytest"]["ini_options"]["timeout"], int)
    constraints = (ROOT / "constraints.txt").read_text()
    assert re.search(rf"(?m)^{re.escape(testmatrix.HYPOTHESIS)} \\\n\s+--hash=sha256:", constraints), "constraints.txt pins another hypothesis"


def test_the_tpu_vm_install_can_be_copied_and_pasted():
    """The README's first install block, from a bare TPU VM: a venv, a uv that
    checks the constraints' hashes, the install, verify."""
    from packaging.requirements import Requirement

    from maxtext_rl_overlay.stages.constraintsfile import UV_CHECKS_CONSTRAINT_HASHES

    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Install (on a TPU VM, Python 3.12)", 1)[1].split("\n## ", 1)[0]
    block = [line[4:] for line in section.split("\n\n")[2].splitlines()]
    assert block[0] == "python3.12 -m venv ~/mrl-venv" and block[1] == ". ~/mrl-venv/bin/activate"
    uv = Requirement(shlex.split(block[2])[-1])
    assert block[2].startswith("python -m pip install ") and uv.name == "uv" and uv.specifier == SpecifierSet(f">={UV_CHECKS_CONSTRAINT_HASHES}")
    assert block[3].startswith("uv pip install -c https://OWNER.github.io/maxtext-rl-overlay/vX.Y.Z/constraints.txt maxtext-rl-overlay")
    assert block[4] == "maxtext-rl-overlay verify"
