"""The stack as users get it: the vLLM wheel the pipeline builds for TPU, the
closure resolved with MaxText 0.2.4, MaxText's own installer run over the
overlay, and the way back. Real packages throughout: MaxText from PyPI, the
PyPI stand-ins for the pins, PyPI's torch 2.11.0 standing in for the CPU build."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

import pytest

import standins
from maxtext_rl_overlay.config import registry
from support.pipeline import ALL, PROJECT, build_standins, unpack

pytestmark = pytest.mark.slow

ENV = dict(os.environ, UV_PYTHON_DOWNLOADS="never")
# tpu_inference asks the TPU metadata server for these at import time.
TPU_ENV = {"TPU_ACCELERATOR_TYPE": "v6e-8", "TPU_NAME": "local", "TPU_WORKER_ID": "0", "JAX_PLATFORMS": "cpu"}


def _needed(so: bytes) -> set[str]:
    """The NEEDED entries of a shared object's dynamic section (readelf -d)."""
    with tempfile.NamedTemporaryFile(suffix=".so") as f:
        f.write(so)
        f.flush()
        out = subprocess.run(["readelf", "-d", f.name], capture_output=True, text=True, check=True).stdout
    return {line.split("[", 1)[1].split("]", 1)[0] for line in out.splitlines() if "(NEEDED)" in line}


def test_vllm_is_built_for_tpu_against_the_closure_torch(built):
    out, proc = built
    (wheel,) = out.glob("vllm-*.whl")
    assert wheel.name.startswith(f"vllm-0.25.0+{PROJECT.local_label}.unpinned.") and "-cp312-cp312-linux_x86_64" in wheel.name
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        libs = {n: _needed(zf.read(n)) for n in ("vllm/spinloop.abi3.so", "vllm/fs_io_C.abi3.so")}
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    # The TPU target builds only the two pure-C++ extensions, as vllm-tpu does.
    assert not [n for n in names if n.endswith(".so") and n not in libs], names
    for so, needed in libs.items():
        assert {"libtorch.so", "libtorch_cpu.so"} <= needed, (so, needed)
        # PyPI's torch is a CUDA build: its CMake config links libtorch_cuda too.
        assert "libtorch_cuda.so" in needed, (so, needed)
    assert "[vllm] built against torch 2.11.0 (CUDA 13.0 build: the stand-in)" in proc.stderr
    requires = [line.split(": ", 1)[1] for line in metadata.splitlines() if line.startswith("Requires-Dist: ")]
    assert "tpu-inference" in requires  # left to constraints.txt, which pins our build
    assert any(r.startswith("fastapi[standard]") and "<0.140.0" in r.replace(" ", "") for r in requires), requires
    constraints = (out.parent / "constraints.txt").read_text()
    assert f"\n{wheel.name.split('-')[0]}=={wheel.name.split('-')[1]} \\\n" in constraints


def test_vllm_source_asking_for_another_torch_is_a_build_error(tmp_path, standin, cache_dir, project):
    """The extensions link torch: a source built for another torch than the
    closure's must fail the build, not the import on the TPU VM."""
    tree = unpack(standin["vllm"], tmp_path / "src")
    pyproject = tree / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('"torch == 2.11.0"', '"torch == 2.10.0"', 1))
    out = tmp_path / "rel" / "dist"
    proc = build_standins(project, out, dict(standin, vllm=tree), cache_dir, only=ALL, check=False)
    assert proc.returncode == 3, proc.stderr
    assert "vllm: its build-system requires 'torch == 2.10.0', but the closure's torch is 2.11.0" in proc.stderr
    assert "Traceback" not in proc.stderr and not out.exists()


def _venv(path: pathlib.Path) -> pathlib.Path:
    subprocess.run(["uv", "venv", "-q", "-p", sys.executable, str(path)], check=True, env=ENV)
    return path / "bin" / "python"


def _verify(venv: pathlib.Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "maxtext-rl-overlay"), "verify", *flags], capture_output=True, text=True, env=dict(ENV, **TPU_ENV))


