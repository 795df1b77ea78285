"""verify's question "does a plain import reach the installed files?", on
real files: a venv with an installed distribution, then what an image adds in
front of it (an older copy on PYTHONPATH or in the current directory) or
beside it (a .pth / egg-link of the base's own install). Each case makes the
shadow, and verify names the module or the file; the clean install passes."""

from __future__ import annotations

import hashlib
import pathlib
import subprocess
import sys

import pytest

from maxtext_rl_overlay.checks import verify
from maxtext_rl_overlay.core import manifest
from unit.unit_support import UV, installable_wheel, uv_offline_env

VERSION = "0.1.8+mrl.2"
PATCHED = "tunix/generate/utils.py"
OURS = b"# the overlay's patched file\n"
#: A patched module in a folder without __init__.py (a namespace package, as
#: some of tpu-inference's are): its parent is never imported to find it.
NAMESPACED = "tunix/kernels/ops.py"


def _doc(files: dict[str, str]) -> manifest.Manifest:
    dist = manifest.Distribution(
        version=VERSION, import_package="tunix", from_pin=True,
        pin=manifest.PinRecord("https://example.invalid/tunix", "c" * 40, "t" * 40, "2026-08-05T00:09:38-07:00"),
        source=manifest.SourceRecord("t" * 40, "c" * 40, None),
        wheel=manifest.WheelFile(f"google_tunix-{VERSION}-py3-none-any.whl", "a" * 64),
        series=(manifest.PatchRecord("0001-x.patch", "Fix x", "Pending", True, (PATCHED,), "b" * 64, None),),
        files=files,
    )
    env = manifest.EnvironmentRecord("maxtext[tpu-post-train]==0.2.4", "maxtext",
                                     manifest.TorchRecord("2.11.0", "2.11.0+cpu", True, "0.26.0"), None)
    return manifest.Manifest("0.1.0", 2, {"google-tunix": dist}, (), env)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """A venv holding an 'overlay build' of google-tunix (its patched file
    among its files); the manifest that vouches for it; its python; its
    site-packages."""
    tmp = tmp_path_factory.mktemp("verify-shadowing")
    links = tmp / "links"
    links.mkdir()
    wheel = installable_wheel(links, "google-tunix", VERSION, package={
        "tunix/__init__.py": b"", "tunix/generate/__init__.py": b"", PATCHED: OURS, NAMESPACED: OURS})
    env = uv_offline_env(tmp)
    venv = tmp / "venv"
    subprocess.run([UV, "venv", "--quiet", "-p", sys.executable, str(venv)], check=True, env=env)
    python = venv / "bin" / "python"
    subprocess.run([UV, "pip", "install", "--quiet", "-p", str(python), str(wheel)], check=True, env=env)
    site = pathlib.Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                       capture_output=True, text=True, check=True).stdout.strip())
    assert (site / PATCHED).read_bytes() == OURS
    return _doc({PATCHED: hashlib.sha256(OURS).hexdigest(), NAMESPACED: hashlib.sha256(OURS).hexdigest()}), str(python), site


def _older_copy(folder: pathlib.Path) -> pathlib.Path:
    """An unpatched copy of the package, as a base image's /deps/src holds it."""
    for relpath in ("tunix/__init__.py", "tunix/generate/__init__.py"):
        (folder / relpath).parent.mkdir(parents=True, exist_ok=True)
        (folder / relpath).write_text("")
    (folder / PATCHED).write_text("# the pin's unpatched file\n")
    return folder


def test_a_clean_install_resolves_to_its_own_files(installed, tmp_path, monkeypatch):
    doc, python, site = installed
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.chdir(tmp_path)
    findings = verify.check_resolution(doc, python=python)
    assert {(f.what, f.found) for f in findings} == {
        ("import tunix resolves to", str(site / "tunix" / "__init__.py")),
        ("import tunix.generate.utils resolves to", str(site / PATCHED)),
        ("import tunix.kernels.ops resolves to", str(site / NAMESPACED)),
    }
    assert all(f.ok for f in findings)
    assert verify.explain(findings, doc) == []


