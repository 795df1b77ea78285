"""The pins: which upstream commit each distribution is built from, and its
patch series. Read once from patches/<dist>/pin.toml and patches/<dist>/series
(the single source of truth) into plain, immutable data."""

from __future__ import annotations

import dataclasses
import difflib
import pathlib
import re
import tomllib
from typing import Any

from . import tomledit
from .errors import OverlayError

#: Build order, and the names --only and --source accept.
DISTRIBUTIONS = ("google-tunix", "tpu-inference", "vllm")
#: Where [build.requirements] overrides look unless a pin's [build]
#: requirement-files says otherwise (vLLM: requirements/tpu.txt).
DEFAULT_REQUIREMENT_FILES = ("pyproject.toml", "requirements.txt")
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
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

    @property
    def pin_file(self) -> pathlib.Path:
        return self.directory / "pin.toml"


@dataclasses.dataclass(frozen=True)
class Project:
    root: pathlib.Path
    revision: int
    pins: dict[str, Pin]
    metadata: dict[str, Any]  # pyproject.toml's [project] table
    config: dict[str, Any]  # pyproject.toml's [tool.maxtext-rl-overlay] table

    @property
    def local_label(self) -> str:
        return f"mrl.{self.revision}"


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


_PIN_KEYS = {"distribution", "import-package", "repository", "commit", "tree", "date", "version", "build", "rebase"}
_BUILD_KEYS = {"env", "requirements", "requirement-files", "torch"}
_REBASE_KEYS = {"version", "last-known-good"}
_LAST_KNOWN_GOOD_KEYS = {"file", "pin"}


def refuse_unknown(found: set[str], known: set[str], where: str) -> None:
    """A misspelt key would otherwise fall back to a default silently."""
    unknown = sorted(found - known)
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, sorted(known), n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise OverlayError(f"{where}: unknown key(s) {', '.join(hints)}; known: {', '.join(sorted(known))}.")


def read_pin(directory: pathlib.Path) -> Pin:
    pin_file = directory / "pin.toml"
    try:
        data = tomllib.loads(pin_file.read_text())
    except FileNotFoundError:
        raise OverlayError(f"{pin_file} is missing.") from None
    except tomllib.TOMLDecodeError as exc:
        raise OverlayError(f"{pin_file} is not valid TOML: {exc}") from None
    refuse_unknown(set(data), _PIN_KEYS, str(pin_file))
    refuse_unknown(set(data.get("build", {})), _BUILD_KEYS, f"{pin_file} [build]")
    try:
        build = data.get("build", {})
        pin = Pin(
            distribution=data["distribution"],
            import_package=data["import-package"],
            repository=data["repository"],
            commit=data["commit"],
            tree=data["tree"],
            date=data["date"],
            version=data["version"],
            build_env=dict(build.get("env", {})),
            requirement_overrides=dict(build.get("requirements", {})),
            requirement_files=tuple(build.get("requirement-files", DEFAULT_REQUIREMENT_FILES)),
            needs_torch=bool(build.get("torch", False)),
            directory=directory,
            series=read_series(directory),
            rebase=read_rebase_policy(data.get("rebase", {}), directory.name, f"{pin_file} [rebase]"),
        )
    except KeyError as exc:
        raise OverlayError(f"{pin_file} lacks the key {exc.args[0]!r}.") from None
    if pin.distribution != directory.name:
        raise OverlayError(f"{pin_file} says distribution {pin.distribution!r} but lives in {directory.name}/.")
    if not _HEX40.match(pin.commit) or (pin.tree and not _HEX40.match(pin.tree)):
        raise OverlayError(f"{pin_file}: commit and tree must be 40 lower-case hex digits.")
    return pin


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
    """Read pyproject.toml's overlay revision and every pin below patches/."""
    # Absolute: the stages run programs in other folders (git am in a copy
    # of the tree) and hand them the patch files' paths.
    root = root.resolve()
    pyproject = root / "pyproject.toml"
    try:
        doc = tomllib.loads(pyproject.read_text())
        config = doc["tool"]["maxtext-rl-overlay"]
        revision = config["revision"]
    except (FileNotFoundError, KeyError):
        raise OverlayError(f"{pyproject} lacks [tool.maxtext-rl-overlay] revision: is {root} the project?") from None
    pins = {name: read_pin(root / "patches" / name) for name in DISTRIBUTIONS}
    return Project(root=root, revision=int(revision), pins=pins, metadata=doc["project"], config=config)


def select(project: Project, only: list[str] | None) -> list[Pin]:
    """The pins --only names, in build order; all of them without --only."""
    if not only:
        return list(project.pins.values())
    unknown = sorted(set(only) - set(DISTRIBUTIONS))
    if unknown:
        raise OverlayError(f"--only: unknown distribution(s) {', '.join(unknown)}; choose from {', '.join(DISTRIBUTIONS)}.")
    return [project.pins[name] for name in DISTRIBUTIONS if name in only]


def set_pin_values(path: pathlib.Path, values: dict[str, str]) -> None:
    """Edit top-level `key = "value"` lines of a pin file in place: the
    comments, the order and every other line stay as they are."""
    text = path.read_text()
    for key, value in values.items():
        text = tomledit.set_value(text, (), key, value, where=str(path))
    path.write_text(text)
