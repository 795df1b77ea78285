"""The target: the environment the overlay is resolved into, MaxText's RL extra and its torch.

The closure constraints.txt pins is the user's whole environment, not only our
wheels: it is resolved together with the MaxText release that the `maxtext`
extra of pyproject.toml names, under that release's own overrides file (read
from its wheel, not copied by hand), and with the torch MaxText's extra asks
for: a CPU build (`torch==X+cpu`), which is also the torch vLLM's extensions
are built against.

The CPU builds live on the PyTorch index (`[tool.maxtext-rl-overlay.torch]`
says where). Where that index is out of reach, PyPI's build of the same
version stands in: a CUDA build, which runs on the CPU but brings the
nvidia-*/cuda-*/triton packages along. It is used only when asked for
(`--torch-standin`), and said to be a stand-in in the build output, the
constraints header, the manifest and `verify`."""

from __future__ import annotations

import dataclasses
import email.parser
import pathlib
import zipfile

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import Version

from ..core.errors import OverlayError
from ..core.output import step
from . import registry
from .pins import Project
from .reader import maxtext_requirement

#: What the stack runs on: a TPU VM (x86_64 Linux, Python 3.12). The closure
#: is resolved for it, and MaxText's requirement markers are evaluated for it.
TARGET_PYTHON = "3.12"
TARGET_PLATFORM = "x86_64-manylinux_2_31"
TARGET_MARKERS = {
    "python_version": TARGET_PYTHON, "python_full_version": f"{TARGET_PYTHON}.0", "sys_platform": "linux",
    "platform_system": "Linux", "platform_machine": TARGET_PLATFORM.split("-", 1)[0], "implementation_name": "cpython",
    "platform_python_implementation": "CPython", "os_name": "posix",
}


@dataclasses.dataclass(frozen=True)
class Torch:
    """The torch of the closure, and of the vLLM build."""

    wanted: str  # what MaxText asks for: "2.11.0+cpu"
    version: str  # what the closure pins: the same, or "2.11.0" for the stand-in
    torchvision_wanted: str
    torchvision: str
    find_links: tuple[str, ...]  # where the CPU builds are (empty for the stand-in: PyPI)
    standin: bool

    @property
    def requirements(self) -> list[str]:
        return [f"torch=={self.version}", f"torchvision=={self.torchvision}"]

    def describe(self) -> str:
        if self.standin:
            return (f"STAND-IN torch {self.version}: PyPI's CUDA build, standing in for MaxText's torch=={self.wanted} "
                    "(the PyTorch CPU index was out of reach); it brings nvidia-*, cuda-* and triton")
        return f"torch {self.version} (CPU build)"


@dataclasses.dataclass(frozen=True)
class Target:
    maxtext: str  # the requirement the overlay's `maxtext` extra holds
    extra: str  # that extra's name
    constraints: tuple[str, ...]  # the MaxText release's overrides file, applied as constraints
    constraints_origin: str  # where they were read
    torch: Torch
    release: pathlib.Path  # the MaxText wheel, downloaded and checked
    vllm_adapter: str  # its folder holding MaxText's vLLM plugin (setup.py), "" for none

    @property
    def overrides(self) -> list[str]:
        """What replaces MaxText's own torch requirements: nothing for the
        real CPU build; for the stand-in, the same versions without +cpu
        (no constraint can satisfy an `==X+cpu` that the index lacks)."""
        return self.torch.requirements if self.torch.standin else []


def resolve(project: Project, *, torch_standin: bool, cache: pathlib.Path) -> Target:
    """Read the MaxText release the project names, and choose the torch."""
    options = project.options.maxtext
    extra = options.extra
    pyproject = project.root / "pyproject.toml"
    # Checked when the project was loaded (options.project_metadata); read here.
    extras = project.metadata.get("optional-dependencies", {})
    requirement = maxtext_requirement(extras, options, str(pyproject))
    (requirement_text,) = extras[extra]
    pinned = [s.version for s in requirement.specifier if s.operator == "=="]
    (mt_extra,) = requirement.extras
    wheel = registry.release_wheel(requirement.name, pinned[0], cache / "releases")
    overrides_file = options.overrides_file
    with zipfile.ZipFile(wheel) as zf:
        try:
            text = zf.read(overrides_file).decode()
        except KeyError:
            raise OverlayError(f"{wheel.name} has no {overrides_file}: fix overrides-file in [tool.maxtext-rl-overlay.maxtext].") from None
        metadata = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        requires = email.parser.Parser().parsestr(zf.read(metadata).decode()).get_all("Requires-Dist") or []
    constraints = tuple(line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip())
    wanted = _exact(requires, mt_extra, "torch", wheel.name)
    vision = _exact(requires, mt_extra, "torchvision", wheel.name)
    if torch_standin:
        torch = Torch(wanted, Version(wanted).public, vision, Version(vision).public, (), True)
    else:
        links = project.options.torch.find_links
        if not links:
            raise OverlayError(f"{pyproject}: [tool.maxtext-rl-overlay.torch] lacks find-links (where torch=={wanted} is published).")
        torch = Torch(wanted, wanted, vision, vision, links, False)
    step.note("environment", f"{requirement_text}, its {overrides_file} as constraints; {torch.describe()}")
    return Target(requirement_text, extra, constraints, f"{wheel.name}:{overrides_file}", torch, wheel, options.vllm_adapter)


def _exact(requires: list[str], extra: str, name: str, where: str) -> str:
    """The one version MaxText's `extra` pins `name` to (`==`)."""
    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            raise OverlayError(f"{where} has a Requires-Dist that is not a requirement, {line!r}: {str(exc).splitlines()[0]}") from None
        if req.name != name or (req.marker and not req.marker.evaluate(dict(TARGET_MARKERS, extra=extra))):
            continue
        versions = [s.version for s in req.specifier if s.operator == "=="]
        if len(versions) == 1:
            return versions[0]
        raise OverlayError(f"{where} asks for {line!r}: expected an exact {name}==VERSION pin, which the vLLM build must match.")
    raise OverlayError(f"{where} does not pin {name} in its {extra!r} extra; the closure's torch cannot be chosen from it.")
