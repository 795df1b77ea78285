"""Load the upstream (unpatched) version of an installed, patched module.

The fix tests first show each bug on upstream code, then show it fixed in the
installed overlay wheel. Rather than keep a second environment with the
upstream wheels, we rebuild the upstream file from the installed one: every
patch of the series that touches the file is reverse-applied with
`git apply -R` (exact, no fuzz), and the result is imported under another
module name beside the patched module. Upstream modules use absolute imports,
so the copy shares every other module with the patched installation: the only
difference between the two is what the series changed in that file.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import pathlib
import shutil
import sys
import tempfile
import traceback
from typing import Any

from maxtext_rl_overlay.config.pins import read_series
from maxtext_rl_overlay.core.errors import OverlayError
from maxtext_rl_overlay.core.git import git
from maxtext_rl_overlay.stages import patchfile
from support import ROOT

PATCHES = ROOT / "patches"


def series(distribution: str) -> list[pathlib.Path]:
    """The patch files of a distribution's series that the installed wheel
    carries, in order (read as the build reads them): all of them but those
    the build left out of an unpinned stand-in (the installed manifest's
    `left_out`: the stand-in lacks the code they change)."""
    from maxtext_rl_overlay.core import manifest

    try:
        built = manifest.load_installed().distributions.get(distribution)
    except OverlayError:  # no built overlay installed (a source checkout): the whole series
        built = None
    left_out = set(built.left_out) if built else set()
    return [p for p in read_series(PATCHES / distribution) if p.name not in left_out]


def _touched(patch: pathlib.Path) -> set[str]:
    """The files a patch changes (their post-image paths)."""
    return {change.path for change in patchfile.parse(patch).files}


def series_touches(distribution: str, relpath: str) -> bool:
    """Whether any patch of the distribution's series changes `relpath`."""
    return any(relpath in _touched(p) for p in series(distribution))


