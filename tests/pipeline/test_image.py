"""The image, built for real over a STAND-IN for MaxText's post-training
image (no registry is reachable here, so no base can be pulled):

- the stand-in: Debian bookworm minbase from Debian's packages (mmdebstrap),
  this machine's CPython 3.12 copied at its own prefix, the upstreams' code
  WITHOUT the overlay's series (the pins' commits where MRL_SOURCES names
  their repositories, else the PyPI stand-in sdists) installed
  into the system Python --no-deps as MaxText's install_post_train_extra_deps
  does, and PYTHONPATH=/deps/src; labelled a stand-in; referenced by digest.
  It carries no jax and no torch (the closure is 5+ GB), so the gate here is
  `verify --files-only`: the overlay's distributions, their patched files,
  where a plain import finds them and leftovers, not the closure's torch and
  imports.
- scripts/build-image.sh builds the overlay's image FROM it by digest, the
  install offline (uv --offline: podman's chroot isolation has only the
  host's network), and `verify` passes inside the container;
- the same build over a base whose unpatched copy of tunix sits on
  PYTHONPATH (/deps/src) fails at the verify gate, naming the module.

With MRL_IMAGE_CLOSURE=1 (the full matrix or a maintainer's run: a 10 GB
layer and smoke's two configurations; CI's scripts/test.sh leaves them out,
saying so), two more over a stand-in base that also holds the release's
closure, MaxText included (maxtext[tpu-post-train]==0.2.4, jax, the
stand-in torch; --no-deps from uv's cache, offline, as constraints.txt pins
them):
- the overlay's image FROM it by digest, the gate being the full `verify`
  (torch and the imports too); inside the container `verify` passes and
  `smoke --cpu-simulation` passes in both configurations (vLLM's Llama, and
  MaxText's model);
- the same build over it with the unpatched tunix on PYTHONPATH fails the
  full gate, naming the module.

The release is MRL_IMAGE_RELEASE (a scripts/build-wheels.sh dist/ made from
this checkout) or the session's stand-in build. Sizes and times are printed
(pytest -s) as "image: ..." lines, and the closure tests print the commands
run inside the container with their whole output."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile

import pytest

from maxtext_rl_overlay.config.pins import load_project
from maxtext_rl_overlay.stages import sources
from support.pipeline import ROOT

TOOLS = ("podman", "buildah", "runc", "mmdebstrap")
MISSING = [t for t in TOOLS if not shutil.which(t)]

pytestmark = [
    pytest.mark.container,
    pytest.mark.slow,
    pytest.mark.timeout(2400),
    pytest.mark.skipif(
        bool(MISSING) or os.geteuid() != 0,
        reason=f"needs {', '.join(TOOLS)} and root (missing: {', '.join(MISSING) or 'root'}): would have built a stand-in "
        "MaxText base (bookworm + CPython 3.12 + the unpatched upstreams, PYTHONPATH=/deps/src), the overlay's image FROM it "
        "by digest with the install offline, run verify inside it, and seen the build over a base whose unpatched tunix "
        "shadows ours on PYTHONPATH fail at the verify gate naming the module",
    ),
]

STANDIN_LABEL = "maxtext-rl-overlay.stand-in"
SOURCES = dict(s.split("=", 1) for s in os.environ.get("MRL_SOURCES", "").split())
CONF = '[containers]\ndefault_ulimits = ["nofile=1024:20000", "nproc=4096:4096"]\n\n[engine]\nruntime = "runc"\n'
PREFIX = pathlib.Path(sys.base_prefix)  # the tool venv's CPython 3.12: copied at its own prefix (its RUNPATH)
LIBS = "libssl3,libsqlite3-0,libffi8,liblzma5,libbz2-1.0,libreadline8,libncursesw6,zlib1g,libuuid1"

BASE = f"""\
# A STAND-IN for MaxText's post-training image, made by the project's tests
# (tests/pipeline/test_image.py): no registry is reachable here.
FROM scratch
ADD rootfs.tar /
COPY python {PREFIX}
ENV PATH={PREFIX}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
RUN --mount=type=bind,source=wheels,target=/w --mount=type=bind,source=uv,target=/uv \\
    /uv pip install --python {PREFIX}/bin/python3 --break-system-packages --no-cache --offline --no-deps --no-index /w/*.whl
RUN mkdir -p /deps/src
WORKDIR /deps
ENV PYTHONPATH=/deps/src
LABEL {STANDIN_LABEL}="a STAND-IN for MaxText's post-training image: bookworm, CPython 3.12, the upstreams without the series"
"""


def _podman(*args: str, env: dict[str, str], check: bool = True, **kw) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, env=env, **kw)
    if check:
        assert done.returncode == 0, f"podman {' '.join(args)}: {done.stderr[-3000:]}"
    return done


def _say(line: str) -> None:
    print(f"image: {line}", flush=True)


@pytest.fixture(scope="module")
def engine_env(tmp_path_factory):
    """podman's settings for this test only (runc, explicit ulimits): the
    machine's configuration is not touched."""
    conf = tmp_path_factory.mktemp("podman") / "containers.conf"
    conf.write_text(CONF)
    return dict(os.environ, CONTAINERS_CONF=str(conf), BUILDAH_ISOLATION="chroot")


@pytest.fixture(scope="module")
def release(request, tmp_path_factory) -> pathlib.Path:
    """A copy of the release whose constraints name the URL it would be
    published at (a build with --base-url), which serves nothing: the image
    installs the release's own wheels all the same."""
    given = os.environ.get("MRL_IMAGE_RELEASE")
    if given:
        out = pathlib.Path(given)
    else:
        out, proc = request.getfixturevalue("built")
        assert proc.returncode == 0, proc.stderr
    copy = tmp_path_factory.mktemp("release") / "dist"
    shutil.copytree(out, copy)
    text = (copy / "constraints.txt").read_text()
    assert "\n--find-links .\n" in text
    (copy / "constraints.txt").write_text(text.replace("\n--find-links .\n", "\n--find-links https://example.invalid/overlay/v0.1.0/\n", 1))
    return copy


def _unpatched_wheels(standin: dict[str, pathlib.Path], dest: pathlib.Path, work: pathlib.Path) -> None:
    """The upstreams without our series, as wheels, built as MaxText's
    installer builds them from GitHub (a plain build of the upstream's tree):
    from the pins' commits where MRL_SOURCES names their repositories (as
    scripts/test.sh does wherever they are at hand), else from the PyPI
    stand-in sdists. Says which."""
    for name in ("google-tunix", "tpu-inference"):
        env = dict(os.environ, UV_PYTHON_DOWNLOADS="never")
        if name in SOURCES:
            # The pin's tree as the tool reads it from the repository (its
            # tree id checked), copied: the build writes beside the code.
            pin = load_project(ROOT).pins[name]
            tree = sources.obtain(pin, SOURCES[name], allow_unpinned=False, cache=work / "sources")
            source = work / name
            shutil.copytree(tree.path, source, symlinks=True)
            version: str | None = pin.version
            _say(f"{name} in the base: the pin's commit {pin.commit[:12]} without the series")
        else:
            source = standin[name]
            found = re.match(r".*-(\d[^-]*)\.tar\.gz$", source.name)
            version = found.group(1) if found else None
            _say(f"{name} in the base: the PyPI stand-in {source.name} without the series (MRL_SOURCES names no repository of it)")
        if name == "tpu-inference" and version:
            env["VLLM_VERSION_OVERRIDE"] = version  # its setup.py takes its version from there
        subprocess.run([str(pathlib.Path(sys.executable).parent / "uv"), "build", "--wheel", "--python", sys.executable,
                        "-o", str(dest), str(source)], check=True, capture_output=True, env=env)


def _python_copy(dest: pathlib.Path) -> None:
    skip = {"test", "idlelib", "tkinter", "ensurepip", "__pycache__"}
    site = pathlib.Path(sysconfig.get_paths(vars={"base": str(PREFIX)})["purelib"])

    def ignore(folder: str, names: list[str]) -> set[str]:
        here = pathlib.Path(folder)
        return {n for n in names if n in skip or (here == site and n not in ("README.txt",))}

    shutil.copytree(PREFIX, dest, symlinks=True, ignore=ignore)
    # packaging, the tool's one dependency, as the closure would hold it.
    tool_site = pathlib.Path(sysconfig.get_paths()["purelib"])
    dest_site = dest / site.relative_to(PREFIX)
    for entry in [tool_site / "packaging", *tool_site.glob("packaging-*.dist-info")]:
        shutil.copytree(entry, dest_site / entry.name)


@pytest.fixture(scope="module")
def bases(tmp_path_factory, engine_env, standin):
    """(clean, shadowed): the stand-in base and the same with the pin's
    unpatched tunix on PYTHONPATH, each by digest."""
    ctx = tmp_path_factory.mktemp("standin-base")
    start = time.monotonic()
    subprocess.run(["mmdebstrap", "--quiet", "--variant=minbase", f"--include={LIBS}", "bookworm", str(ctx / "rootfs.tar")],
                   check=True, capture_output=True)
    _say(f"mmdebstrap bookworm minbase: {time.monotonic() - start:.0f} s, {(ctx / 'rootfs.tar').stat().st_size / 1e6:.0f} MB")
    _python_copy(ctx / "python")
    (ctx / "wheels").mkdir()
    _unpatched_wheels(standin, ctx / "wheels", tmp_path_factory.mktemp("unpatched"))
    shutil.copy2(pathlib.Path(sys.executable).parent / "uv", ctx / "uv")
    (ctx / "Containerfile").write_text(BASE)
    start = time.monotonic()
    _podman("build", "--isolation", "chroot", "--tag", "localhost/mrl-standin-base:test", str(ctx), env=engine_env)
    _say(f"stand-in base built in {time.monotonic() - start:.0f} s")
    clean = "localhost/mrl-standin-base@" + _podman("image", "inspect", "--format", "{{.Digest}}", "localhost/mrl-standin-base:test",
                                                  env=engine_env).stdout.strip()
    # The shadowing base: the unpatched tunix of the base's own wheel, also in /deps/src.
    shadow = tmp_path_factory.mktemp("shadowed-base")
    (wheel,) = (ctx / "wheels").glob("google_tunix-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(shadow / "src", [n for n in zf.namelist() if n.startswith("tunix/")])
    (shadow / "Containerfile").write_text(f"FROM {clean}\nCOPY src/ /deps/src/\n"
                                          f'LABEL {STANDIN_LABEL}.shadowed="the unpatched tunix on PYTHONPATH (/deps/src)"\n')
    _podman("build", "--isolation", "chroot", "--tag", "localhost/mrl-standin-shadowed:test", str(shadow), env=engine_env)
    shadowed = "localhost/mrl-standin-shadowed@" + _podman("image", "inspect", "--format", "{{.Digest}}",
                                                         "localhost/mrl-standin-shadowed:test", env=engine_env).stdout.strip()
    yield clean, shadowed
    _podman("rmi", "--force", "localhost/mrl-standin-shadowed:test", "localhost/mrl-standin-base:test", env=engine_env, check=False)


def _build(base: str, release: pathlib.Path, tag: str, *, install: str = "replace",
           verify_args: str = "--files-only") -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    env = {k: v for k, v in os.environ.items() if k != "CONTAINERS_CONF"}  # the script's own configuration
    command = [str(ROOT / "scripts" / "build-image.sh"), "--base", base, "--release", str(release), "--tag", tag,
               "--install", install, "--offline"]
    if verify_args:
        command += ["--verify-args", verify_args]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    return done, time.monotonic() - start


def test_the_overlay_image_over_the_standin_passes_verify_inside(bases, release, engine_env):
    clean, _ = bases
    tag = "localhost/mrl-overlay:test"
    before = _image_ids(engine_env)
    cold, cold_s = _build(clean, release, tag)
    try:
        assert cold.returncode == 0, cold.stderr[-5000:]
        assert "verify: yes" in cold.stderr and "--files-only" in cold.stderr
        digest = cold.stdout.strip()
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), cold.stdout
        warm, warm_s = _build(clean, release, tag)
        assert warm.returncode == 0 and warm.stdout.strip() == digest, "the same inputs, the same image"
        inside = _podman("run", "--rm", f"localhost/mrl-overlay@{digest}", "maxtext-rl-overlay", "verify", "--files-only",
                         env=engine_env, check=False)
        assert inside.returncode == 0, inside.stdout + inside.stderr
        assert "verify: yes" in inside.stdout
        _say(f"podman run --rm localhost/mrl-overlay@{digest} maxtext-rl-overlay verify --files-only: "
             + inside.stdout.strip().splitlines()[-1])
        assert re.search(r"import tunix\.generate\.utils resolves to .*site-packages/tunix/generate/utils\.py .* ok", inside.stdout)
        labels = json.loads(_podman("image", "inspect", "--format", "{{json .Labels}}", tag, env=engine_env).stdout)
        constraints = (release / "constraints.txt").read_bytes()
        assert labels["org.opencontainers.image.base.digest"] == clean.split("@")[1]
        assert labels["org.opencontainers.image.base.name"] == clean
        assert labels["maxtext-rl-overlay.constraints.sha256"] == hashlib.sha256(constraints).hexdigest()
        assert labels["org.opencontainers.image.version"].startswith("0.1.0+mrl.")
        assert labels[STANDIN_LABEL].startswith("a STAND-IN"), "the base's stand-in label is inherited"
        sizes = {ref: int(_podman("image", "inspect", "--format", "{{.Size}}", ref, env=engine_env).stdout) for ref in (clean, tag)}
        _say(f"stand-in base {sizes[clean] / 1e6:.0f} MB; overlay image {sizes[tag] / 1e6:.0f} MB "
             f"(the overlay adds {(sizes[tag] - sizes[clean]) / 1e6:.1f} MB); build {cold_s:.0f} s cold, {warm_s:.0f} s warm")
    finally:
        _podman("rmi", "--force", tag, env=engine_env, check=False)
        made = _image_ids(engine_env) - before
        if made:
            _podman("rmi", "--force", *made, env=engine_env, check=False)


def _image_ids(env: dict[str, str]) -> set[str]:
    return set(_podman("images", "--all", "--quiet", "--no-trunc", env=env).stdout.split())


def test_a_base_whose_unpatched_copy_shadows_ours_fails_at_the_verify_gate(bases, release, engine_env):
    _, shadowed = bases
    before = _image_ids(engine_env)
    try:
        done, _ = _build(shadowed, release, "localhost/mrl-overlay-shadowed:test")
    finally:  # the failed build's cached steps: this test's, and only those
        made = _image_ids(engine_env) - before
        if made:
            _podman("rmi", "--force", *made, env=engine_env, check=False)
    assert done.returncode == 1, done.stderr[-5000:]
    assert "RUN maxtext-rl-overlay verify" in done.stderr and "verify: NO" in done.stderr
    assert re.search(r"import tunix\.generate\.utils resolves to .*/deps/src/tunix/generate/utils\.py \(SHADOWS", done.stderr), done.stderr[-5000:]
    assert "A plain import does not reach the overlay's files: tunix" in done.stderr
    for line in done.stderr.splitlines():
        if "SHADOWS" in line or line.startswith(("verify: NO", "Error: building")) or "A plain import" in line:
            _say("shadowed base: " + " ".join(line.split()))
    assert done.stderr.rstrip().endswith("build-image.sh: the build failed (the output above says where; a failed verify gate lists what differs)")


# The image over a base that holds the closure: the full gate and smoke inside.
#
# MRL_IMAGE_CLOSURE=1 selects these: the closure base is a 10 GB layer and
# smoke --cpu-simulation runs both configurations inside the container (tens
# of minutes on 2 cores), so they belong to the full matrix or a
# maintainer's run, not to CI's scripts/test.sh.

CLOSURE_SWITCH = "MRL_IMAGE_CLOSURE"
closure_only = pytest.mark.skipif(
        os.environ.get(CLOSURE_SWITCH) != "1",
        reason=f"{CLOSURE_SWITCH}=1 selects it (a 10 GB layer and smoke's two configurations: the full matrix or a maintainer's "
        "run): would have built a stand-in MaxText base that also holds the release's closure (jax, the stand-in torch, "
        "maxtext[tpu-post-train]==0.2.4, transformers; installed offline from uv's cache), the overlay's image FROM it by "
        "digest with the full verify as its gate, run verify and smoke --cpu-simulation inside it (vLLM's Llama and "
        "MaxText's model), and seen the base whose unpatched tunix shadows ours fail the full gate",
)
CLOSURE_TIMEOUT = pytest.mark.timeout(7200)  # the closure base's 10 GB layer, two builds, verify and smoke inside
#: The release's own distributions: the overlay's image installs them; the base holds the rest of the closure.
OWN = ("maxtext-rl-overlay", "google-tunix", "tpu-inference", "vllm", "maxtext-vllm-adapter")
UV_CACHE = "/mrl-uv-cache"  # where the host's uv cache is mounted during the closure base's build

CLOSURE_BASE = """\
# A STAND-IN for MaxText's post-training image WITH its closure, made by the
# project's tests (tests/pipeline/test_image.py): no registry is reachable here.
# Over the stand-in base (bookworm, CPython 3.12, the upstreams without the
# series, PYTHONPATH=/deps/src): the release's closure but the release's own
# distributions, at the constraints' versions (maxtext[tpu-post-train]==0.2.4,
# jax, the stand-in torch, ...), --no-deps from uv's cache mounted at {cache}
# for this build, offline. The end state is MaxText's: its closure, and the
# upstreams without the series (not replaced: they are not in the list).
FROM {base}
RUN --mount=type=bind,source=closure.txt,target=/mrl-closure.txt --mount=type=bind,source=uv,target=/uv \\
    /uv pip install --python {python} --break-system-packages --offline --cache-dir {cache} --link-mode copy \\
      --no-deps -r /mrl-closure.txt
LABEL {label}.closure="a STAND-IN for MaxText's post-training image WITH the closure: maxtext[tpu-post-train]==0.2.4, jax, the stand-in torch"
"""


def _closure_requirements(release: pathlib.Path) -> str:
    """constraints.txt's pins (name==version), the release's own left out;
    MaxText as MaxText's image holds it: its release (the overlay's build's
    public version), which the overlay's image replaces."""
    pins = re.findall(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", (release / "constraints.txt").read_text(), re.M)
    return "".join(f"{name}=={version.split('+')[0] if name == 'maxtext' else version}\n" for name, version in pins if name not in OWN)


def _uv() -> str:
    return str(pathlib.Path(sys.executable).parent / "uv")


@pytest.fixture(scope="module")
def closure_bases(request, tmp_path_factory, engine_env, release):
    """(closure, shadowed), each by digest: a MaxText post-training image that
    holds the closure (MRL_IMAGE_CLOSURE_BASE, IMAGE@sha256:..., where one is at
    hand; else the stand-in base with the closure, made here), and the same
    with its own unpatched tunix copied onto PYTHONPATH (/deps/src)."""
    given = os.environ.get("MRL_IMAGE_CLOSURE_BASE")
    made = []
    if given:
        assert re.fullmatch(r"[^@\s]+@sha256:[0-9a-f]{64}", given), f"MRL_IMAGE_CLOSURE_BASE={given}: give IMAGE@sha256:<digest>"
        closure = given
    else:
        closure = _closure_standin(request.getfixturevalue("bases")[0], release, tmp_path_factory.mktemp("closure-base"), engine_env)
        made.append("localhost/mrl-standin-closure:test")
    shadow = tmp_path_factory.mktemp("closure-shadowed")
    (shadow / "Containerfile").write_text(SHADOWED_CLOSURE.format(base=closure, label=STANDIN_LABEL))
    _podman("build", "--isolation", "chroot", "--tag", "localhost/mrl-closure-shadowed:test", str(shadow), env=engine_env)
    made.insert(0, "localhost/mrl-closure-shadowed:test")
    shadowed = "localhost/mrl-closure-shadowed@" + _podman("image", "inspect", "--format", "{{.Digest}}", made[0], env=engine_env).stdout.strip()
    yield closure, shadowed
    _podman("rmi", "--force", *made, env=engine_env, check=False)


#: The base's own unpatched tunix, copied where MaxText's images put sources (PYTHONPATH=/deps/src): it shadows ours.
SHADOWED_CLOSURE = """\
FROM {base}
RUN mkdir -p /deps/src && python3 -c 'import importlib.util, shutil; \\
    shutil.copytree(importlib.util.find_spec("tunix").submodule_search_locations[0], "/deps/src/tunix", \\
                    ignore=shutil.ignore_patterns("__pycache__"))'
ENV PYTHONPATH=/deps/src
LABEL {label}.shadowed="the base's unpatched tunix on PYTHONPATH (/deps/src)"
"""


def _closure_standin(clean: str, release: pathlib.Path, ctx: pathlib.Path, engine_env: dict[str, str]) -> str:
    """The stand-in base with the release's closure, by digest."""
    (ctx / "closure.txt").write_text(_closure_requirements(release))
    assert re.search(r"^maxtext==", (ctx / "closure.txt").read_text(), re.M), f"{release}: its closure holds no MaxText"
    cache = subprocess.run([_uv(), "cache", "dir"], capture_output=True, text=True, check=True).stdout.strip()
    # Everything must be in uv's cache: the base's install is offline.
    dry = subprocess.run([_uv(), "pip", "install", "--dry-run", "--offline", "--no-deps", "--python", sys.executable,
                          "-r", str(ctx / "closure.txt")], capture_output=True, text=True)
    assert dry.returncode == 0, f"uv's cache ({cache}) lacks part of the closure (install it once with the network): {dry.stderr[-2000:]}"
    shutil.copy2(_uv(), ctx / "uv")
    (ctx / "Containerfile").write_text(CLOSURE_BASE.format(base=clean, python=PREFIX / "bin" / "python3", cache=UV_CACHE, label=STANDIN_LABEL))
    start = time.monotonic()
    _podman("build", "--isolation", "chroot", "--volume", f"{cache}:{UV_CACHE}", "--tag", "localhost/mrl-standin-closure:test",
            str(ctx), env=engine_env, timeout=3600)
    _say(f"stand-in base with the closure built in {time.monotonic() - start:.0f} s")
    return "localhost/mrl-standin-closure@" + _podman("image", "inspect", "--format", "{{.Digest}}", "localhost/mrl-standin-closure:test",
                                                    env=engine_env).stdout.strip()


def _run_inside(image: str, *command: str, env: dict[str, str], volume: pathlib.Path | None = None,
                timeout: float = 3600) -> tuple[subprocess.CompletedProcess[str], float]:
    args = ["run", "--rm", "--shm-size", "2g"]
    if volume is not None:
        args += ["--volume", f"{volume}:/mrl-out"]
    start = time.monotonic()
    done = _podman(*args, image, *command, env=env, check=False, timeout=timeout)
    seconds = time.monotonic() - start
    _say(f"podman {' '.join(args)} {image} {' '.join(command)}: exit {done.returncode} in {seconds:.0f} s")
    for line in (done.stdout + done.stderr).strip().splitlines():
        _say("  " + line)
    return done, seconds


def _size(ref: str, env: dict[str, str]) -> int:
    return int(_podman("image", "inspect", "--format", "{{.Size}}", ref, env=env).stdout)


@closure_only
@CLOSURE_TIMEOUT
def test_the_overlay_image_over_a_closure_base_passes_the_full_verify_and_smoke_inside(closure_bases, release, engine_env,
                                                                                       tmp_path):
    base, _ = closure_bases
    tag = "localhost/mrl-overlay-closure:test"
    before = _image_ids(engine_env)
    cold, cold_s = _build(base, release, tag, verify_args="")
    try:
        assert cold.returncode == 0, cold.stderr[-5000:]
        assert "RUN maxtext-rl-overlay verify" in cold.stderr and "--files-only" not in cold.stderr
        assert "verify: yes" in cold.stderr
        digest = cold.stdout.strip()
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), cold.stdout
        warm, warm_s = _build(base, release, tag, verify_args="")
        assert warm.returncode == 0 and warm.stdout.strip() == digest, "the same inputs, the same image"
        image = f"localhost/mrl-overlay-closure@{digest}"
        verify, verify_s = _run_inside(image, "maxtext-rl-overlay", "verify", env=engine_env)
        assert verify.returncode == 0 and "verify: yes" in verify.stdout, verify.stdout + verify.stderr
        assert "--files-only" not in verify.stdout
        out = tmp_path / "out"
        out.mkdir()
        smoke, smoke_s = _run_inside(image, "maxtext-rl-overlay", "smoke", "--cpu-simulation", "--json", "/mrl-out/smoke.json",
                                     env=engine_env, volume=out)
        assert smoke.returncode == 0, (smoke.stdout + smoke.stderr)[-8000:]
        result = json.loads((out / "smoke.json").read_text())
        assert result["ok"] and result["skipped"] == {}, result["failed"] or result["skipped"]
        ran = {c["name"]: c["seconds"] for c in result["configurations"]}
        assert set(ran) == {"llama-device-indexes", "maxtext-new-model-design"}, ran
        labels = json.loads(_podman("image", "inspect", "--format", "{{json .Labels}}", tag, env=engine_env).stdout)
        assert labels["org.opencontainers.image.base.digest"] == base.split("@")[1]
        if "MRL_IMAGE_CLOSURE_BASE" not in os.environ:
            assert labels[STANDIN_LABEL + ".closure"].startswith("a STAND-IN"), "the base's stand-in label is inherited"
        sizes = {ref: _size(ref, env=engine_env) for ref in (base, tag)}
        _say(f"base with the closure {sizes[base] / 1e9:.2f} GB; overlay image {sizes[tag] / 1e9:.2f} GB (the overlay adds "
             f"{(sizes[tag] - sizes[base]) / 1e6:.1f} MB); build {cold_s:.0f} s cold, {warm_s:.0f} s warm; verify inside "
             f"{verify_s:.0f} s; smoke --cpu-simulation inside {smoke_s:.0f} s ("
             + ", ".join(f"{name}: {sum(s.values()):.0f} s" for name, s in ran.items()) + ")")
    finally:
        _podman("rmi", "--force", tag, env=engine_env, check=False)
        made = _image_ids(engine_env) - before
        if made:
            _podman("rmi", "--force", *made, env=engine_env, check=False)


@closure_only
@CLOSURE_TIMEOUT
def test_a_closure_base_whose_unpatched_copy_shadows_ours_fails_the_full_verify_gate(closure_bases, release, engine_env):
    _, shadowed = closure_bases
    before = _image_ids(engine_env)
    try:
        done, _ = _build(shadowed, release, "localhost/mrl-overlay-closure-shadowed:test", verify_args="")
    finally:
        made = _image_ids(engine_env) - before
        if made:
            _podman("rmi", "--force", *made, env=engine_env, check=False)
    assert done.returncode == 1, done.stderr[-5000:]
    assert "verify: NO" in done.stderr and "--files-only" not in done.stderr
    assert re.search(r"import tunix\.generate\.utils resolves to .*/deps/src/tunix/generate/utils\.py \(SHADOWS", done.stderr), done.stderr[-5000:]
    for line in done.stderr.splitlines():
        if "SHADOWS" in line or line.startswith(("verify: NO", "Error: building")) or "A plain import" in line:
            _say("shadowed closure base: " + " ".join(line.split()))
