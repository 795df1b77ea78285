"""The pins: which upstream commit each distribution is built from, and its
patch series. Read once from patches/<dist>/pin.toml and patches/<dist>/series
(the single source of truth) into plain, immutable data."""

from __future__ import annotations

import dataclasses
import pathlib
import re
import tomllib
from typing import Any

from ..core import tomledit
from ..core.errors import OverlayError
from ..core.staging import write_atomically
from . import schema
from .reader import (
    ProjectOptions,
    boolean,
    cutoff_value,
    iso_date,
    project_metadata,
    project_options,
    refuse_unknown,
    string,
    string_table,
    strings,
    table,
    version,
)

#: Build order, and the names --only and --source accept.
DISTRIBUTIONS = ("google-tunix", "tpu-inference", "vllm", "maxtext")
#: Where [build.requirements] overrides look unless a pin's [build]
#: requirement-files says otherwise (vLLM: requirements/tpu.txt).
DEFAULT_REQUIREMENT_FILES = ("pyproject.toml", "requirements.txt")
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
#: How scripts/rebase.sh names the version of a new pin ([rebase] version):
#: "release-tag-dev-date" <newest release tag>.dev<commit date>, as daily
#: builds are named; "pyproject" the static [project] version at the commit;
#: "kept" the previous pin's, for a person to set.
VERSION_RULES = ("release-tag-dev-date", "pyproject", "kept")


@dataclasses.dataclass(frozen=True)
class LastKnownGood:
    """A file in the upstream tree naming the commit of another pinned
    distribution that the upstream's CI verified."""
    file: str  # tree-relative
    pin: str  # the distribution it names a commit of


@dataclasses.dataclass(frozen=True)
class RebasePolicy:
    """What scripts/rebase.sh does for a distribution besides carrying its
    series: patches/<dist>/pin.toml [rebase]."""
    version_rule: str = "kept"
    last_known_good: LastKnownGood | None = None

    def touched(self, name: str) -> tuple[str, ...]:
        """Every project file a rebase of `name` may write (root-relative);
        patches/<name>/ as a folder."""
        other = (f"patches/{self.last_known_good.pin}/pin.toml",) if self.last_known_good else ()
        return (f"patches/{name}", *other, "constraints.txt")


@dataclasses.dataclass(frozen=True)
class Release:
    """A release wheel a series is carried on (pin.toml [release]), where the
    upstream publishes no source distribution: the wheel of the pinned
    commit, unpacked, is the tree the series applies to (MaxText: PyPI has
    its releases as pure-Python wheels only, and the tag's `src/` holds the
    same files but for blobs its snapshot lacks)."""
    wheel: str  # its file name on the package index
    sha256: str

    @property
    def version(self) -> str:
        return self.wheel.split("-")[1]


@dataclasses.dataclass(frozen=True)
class Pin:
    distribution: str
    import_package: str
    repository: str
    commit: str
    tree: str  # "" when the tree id is not recorded yet (vLLM: no mirror here)
    date: str  # the commit's committer date (ISO 8601): the wheels' SOURCE_DATE_EPOCH
    version: str  # the upstream version string the wheel is built as
    build_env: dict[str, str]
    requirement_overrides: dict[str, str]  # requirement name -> replacement
    requirement_files: tuple[str, ...]  # where the overrides look (tree-relative)
    directory: pathlib.Path  # patches/<dist>/
    series: tuple[pathlib.Path, ...]
    # Built against the closure's torch (C++ extensions link it): without
    # build isolation, in a build environment holding exactly that torch.
    needs_torch: bool = False
    rebase: RebasePolicy = RebasePolicy()
    release: Release | None = None  # the series applies to this wheel's files, not to the commit's tree

    @property
    def pin_file(self) -> pathlib.Path:
        return self.directory / "pin.toml"


@dataclasses.dataclass(frozen=True)
class Project:
    root: pathlib.Path
    pins: dict[str, Pin]
    metadata: dict[str, Any]  # pyproject.toml's [project] table, checked (options.project_metadata)
    options: ProjectOptions  # pyproject.toml's [tool.maxtext-rl-overlay] table, checked

    @property
    def revision(self) -> int:
        return self.options.revision

    @property
    def local_label(self) -> str:
        return f"mrl.{self.revision}"

    @property
    def resolution_cutoff(self) -> str:
        """uv's --exclude-newer for every resolution against the registry."""
        return self.options.resolution_cutoff