def unpatched_source(distribution: str, module: str) -> str:
    """The text of `module` as upstream ships it, rebuilt from the installed copy."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"{module} is not installed")
    text = _reverse_series(distribution, pathlib.Path(spec.origin), module.replace(".", "/") + ".py")
    if text is None:
        raise LookupError(f"{module} is not upstream's: the series adds it")
    return text


def _reverse_series(distribution: str, installed: pathlib.Path, relpath: str) -> str | None:
    """`installed` (the file at `relpath` of the distribution) with every
    patch of the series that touches it reverse-applied; None where the
    series created the file."""
    patches = [p for p in series(distribution) if relpath in _touched(p)]
    if not patches:
        raise LookupError(f"no patch of patches/{distribution}/series touches {relpath}")
    with tempfile.TemporaryDirectory(prefix="unpatched-") as tmp:
        work = pathlib.Path(tmp)
        target = work / relpath
        target.parent.mkdir(parents=True)
        shutil.copyfile(installed, target)
        for patch in reversed(patches):
            proc = git("apply", "-R", "--include", relpath, str(patch), cwd=work, check=False)
            if proc.returncode != 0:
                raise RuntimeError(
                    f"{installed} does not carry {patch.name} exactly "
                    f"(git apply -R failed): {proc.stderr.strip()}"
                )
        return target.read_text() if target.exists() else None


class _UpstreamFinder(importlib.abc.MetaPathFinder):
    """Imports the modules the series touch as upstream ships them, under
    their own names (see `upstream_imports`)."""

    def __init__(self, modules: dict[str, str]):
        self.modules = modules  # module name -> distribution

    def find_spec(self, fullname, path=None, target=None):
        distribution = self.modules.get(fullname)
        if distribution is None:
            return None
        installed = importlib.machinery.PathFinder.find_spec(fullname, path)
        if installed is None or installed.origin is None:
            return None
        text = _reverse_series(distribution, pathlib.Path(installed.origin), fullname.replace(".", "/") + ".py")
        if text is None:
            raise ModuleNotFoundError(f"{fullname} is not upstream's: the series adds it", name=fullname)
        copy = _keep_dir() / "upstream-modules" / (fullname + ".py")
        copy.parent.mkdir(exist_ok=True)
        copy.write_text(text)
        return importlib.util.spec_from_file_location(fullname, copy)


def upstream_imports(distributions: tuple[str, ...]) -> list[str]:
    """From now on, import every module that a patch of these series touches
    as upstream ships it: the installed file with the series reverse-applied,
    under the module's own name, so the whole process runs the pins' code
    (call before any of them is imported). Returns the modules so served."""
    modules = {}
    for distribution in distributions:
        for patch in series(distribution):
            for relpath in _touched(patch):
                if relpath.endswith(".py") and not relpath.endswith("__init__.py"):
                    modules[relpath[:-3].replace("/", ".")] = distribution
    already = sorted(name for name in modules if name in sys.modules)
    if already:
        raise RuntimeError(f"upstream_imports: already imported as installed: {already}")
    sys.meta_path.insert(0, _UpstreamFinder(modules))
    return sorted(modules)


def unpatched_package(distribution: str, installed: pathlib.Path, dest: pathlib.Path,
                      keep: tuple[str, ...] = (), patches: list[pathlib.Path] | None = None) -> list[str]:
    """A copy of the installed package folder `installed` (e.g. site-packages'
    tpu_inference) at `dest/<its name>` with the whole series reverse-applied
    (last patch first; each `git apply -R`, exact, restricted to the
    package's files), except the patches whose names start with one of
    `keep`. A folder that holds it, put first on a process's PYTHONPATH,
    makes that process import the pin's package. `patches`: the series
    (default: patches/<distribution>/series). Returns the names of the
    patches reverse-applied, in the order applied."""
    package = installed.name
    shutil.copytree(installed, dest / package, ignore=shutil.ignore_patterns("__pycache__"))
    reversed_ = []
    for patch in reversed(series(distribution) if patches is None else patches):
        if keep and patch.name.startswith(keep):
            continue
        if not any(path.startswith(package + "/") for path in _touched(patch)):
            continue
        proc = git("apply", "-R", "--include", f"{package}/*", str(patch), cwd=dest, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"{installed} does not carry {patch.name} exactly (git apply -R failed): {proc.stderr.strip()}")
        reversed_.append(patch.name)
    return reversed_


def source_before(distribution: str, module: str, patch_prefix: str) -> str:
    """The text of `module` as the series leaves it just before the patch
    whose name starts with `patch_prefix`: upstream's, rebuilt from the
    installed copy, with the earlier patches that touch it applied again (so
    later patches of the series do not matter)."""
    relpath = module.replace(".", "/") + ".py"
    patches = series(distribution)
    stop = next((i for i, p in enumerate(patches) if p.name.startswith(patch_prefix)), None)
    if stop is None:
        raise LookupError(f"no patch of patches/{distribution}/series starts with {patch_prefix!r}")
    with tempfile.TemporaryDirectory(prefix="series-prefix-") as tmp:
        target = pathlib.Path(tmp) / relpath
        target.parent.mkdir(parents=True)
        target.write_text(unpatched_source(distribution, module))
        for patch in patches[:stop]:
            if relpath in _touched(patch):
                git("apply", "--include", relpath, str(patch), cwd=pathlib.Path(tmp), what=f"git apply {patch.name} to {relpath}")
        return target.read_text()


def load_unpatched(distribution: str, module: str) -> Any:
    """Import the upstream version of `module` as `<module>__unpatched`
    (upstream's code: untyped, Any, as pyproject's mypy section reads it)."""
    return load_source(module + "__unpatched", module, unpatched_source(distribution, module))


def load_before(distribution: str, module: str, patch_prefix: str, name: str) -> Any:
    """Import `module` as the series leaves it before `patch_prefix`, as `name`."""
    return load_source(name, module, source_before(distribution, module, patch_prefix))


def load_source(name: str, module: str, source: str) -> Any:
    """Import `source` as module `name`, in `module`'s package, beside it.

    The source is written to a file that lives as long as the process, so
    tracebacks through it show its real lines."""
    if name in sys.modules:
        return sys.modules[name]
    path = _keep_dir() / (name + ".py")
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None  # a .py file's
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = module.rpartition(".")[0]
    sys.modules[name] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        del sys.modules[name]
        raise
    return mod


_KEEP: list[tempfile.TemporaryDirectory] = []
#: The folder the upstream copies are written to (named by this prefix).
_KEEP_PREFIX = "unpatched-modules-"


def traceback_frames(error: BaseException, copies: str) -> list[dict]:
    """The frames of `error`'s traceback in installed packages (by their path
    inside site-packages) and in the upstream copies made here (as
    `<copies>:<file name>`), for a result a test asserts on."""
    out = []
    for f in traceback.extract_tb(error.__traceback__):
        path = f.filename.replace(os.sep, "/")
        if "/site-packages/" in path:
            path = path.split("/site-packages/", 1)[1]
        elif _KEEP_PREFIX in path:
            path = f"{copies}:" + pathlib.Path(path).name
        else:
            continue
        out.append({"file": path, "function": f.name, "line": (f.line or "").strip()})
    return out


def _keep_dir() -> pathlib.Path:
    if not _KEEP:
        _KEEP.append(tempfile.TemporaryDirectory(prefix=_KEEP_PREFIX))
    return pathlib.Path(_KEEP[0].name)


def tunix_sync_modules(patch_prefix: str, marker: str) -> tuple[Any, Any, Any]:
    """Tunix's tunix.generate.utils three ways: the pins', the series' before
    `patch_prefix`, and the installed one; `marker` (a name the patch adds)
    is in the installed file and not in the one before it, or every
    "before" a test shows proves nothing."""
    from tunix.generate import utils as patched

    pins = load_unpatched("google-tunix", "tunix.generate.utils")
    name = f"tunix_generate_utils_before_{patch_prefix}"
    before = load_before("google-tunix", "tunix.generate.utils", patch_prefix, name)
    assert marker in pathlib.Path(patched.__file__).read_text()
    assert marker not in pathlib.Path(before.__file__).read_text()
    return pins, before, patched


def weights_required() -> dict[str, Any]:
    """What VllmSampler.update_params passes transfer_state_directly: every nnx.Param of the target must be reached."""
    from flax import nnx

    return {"weight_types": (nnx.Param,)}
