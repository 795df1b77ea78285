"""The configuration reader: the tool's settings besides its command line,
checked and typed: the `[tool.maxtext-rl-overlay]` table of pyproject.toml
(and what the build reads of its `[project]` table) and the MRL_*
environment variables. Their names are the schema's (schema.py, which also
documents their types and defaults and generates docs/configuration.md's
tables); each value is checked when it is read: a wrong type, or a misspelt
key (with the nearest known one), is refused with its place and what was
expected, instead of falling back to a default or failing later. The pin
files (pins.py) and the matrix table (testmatrix.py) are read with the same
checks. Also here: the cache folder's layers (cache_dir), the one value of
the command line that two stages read (an upstream's source, NAME=PATH),
and the TPU cell's host stand-ins active in the process (host_stand_ins)."""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import os
import pathlib
import re
import sys
from collections.abc import Mapping, Sequence, Set
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

from ..core.errors import OverlayError, UsageError
from . import schema

# -- typed values ------------------------------------------------------------


def refuse_unknown(found: Set[str], known: Set[str], where: str) -> None:
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


def version(data: Mapping[str, Any], key: str, where: str, default: Any = _REQUIRED) -> str:
    """A public PEP 440 version in its normal form: the tool appends its own
    local label (+mrl.N), and the wheel's name carries the normal form, so
    any other spelling fails only once a wheel is built."""
    value = string(data, key, where, default)
    try:
        normal = Version(value)
    except InvalidVersion:
        raise OverlayError(f"{where}: {key} = {value!r} is not a PEP 440 version (such as 1.2.3 or 0.25.0.dev20260727).") from None
    if normal.local is not None:
        raise OverlayError(f"{where}: {key} = {value!r} has a local label (+{normal.local}); the build adds its own (+mrl.N): "
                           f"write {normal.public!r}.")
    if str(normal) != value:
        raise OverlayError(f"{where}: {key} = {value!r} is not in PEP 440's normal form: write {str(normal)!r}.")
    return value


def iso_date(data: Mapping[str, Any], key: str, where: str, default: Any = _REQUIRED) -> str:
    """An ISO 8601 date and time with its UTC offset (as `git log --format=%cI`
    prints it), or "" for none: it becomes a wheel's SOURCE_DATE_EPOCH, which
    a time without an offset would make depend on the machine's time zone."""
    value = string(data, key, where, default)
    if value:
        try:
            when: datetime.datetime | None = datetime.datetime.fromisoformat(value)
        except ValueError:
            when = None
        if when is None or when.tzinfo is None:
            raise OverlayError(f"{where}: {key} = {value!r} is not an ISO 8601 date and time with its UTC offset, "
                               "such as 2026-07-27T09:44:06-07:00 (git log -1 --format=%cI COMMIT), or \"\" for none.")
    return value


#: The one spelling of a resolution cutoff: an RFC 3339 time in UTC, to the second.
_CUTOFF = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
CUTOFF_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


def cutoff_value(value: str, where: str) -> str:
    """A resolution cutoff, such as 2026-12-01T12:00:00Z: RFC 3339, UTC, to
    the second, and in that one spelling (it is a cache key and the
    constraints header's words, so two spellings of one time would be two
    inputs). Returned as given."""
    try:
        ok = bool(_CUTOFF.match(value)) and datetime.datetime.strptime(value, CUTOFF_FORMAT) is not None
    except ValueError:
        ok = False
    if not ok:
        raise OverlayError(f"{where}: {value!r} is not a time in UTC written as YYYY-MM-DDTHH:MM:SSZ, such as 2026-12-01T12:00:00Z.")
    return value


def cutoff_now() -> str:
    """This moment as a resolution cutoff (UTC, to the second): the moment
    SOURCE_DATE_EPOCH names where it is set (reproducible-builds' "the
    current time" for a run that must give the same bytes twice, such as a
    rebase replayed after a kill), else the clock's."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    if epoch:
        if not epoch.isdigit():
            raise OverlayError(f"SOURCE_DATE_EPOCH must be whole seconds since 1970, not {epoch!r}.")
        return datetime.datetime.fromtimestamp(int(epoch), datetime.UTC).strftime(CUTOFF_FORMAT)
    return datetime.datetime.now(datetime.UTC).strftime(CUTOFF_FORMAT)


def cutoff(data: Mapping[str, Any], key: str, where: str, default: Any = _REQUIRED) -> str:
    """[tool.maxtext-rl-overlay] resolution-cutoff: see cutoff_value."""
    return cutoff_value(string(data, key, where, default), f"{where}: {key}")


def requirements(data: Mapping[str, Any], key: str, where: str, default: Any = _REQUIRED) -> tuple[str, ...]:
    """A list of PEP 508 requirements, such as `dependencies = ["packaging>=24"]`."""
    value = strings(data, key, where, default)
    for text in value:
        try:
            Requirement(text)
        except InvalidRequirement as exc:
            raise OverlayError(f"{where}: {key} holds {text!r}, which is not a requirement ({str(exc).splitlines()[0]}).") from None
    return value


def string_table(data: Mapping[str, Any], key: str, where: str, default: Any = _REQUIRED) -> dict[str, str]:
    """A table of string values, such as `env = { NAME = "value" }`."""
    value = _get(data, key, where, default)
    wrong = {k: v for k, v in value.items() if not isinstance(v, str)} if isinstance(value, dict) else None
    if wrong is None or wrong:
        shown = ", ".join(f"{k} = {v!r}" for k, v in wrong.items()) if wrong else repr(value)
        raise OverlayError(f"{where}: {key} must be a table of strings (NAME = \"value\"), not {shown}.")
    return dict(value)


def named_source(text: str, known: Sequence[str]) -> tuple[str, str]:
    """`--source NAME=PATH` of build and rebase: one of the `known`
    distributions (pins.DISTRIBUTIONS) and where to take it from. Raises
    ValueError saying what is wrong (the CLI shows it as a usage error)."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise ValueError(f"expected NAME=PATH, got {text!r}")
    if name not in known:
        raise ValueError(f"unknown distribution {name!r} in {text!r}; choose from {', '.join(known)}")
    return name, path


