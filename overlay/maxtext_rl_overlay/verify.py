"""Stage 5, on the target machine: is the installed stack the overlay's, and
does it work? Three questions, each a list of findings:

1. files: are the installed distributions the overlay builds, with every file
   the series touches intact (on disk and in the installer's RECORD)?
2. environment: is torch the closure's (and is it a stand-in)?
3. imports: do the packages the overlay vouches for import, in a fresh
   process (a stack whose files are intact can still lack a dependency)?

Within the first: does a plain `import` reach the installed files? An image
can put an older copy first (a PYTHONPATH entry such as MaxText's
/deps/src, the current directory, a .pth line) or leave a .pth / egg-link of
its own install of an upstream behind. Where each module resolves is asked
in a fresh interpreter of the same environment, without importing it.

A distribution replaced by another build of the same upstream (what MaxText's
install_tpu_post_train_extra_deps does: it installs the three upstreams from
GitHub with --no-deps) is recognised and explained, with the command that
restores the overlay."""

from __future__ import annotations

import base64
import dataclasses
import importlib.metadata as md
import json
import pathlib
import sys

from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from . import manifest, proc, tables
from .digest import sha256_file
from .errors import OverlayError, TimedOut
from .manifest import Manifest

#: How long the import check may take (tpu_inference alone imports vLLM,
#: torch and transformers: 25-35 s on a small machine).
IMPORT_TIMEOUT = 900
#: How long finding where the modules resolve may take (nothing is imported).
RESOLVE_TIMEOUT = 120


@dataclasses.dataclass(frozen=True)
class Finding:
    distribution: str
    what: str  # "version", a file path, "source", "import <module>", ...
    expected: str
    found: str
    ok: bool


def _record_hash(dist: md.Distribution, relpath: str) -> str | None:
    """The sha256 the installer recorded for a file (RECORD), hex."""
    for f in dist.files or ():
        if str(f) == relpath and f.hash is not None and f.hash.mode == "sha256":
            return base64.urlsafe_b64decode(f.hash.value + "=" * (-len(f.hash.value) % 4)).hex()
    return None


def _origin(dist: md.Distribution) -> str:
    """Where the installer took a distribution from (PEP 610), if it says."""
    try:
        direct = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        direct = {}
    url = direct.get("url", "")
    vcs = direct.get("vcs_info", {})
    return f"{vcs.get('vcs', '')}+{url}@{vcs.get('commit_id', '')}" if vcs else url


def _replaced(want: str, found: str, dist: md.Distribution) -> str:
    """The found version, explained when another build took our place."""
    try:
        ours, theirs = Version(want), Version(found)
    except InvalidVersion:
        return found
    if theirs.local and theirs.local.startswith("mrl."):
        return f"{found} (another overlay build: install the constraints this one came with)"
    origin = _origin(dist)
    how = f" from {origin}" if origin else ""
    same = "the same upstream" if theirs.public == ours.public or origin else "an upstream"
    return f"{found}: REPLACED by {same} build, not the overlay's{how}"


