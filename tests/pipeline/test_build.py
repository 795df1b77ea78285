"""The build pipeline end to end, on real upstream code, offline from GitHub:
build -> index -> install with the constraints -> verify, and every failure
the issue names giving a clear error and leaving nothing half-done."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import zipfile

import pytest

from maxtext_rl_overlay.stages import inputdigests, patchfile
from support.pipeline import (
    ALL,
    PROJECT,
    ROOT,
    build_standins,
    git_repo_of,
    unpack,
)
from support.project import run_tool, set_pin
from unit.unit_support import default_signals

pytestmark = pytest.mark.slow

SAMPLING = "tpu_inference/layers/jax/sample/sampling.py"


def _sums(out: pathlib.Path) -> str:
    return (out / "SHA256SUMS").read_text()


def _snapshot(folder: pathlib.Path) -> dict[str, bytes]:
    """Every file below `folder` (and beside it: constraints.txt), by content."""
    files = {str(p.relative_to(folder.parent)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    constraints = folder.parent / "constraints.txt"
    files["constraints.txt"] = constraints.read_bytes()
    return files


def _no_leftovers(out: pathlib.Path) -> None:
    left = [p.name for p in out.parent.iterdir() if ".partial-" in p.name or ".old-" in p.name]
    assert not left, f"staging folders left behind: {left}"


def test_build_writes_index_constraints_and_labels_unpinned(built):
    out, proc = built
    wheels = sorted(p.name for p in out.glob("*.whl"))
    assert [w.split("-")[0] for w in wheels] == ["google_tunix", "maxtext", "maxtext_rl_overlay", "maxtext_vllm_adapter", "tpu_inference", "vllm"]
    for wheel in wheels:
        if not wheel.startswith("maxtext"):
            assert f"+{PROJECT.local_label}.unpinned." in wheel, wheel  # a stand-in says so in its version
    index = (out / "index.html").read_text()
    constraints = (out.parent / "constraints.txt").read_text()
    for line in _sums(out).splitlines():
        sha, name = line.split()
        assert f'href="{urllib.parse.quote(name)}#sha256={sha}"' in index
        assert f"--hash=sha256:{sha}" in constraints
    assert "NOT built from the pins" in constraints
    # How it was made: the command (sources as PATH, then what was found
    # there), uv, the tool; uv's annotations; the overlay's own local label.
    assert re.search(r"\n# Made by: maxtext-rl-overlay build --source google-tunix=PATH --source tpu-inference=PATH --source vllm=PATH "
                     r"--only google-tunix,tpu-inference,vllm,maxtext --unpinned --torch-standin --out \.\.\./dist --constraints \.\.\./constraints\.txt\n"
                     r"#   google-tunix: --source google_tunix-0\.1\.7\.tar\.gz, tree [0-9a-f]{40} \(NOT the pin\)\n", constraints), constraints[:3000]
    assert re.search(r"\n#   with uv \d+\.\d+\.\d+.*, the tool's code sha256 [0-9a-f]{64}\n"
                     rf"# {re.escape(inputdigests.INPUTS_TITLE)}\n#   maxtext-rl-overlay: [0-9a-f]{{64}} \(", constraints)
    # What it was made from, as tests/unit recomputes it from the checkout: the same digests, in both copies.
    assert inputdigests.recorded_inputs(constraints) == inputdigests.input_digests(PROJECT, PROJECT.pins)
    assert inputdigests.stale_constraints(constraints, PROJECT) == "" and inputdigests.stale_constraints((out / "constraints.txt").read_text(), PROJECT) == ""
    assert "\n# Needs uv >= 0.5.3: " in constraints and "\n    # via maxtext-rl-overlay\n" in constraints
    assert re.search(rf"\nmaxtext-rl-overlay==0\.1\.0\+{PROJECT.local_label}\.[0-9a-f]{{12}} \\\n", constraints)
    assert "--find-links ./dist\n" in constraints
    assert "--find-links .\n" in (out / "constraints.txt").read_text()
    assert sorted(p.relative_to(out).as_posix() for p in (out / "simple").rglob("index.html")) == [
        "simple/google-tunix/index.html", "simple/index.html", "simple/maxtext-rl-overlay/index.html",
        "simple/maxtext-vllm-adapter/index.html", "simple/maxtext/index.html", "simple/tpu-inference/index.html", "simple/vllm/index.html"]
    assert oct(out.stat().st_mode & 0o777) == "0o755", "readable by a web server running as another user"
    # The closure the stack needs on a TPU VM is pinned exactly, as MaxText
    # 0.2.4's extra and its overrides file ask (torch: PyPI's stand-in build).
    for pin in ("jax==0.11.0", "jaxlib==0.11.0", "libtpu==0.0.44", "flax==0.12.8", "qwix==0.1.8", "optax==0.2.6",
                "gcsfs==2026.2.0", "fsspec==2026.2.0", f"maxtext==0.2.4+{PROJECT.local_label}", "torch==2.11.0", "torchvision==0.26.0"):
        assert f"\n{pin} " in constraints, pin
    assert "# STAND-IN torch 2.11.0: PyPI's CUDA build, standing in for MaxText's torch==2.11.0+cpu" in constraints
    assert "STAND-IN torch 2.11.0" in proc.stderr
    overrides = (out / "torch-standin-overrides.txt").read_text()
    assert "STAND-IN" in overrides and "\ntorch==2.11.0\ntorchvision==0.26.0\n" in overrides
    assert "[google-tunix] applying 0001-" in proc.stderr and "building the wheel" in proc.stderr
    assert "[vllm] UNPINNED source" in proc.stderr and "[vllm] empty series: nothing to apply" in proc.stderr
    # MaxText from its pinned release wheel (the package index's), its series applied, the wheel packed with its metadata.
    assert "[maxtext] applying backport-v0.2.5-" in proc.stderr and "[maxtext] packing the wheel from maxtext-0.2.4-py3-none-any.whl" in proc.stderr
    assert "#   maxtext: the package index's maxtext-0.2.4-py3-none-any.whl, tree f2b4644b4b6e" in constraints


def test_every_wheel_carries_its_licence_files(built, standin):
    """Ours: the project's LICENSE; the upstreams': their trees' own; MaxText's
    vLLM plugin (a folder of the release without a licence of its own): the
    release's licence files."""
    out, _ = built
    licences = {}
    for wheel in out.glob("*.whl"):
        with zipfile.ZipFile(wheel) as zf:
            licences[wheel.name.split("-")[0]] = {n.rsplit("/", 1)[-1]: zf.read(n) for n in zf.namelist() if ".dist-info/licenses/" in n}
    assert licences["maxtext_rl_overlay"] == {"LICENSE": (PROJECT.root / "LICENSE").read_bytes()}
    assert sorted(licences["maxtext_vllm_adapter"]) == ["AUTHORS", "LICENSE", "LICENSE_HEADER"]
    assert b"Apache License" in licences["maxtext_vllm_adapter"]["LICENSE"]
    for name in ("google-tunix", "tpu-inference", "vllm"):
        tree = unpack(standin[name], out.parent / f"tree-{name}")
        own = {p.name: p.read_bytes() for p in tree.iterdir() if p.is_file() and p.name.upper().startswith(("LICEN", "NOTICE", "COPYING", "AUTHORS"))}
        assert own and licences[name.replace("-", "_")] == own, name