def test_maxtext_install_then_maxtexts_own_installer_then_restore(built, tmp_path, cache_dir):
    """The README's MaxText command (stand-in form) into a fresh venv: MaxText
    0.2.4 from PyPI and the overlay, one closure; verify yes; MaxText's shims
    import. Then the step install_tpu_post_train_extra_deps runs, replayed
    from the release's own post_train_github_deps.txt with a local archive
    for the tunix pin (no GitHub here): verify says what happened and how to
    restore; the restore command brings verify back to yes."""
    out, _ = built
    constraints = out.parent / "constraints.txt"
    venv = tmp_path / "venv"
    py = _venv(venv)
    try:
        install = ["uv", "pip", "install", "-q", "-p", str(py), "-c", str(constraints),
                   "--override", str(out / "torch-standin-overrides.txt"), "maxtext-rl-overlay[maxtext]"]
        subprocess.run(install, check=True, env=ENV)
        ok = _verify(venv)
        assert ok.returncode == 0, ok.stdout + ok.stderr
        shim = subprocess.run([str(py), "-c", "import jax, maxtext.integration.tunix.tunix_adapter as a; "
                               "assert jax.lax.top_k is a._compat_top_k; print('shims active')"],
                              capture_output=True, text=True, env=dict(ENV, **TPU_ENV))
        assert "shims active" in shim.stdout, shim.stderr[-2000:]

        # MaxText's step: `uv pip install -r post_train_github_deps.txt --no-deps
        # --no-build-isolation`, VLLM_TARGET_DEVICE=tpu, UV_TORCH_BACKEND=cpu.
        wheel = registry.release_wheel("maxtext", "0.2.4", cache_dir / "releases")  # the build's own, reused
        with zipfile.ZipFile(wheel) as zf:
            deps = zf.read("dependencies/extra_deps/post_train_github_deps.txt").decode()
        tunix_line = next(line for line in deps.splitlines() if line.startswith("google-tunix @ "))
        assert PROJECT.pins["google-tunix"].commit in tunix_line  # the release names our pin
        archive = tmp_path / f"tunix-{PROJECT.pins['google-tunix'].commit}.tar.gz"
        shutil.copy2(standins.fetch("google-tunix"), archive)  # the pinned tree is out of reach: its stand-in
        replay = tmp_path / "post_train_github_deps.txt"
        replay.write_text(f"google-tunix @ {archive.as_uri()}\n")
        subprocess.run(["uv", "pip", "install", "-q", "-p", str(py), "-r", str(replay), "--no-deps", "--no-build-isolation"],
                       check=True, env=dict(ENV, VLLM_TARGET_DEVICE="tpu", UV_TORCH_BACKEND="cpu"))
        replaced = _verify(venv, "--no-imports")  # what replaced what is in the files; the imports cost a minute
        assert replaced.returncode == 1, replaced.stdout
        row = next(line for line in replaced.stdout.splitlines() if line.startswith("google-tunix") and " version " in line)
        assert f"REPLACED by the same upstream build, not the overlay's from {archive.as_uri()}" in row, row
        assert "install_tpu_post_train_extra_deps" in replaced.stderr and "do not run it" in replaced.stderr
        restore = next(line for line in replaced.stderr.splitlines() if "Restore the overlay with" in line).split(": ", 1)[1]
        assert restore == 'uv pip install -c constraints.txt --override torch-standin-overrides.txt "maxtext-rl-overlay[maxtext]"', restore

        cmd = restore.replace("constraints.txt", str(constraints), 1).replace("torch-standin-overrides.txt", str(out / "torch-standin-overrides.txt"))
        args = cmd.replace('"', "").split()
        subprocess.run([*args[:3], "-q", "-p", str(py), *args[3:]], check=True, env=ENV)
        back = _verify(venv)
        assert back.returncode == 0, back.stdout + back.stderr
    finally:
        shutil.rmtree(venv, ignore_errors=True)


def test_joint_resolution_cannot_pick_the_unpatched_releases(built):
    """With the constraints, MaxText's own requirement on google-tunix
    resolves to our build, and so does asking for PyPI's releases by their
    versions (`==X` admits `X+local`, and the constraints admit only ours)."""
    out, _ = built
    constraints = out.parent / "constraints.txt"
    overrides = out / "torch-standin-overrides.txt"

    def resolved(*reqs: str) -> dict[str, str]:
        proc = subprocess.run(
            ["uv", "pip", "compile", "-", "-q", "--no-header", "--no-annotate", "-c", str(constraints), "--override", str(overrides),
             "--python-version", "3.12", "--python-platform", "x86_64-manylinux_2_31", "-p", sys.executable],
            input="\n".join(reqs) + "\n", capture_output=True, text=True, env=ENV)
        assert proc.returncode == 0, proc.stderr
        return dict(line.split("==", 1) for line in proc.stdout.splitlines() if "==" in line)

    label = f"+{PROJECT.local_label}.unpinned."
    assert label in resolved("maxtext[tpu-post-train]==0.2.4")["google-tunix"]
    for name, version in (("google-tunix", "0.1.7"), ("tpu-inference", "0.25.0.dev20260728"), ("vllm", "0.25.0")):
        got = resolved("maxtext[tpu-post-train]==0.2.4", f"{name}=={version}")[name]
        assert got.startswith(version + label), (name, got)