def check(doc: Manifest | None = None, *, require_pinned: bool = False, python: str = sys.executable,
          environment: bool = True) -> list[Finding]:
    """The overlay's distributions, their patched files and where a plain
    import finds them; and, with `environment`, the closure's torch."""
    doc = doc if doc is not None else manifest.load_installed()
    findings: list[Finding] = []
    for name, want in sorted(doc.distributions.items()):
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            findings.append(Finding(name, "version", want.version, "not installed", False))
            continue
        if canonicalize_name(dist.metadata["Name"]) != canonicalize_name(name):
            findings.append(Finding(name, "name", name, dist.metadata["Name"], False))
        same = dist.version == want.version
        findings.append(Finding(name, "version", want.version, dist.version if same else _replaced(want.version, dist.version, dist), same))
        pin = f"pin {want.pin.commit[:12]}"
        if want.from_pin:
            findings.append(Finding(name, "source", pin, pin, True))
        else:
            findings.append(Finding(name, "source", pin, f"UNPINNED stand-in tree {want.source.tree[:12]}", not require_pinned))
        for relpath, sha in sorted(want.files.items()):
            path = dist.locate_file(relpath)
            try:
                found = sha256_file(pathlib.Path(str(path)))
            except OSError:
                found = "missing"
            recorded = _record_hash(dist, relpath)
            ok = found == sha and recorded == sha
            if found == sha and recorded != sha:
                found = f"{found[:12]} (RECORD says {recorded[:12] if recorded else 'nothing'}: not installed from the overlay wheel)"
            findings.append(Finding(name, relpath, sha, found, ok))
    for name in sorted(doc.not_built):
        # The release was built without it (build --only): whatever is
        # installed under that name carries none of the overlay's fixes.
        installed = _version(name)
        found = NOT_BUILT + ("" if installed == "not installed" else f"; installed: {installed}, not an overlay build")
        findings.append(Finding(name, "built", "an overlay build", found, False))
    findings += check_resolution(doc, python=python)
    if environment:
        findings += check_environment(doc, require_pinned=require_pinned)
    return findings


# Run in a fresh interpreter of the environment verified (its site, its
# PYTHONPATH, '' first as for `python -c`): for each module, the file the
# overlay's distribution installed and the one a plain import resolves,
# found through the import system's own finders without executing anything;
# then every .pth and egg-link on the path that belongs to one of the
# distributions (by its name or by what it adds) and is not a file of the
# overlay's installed distribution. argv[1]: JSON {"modules": [[module, dist,
# version, relpath]], "versions": {dist: version}, "packages": {dist: import
# package}}. Only the overlay's own build (its version) counts as installed.
_RESOLVER = r"""
import importlib.metadata as md, json, os, re, site, sys, types
asked = json.loads(sys.argv[1])

def canon(name):
    return re.sub(r"[-_.]+", "-", name).lower()

def ours(dist, version):
    for d in md.distributions(name=dist):
        if d.version == version:
            return d
    return None

def resolve(module):
    spec, path = None, None
    parts = module.split(".")
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        loaded = sys.modules.get(name)
        spec = getattr(loaded, "__spec__", None) if loaded is not None else None
        if spec is None:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                spec = find(name, path) if find else None
                if spec is not None:
                    break
        if spec is None:
            return "not found"
        path = spec.submodule_search_locations
        if path is not None and name not in sys.modules:
            # An inert stand-in for the package, never executed: the path
            # finder reads a namespace package's parent from sys.modules.
            placeholder = types.ModuleType(name)
            placeholder.__path__, placeholder.__spec__ = path, spec
            sys.modules[name] = placeholder
    if spec.origin in (None, "namespace"):
        return "a namespace package: " + ", ".join(spec.submodule_search_locations or ())
    return os.path.realpath(spec.origin)

out = {"modules": [], "leftovers": []}
for module, dist, version, relpath in asked["modules"]:
    d = ours(dist, version)
    if d is not None:
        out["modules"].append([module, os.path.realpath(str(d.locate_file(relpath))), resolve(module)])

recorded = set()
for dist, version in asked["versions"].items():
    d = ours(dist, version)
    for f in (d.files or ()) if d is not None else ():
        recorded.add(os.path.realpath(str(d.locate_file(f))))
folders = []
for entry in [*site.getsitepackages(), site.getusersitepackages(), *sys.path]:
    real = os.path.realpath(entry or ".")
    if os.path.isdir(real) and real not in folders:
        folders.append(real)
packages = asked["packages"]
for folder in folders:
    for name in sorted(os.listdir(folder)):
        if not name.endswith((".pth", ".egg-link")):
            continue
        path = os.path.join(folder, name)
        if path in recorded or not os.path.isfile(path):
            continue
        try:
            lines = [l.strip() for l in open(path, encoding="utf-8", errors="replace")]
        except OSError:
            continue
        stem = name[: -len(".egg-link")] if name.endswith(".egg-link") else name[: -len(".pth")]
        stem = stem.removeprefix("__editable__.").split("-")[0]
        for dist, package in packages.items():
            by_name = canon(stem) == canon(dist)
            adds = [l for l in lines if l and not l.startswith(("#", "import ", "import	"))
                    and (os.path.isdir(os.path.join(folder, l, package)) or os.path.isfile(os.path.join(folder, l, package + ".py")))]
            hooks = [l for l in lines if l.startswith(("import ", "import	")) and re.search(
                r"(__editable___" + re.escape(dist.replace("-", "_")) + r"_|" + re.escape(package) + r")", l)]
            if by_name or adds or hooks:
                what = "adds " + os.path.realpath(os.path.join(folder, adds[0])) if adds else "runs " + hooks[0] if hooks else "names " + dist
                out["leftovers"].append([dist, path, what])
print(json.dumps(out))
"""


