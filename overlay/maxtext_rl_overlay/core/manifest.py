"""The build manifest: what each overlay wheel was built from, and the sha256
of every installed file its series touches. The build writes it into the
maxtext-rl-overlay wheel; `verify` reads it back on the target machine.

This module is the format and nothing else: typed records and their JSON
form. It imports nothing of the build side, so `verify` depends on the
manifest's format alone. Plain JSON, keys sorted, no machine paths or times:
the same pins give the same manifest, and so the same maxtext-rl-overlay
wheel, on any machine."""

from __future__ import annotations

import dataclasses
import json
from importlib import resources
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from .errors import OverlayError
from .jsonread import json_object

FORMAT = 1
RESOURCE = "manifest.json"


@dataclasses.dataclass(frozen=True)
class WheelFile:
    filename: str
    sha256: str


@dataclasses.dataclass(frozen=True)
class PinRecord:
    repository: str
    commit: str
    tree: str
    date: str


@dataclasses.dataclass(frozen=True)
class SourceRecord:
    tree: str  # the git tree id of what was built
    commit: str | None  # None for a tree that came without git history
    upstream_version: str | None  # an sdist stand-in's own version


@dataclasses.dataclass(frozen=True)
class PatchRecord:
    """One patch of a series as it was applied (patching.apply_series makes
    it), and so as the manifest and a kept patched tree record it."""

    name: str
    subject: str
    upstream_status: str
    blobs_checked: bool  # pre/post-image blob ids verified (pinned tree only)
    files: tuple[str, ...]
    sha256: str  # of the patch file
    patch_id: str | None  # git patch-id --stable, where git was installed

    @classmethod
    def from_plain(cls, data: dict[str, Any]) -> PatchRecord:
        """The record from its JSON form (files as a list)."""
        return cls(**dict(data, files=tuple(data["files"])))


@dataclasses.dataclass(frozen=True)
class BuiltAgainst:
    """The torch a distribution's extensions link (vLLM)."""

    torch: str
    cuda: str  # "" for a CPU build


@dataclasses.dataclass(frozen=True)
class Distribution:
    """One overlay build of an upstream."""

    version: str
    import_package: str
    from_pin: bool  # False: a stand-in tree, labelled unpinned
    pin: PinRecord
    source: SourceRecord
    wheel: WheelFile
    series: tuple[PatchRecord, ...]
    # Files the series touches that the wheel installs, relpath -> sha256.
    files: dict[str, str]
    built_against: BuiltAgainst | None = None
    # Patches of the series not applied: an unpinned stand-in lacks the code
    # they change (their `Unpinned-Source: left out [why]` trailer).
    left_out: tuple[str, ...] = ()
    # The overlay's extra that installs it ("maxtext": MaxText itself); ""
    # for a distribution every install of the overlay has.
    extra: str = ""


@dataclasses.dataclass(frozen=True)
class Adapter:
    """MaxText's vLLM plugin, built unchanged from the MaxText release."""

    name: str
    version: str
    wheel: WheelFile
    source: str  # "<release wheel>:<folder>"


@dataclasses.dataclass(frozen=True)
class TorchRecord:
    version: str  # what the closure pins
    wanted: str  # what MaxText asks for
    standin: bool
    torchvision: str


@dataclasses.dataclass(frozen=True)
class EnvironmentRecord:
    """The environment the closure was resolved for: what `verify` checks
    beyond our wheels, and how it tells the user to restore them."""

    maxtext: str  # the requirement of the overlay's `maxtext` extra
    extra: str
    torch: TorchRecord
    maxtext_vllm_adapter: Adapter | None
    resolution_cutoff: str = ""  # the registry's moment the closure was resolved against; "" in a manifest from before it