def read_series(directory: pathlib.Path) -> tuple[pathlib.Path, ...]:
    """The patches named by a quilt `series` file, checked against the folder.

    Quilt's format: one patch a line, `#` starts a comment, options after the
    name (e.g. -p1) are allowed; we accept only -p1, the format-patch default.
    A .patch file in the folder that the series does not name is an error, so
    a patch can never be silently left out.
    """
    series_file = directory / "series"
    if not series_file.is_file():
        raise OverlayError(f"{series_file} is missing: every patches/<dist>/ needs a series file (it may be empty).")
    names: list[str] = []
    for lineno, line in enumerate(series_file.read_text().splitlines(), 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        if fields[1:] not in ([], ["-p1"]):
            raise OverlayError(f"{series_file}:{lineno}: only '-p1' may follow a patch name, got {' '.join(fields[1:])!r}.")
        names.append(fields[0])
    if len(set(names)) != len(names):
        raise OverlayError(f"{series_file} names a patch twice.")
    paths = []
    for name in names:
        path = directory / name
        if not path.is_file():
            raise OverlayError(f"{series_file} names {name}, which is not in {directory}.")
        paths.append(path)
    stray = sorted(p.name for p in directory.glob("*.patch") if p.name not in names)
    if stray:
        raise OverlayError(
            f"{directory} holds patches outside its series: {', '.join(stray)}. "
            f"Add them to {series_file} or delete them."
        )
    return tuple(paths)


_PIN_KEYS = schema.keys(schema.PIN)
_BUILD_KEYS = schema.keys(schema.PIN, "build")
_REBASE_KEYS = schema.keys(schema.PIN, "rebase")
# The parts of one value (schema.py's `rebase.last-known-good`), not settings of their own.
_LAST_KNOWN_GOOD_KEYS = {"file", "pin"}


def read_pin(directory: pathlib.Path) -> Pin:
    pin_file = directory / "pin.toml"
    where = str(pin_file)
    data = read_toml(pin_file)
    refuse_unknown(set(data), _PIN_KEYS, where)
    build_where = f"{pin_file} [build]"
    build = table(data.get("build", {}), build_where)
    refuse_unknown(set(build), _BUILD_KEYS, build_where)
    pin = Pin(
        distribution=string(data, "distribution", where),
        import_package=string(data, "import-package", where),
        repository=string(data, "repository", where),
        commit=string(data, "commit", where),
        tree=string(data, "tree", where),
        date=iso_date(data, "date", where),
        version=version(data, "version", where),
        build_env=string_table(build, "env", build_where, {}),
        requirement_overrides=string_table(build, "requirements", build_where, {}),
        requirement_files=strings(build, "requirement-files", build_where, DEFAULT_REQUIREMENT_FILES),
        needs_torch=boolean(build, "torch", build_where, False),
        directory=directory,
        series=read_series(directory),
        rebase=read_rebase_policy(data.get("rebase", {}), directory.name, f"{pin_file} [rebase]"),
        release=read_release(data.get("release"), f"{pin_file} [release]"),
    )
    if pin.distribution != directory.name:
        raise OverlayError(f"{pin_file} says distribution {pin.distribution!r} but lives in {directory.name}/.")
    if not _HEX40.match(pin.commit) or (pin.tree and not _HEX40.match(pin.tree)):
        raise OverlayError(f"{pin_file}: commit and tree must be 40 lower-case hex digits.")
    return pin


_RELEASE_KEYS = schema.keys(schema.PIN, "release")


def read_release(data: object, where: str) -> Release | None:
    """A pin file's [release] table, checked; None without one."""
    if data is None:
        return None
    release = table(data, where)
    refuse_unknown(set(release), _RELEASE_KEYS, where)
    wheel, sha = string(release, "wheel", where), string(release, "sha256", where)
    if not wheel.endswith(".whl") or wheel.count("-") < 4:
        raise OverlayError(f"{where}: wheel = {wheel!r} is not a wheel's file name (NAME-VERSION-PY-ABI-PLATFORM.whl).")
    if not _SHA256.match(sha):
        raise OverlayError(f"{where}: sha256 must be 64 lower-case hex digits.")
    return Release(wheel, sha)


def read_toml(path: pathlib.Path) -> dict[str, Any]:
    """A TOML file's data; a missing or malformed file is an OverlayError
    naming it (and, for a malformed one, the line)."""
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise OverlayError(f"{path} is missing.") from None
    except UnicodeDecodeError as exc:
        raise OverlayError(f"{path} is not UTF-8 text: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise OverlayError(f"{path} is not valid TOML: {exc}") from None


def read_rebase_policy(table: object, name: str, where: str) -> RebasePolicy:
    """A pin file's [rebase] table, checked: a wrong value would otherwise
    surface only in the middle of a rebase, after the project was changed."""
    if not isinstance(table, dict):
        raise OverlayError(f"{where} must be a table.")
    refuse_unknown(set(table), _REBASE_KEYS, where)
    rule = table.get("version", RebasePolicy.version_rule)
    if rule not in VERSION_RULES:
        raise OverlayError(f"{where}: version = {rule!r} is not a version rule; choose from {', '.join(map(repr, VERSION_RULES))}.")
    lkg = table.get("last-known-good")
    if lkg is None:
        return RebasePolicy(rule)
    where = f"{where} last-known-good"
    if not isinstance(lkg, dict):
        raise OverlayError(f"{where} must be a table {{ file = \"...\", pin = \"...\" }}.")
    refuse_unknown(set(lkg), _LAST_KNOWN_GOOD_KEYS, where)
    missing = sorted(_LAST_KNOWN_GOOD_KEYS - set(lkg))
    if missing:
        raise OverlayError(f"{where} lacks {', '.join(map(repr, missing))}.")
    file, pin = lkg["file"], lkg["pin"]
    parts = pathlib.PurePosixPath(file).parts if isinstance(file, str) else ()
    if not parts or file.startswith("/") or ".." in parts:
        raise OverlayError(f"{where}: file = {file!r} must be a path inside the upstream tree.")
    if pin not in DISTRIBUTIONS or pin == name:
        others = [d for d in DISTRIBUTIONS if d != name]
        raise OverlayError(f"{where}: pin = {pin!r} must name another distribution: one of {', '.join(others)}.")
    return RebasePolicy(rule, LastKnownGood(file, pin))


def load_project(root: pathlib.Path) -> Project:
    """Read pyproject.toml's overlay options and every pin below patches/."""
    # Absolute: the stages run programs in other folders (git am in a copy
    # of the tree) and hand them the patch files' paths.
    root = root.resolve()
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file():
        raise OverlayError(f"{pyproject} is missing: is {root} the project?")
    doc = read_toml(pyproject)
    config = doc.get("tool", {}).get("maxtext-rl-overlay") if isinstance(doc.get("tool"), dict) else None
    if config is None:
        raise OverlayError(f"{pyproject} lacks [tool.maxtext-rl-overlay]: is {root} the project?")
    options = project_options(config, str(pyproject))
    metadata = project_metadata(doc.get("project"), str(pyproject), options.maxtext)
    pins = {name: read_pin(root / "patches" / name) for name in DISTRIBUTIONS}
    return Project(root=root, pins=pins, metadata=metadata, options=options)


def select(project: Project, only: list[str] | None) -> list[Pin]:
    """The pins --only names, in build order; all of them without --only."""
    if not only:
        return list(project.pins.values())
    unknown = sorted(set(only) - set(DISTRIBUTIONS))
    if unknown:
        raise OverlayError(f"--only: unknown distribution(s) {', '.join(unknown)}; choose from {', '.join(DISTRIBUTIONS)}.")
    return [project.pins[name] for name in DISTRIBUTIONS if name in only]


def set_resolution_cutoff(root: pathlib.Path, value: str) -> str:
    """Move pyproject.toml's [tool.maxtext-rl-overlay] resolution-cutoff to
    `value` in place (its comments and every other line kept); the old value."""
    pyproject = root / "pyproject.toml"
    old = load_project(root).resolution_cutoff
    cutoff_value(value, f"{pyproject} [tool.maxtext-rl-overlay]: resolution-cutoff")
    text = tomledit.set_value(pyproject.read_text(), ("tool", "maxtext-rl-overlay"), "resolution-cutoff", value, where=str(pyproject))
    write_atomically(pyproject, text)
    return old


def set_pin_values(path: pathlib.Path, values: dict[str, str]) -> None:
    """Edit top-level `key = "value"` lines of a pin file in place: the
    comments, the order and every other line stay as they are."""
    text = path.read_text()
    for key, value in values.items():
        text = tomledit.set_value(text, (), key, value, where=str(path))
    write_atomically(path, text)  # a run killed meanwhile leaves the old file or the new one, never half of it