def check_resolution(doc: Manifest, *, python: str = sys.executable) -> list[Finding]:
    """Does a plain `import` of each module the overlay vouches for reach
    the file its distribution installed, and is there no leftover .pth or
    egg-link of another install of one of its distributions? Asked of
    `python` in a fresh process, in this process's environment."""
    modules: list[list[str]] = []
    for name, want in sorted(doc.distributions.items()):
        files = {want.import_package: f"{want.import_package}/__init__.py"}
        for relpath in sorted(want.files):
            if relpath.endswith(".py"):
                files.setdefault(relpath[: -len(".py")].replace("/", ".").removesuffix(".__init__"), relpath)
        modules += [[module, name, want.version, relpath] for module, relpath in files.items()]
    asked = {
        "modules": modules,
        "versions": {name: d.version for name, d in doc.distributions.items()},
        "packages": {name: d.import_package for name, d in doc.distributions.items()},
    }
    try:
        result = proc.run([python, "-c", _RESOLVER, json.dumps(asked)], check=False, timeout=RESOLVE_TIMEOUT,
                          env={"PYTHONWARNINGS": "ignore"}, what="finding where each module resolves, in a fresh process")
    except TimedOut:  # it did not finish in time
        result = None
    try:
        found = json.loads(result.stdout.strip().splitlines()[-1]) if result else None
    except (ValueError, IndexError):  # it printed no answer
        found = None
    if result is None or not isinstance(found, dict):
        tail = (result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1] if result else f"timed out after {RESOLVE_TIMEOUT} s"
        return [Finding(name, "resolution", "a plain import finds the installed files", f"could not be asked: {tail}", False)
                for name in sorted(doc.distributions)]
    findings = []
    by_module = {m[0]: m[1] for m in modules}
    for module, installed, resolved in found["modules"]:
        ok = resolved == installed
        findings.append(Finding(by_module[module], f"import {module} resolves to", installed,
                                resolved if ok else f"{resolved} ({SHADOWED})", ok))
    for dist, path, what in found["leftovers"]:
        findings.append(Finding(dist, f"leftover {path}", "no .pth / egg-link of another install", f"{LEFTOVER}: {what}", False))
    return findings


#: What `check_resolution` says of a module a plain import finds elsewhere.
SHADOWED = "SHADOWS the overlay's installed file"
#: ... and of a .pth / egg-link of another install.
LEFTOVER = "LEFTOVER of another install"


#: What `check` finds for a distribution the release was built without.
NOT_BUILT = "NOT BUILT into this release (build --only left it out)"


def check_environment(doc: Manifest, *, require_pinned: bool = False) -> list[Finding]:
    """The closure's torch: the version the vLLM extensions were built
    against, and whether it is the CPU build or PyPI's stand-in."""
    torch = doc.environment.torch
    found = _version("torch")
    label = f"{torch.version} (STAND-IN for {torch.wanted}: PyPI's CUDA build)" if torch.standin else torch.version
    findings = [Finding("torch", "version", label, found, found == torch.version and not (torch.standin and require_pinned))]
    adapter = doc.environment.maxtext_vllm_adapter
    if adapter and _maxtext_installed():
        # With MaxText, its vLLM plugin must be there (vLLM's engine processes
        # find MaxTextForCausalLM through it), built from the same release.
        found = _version(adapter.name)
        findings.append(Finding(adapter.name, "version", adapter.version, found, found == adapter.version))
    return findings


