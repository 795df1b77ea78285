"""The build environment of a distribution whose C++ extensions link torch (vLLM).

An isolated build would install whatever torch the source's build-system asks
for. The extensions must link the torch the user will run, the closure's, so
such a distribution is built without isolation in an environment made here:
the source's own build requirements, with torch replaced by the closure's.
The source's torch requirement must admit that torch; a mismatch is an error
at build time, not an import failure on the TPU VM.

A CUDA build of torch (the PyPI stand-in for the CPU build) cannot be built
against without the CUDA toolkit, even for extensions that use no CUDA: its
CMake config stops when it finds none. The toolkit then comes from PyPI, at
the version that torch itself requires (cuda-toolkit), and the extensions
link libtorch_cuda.so as well: they need that CUDA torch at run time, which
is the stand-in closure's.

The rest of the build requirements (cmake, ninja, setuptools-scm,
setuptools-rust, jinja2, ... : the toolchain) are pinned with hashes in a
generated file beside the pin, `patches/<dist>/build-requirements.txt`,
whose header says how it was made and from which requirements. The build
installs exactly those (`--require-hashes`), then torch under them, so that
a re-run of a release tag weeks later builds with the same tools. The file
is resolved again only when the tree's requirements no longer match the
ones it records (a moved pin), preferring its old versions, against the
registry as of the project's resolution cutoff (which its header names);
the build says so, and the new file is to be committed.

Environments are cached by their inputs (a buildcache.Entry): the pinned
toolchain (versions and hashes), torch, the interpreter and the resolution
cutoff (torch's own requirements are resolved when it is installed, against
the registry as of the cutoff). A venv cannot be
moved once made, so one is made in place and its record written only at the
end (Entry.make, in place); an incomplete one is made again."""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import shutil
import sys
import tempfile
import tomllib
from importlib import resources
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .. import probes
from ..cache import buildcache, cachekeys
from ..config.target import Torch
from ..core.errors import OverlayError
from ..core.output import step
from ..core.proc import run
from ..core.staging import write_atomically

#: Bumped when what a kept build environment's record says changes.
BUILDENV_CACHE_FORMAT = 2
BUILD_CONSTRAINTS = resources.files("maxtext_rl_overlay") / "resources" / "build-constraints.txt"
#: The pinned build toolchain of a distribution built here, in its pin's folder.
TOOLCHAIN_FILE = "build-requirements.txt"
_INPUT = "# Input (the tree's build-system requires, torch aside): "
#: The parts of the CUDA toolkit a CUDA torch's CMake config needs to configure.
CUDA_TOOLKIT_EXTRAS = "nvcc,crt,nvvm,cccl,cudart"


@dataclasses.dataclass(frozen=True)
class BuildEnv:
    root: pathlib.Path  # the venv (its path must not reach the wheel's bytes)
    python: pathlib.Path
    env: dict[str, str]  # what the build runs with: PATH first, and CUDA settings for a CUDA torch
    torch: str  # the torch distribution installed there (its version)
    cuda: str  # its CUDA version, "" for a CPU build


def prepare(who: str, tree: pathlib.Path, torch: Torch, python: str, cache: pathlib.Path, toolchain_file: pathlib.Path, cutoff: str) -> BuildEnv:
    requires = _build_requires(who, tree, torch)
    toolchain = pinned_toolchain(who, requires, python, toolchain_file, cutoff)
    inputs = {"format": BUILDENV_CACHE_FORMAT, "toolchain": _pins_and_hashes(toolchain), "torch": torch.version,
              "find_links": list(torch.find_links), "python": _version_of(python), "exclude_newer": cutoff}
    key = cachekeys.key(inputs)
    entry = buildcache.KINDS["buildenv"].entry(cache, key, key, who=who)
    root = entry.path
    # Under the entry's lock: an incomplete environment (no record) is one a
    # build was interrupted in (no other build can be filling it), so it is
    # made again; a concurrent build wanting the same one waits for it.
    with entry.locked():
        info = kept_environment(entry)
        if info is None:
            with step(who, f"making the build environment with torch=={torch.version} ({key[:12]})"):
                # A full disk, a failed install: no half-made environment is left.
                info = entry.make(lambda root: {**_make(who, root, python, toolchain, torch, cutoff), "inputs": inputs}, in_place=True)
    if info["version"] != torch.version:
        raise OverlayError(f"{who}: the build environment {root} holds torch {info['version']}, not the closure's {torch.version}; delete it and build again.")
    bindir = root / "bin"
    # No RPATH: CMake would set one naming this environment's torch and blank
    # it at install without shrinking the string table, so the path's length
    # would reach the wheel's bytes (and no installed wheel may point here).
    env = {"PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}", "CMAKE_ARGS": "-DCMAKE_SKIP_RPATH=ON"}
    if info["cuda"]:
        cuda = pathlib.Path(info["cuda_home"])
        env.update(
            CUDA_HOME=str(cuda),
            PATH=f"{bindir}{os.pathsep}{cuda / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
            CMAKE_ARGS=f"{env['CMAKE_ARGS']} -DCUDA_TOOLKIT_ROOT_DIR={cuda} -DCUDAToolkit_ROOT={cuda} -DCMAKE_CUDA_COMPILER={cuda / 'bin' / 'nvcc'}",
        )
        step.note(who, f"built against torch {info['version']} (CUDA {info['cuda']} build: the stand-in); its extensions will link libtorch_cuda.so too")
    else:
        step.note(who, f"built against torch {info['version']} (CPU build)")
    return BuildEnv(root, bindir / "python", env, info["version"], info["cuda"])