def named_sources(given: Sequence[tuple[str, str]]) -> dict[str, str]:
    """Every `--source NAME=PATH` of a command (build, tpu-cell bundle), by
    name; a name given twice is a usage error."""
    sources: dict[str, str] = {}
    for name, path in given:
        if name in sources:
            raise UsageError(f"--source {name} given twice.")
        sources[name] = path
    return sources


def project_root(given: pathlib.Path | None, start: pathlib.Path | None = None) -> pathlib.Path:
    """The checkout a command works in: --project DIR, else the one holding
    `start` (the current folder)."""
    if given is not None:
        return given
    here = start or pathlib.Path.cwd()
    for path in (here, *here.parents):
        if (path / "patches").is_dir() and (path / "pyproject.toml").is_file():
            return path
    raise OverlayError(f"{here} is not inside a maxtext-rl-overlay checkout (no patches/ and pyproject.toml above it); pass --project.")


# -- pyproject.toml [tool.maxtext-rl-overlay] -------------------------------

#: The table's own keys (`matrix`'s inside are testmatrix.load_matrix's), and
#: its sub-tables'.
PROJECT_KEYS = schema.keys(schema.PYPROJECT)
MAXTEXT_KEYS = schema.keys(schema.PYPROJECT, "maxtext")
TORCH_KEYS = schema.keys(schema.PYPROJECT, "torch")


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
    # uv's --exclude-newer for every resolution the tool makes against the registry (YYYY-MM-DDTHH:MM:SSZ):
    # the registry as of that time is an input, declared here, so a commit resolves to one closure on any day.
    resolution_cutoff: str
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
        resolution_cutoff=cutoff(data, "resolution-cutoff", where),
        maxtext=MaxTextOptions(
            overrides_file=string(maxtext, "overrides-file", maxtext_where),
            extra=string(maxtext, "extra", maxtext_where, MaxTextOptions.extra),
            vllm_adapter=string(maxtext, "vllm-adapter", maxtext_where, MaxTextOptions.vllm_adapter),
        ),
        torch=TorchOptions(strings(torch, "find-links", torch_where, TorchOptions.find_links)),
        matrix=table(data.get("matrix", {}), f"{where[:-1]}.matrix]"),
    )


# -- pyproject.toml [project]: what the build reads of it --------------------

#: What the build writes into the overlay's own wheel, so none may be dynamic.
_STATIC = ("version", "dependencies", "optional-dependencies")


def project_metadata(data: object, where: str, maxtext: MaxTextOptions) -> dict[str, Any]:
    """pyproject.toml's [project] table, checked for what the build reads and
    edits of it (a static version, the dependencies and the extras, each a
    requirement) and for the cross-reference of [tool.maxtext-rl-overlay.maxtext]
    `extra`; returned as it is. Wrong here, the build would fail only after
    every upstream wheel was built."""
    pyproject = where
    where = f"{where} [project]"
    data = table(data, where)
    dynamic = [key for key in strings(data, "dynamic", where, ()) if key in _STATIC]
    if dynamic:
        raise OverlayError(f"{where}: dynamic lists {', '.join(dynamic)}, which the build reads and writes as static values (the "
                           "overlay's wheel gets its version from them, and the exact overlay builds added to its dependencies): "
                           "set them in [project] and take them out of dynamic.")
    version(data, "version", where)
    if "dependencies" not in data:
        raise OverlayError(f"{where} lacks the key 'dependencies': the build adds the overlay builds to it (write dependencies = [] for none).")
    strings(data, "dependencies", where)
    extras_where = f"{where[:-1]}.optional-dependencies]"
    extras = table(data.get("optional-dependencies", {}), extras_where)
    for name in extras:
        strings(extras, name, extras_where)
    maxtext_requirement(extras, maxtext, pyproject)
    requirements(data, "dependencies", where)
    for name in extras:
        requirements(extras, name, extras_where)
    return data


