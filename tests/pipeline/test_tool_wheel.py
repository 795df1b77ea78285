"""The tool as its users get it: its own wheel, installed (not editable),
holds every file the package reads, and builds from there."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

from support import ROOT

pytestmark = pytest.mark.slow

PACKAGE = ROOT / "overlay" / "maxtext_rl_overlay"
#: The tool venv's uv (scripts/setup.sh installs it there).
UV = shutil.which("uv") or str(pathlib.Path(sys.executable).parent / "uv")


def _package_files() -> set[str]:
    """The package's files in the checkout, as wheel paths (what git tracks
    there: no caches, no build-time manifest)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--", "."], cwd=PACKAGE, capture_output=True, check=True).stdout.decode().split("\0")
    return {f"maxtext_rl_overlay/{name}" for name in listed if name}


@pytest.fixture(scope="module")
def tool_wheel(tmp_path_factory) -> pathlib.Path:
    """`uv build --wheel` of a copy of the checkout's tracked files, as CI or a user builds it."""
    tmp = tmp_path_factory.mktemp("tool-wheel")
    src = tmp / "src"
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, tracked):
        dest = src / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes((ROOT / name).read_bytes())
    subprocess.run([UV, "build", "--wheel", "--no-progress", "--out-dir", str(tmp / "out"), str(src)], check=True, capture_output=True,
                   env=dict(os.environ, UV_PYTHON_DOWNLOADS="never"))
    (wheel,) = (tmp / "out").glob("maxtext_rl_overlay-*.whl")
    return wheel


def test_tool_wheel_holds_every_package_file(tool_wheel):
    with zipfile.ZipFile(tool_wheel) as zf:
        names = set(zf.namelist())
    missing = sorted(_package_files() - names)
    assert not missing, f"the tool's wheel lacks {missing}: add them to [tool.setuptools.package-data]"
    assert "maxtext_rl_overlay/resources/build-constraints.txt" in names
    (licence,) = [n for n in names if n.endswith(".dist-info/licenses/LICENSE")]
    with zipfile.ZipFile(tool_wheel) as zf:
        assert zf.read(licence) == (ROOT / "LICENSE").read_bytes()


def test_build_runs_from_the_installed_wheel(tool_wheel, tmp_path, standin, cache_dir, project, built):
    venv = tmp_path / "venv"
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", MRL_CACHE_DIR=str(cache_dir))
    subprocess.run([UV, "venv", "--quiet", "-p", sys.executable, str(venv)], check=True, env=env)
    subprocess.run([UV, "pip", "install", "--quiet", "-p", str(venv / "bin" / "python"), f"{tool_wheel}[build]"], check=True, env=env)
    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import maxtext_rl_overlay; print(maxtext_rl_overlay.__file__)"],
                           cwd=tmp_path, capture_output=True, text=True, check=True).stdout.strip()
    assert where.startswith(str(venv)), f"imported from {where}, not from the installed wheel"
    out = tmp_path / "dist"
    # The venv's own uv and console script, from a folder outside the checkout.
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    proc = subprocess.run(
        [str(venv / "bin" / "maxtext-rl-overlay"), "build", "--project", str(project), "--unpinned", "--torch-standin",
         "--only", "google-tunix", "--source", f"google-tunix={standin['google-tunix']}",
         "--out", str(out), "--constraints", str(tmp_path / "constraints.txt")],
        cwd=tmp_path, capture_output=True, text=True, env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert sorted(p.name.split("-")[0] for p in out.glob("*.whl")) == ["google_tunix", "maxtext_rl_overlay", "maxtext_vllm_adapter"]
    # Another build (other wheels inside), another name: the overlay's local label.
    (ours,) = out.glob("maxtext_rl_overlay-*.whl")
    (other,) = built[0].glob("maxtext_rl_overlay-*.whl")
    assert ours.name != other.name and ours.name.split("-")[1].split("+")[0] == other.name.split("-")[1].split("+")[0], (ours.name, other.name)