def test_vllm_is_built_without_rust_where_a_rust_toolchain_is_installed(built, cache_dir):
    """The decision in patches/vllm/pin.toml (CARGO=false): setuptools-rust
    skips vLLM's optional Rust extensions without running cargo, so a runner
    with cargo builds the same wheel as one without."""
    out, proc = built
    calls = out.parent / "rust" / "calls.log"
    ran = calls.read_text().splitlines() if calls.exists() else []
    assert not [c for c in ran if c.startswith("cargo")], f"the build ran cargo: {ran}"
    (wheel,) = out.glob("vllm-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        rust = [n for n in zf.namelist() if n.startswith(("vllm/_rust_", "vllm/vllm-rs"))]
    assert not rust, rust


def test_vllm_build_environment_holds_the_pinned_toolchain(built, cache_dir):
    out, proc = built
    assert "[vllm] build toolchain: " in proc.stderr and "pinned with hashes by vllm/build-requirements.txt" in proc.stderr
    pinned = (PROJECT.pins["vllm"].directory / "build-requirements.txt").read_text()
    (env,) = (cache_dir / "buildenv").iterdir()
    installed = dict(p.name.removesuffix(".dist-info").rsplit("-", 1) for p in env.glob("lib/python*/site-packages/*.dist-info"))
    installed = {name.lower().replace("_", "-"): version for name, version in installed.items()}
    for name in ("cmake", "ninja", "setuptools-scm", "setuptools-rust", "jinja2", "setuptools", "wheel"):
        assert f"\n{name}=={installed[name]} \\\n" in pinned, (name, installed.get(name))


def test_install_with_constraints_then_verify(built, tmp_path):
    """The user's command into a fresh venv; then verify says yes, and says no
    for a tampered file and for the unpatched upstream release."""
    out, _ = built
    venv = tmp_path / "venv"
    py = venv / "bin" / "python"
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never")
    subprocess.run(["uv", "venv", "-q", "-p", sys.executable, str(venv)], check=True, env=env)
    try:
        subprocess.run(["uv", "pip", "install", "-q", "-p", str(py), "-c", str(out.parent / "constraints.txt"), "maxtext-rl-overlay"],
                       check=True, cwd=tmp_path, env=env)
        def verify(*flags: str) -> subprocess.CompletedProcess:
            return subprocess.run([str(venv / "bin" / "maxtext-rl-overlay"), "verify", *flags], capture_output=True, text=True)

        ok = verify()
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert "verify: yes" in ok.stdout and "UNPINNED" in ok.stdout and "the stack imports" in ok.stdout
        for module in ("tpu_inference", "tunix", "vllm", "tpu_inference.layers.jax.sample.sampling"):
            assert any(f"import {module} " in line and line.rstrip().endswith("ok") for line in ok.stdout.splitlines()), module
        assert "STAND-IN for 2.11.0+cpu" in ok.stdout

        installed = next(venv.glob(f"lib/python3.*/site-packages/{SAMPLING}"))
        original = installed.read_bytes()
        installed.write_bytes(original.replace(b"import jax", b"import jax  # tampered", 1))
        # The file checks: each import of the stack costs ~45 s, and the first verify showed it imports.
        tampered = verify("--no-imports")
        assert tampered.returncode == 1
        assert "verify: NO" in tampered.stderr
        # A stack whose files are intact but which cannot import is not good either.
        vllm_dir = next(venv.glob("lib/python3.*/site-packages/vllm"))
        vllm_dir.rename(vllm_dir.with_name("vllm.away"))
        broken = verify()
        vllm_dir.with_name("vllm.away").rename(vllm_dir)
        assert broken.returncode == 1 and "The stack does not import: import " in broken.stderr, broken.stderr
        assert any(SAMPLING in line and "DIFFERS" in line for line in tampered.stdout.splitlines())
        installed.write_bytes(original)
        assert verify("--no-imports").returncode == 0

        # The unpatched upstream release, under the same name.
        subprocess.run(["uv", "pip", "install", "-q", "-p", str(py), "--no-deps", "--reinstall-package", "tpu-inference",
                        "tpu-inference==0.25.0.dev20260728"], check=True, env=env)
        upstream = verify("--no-imports")
        assert upstream.returncode == 1
        rows = [line for line in upstream.stdout.splitlines() if line.startswith("tpu-inference") and "DIFFERS" in line]
        assert any(" version " in r and "0.25.0.dev20260728: REPLACED" in r for r in rows), upstream.stdout
        assert any(SAMPLING in r for r in rows), upstream.stdout
    finally:
        shutil.rmtree(venv, ignore_errors=True)


def test_reproducible_and_engines_agree(built, tmp_path, standin):
    """Same pins -> byte-identical wheels: a second build with a cold cache (a
    new vLLM build environment too) in another folder, and a build with the
    patch-ng engine (no git), give the same sha256, vLLM's compiled
    extensions included. From the same checkout as `built`: the overlay's
    own wheel records the project commit it was made from."""
    out, _ = built
    again = build_standins(ROOT, tmp_path / "a" / "dist", standin, tmp_path / "cold-cache", only=ALL)
    assert again.returncode == 0, again.stderr
    assert _sums(tmp_path / "a" / "dist") == _sums(out)
    for page in ["index.html", *(p.relative_to(out) for p in (out / "simple").rglob("index.html"))]:
        assert (tmp_path / "a" / "dist" / page).read_bytes() == (out / page).read_bytes(), page
    ng = build_standins(ROOT, tmp_path / "b" / "dist", standin, tmp_path / "cold-cache", "--engine", "patch-ng", only=ALL)
    assert ng.returncode == 0, ng.stderr
    assert "(patch-ng)" in ng.stderr
    # Kept wheels are found by their tree's git id: patch-ng made the very trees git am made.
    for name in ("google-tunix", "tpu-inference"):
        assert f"[{name}] tree " in ng.stderr and f"[{name}] building the wheel" not in ng.stderr, ng.stderr
    assert _sums(tmp_path / "b" / "dist") == _sums(out)


@pytest.fixture
def previous(tmp_path, standin, cache_dir, project):
    """A good build in place, to check that a failed build leaves it as it was."""
    out = tmp_path / "rel" / "dist"
    build_standins(project, out, standin, cache_dir)
    return out, _snapshot(out)


def _fails_cleanly(proc, out, before, *needles):
    assert proc.returncode == 3, proc.stderr
    err = proc.stderr
    assert "Traceback" not in err, err
    for needle in needles:
        assert needle in err, f"{needle!r} not in:\n{err}"
    assert _snapshot(out) == before, "a failed build changed the published index or constraints"
    _no_leftovers(out)


@pytest.mark.parametrize("engine", ["git", "patch-ng"])
def test_corrupt_patch(previous, project, standin, cache_dir, engine):
    out, before = previous
    patch = next((project / "patches" / "tpu-inference").glob("0001-*.patch"))
    text = patch.read_text()
    # Damage one context line of the hunk: the patch no longer fits any tree.
    i = text.index("\n     \"\"\"\n")
    patch.write_text(text[:i] + "\n     '''\n" + text[i + 9 :])
    proc = build_standins(project, out, standin, cache_dir, "--engine", engine, check=False)
    _fails_cleanly(proc, out, before, "tpu-inference", patch.name, "does not apply")


def test_patch_no_longer_applies(previous, project, standin, cache_dir, tmp_path):
    """Upstream changed the lines the patch touches."""
    out, before = previous
    tree = unpack(standin["tpu-inference"], tmp_path / "src")
    f = tree / SAMPLING
    f.write_text(f.read_text().replace("# Find the topK values.", "# Find the top-k values (upstream moved on)."))
    proc = run_tool(project, "build", "--torch-standin", "--unpinned", "--only", "tpu-inference", "--source", f"tpu-inference={tree}",
                    "--out", str(out), "--constraints", str(out.parent / "constraints.txt"), cache=cache_dir)
    _fails_cleanly(proc, out, before, "tpu-inference", "0001-", "does not apply", "rebase")


@pytest.mark.parametrize("engine", ["git", "patch-ng"])
def test_already_applied_patch(previous, project, standin, cache_dir, tmp_path, engine):
    out, before = previous
    tree = unpack(standin["tpu-inference"], tmp_path / "src")
    patch = next((project / "patches" / "tpu-inference").glob("0001-*.patch"))
    subprocess.run(["git", "apply", str(patch)], cwd=tree, check=True)
    proc = run_tool(project, "build", "--torch-standin", "--unpinned", "--only", "tpu-inference", "--source", f"tpu-inference={tree}", "--engine", engine,
                    "--out", str(out), "--constraints", str(out.parent / "constraints.txt"), cache=cache_dir)
    _fails_cleanly(proc, out, before, "tpu-inference", patch.name, "already applied")


def test_pinned_git_source_and_wrong_tree_id(previous, project, standin, cache_dir, tmp_path):
    """A git source holding the pinned commit builds as pinned, with the pre-
    and post-image blob ids checked; a pin whose tree id is wrong is refused."""
    out, before = previous
    repo = unpack(standin["tpu-inference"], tmp_path / "src")
    commit, tree, date = git_repo_of(repo)
    left_out = _series_fitting(project / "patches" / "tpu-inference", repo)
    assert len(left_out) < 3, f"the stand-in stands for the pin poorly: {left_out} do not fit it"
    set_pin(project, "tpu-inference", commit=commit, tree="0" * 40, date=date)
    args = ["build", "--torch-standin", "--only", "tpu-inference", "--source", f"tpu-inference={repo}", "--out", str(out),
            "--constraints", str(out.parent / "constraints.txt")]
    proc = run_tool(project, *args, cache=cache_dir)
    _fails_cleanly(proc, out, before, "tpu-inference", commit, f"has tree {tree}", "0" * 40)

    set_pin(project, "tpu-inference", tree=tree)
    good = run_tool(project, *args, cache=cache_dir)
    assert good.returncode == 0, good.stderr
    assert "unpinned" not in "".join(p.name for p in out.glob("tpu_inference-*.whl"))
    assert "Built from the pins" in (out.parent / "constraints.txt").read_text()


def _series_fitting(folder: pathlib.Path, repo: pathlib.Path) -> list[str]:
    """Cut the series in `folder` to the patches whose pre-images `repo`'s
    tree (or a patch kept before them) holds: the stand-in source is a
    release made a day after the pin, and a file changed that day (the
    995930220 backport's kv_cache_manager.py) no longer fits. Returns the
    patches left out."""
    blobs = set(subprocess.run(["git", "ls-tree", "-r", "--format=%(objectname)", "HEAD"], cwd=repo, capture_output=True, text=True,
                               check=True).stdout.split())
    kept, left_out = [], []
    for name in [n for n in (folder / "series").read_text().split() if n.endswith(".patch")]:
        changes = patchfile.parse(folder / name).files
        if all(c.pre == patchfile.ZERO or c.pre in blobs for c in changes):
            kept.append(name)
            blobs |= {c.post for c in changes}
        else:
            left_out.append(name)
            (folder / name).unlink()
    (folder / "series").write_text("".join(n + "\n" for n in kept))
    return left_out


def test_missing_source(previous, project, cache_dir, tmp_path):
    """No --source and the upstream unreachable: the error names the upstream,
    the pin and the flag to use."""
    out, before = previous
    set_pin(project, "tpu-inference", repository=(tmp_path / "nowhere").as_uri())
    proc = run_tool(project, "build", "--torch-standin", "--only", "tpu-inference", "--out", str(out),
                    "--constraints", str(out.parent / "constraints.txt"), cache=cache_dir)
    _fails_cleanly(proc, out, before, "tpu-inference: cannot reach", "7ecc401e6faefe3f793f3e4a8e6e2dbc49eca868", "--source tpu-inference=PATH")


def test_unpinned_tree_refused_without_flag(previous, project, standin, cache_dir):
    out, before = previous
    proc = run_tool(project, "build", "--torch-standin", "--only", "tpu-inference", "--source", f"tpu-inference={standin['tpu-inference']}",
                    "--out", str(out), "--constraints", str(out.parent / "constraints.txt"), cache=cache_dir)
    _fails_cleanly(proc, out, before, "is not the pinned tree", "--unpinned")


def test_patch_outside_series_and_missing_trailer(previous, project, standin, cache_dir):
    out, before = previous
    directory = project / "patches" / "tpu-inference"
    patch = next(directory.glob("0001-*.patch"))
    stray = directory / "0099-stray.patch"
    shutil.copy2(patch, stray)
    proc = build_standins(project, out, standin, cache_dir, check=False)
    _fails_cleanly(proc, out, before, "outside its series", "0099-stray.patch")
    stray.unlink()
    patch.write_text(patch.read_text().replace("Upstream-Status: Pending", "Upstream: maybe"))
    proc = build_standins(project, out, standin, cache_dir, check=False)
    _fails_cleanly(proc, out, before, "Upstream-Status", patch.name)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=lambda s: s.name)