def _version(name: str) -> str:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return "not installed"


def _maxtext_installed() -> bool:
    return _version("maxtext") != "not installed"


def import_modules(doc: Manifest) -> dict[str, str]:
    """What the overlay vouches for, module -> distribution: every
    distribution's import package, and each module its series patches."""
    modules: dict[str, str] = {}
    for name, want in sorted(doc.distributions.items()):
        modules[want.import_package] = name
        for relpath in sorted(want.files):
            if relpath.endswith(".py"):
                modules.setdefault(relpath[: -len(".py")].replace("/", ".").removesuffix(".__init__"), name)
    adapter = doc.environment.maxtext_vllm_adapter
    if adapter and _maxtext_installed():
        modules["maxtext_vllm_adapter"] = adapter.name
    return modules


# Run in a fresh interpreter: each import's outcome as one JSON line.
_IMPORTER = """
import importlib, json, sys, traceback
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        print(json.dumps([name, ""]), flush=True)
    except BaseException as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        print(json.dumps([name, f"{type(exc).__name__}: {exc} ({where.filename}:{where.lineno})"]), flush=True)
"""


def check_imports(doc: Manifest | None = None, *, python: str = sys.executable) -> list[Finding]:
    doc = doc if doc is not None else manifest.load_installed()
    modules = import_modules(doc)
    try:
        result = proc.run([python, "-c", _IMPORTER, *modules], check=False, timeout=IMPORT_TIMEOUT, env={"PYTHONWARNINGS": "ignore"},
                          what="importing the stack in a fresh process")
    except TimedOut:  # it did not finish in time
        return [Finding(d, f"import {m}", "imported", f"timed out after {IMPORT_TIMEOUT} s", False) for m, d in modules.items()]
    done: dict[str, str] = {}
    for line in result.stdout.splitlines():
        try:
            module, error = json.loads(line)
        except ValueError:
            continue  # a package printing to stdout while it imports
        done[module] = error
    findings = []
    for module, dist in modules.items():
        if module not in done:
            tail = (result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1]
            findings.append(Finding(dist, f"import {module}", "imported", f"the interpreter died: {tail}", False))
        else:
            findings.append(Finding(dist, f"import {module}", "imported", done[module] or "imported", not done[module]))
    return findings


def restore_command(doc: Manifest) -> str:
    """The command that puts the overlay back after another installer
    replaced part of it (the user's own install command, as constraints.txt
    pins our builds exactly)."""
    env = doc.environment
    target = f'"maxtext-rl-overlay[{env.extra}]"' if _maxtext_installed() else "maxtext-rl-overlay"
    override = " --override torch-standin-overrides.txt" if env.torch.standin and "[" in target else ""
    return f"uv pip install -c constraints.txt{override} {target}"


def render(findings: list[Finding]) -> str:
    def short(s: str) -> str:  # sha256 columns stay readable
        return s[:12] if len(s) == 64 else s

    rows = [("distribution", "check", "expected", "found", "")]
    rows += [(f.distribution, f.what, short(f.expected), short(f.found), "ok" if f.ok else "DIFFERS") for f in findings]
    return tables.render(rows)