def maxtext_requirement(extras: Mapping[str, Any], maxtext: MaxTextOptions, pyproject: str) -> Requirement:
    """The MaxText release that [tool.maxtext-rl-overlay.maxtext] `extra`
    names: that extra of [project.optional-dependencies] must exist and hold
    exactly one requirement, name[extra]==version."""
    name = maxtext.extra
    if name not in extras:
        close = difflib.get_close_matches(name, sorted(extras), n=1)
        raise OverlayError(f"{pyproject} [tool.maxtext-rl-overlay.maxtext]: extra = {name!r} names no extra of [project.optional-dependencies]"
                           + (f" (did you mean {close[0]!r}?)" if close else "") + f"; its extras: {', '.join(sorted(extras)) or 'none'}.")
    try:
        (text,) = extras[name]
        requirement = Requirement(text)
    except (ValueError, InvalidRequirement) as exc:
        why = f" ({str(exc).splitlines()[0]})" if isinstance(exc, InvalidRequirement) else ""
        raise OverlayError(f"{pyproject}: the [project.optional-dependencies] extra {name!r} must hold "
                           f"exactly one requirement, the MaxText release (name[extra]==version){why}.") from None
    pinned = [s.version for s in requirement.specifier if s.operator == "=="]
    if len(pinned) != 1 or len(requirement.extras) != 1:
        raise OverlayError(f"{pyproject}: the {name!r} extra must name one MaxText release and one of its extras exactly "
                           f"(name[extra]==version), not {text!r}.")
    return requirement


# -- the environment ----------------------------------------------------------

#: Every MRL_* variable the tool reads, and what it means.
VARIABLES = schema.meanings(schema.TOOL_ENVIRONMENT)
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")


@dataclasses.dataclass(frozen=True)
class Settings:
    cache_dir: pathlib.Path
    refresh: bool = False
    python: str | None = None


def settings(environ: Mapping[str, str] | None = None) -> Settings:
    """The MRL_* variables of the environment (this process's by default), checked."""
    env = os.environ if environ is None else environ
    refresh = env.get("MRL_REFRESH", "").strip().lower()
    if refresh not in _TRUE + _FALSE:
        raise OverlayError(f"MRL_REFRESH={env['MRL_REFRESH']!r}: expected 1 (resolve afresh) or 0.")
    return Settings(cache_dir=cache_dir(None, env), refresh=refresh in _TRUE, python=env.get("MRL_PYTHON") or None)


def cache_dir(given: pathlib.Path | None = None, environ: Mapping[str, str] | None = None) -> pathlib.Path:
    """The build cache, each layer over the one before (docs/configuration.md,
    "Which value wins"): ~/.cache/maxtext-rl-overlay, XDG_CACHE_HOME's,
    MRL_CACHE_DIR, then `given`: the folder a caller's options name (a
    rebase's or a test's; no command line names one). Every stage asks here,
    so that none spells the order again."""
    if given is not None:
        return given
    env = os.environ if environ is None else environ
    cache = env.get("MRL_CACHE_DIR") or os.path.join(env.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "maxtext-rl-overlay")
    return pathlib.Path(cache).expanduser().absolute()


# -- the TPU cell's host stand-ins ---------------------------------------------

#: The module the host stand-ins are (scripts/tpu-cell/stand_ins/sitecustomize.py,
#: the bundle's stand-ins/): Python imports it as it starts, in every process
#: whose PYTHONPATH holds its folder, and it activates those MRL_HOST_STAND_INS names.
STAND_INS_MODULE = "sitecustomize"


def host_stand_ins(modules: Mapping[str, object] | None = None) -> dict[str, str]:
    """The TPU cell's host stand-ins active in this process, each with what it
    replaces (docs/tpu-cell.md); none on a TPU VM. Read from the stand-ins'
    own module (its ACTIVE) in `modules` (this process's by default), not
    from a variable: the one variable, MRL_HOST_STAND_INS, says what was
    asked, and only the module knows what it made active here. A child
    process (smoke's engine) inherits that variable and PYTHONPATH, runs the
    module as it starts, and so reads the same here. Another sitecustomize
    (the host's own, found first) holds no ACTIVE: none is active then."""
    module = (sys.modules if modules is None else modules).get(STAND_INS_MODULE)
    active = getattr(module, "ACTIVE", None)
    if not isinstance(active, dict):
        return {}
    return {str(name): str(what) for name, what in active.items()}


#: MRL_* variables of the scripts and the test suites, not of the tool
#: (the schema lists them with the tool's, for the docs).
TEST_VARIABLES = tuple(schema.meanings(schema.SCRIPT_ENVIRONMENT))