def test_interrupted_build_publishes_nothing(previous, project, standin, tmp_path, sig):
    out, before = previous
    # A cache of its own: in the shared one the wheels are kept, and the build
    # would reuse them instead of running the build it is to be stopped in.
    env = dict(os.environ, MRL_CACHE_DIR=str(tmp_path / "cold-cache"), UV_PYTHON_DOWNLOADS="never")
    args = [sys.executable, "-m", "maxtext_rl_overlay", "build", "--unpinned", "--torch-standin", "--only", "google-tunix,tpu-inference",
            "--out", str(out), "--constraints", str(out.parent / "constraints.txt"), "--project", str(project)]
    for name in ("google-tunix", "tpu-inference"):
        args += ["--source", f"{name}={standin[name]}"]
    # The signals at their defaults in the build, however this suite was
    # started (a background job's children start with SIGINT ignored).
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, text=True, env=env, preexec_fn=default_signals)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:  # interrupt in the middle: during the second wheel's build
        seen.append(line)
        if line.startswith("[tpu-inference] building the wheel ..."):
            time.sleep(0.3)
            proc.send_signal(sig)
            break
    rest = proc.stderr.read()
    assert proc.wait(timeout=120) == 130, "".join(seen) + rest
    assert "interrupted; nothing was published" in rest
    assert _snapshot(out) == before
    _no_leftovers(out)