def maxtext_name(requirement: str) -> str:
    """The normalized name of the distribution the `maxtext` extra's
    requirement names (maxtext); "" for none (an environment recording no
    requirement). The build asks it of its Target's requirement, verify of
    the one the manifest records: it lives here, beside the record, as
    verify imports nothing of config/ (a TPU VM needs nothing of the build)."""
    return str(canonicalize_name(Requirement(requirement).name)) if requirement else ""


@dataclasses.dataclass(frozen=True)
class ProjectRecord:
    """The project commit the overlay's own wheel was made from: the newest
    one that changed a file of it (not HEAD: a commit changing none of them,
    such as the one committing a regenerated constraints.txt, must not
    change the wheel), and the files that differed from it (uncommitted)."""

    commit: str
    dirty: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Manifest:
    overlay_version: str
    revision: int
    distributions: dict[str, Distribution]
    not_built: tuple[str, ...]
    environment: EnvironmentRecord
    project: ProjectRecord | None = None  # None: made without git (a copy of the files), or the commit could not be told

    def dumps(self) -> str:
        doc = {
            "format": FORMAT,
            "overlay": {"version": self.overlay_version, "revision": self.revision},
            "distributions": {name: _plain(d) for name, d in self.distributions.items()},
            "not_built": sorted(self.not_built),
            "environment": _plain(self.environment),
            "project": _plain(self.project) if self.project else None,
        }
        return json.dumps(doc, indent=2, sort_keys=True) + "\n"

    @classmethod
    def loads(cls, text: str) -> Manifest:
        doc = json_object(text, "the installed manifest", "; reinstall maxtext-rl-overlay.", name_type=True)
        if doc.get("format") != FORMAT:
            raise OverlayError(f"the installed manifest has format {doc.get('format')}; this tool reads format {FORMAT}.")
        try:
            env = doc["environment"]
            adapter = env.get("maxtext_vllm_adapter")
            project = doc.get("project")
            return cls(
                overlay_version=doc["overlay"]["version"],
                revision=doc["overlay"]["revision"],
                distributions={name: _distribution(d) for name, d in doc["distributions"].items()},
                not_built=tuple(doc["not_built"]),
                environment=EnvironmentRecord(
                    env["maxtext"], env["extra"], TorchRecord(**env["torch"]),
                    Adapter(adapter["name"], adapter["version"], WheelFile(**adapter["wheel"]), adapter["source"]) if adapter else None,
                    str(env.get("resolution_cutoff", "")),
                ),
                project=ProjectRecord(project["commit"], tuple(project["dirty"])) if project else None,
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise OverlayError(f"the installed manifest is damaged ({type(exc).__name__}: {exc}); reinstall maxtext-rl-overlay.") from None


def _plain(record: Any) -> Any:
    """A record as JSON data: tuples as lists, and an absent built_against
    left out (as the format has it for pure-Python distributions)."""
    data = dataclasses.asdict(record)
    if data.get("built_against", ...) is None:
        del data["built_against"]
    return data


def _distribution(d: dict[str, Any]) -> Distribution:
    return Distribution(
        version=d["version"],
        import_package=d["import_package"],
        from_pin=d["from_pin"],
        pin=PinRecord(**d["pin"]),
        source=SourceRecord(**d["source"]),
        wheel=WheelFile(**d["wheel"]),
        series=tuple(PatchRecord.from_plain(p) for p in d["series"]),
        files=dict(d["files"]),
        built_against=BuiltAgainst(**d["built_against"]) if d.get("built_against") else None,
        left_out=tuple(d.get("left_out", ())),
        extra=str(d.get("extra", "")),
    )


def load_installed() -> Manifest:
    """The manifest of the installed maxtext-rl-overlay wheel."""
    try:
        text = (resources.files("maxtext_rl_overlay") / RESOURCE).read_text()
    except FileNotFoundError:
        raise OverlayError(
            "this maxtext-rl-overlay carries no build manifest: it was installed from a source "
            "tree, not from a wheel made by scripts/build-wheels.sh. Install the built wheel."
        ) from None
    return Manifest.loads(text)