def _build_requires(who: str, tree: pathlib.Path, torch: Torch) -> list[str]:
    """The source's build requirements but torch (whose requirement must
    admit the closure's torch), sorted."""
    try:
        requires = tomllib.loads((tree / "pyproject.toml").read_text())["build-system"]["requires"]
    except (FileNotFoundError, KeyError, tomllib.TOMLDecodeError):
        raise OverlayError(f"{who}: the source has no [build-system] requires in pyproject.toml to make its build environment from.") from None
    out, found = [], False
    for text in requires:
        req = Requirement(text)
        if req.name != "torch":
            out.append(text)
            continue
        found = True
        if not req.specifier.contains(torch.version, prereleases=True):
            raise OverlayError(
                f"{who}: its build-system requires {text!r}, but the closure's torch is {torch.version} "
                f"(MaxText asks for torch=={torch.wanted}). The extensions must be built against the torch "
                "the user runs: move the pin to a commit built for that torch, or the MaxText release."
            )
    if not found:
        raise OverlayError(f"{who}: its pin says it builds against torch ([build] torch = true), but its build-system does not require torch.")
    return sorted(out)


def pinned_toolchain(who: str, requires: list[str], python: str, path: pathlib.Path, cutoff: str) -> str:
    """The text of `path`, the pinned toolchain for `requires`: read as it
    is when it records these requirements, else resolved (preferring its
    old versions, against the registry as of `cutoff`) and written."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        text, reason = "", "there is none yet"
    else:
        if _recorded_input(text) == requires:
            step.note(who, f"build toolchain: {len(_pins_and_hashes(text))} packages pinned with hashes by {path.parent.name}/{path.name}")
            return text
        reason = "the tree's build requirements are not the ones it records"
    with tempfile.TemporaryDirectory(prefix="mrl-toolchain-") as tmp:
        out = pathlib.Path(tmp) / TOOLCHAIN_FILE
        # uv keeps the pins of an existing output file where it can: the old versions are preferred.
        out.write_text("".join(f"{name}=={version}\n" for name, (version, _) in _pins_and_hashes(text).items()))
        backends = pathlib.Path(tmp) / "build-constraints.txt"
        backends.write_text(BUILD_CONSTRAINTS.read_text())
        flags = ["--generate-hashes", "--no-header", "--quiet", "-c", backends.name, "--exclude-newer", cutoff]
        with step(who, f"resolving the build toolchain ({reason})"):
            _run(who, ["uv", "pip", "compile", "-", *flags, "--python", python, "--output-file", out.name], "resolving the build toolchain",
                 cwd=pathlib.Path(tmp), input="".join(f"{r}\n" for r in requires))
        body = out.read_text()
    header = [
        f"# The build toolchain of {who}, pinned with hashes: generated by `maxtext-rl-overlay build`; do not edit.",
        "# The build installs exactly these (uv pip install --require-hashes --no-deps -r), then the closure's torch under them.",
        "# Resolved again, preferring these versions, only when the tree's build requirements change: commit the result.",
        f"# Made by: uv pip compile - {' '.join(flags)} --python PYTHON --output-file {TOOLCHAIN_FILE}",
        f"#   with {cachekeys.uv_version()}, PYTHON {_version_of(python).split()[0]} on {sys.platform} {os.uname().machine}; "
        f"build-constraints.txt: the tool's pinned build backends; stdin: the input below",
        _INPUT + json.dumps(requires),
    ]
    text = "\n".join(header) + "\n" + body
    write_atomically(path, text)
    step.note(who, f"wrote the pinned build toolchain {path} ({len(_pins_and_hashes(text))} packages): commit it")
    return text


def _recorded_input(text: str) -> list[str] | None:
    for line in text.splitlines():
        if line.startswith(_INPUT):
            try:
                value = json.loads(line[len(_INPUT):])
            except ValueError:
                return None
            return [str(v) for v in value] if isinstance(value, list) else None
    return None


def _pins_and_hashes(text: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """{name: (version, sorted hashes)} of a hashed requirements file."""
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    name = ""
    for line in text.splitlines():
        if "==" in line and line[:1] not in " \t#-":
            name, version = line.split("==", 1)
            name = canonicalize_name(name)
            out[name] = (version.split()[0].rstrip("\\"), ())
        elif name and line.strip().startswith("--hash="):
            version, hashes = out[name]
            out[name] = (version, tuple(sorted((*hashes, line.strip().split("=", 1)[1].rstrip(" \\")))))
    return out


def _version_of(python: str) -> str:
    return str(cachekeys.python_version(python, what=f"asking {python} its version"))


def _run(who: str, cmd: list[str], what: str, cwd: pathlib.Path | None = None, input: str | None = None) -> str:
    return str(run(cmd, who=who, what=what, env={"UV_PYTHON_DOWNLOADS": "never"}, log=True, cwd=cwd, input=input).stdout)


def _make(who: str, root: pathlib.Path, python: str, toolchain: str, torch: Torch, cutoff: str) -> dict[str, Any]:
    uv = shutil.which("uv") or "uv"
    vpy = str(root / "bin" / "python")
    links = [a for link in torch.find_links for a in ("--find-links", link)]
    with tempfile.TemporaryDirectory(prefix="mrl-buildenv-") as tmp:
        lockfile = pathlib.Path(tmp) / TOOLCHAIN_FILE
        lockfile.write_text(toolchain)
        _run(who, [uv, "venv", "--quiet", "-p", python, str(root)], "making the build venv")
        _run(who, [uv, "pip", "install", "--quiet", "-p", vpy, "--require-hashes", "--no-deps", "-r", str(lockfile)],
             "installing the pinned build toolchain")
        # torch and what it needs under the toolchain's pins (and their hashes): what they share stays as pinned.
        # What torch needs beyond them is resolved against the registry as of the cutoff.
        under = [uv, "pip", "install", "--quiet", "-p", vpy, "-c", str(lockfile), "--exclude-newer", cutoff]
        _run(who, [*under, *links, f"torch=={torch.version}"], "installing torch")
        info = json.loads(_run(who, probes.command(vpy, "torch_build"), "importing torch in the build venv").strip().splitlines()[-1])
        if info["version"] != torch.version:
            raise OverlayError(f"{who}: the build venv got torch {info['version']}, not the closure's {torch.version}.")
        if info["cuda"]:
            toolkit = [r for r in info["requires"] if Requirement(r).name == "cuda-toolkit"]
            pinned = [s.version for r in toolkit for s in Requirement(r).specifier if s.operator == "=="]
            if len(pinned) != 1:
                raise OverlayError(f"{who}: torch {info['version']} is a CUDA build but does not pin cuda-toolkit ({toolkit}); "
                                   "cannot choose the toolkit to build against.")
            _run(who, [*under, f"cuda-toolkit[{CUDA_TOOLKIT_EXTRAS}]=={pinned[0]}"], "installing the CUDA toolkit")
            info["cuda_home"] = str(_link_toolkit(who, root, info["cuda"]))
    return dict(info)  # the record, written last by the entry: what says that the environment is complete


def kept_environment(entry: buildcache.Entry) -> dict[str, Any] | None:
    """The record of a complete build environment; None for none (an
    environment a build was stopped in, without its record) or a damaged
    one (said and removed): it is made again."""

    def check(record: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(record["version"], str) or not isinstance(record["cuda"], str):
            raise buildcache.Damaged
        return record

    return entry.reuse(check)


def _link_toolkit(who: str, root: pathlib.Path, cuda: str) -> pathlib.Path:
    """The pip-installed toolkit as CMake's FindCUDAToolkit expects a CUDA
    installation to look: unversioned library names and a lib64 folder."""
    major = cuda.split(".")[0]
    homes = list(root.glob(f"lib/python*/site-packages/nvidia/cu{major}"))
    if len(homes) != 1 or not (homes[0] / "bin" / "nvcc").is_file():
        raise OverlayError(f"{who}: the CUDA {cuda} toolkit is not where cuda-toolkit installs it (nvidia/cu{major} with bin/nvcc) in {root}.")
    home = homes[0]
    for lib in ("cudart", "nvrtc"):
        versioned = home / "lib" / f"lib{lib}.so.{major}"
        link = home / "lib" / f"lib{lib}.so"
        if versioned.is_file() and not link.exists():
            link.symlink_to(versioned.name)
    if not (home / "lib64").exists():
        (home / "lib64").symlink_to("lib")
    return home
