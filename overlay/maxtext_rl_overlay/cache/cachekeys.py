"""What a kept result is keyed by: the sha256 of a record of its inputs.

Contents rather than paths, and what the answer depends on besides them:
the uv that made it and how it was configured (uv_identity), the C and C++
compilers of a compiled wheel (compiler_identity), and the tool's own code
(tool_digest). A change to any of them is a miss in the cache (buildcache),
never a stale answer."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import pathlib
import shlex
import shutil
import sys
import tempfile
import tomllib
from collections.abc import Mapping
from importlib import resources
from typing import Any

from .. import probes
from ..core import proc


def key(inputs: dict[str, Any]) -> str:
    """The sha256 of a record of inputs (JSON, keys sorted)."""
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


@functools.cache
def tool_digest() -> str:
    """The sha256 of this package's code and resources: a result made by
    another version of the tool is not reused."""
    digest = hashlib.sha256()
    package = resources.files("maxtext_rl_overlay")
    paths = sorted(p for p in pathlib.Path(str(package)).rglob("*") if p.is_file() and p.suffix in (".py", ".txt"))
    for path in paths:
        digest.update(f"{path.relative_to(str(package))}\0".encode() + path.read_bytes() + b"\0")
    return digest.hexdigest()


def uv_identity(python: str) -> dict[str, Any]:
    """What uv's answer depends on besides its arguments: its version, the
    interpreter it runs builds with, the UV_* variables (as digests: they
    may hold secrets) and the settings files it may read."""
    return {
        "uv": uv_version(),
        "interpreter": _interpreter(python),
        "uv_environment": {k: _sha(v) for k, v in sorted(os.environ.items()) if k.startswith("UV_") and k not in _UV_NEUTRAL},
        "uv_config": _uv_config(),
    }


def compiler_identity(env: Mapping[str, str]) -> dict[str, str]:
    """The C and C++ compilers a build with `env` (its whole environment)
    compiles with: CC and CXX, else the cc and c++ on its PATH (CMake's and
    setuptools' first choices), each as the file it is and what its
    --version says. After a compiler upgrade a kept compiled wheel is a miss,
    as a cold build would compile with the new one."""
    path = env.get("PATH", "")
    return {var: compiler_version(env.get(var) or default, path) for var, default in (("CC", "cc"), ("CXX", "c++"))}


@functools.cache
def compiler_version(command: str, path: str) -> str:
    words = shlex.split(command)
    found = shutil.which(words[0], path=path) if words else None
    if found is None:
        return f"{command}: not found"
    done = proc.run([found, *words[1:], "--version"], check=False, what=f"reading the version of the compiler {command}")
    return f"{command} ({os.path.realpath(found)}), exit {done.returncode}: {str(done.stdout).strip()}"


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


#: uv variables that change how it works, not what it resolves to; every
#: other UV_* variable is part of the key (an unknown one costs a miss, never
#: a wrong answer).
_UV_NEUTRAL = frozenset({
    "UV_CACHE_DIR", "UV_NO_CACHE", "UV_NO_PROGRESS", "UV_CONCURRENT_DOWNLOADS", "UV_CONCURRENT_BUILDS",
    "UV_CONCURRENT_INSTALLS", "UV_HTTP_TIMEOUT", "UV_REQUEST_TIMEOUT", "UV_HTTP_RETRIES", "UV_LINK_MODE",
    "UV_PYTHON_DOWNLOADS", "UV_COLOR", "UV_NO_WRAP", "UV_LOG_CONTEXT",
})


@functools.cache
def _interpreter(python: str) -> str:
    """The interpreter uv runs builds with (also the resolver's, which builds
    the metadata of sdists): its path and version."""
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        return f"{os.path.realpath(python)} {sys.version}"
    said = python_version(python, what="reading the interpreter's version")
    return f"{os.path.realpath(python)} {said}"


def python_version(python: str, *, what: str, check: bool = True) -> str | None:
    """`python`'s sys.version, as it says it (probes/python_version.py);
    with check=False, None for one that does not run."""
    done = proc.run(probes.command(python, "python_version"), what=what, check=check)
    return str(done.stdout).strip() if done.returncode == 0 else None


@functools.cache
def uv_version() -> str:
    return str(proc.run(["uv", "--version"], what="reading uv's version").stdout).strip()


def _uv_config() -> dict[str, str]:
    """sha256 of the uv settings files uv may read here: the user's and the
    system's uv.toml, UV_CONFIG_FILE, and uv.toml or [tool.uv] of
    pyproject.toml in this folder or any above it."""
    home = os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config")
    candidates = [pathlib.Path(home) / "uv" / "uv.toml", pathlib.Path("/etc/uv/uv.toml")]
    candidates += [pathlib.Path(d) / "uv" / "uv.toml" for d in os.environ.get("XDG_CONFIG_DIRS", "").split(":") if d]
    if os.environ.get("UV_CONFIG_FILE"):
        candidates.append(pathlib.Path(os.environ["UV_CONFIG_FILE"]))
    # uv reads the nearest project's settings above the folder it runs in:
    # this one, or a temporary folder (the resolutions run there).
    for folder in (pathlib.Path.cwd(), pathlib.Path(tempfile.gettempdir())):
        for d in (folder, *folder.parents):
            candidates += [d / "uv.toml", d / "pyproject.toml"]
    found = {}
    for path in candidates:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if path.name == "pyproject.toml":
            try:
                table = tomllib.loads(data.decode()).get("tool", {}).get("uv")
            except (UnicodeDecodeError, tomllib.TOMLDecodeError):
                table = data.decode(errors="replace")
            if table is None:
                continue
            data = json.dumps(table, sort_keys=True, default=str).encode()
        found[str(path)] = hashlib.sha256(data).hexdigest()
    return found