@pytest.mark.parametrize("where", ["PYTHONPATH", "current directory", ".pth inserting first"])
def test_an_older_copy_first_on_the_path_shadows_the_installed_module(installed, tmp_path, monkeypatch, where):
    doc, python, site = installed
    copy = _older_copy(tmp_path / "deps" / "src")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.chdir(tmp_path)
    pth = site / "zz-first.pth"
    if where == "PYTHONPATH":
        monkeypatch.setenv("PYTHONPATH", str(copy))
    elif where == "current directory":
        monkeypatch.chdir(copy)
    else:
        pth.write_text(f"import sys; sys.path.insert(0, {str(copy)!r})\n")
    try:
        findings = verify.check_resolution(doc, python=python)
    finally:
        pth.unlink(missing_ok=True)
    bad = {f.what: f for f in findings if not f.ok}
    assert set(bad) == {"import tunix resolves to", "import tunix.generate.utils resolves to", "import tunix.kernels.ops resolves to"}
    assert bad["import tunix.kernels.ops resolves to"].found.startswith("not found"), "the older tunix has no kernels/"
    utils = bad["import tunix.generate.utils resolves to"]
    assert utils.expected == str(site / PATCHED)
    assert utils.found == str(copy / PATCHED) and utils.problem is verify.Problem.SHADOWED and utils.subject == "tunix.generate.utils"
    assert utils.shown == f"{copy / PATCHED} ({verify.SHADOWED})" and utils.remedy
    (line,) = verify.explain(findings, doc)
    assert "A plain import does not reach the overlay's files: tunix, tunix.generate.utils, tunix.kernels.ops resolve elsewhere" in line
    assert f"(tunix: {copy / 'tunix' / '__init__.py'}, not {site / 'tunix' / '__init__.py'})" in line
    assert "PYTHONPATH" in line and "remove that copy or that entry" in line


def test_a_copy_without_init_files_does_not_shadow(installed, tmp_path, monkeypatch):
    """A namespace portion (no __init__.py) loses to the installed regular
    package, as Python's import system decides: no false alarm."""
    doc, python, _ = installed
    copy = _older_copy(tmp_path / "src")
    (copy / "tunix" / "__init__.py").unlink()
    monkeypatch.setenv("PYTHONPATH", str(copy))
    assert all(f.ok for f in verify.check_resolution(doc, python=python))


@pytest.mark.parametrize("name, text", [
    ("__editable__.google_tunix-0.1.8.pth", "{src}\n"),  # a setuptools editable install's path file
    ("google-tunix.egg-link", "{src}\n.\n"),  # `setup.py develop` / pip -e of old
    ("easy-install.pth", "{src}\n"),  # a path file of another name that adds a folder holding tunix
    ("__editable__.google_tunix-0.1.8.pth", "import __editable___google_tunix_0_1_8_finder; "
                                            "__editable___google_tunix_0_1_8_finder.install()\n"),
], ids=["editable-pth", "egg-link", "path-pth", "finder-pth"])
def test_a_leftover_pth_or_egg_link_of_another_install_is_named(installed, tmp_path, monkeypatch, name, text):
    doc, python, site = installed
    src = _older_copy(tmp_path / "checkout")
    leftover = site / name
    leftover.write_text(text.format(src=src))
    try:
        monkeypatch.delenv("PYTHONPATH", raising=False)
        monkeypatch.chdir(tmp_path)
        findings = verify.check_resolution(doc, python=python)
    finally:
        leftover.unlink()
    bad = [f for f in findings if not f.ok]
    (finding,) = bad
    assert finding.distribution == "google-tunix" and finding.what == f"leftover {leftover}"
    assert finding.problem is verify.Problem.LEFTOVER and finding.subject == str(leftover) and finding.remedy == f"delete {leftover}"
    assert finding.shown.startswith(verify.LEFTOVER)
    (line,) = verify.explain(findings, doc)
    assert f"Another install of google-tunix left {leftover} behind: delete it" in line


def test_an_unrelated_pth_is_not_a_leftover(installed, tmp_path, monkeypatch):
    doc, python, site = installed
    other = tmp_path / "other"
    (other / "somethingelse").mkdir(parents=True)
    leftover = site / "zz-other.pth"
    leftover.write_text(f"{other}\nimport os\n")
    try:
        monkeypatch.chdir(tmp_path)
        findings = verify.check_resolution(doc, python=python)
    finally:
        leftover.unlink()
    assert all(f.ok for f in findings), [f for f in findings if not f.ok]


def test_an_interpreter_that_cannot_answer_is_a_failure_not_a_pass(installed, tmp_path):
    doc, _, _ = installed
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'no python here' >&2\nexit 1\n")
    broken.chmod(0o755)
    (finding,) = verify.check_resolution(doc, python=str(broken))
    assert not finding.ok and finding.what == "resolution" and finding.shown == "could not be asked: no python here"


def test_check_asks_it_too(installed):
    """`maxtext-rl-overlay verify` reaches the question through check(), so
    `verify --no-imports` asks it too (it imports nothing)."""
    doc, python, _ = installed
    findings = verify.check(doc, python=python)
    assert "import tunix.generate.utils resolves to" in {f.what for f in findings}


def test_files_only_leaves_out_the_closure_not_the_resolution(installed):
    """verify --files-only (an image over a base whose closure is checked
    otherwise) still asks where the modules resolve; only torch is left out."""
    doc, python, _ = installed
    assert "torch" in {f.distribution for f in verify.check(doc, python=python)}
    files_only = verify.check(doc, python=python, environment=False)
    assert "torch" not in {f.distribution for f in files_only}
    assert all(f.ok for f in files_only if f.what.endswith(" resolves to"))
