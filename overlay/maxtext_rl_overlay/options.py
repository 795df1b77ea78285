"""The tool's options besides its command line, checked and typed: the
`[tool.maxtext-rl-overlay]` table of pyproject.toml and the MRL_* environment
variables. Their names, types and defaults are declared here and nowhere
else, and each value is checked when it is read: a wrong type, or a misspelt
key (with the nearest known one), is refused with its place and what was
expected, instead of falling back to a default or failing later. The pin
files (pins.py) and the matrix table (testmatrix.py) are read with the same
checks. README.md, "Configuration", documents the schema."""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import pathlib
from collections.abc import Mapping
from typing import Any

from .errors import OverlayError

# -- typed values ------------------------------------------------------------


def refuse_unknown(found: set[str], known: set[str], where: str) -> None:
    """A misspelt key would otherwise fall back to a default silently."""
    unknown = sorted(found - known)
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise OverlayError(f"{where}: unknown key(s) {', '.join(hints)}; known: {', '.join(sorted(known))}.")


_REQUIRED: Any = object()


def table(value: object, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise OverlayError(f"{where} must be a table, not {value!r}.")
    return value


def _get(data: Mapping[str, Any], key: str, where: str, default: Any) -> Any:
    if key in data:
        return data[key]
    if default is _REQUIRED:
        raise OverlayError(f"{where} lacks the key {key!r}.")
    return default


def string(data: Mapping[str, Any], key: str, where: str, default: Any = _REQUIRED) -> str:
    value = _get(data, key, where, default)
    if not isinstance(value, str):
        raise OverlayError(f"{where}: {key} must be a string, not {value!r}.")
    return value


def boolean(data: Mapping[str, Any], key: str, where: str, default: Any = _REQUIRED) -> bool:
    value = _get(data, key, where, default)
    if not isinstance(value, bool):
        raise OverlayError(f"{where}: {key} must be true or false, not {value!r}.")
    return value


def natural(data: Mapping[str, Any], key: str, where: str, default: Any = _REQUIRED) -> int:
    """A whole number, 0 or more (TOML's booleans are not numbers here)."""
    value = _get(data, key, where, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise OverlayError(f"{where}: {key} must be a whole number (0 or more), not {value!r}.")
    return value


def strings(data: Mapping[str, Any], key: str, where: str, default: Any = _REQUIRED) -> tuple[str, ...]:
    value = _get(data, key, where, default)
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise OverlayError(f"{where}: {key} must be a list of strings, not {value!r}.")
    return tuple(value)


def string_table(data: Mapping[str, Any], key: str, where: str, default: Any = _REQUIRED) -> dict[str, str]:
    """A table of string values, such as `env = { NAME = "value" }`."""
    value = _get(data, key, where, default)
    wrong = {k: v for k, v in value.items() if not isinstance(v, str)} if isinstance(value, dict) else None
    if wrong is None or wrong:
        shown = ", ".join(f"{k} = {v!r}" for k, v in wrong.items()) if wrong else repr(value)
        raise OverlayError(f"{where}: {key} must be a table of strings (NAME = \"value\"), not {shown}.")
    return dict(value)


# -- pyproject.toml [tool.maxtext-rl-overlay] -------------------------------

#: The table's own keys; `matrix` has its schema in testmatrix.load_matrix.
PROJECT_KEYS = {"revision", "maxtext", "torch", "matrix"}
MAXTEXT_KEYS = {"extra", "overrides-file", "vllm-adapter"}
TORCH_KEYS = {"find-links"}


@dataclasses.dataclass(frozen=True)
class MaxTextOptions:
    """[tool.maxtext-rl-overlay.maxtext]: the MaxText release of the extra."""
    overrides_file: str  # its overrides file, inside its wheel
    extra: str = "maxtext"  # the overlay's extra that names the release
    vllm_adapter: str = ""  # its folder holding MaxText's vLLM plugin; "" for none


@dataclasses.dataclass(frozen=True)
class TorchOptions:
    """[tool.maxtext-rl-overlay.torch]: where the CPU torch is published."""
    find_links: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ProjectOptions:
    revision: int  # the local label of every wheel is mrl.<revision>
    maxtext: MaxTextOptions
    torch: TorchOptions
    matrix: Mapping[str, Any]  # checked by testmatrix.load_matrix, where it is used


def project_options(data: object, where: str) -> ProjectOptions:
    """pyproject.toml's [tool.maxtext-rl-overlay], checked."""
    where = f"{where} [tool.maxtext-rl-overlay]"
    data = table(data, where)
    refuse_unknown(set(data), PROJECT_KEYS, where)
    maxtext_where = f"{where[:-1]}.maxtext]"
    maxtext = table(_get(data, "maxtext", where, _REQUIRED), maxtext_where)
    refuse_unknown(set(maxtext), MAXTEXT_KEYS, maxtext_where)
    torch_where = f"{where[:-1]}.torch]"
    torch = table(data.get("torch", {}), torch_where)
    refuse_unknown(set(torch), TORCH_KEYS, torch_where)
    return ProjectOptions(
        revision=natural(data, "revision", where),
        maxtext=MaxTextOptions(
            overrides_file=string(maxtext, "overrides-file", maxtext_where),
            extra=string(maxtext, "extra", maxtext_where, MaxTextOptions.extra),
            vllm_adapter=string(maxtext, "vllm-adapter", maxtext_where, MaxTextOptions.vllm_adapter),
        ),
        torch=TorchOptions(strings(torch, "find-links", torch_where, TorchOptions.find_links)),
        matrix=table(data.get("matrix", {}), f"{where[:-1]}.matrix]"),
    )


# -- the environment ----------------------------------------------------------

#: Every MRL_* variable the tool reads, and what it means (its default).
VARIABLES = {
    "MRL_CACHE_DIR": "the build cache (default: $XDG_CACHE_HOME/maxtext-rl-overlay, or ~/.cache/maxtext-rl-overlay)",
    "MRL_REFRESH": "1: resolve the closure afresh, whatever the cache holds (default: 0)",
    "MRL_CLOSURE_MAX_AGE": "seconds a cached resolution of the closure is reused (default: 86400, a day)",
    "MRL_PYTHON": "the interpreter of the matrix's cells, tried before python3.X on PATH and pyenv's (default: none)",
}
#: How long a cached resolution is reused, in seconds.
CLOSURE_MAX_AGE = 24 * 3600.0
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class Settings:
    cache_dir: pathlib.Path
    refresh: bool = False
    closure_max_age: float = CLOSURE_MAX_AGE
    python: str | None = None


def settings(environ: Mapping[str, str] | None = None) -> Settings:
    """The MRL_* variables of the environment (this process's by default), checked."""
    env = os.environ if environ is None else environ
    cache = env.get("MRL_CACHE_DIR") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "maxtext-rl-overlay")
    refresh = env.get("MRL_REFRESH", "").strip().lower()
    if refresh not in _TRUE + _FALSE:
        raise OverlayError(f"MRL_REFRESH={env['MRL_REFRESH']!r}: expected 1 (resolve afresh) or 0.")
    age_text = env.get("MRL_CLOSURE_MAX_AGE", "").strip()
    try:
        age = float(age_text) if age_text else CLOSURE_MAX_AGE
    except ValueError:
        age = math.nan
    if not 0 <= age < math.inf:
        raise OverlayError(f"MRL_CLOSURE_MAX_AGE={env['MRL_CLOSURE_MAX_AGE']!r}: expected a number of seconds (0 or more).")
    return Settings(cache_dir=pathlib.Path(cache).expanduser().absolute(), refresh=refresh in _TRUE, closure_max_age=age,
                    python=env.get("MRL_PYTHON") or None)


#: MRL_* variables of the scripts and the test suites, not of the tool
#: (README.md lists them with the tool's).
TEST_VARIABLES = ("MRL_SOURCES", "MRL_WORK", "MRL_KEEP", "MRL_PLATFORM", "MRL_QUICK", "MRL_MAXTEXT", "MRL_MAXTEXT_SHIMS",
                  "MRL_BENCH_PYTHON", "MRL_PAGES_URL")