def explain(findings: list[Finding], doc: Manifest) -> list[str]:
    """What the user should know and do, in sentences, for what failed."""
    lines = []
    replaced = [f for f in findings if f.what == "version" and "REPLACED" in f.found]
    if replaced:
        lines.append(
            f"{', '.join(f.distribution for f in replaced)} {'was' if len(replaced) == 1 else 'were'} replaced by builds "
            "that are not the overlay's, without its fixes. MaxText's install_tpu_post_train_extra_deps does this "
            "(it installs the upstreams from GitHub with --no-deps): the overlay replaces that step, so do not run it."
        )
        lines.append(f"Restore the overlay with (the constraints file you installed from): {restore_command(doc)}")
    left_out = [f.distribution for f in findings if f.found.startswith(NOT_BUILT)]
    if left_out:
        lines.append(
            f"This release was built without {', '.join(left_out)} (build --only): it is not the whole stack, and an install "
            "from it cannot have the overlay's fixes there. Install a release built with every distribution "
            "(scripts/build-wheels.sh without --only)."
        )
    shadowed = [f for f in findings if SHADOWED in f.found]
    if shadowed:
        first = shadowed[0]
        module = first.what.removeprefix("import ").removesuffix(" resolves to")
        lines.append(
            f"A plain import does not reach the overlay's files: {', '.join(f.what.split()[1] for f in shadowed)} "
            f"resolve{'s' if len(shadowed) == 1 else ''} elsewhere ({module}: {first.found.split(' (')[0]}, not {first.expected}). "
            "An older copy comes first on the path (a PYTHONPATH entry such as a base image's /deps/src, the current directory, "
            "or a .pth line): remove that copy or that entry."
        )
    leftovers = [f for f in findings if f.found.startswith(LEFTOVER)]
    if leftovers:
        lines.append(
            f"Another install of {', '.join(sorted({f.distribution for f in leftovers}))} left "
            f"{', '.join(f.what.removeprefix('leftover ') for f in leftovers)} behind: delete "
            f"{'it' if len(leftovers) == 1 else 'them'} (an editable or egg-link install the overlay's install did not remove)."
        )
    failed = [f for f in findings if f.what.startswith("import ") and not f.ok and not f.what.endswith(" resolves to")]
    if failed:
        lines.append(f"The stack does not import: {failed[0].what} failed with {failed[0].found}.")
    return lines


#: What a finding accepted as a host's deviation says (verify --host-deviations).
DEVIATION = "a HOST DEVIATION from the release"


def host_deviations(closure: pathlib.Path) -> list[str]:
    """What this environment runs that differs from the release's closure
    (`closure`: its `name==version` lines, as the TPU cell's bundle writes
    them, release-closure.txt, whose header names the release's Python):
    the Python, each distribution at another version, and those not
    installed. Said, never accepted silently: verify --host-deviations names
    each one in its verdict."""
    import re

    try:
        text = closure.read_text()
    except OSError as exc:
        raise OverlayError(f"--host-deviations {closure}: cannot read it ({exc.strerror}).") from None
    pins: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#")[0].strip()
        if "==" in line and not line.startswith("-"):
            name, version = line.split("==", 1)
            pins[str(canonicalize_name(name))] = version.strip()
    if not pins:
        raise OverlayError(f"--host-deviations {closure}: no name==version lines (give the bundle's release-closure.txt).")
    said = re.search(r"^#.*\bPython (\d+\.\d+)\b", text, re.MULTILINE)
    release_python = said.group(1) if said else "not said"
    python = ".".join(map(str, sys.version_info[:3]))
    lines = [] if python.startswith(release_python + ".") else [f"Python {python} (the release's: {release_python})"]
    absent = []
    for name, version in sorted(pins.items()):
        found = _version(name)
        if found == "not installed":
            absent.append(name)
        elif found != version:
            lines.append(f"{name} {found} (the release's: {version})")
    if absent:
        lines.append(f"not installed ({len(absent)}): {', '.join(absent)}")
    return lines


def accept_deviations(findings: list[Finding], deviations: list[str]) -> list[Finding]:
    """The closure's findings that only a named deviation fails (torch at
    the host's version) accepted, saying so; the overlay's own never are."""
    named = {line.split()[0] for line in deviations}
    return [dataclasses.replace(f, found=f"{f.found} ({DEVIATION})", ok=True)
            if not f.ok and f.what == "version" and f.distribution == "torch" and f.distribution in named else f for f in findings]
