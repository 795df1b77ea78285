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

import argparse
import base64
import dataclasses
import enum
import importlib.metadata as md
import json
import pathlib
import sys
from collections.abc import Callable

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from .. import probes
from ..core import manifest, proc, tables
from ..core.digest import sha256_file
from ..core.errors import OverlayError, TimedOut
from ..core.manifest import Manifest
from ..probes import host_facts
from . import reports
from .verdict import Command, Said, write_report

#: How long the import check may take (tpu_inference alone imports vLLM,
#: torch and transformers: 25-35 s on a small machine).
IMPORT_TIMEOUT = 900
#: How long finding where the modules resolve may take (nothing is imported).
RESOLVE_TIMEOUT = 120


class Check(enum.StrEnum):
    """What a finding checked; its subject (a file, a module, a path) is the finding's."""

    VERSION = "version"  # the installed version is the overlay build's (torch: the closure's)
    NAME = "name"  # the distribution's metadata names it
    SOURCE = "source"  # built from the pinned tree, not a stand-in
    FILE = "file"  # a patched file intact, on disk and in RECORD (subject: its path)
    BUILT = "built"  # the release holds an overlay build of it
    RESOLUTION = "resolution"  # the resolver could answer at all
    RESOLVES_TO = "resolves to"  # a plain import of the subject module reaches the installed file
    LEFTOVER = "leftover"  # the subject .pth / egg-link belongs to another install
    IMPORT = "import"  # the subject module imports


class Problem(enum.StrEnum):
    """Why a finding differs (or, DEVIATION, why it was accepted): what
    `explain` groups its sentences by, and what a report names."""

    REPLACED = "replaced"  # another build of the same upstream took the overlay's place
    OTHER_OVERLAY_BUILD = "other overlay build"  # an overlay build of another release
    NOT_FROM_WHEEL = "not from the wheel"  # the file is intact but RECORD disagrees
    STAND_IN = "stand-in"  # built from an unpinned tree
    NOT_BUILT = "not built"  # the release was built without it (build --only)
    NOT_ASKED = "not asked"  # the resolver or the importer gave no answer
    SHADOWED = "shadowed"  # a plain import finds another file first
    LEFTOVER = "leftover"  # a .pth / egg-link of another install
    IMPORT_FAILED = "import failed"
    DEVIATION = "host deviation"  # accepted as a named host deviation (--host-deviations)


#: The check column of a check with a subject (Finding.what); the others say the check's name.
_WHAT: dict[Check, str] = {Check.FILE: "{subject}", Check.RESOLVES_TO: "import {subject} resolves to", Check.IMPORT: "import {subject}",
                           Check.LEFTOVER: "leftover {subject}"}

#: What to do about a problem, where that is the same whatever was found: a
#: finding's `remedy`, and what `explain` says again in its sentences.
REMEDY: dict[Problem, str] = {
    Problem.OTHER_OVERLAY_BUILD: "install with the constraints file this release came with",
    Problem.STAND_IN: "install a release built from the pinned sources (build without --unpinned)",
    Problem.NOT_BUILT: "install a release built with every distribution (scripts/build-wheels.sh without --only)",
    Problem.SHADOWED: "remove the older copy that comes first on the path, or its entry (PYTHONPATH, the current directory, a .pth line)",
}


@dataclasses.dataclass(frozen=True)
class Finding:
    """One check of one distribution, as data: what was checked (`check`,
    `subject`), what was expected and found, whether it holds, why not
    (`problem`, `detail`) and what to do (`remedy`). The table's text is
    made from these by `what` and `shown`, and nowhere else."""

    distribution: str
    check: Check
    expected: str
    found: str
    ok: bool
    subject: str = ""
    problem: Problem | None = None
    detail: str = ""  # what the problem's words need besides: the origin, RECORD's digest, what a leftover adds
    remedy: str = ""

    @property
    def what(self) -> str:
        """The check column: "version", the file's path, "import MODULE", ..."""
        return _WHAT[self.check].format(subject=self.subject) if self.check in _WHAT else self.check.value

    @property
    def shown(self) -> str:
        """The found column: the value found, with what is wrong with it (_SHOWN)."""
        words = _SHOWN.get(self.problem) if self.problem is not None else None
        return words(self.found, self.detail) if words else self.found


#: The found column, by problem: (found, detail) -> the value found, with what is wrong with it.
_SHOWN: dict[Problem, Callable[[str, str], str]] = {
    Problem.REPLACED: lambda found, detail: f"{found}: REPLACED by {detail}",
    Problem.OTHER_OVERLAY_BUILD: lambda found, _: f"{found} (another overlay build: install the constraints this one came with)",
    Problem.NOT_FROM_WHEEL: lambda found, detail: f"{found[:12]} (RECORD says {detail}: not installed from the overlay wheel)",
    Problem.STAND_IN: lambda found, _: f"UNPINNED stand-in tree {found}",
    Problem.NOT_BUILT: lambda found, _: NOT_BUILT + (f"; installed: {found}, not an overlay build" if found != NOT_INSTALLED else ""),
    Problem.NOT_ASKED: lambda found, detail: f"{detail}: {found}" if detail else found,
    Problem.SHADOWED: lambda found, _: f"{found} ({SHADOWED})",
    Problem.LEFTOVER: lambda found, _: f"{LEFTOVER}: {found}",
    Problem.DEVIATION: lambda found, _: f"{found} ({DEVIATION})",
}

#: What `_version` says of a distribution that is not installed.
NOT_INSTALLED = "not installed"


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


def _version_finding(name: str, want: str, dist: md.Distribution, doc: Manifest) -> Finding:
    """The installed version against the overlay build's; where another
    build took our place, which one and what restores ours."""
    found = dist.version
    if found == want:
        return Finding(name, Check.VERSION, want, found, True)
    restore = _restore(doc)
    try:
        ours, theirs = Version(want), Version(found)
    except InvalidVersion:
        return Finding(name, Check.VERSION, want, found, False, remedy=restore)
    if theirs.local and theirs.local.startswith("mrl."):
        return Finding(name, Check.VERSION, want, found, False, problem=Problem.OTHER_OVERLAY_BUILD,
                       remedy=REMEDY[Problem.OTHER_OVERLAY_BUILD])
    origin = _origin(dist)
    how = f" from {origin}" if origin else ""
    same = "the same upstream" if theirs.public == ours.public or origin else "an upstream"
    return Finding(name, Check.VERSION, want, found, False, problem=Problem.REPLACED, detail=f"{same} build, not the overlay's{how}",
                   remedy=f"do not run MaxText's install_tpu_post_train_extra_deps; {restore}")


def source_finding(name: str, want: manifest.Distribution, require_pinned: bool) -> Finding:
    """Whether `name` was built from its pin, or from an unpinned stand-in
    tree (and which patches were left out of it: code the stand-in lacks)."""
    pin = f"pin {want.pin.commit[:12]}"
    if want.from_pin:
        return Finding(name, Check.SOURCE, pin, pin, True)
    tree = want.source.tree[:12] + (f" (left out of it: {', '.join(want.left_out)})" if want.left_out else "")
    return Finding(name, Check.SOURCE, pin, tree, not require_pinned, problem=Problem.STAND_IN, remedy=REMEDY[Problem.STAND_IN])


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
            if want.extra:  # installed with the overlay's extra alone (MaxText): an install without it has nothing of it to check
                findings.append(Finding(name, Check.VERSION, f"{want.version} (with [{want.extra}])", NOT_INSTALLED, True))
                continue
            findings.append(Finding(name, Check.VERSION, want.version, NOT_INSTALLED, False, remedy=f"install the overlay: {restore_command(doc)}"))
            continue
        if canonicalize_name(dist.metadata["Name"]) != canonicalize_name(name):
            findings.append(Finding(name, Check.NAME, name, dist.metadata["Name"], False, remedy=_restore(doc)))
        findings.append(_version_finding(name, want.version, dist, doc))
        findings.append(source_finding(name, want, require_pinned))
        for relpath, sha in sorted(want.files.items()):
            path = dist.locate_file(relpath)
            try:
                found = sha256_file(pathlib.Path(str(path)))
            except OSError:
                found = "missing"
            recorded = _record_hash(dist, relpath)
            ok = found == sha and recorded == sha
            reinstall = "" if ok else f"reinstall the overlay's wheel: {restore_command(doc)} --reinstall-package {name}"
            if found == sha and recorded != sha:
                findings.append(Finding(name, Check.FILE, sha, found, ok, subject=relpath, problem=Problem.NOT_FROM_WHEEL,
                                        detail=recorded[:12] if recorded else "nothing", remedy=reinstall))
            else:
                findings.append(Finding(name, Check.FILE, sha, found, ok, subject=relpath, remedy=reinstall))
    for name in sorted(doc.not_built):
        if name == manifest.maxtext_name(doc.environment.maxtext) and not _maxtext_installed():
            continue  # the extra's alone, and not installed: nothing runs without the overlay's fixes
        # The release was built without it (build --only): whatever is
        # installed under that name carries none of the overlay's fixes.
        findings.append(Finding(name, Check.BUILT, "an overlay build", _version(name), False, problem=Problem.NOT_BUILT,
                                remedy=REMEDY[Problem.NOT_BUILT]))
    findings += check_resolution(doc, python=python)
    if environment:
        findings += check_environment(doc, require_pinned=require_pinned)
    return findings


def _vouched(doc: Manifest) -> list[tuple[str, str, str]]:
    """Each module the overlay vouches for, distribution by distribution:
    its import package, then each module its series patches, as (module,
    distribution, the file it is installed as)."""
    out: list[tuple[str, str, str]] = []
    for name, want in sorted(doc.distributions.items()):
        if want.extra and _version(name) == NOT_INSTALLED:
            continue  # the extra's alone (MaxText), not installed here
        files = {want.import_package: f"{want.import_package}/__init__.py"}
        for relpath in sorted(want.files):
            if relpath.endswith(".py"):
                files.setdefault(relpath[: -len(".py")].replace("/", ".").removesuffix(".__init__"), relpath)
        out += [(module, name, relpath) for module, relpath in files.items()]
    return out


def _restore(doc: Manifest) -> str:
    return f"restore the overlay: {restore_command(doc)}"


def _sentence(remedy: str) -> str:
    """A remedy as a sentence of `explain`."""
    return remedy[0].upper() + remedy[1:] + "."


def check_resolution(doc: Manifest, *, python: str = sys.executable) -> list[Finding]:
    """Does a plain `import` of each module the overlay vouches for reach
    the file its distribution installed, and is there no leftover .pth or
    egg-link of another install of one of its distributions? Asked of
    `python` in a fresh process, in this process's environment."""
    modules = [[module, name, doc.distributions[name].version, relpath] for module, name, relpath in _vouched(doc)]
    asked = {
        "modules": modules,
        "versions": {name: d.version for name, d in doc.distributions.items()},
        "packages": {name: d.import_package for name, d in doc.distributions.items()},
    }
    try:
        # probes/resolver.py: standard library only, it imports none of the modules it locates.
        result = proc.run(probes.command(python, "resolver", json.dumps(asked)), check=False, timeout=RESOLVE_TIMEOUT,
                          env={"PYTHONWARNINGS": "ignore"}, what="finding where each module resolves, in a fresh process")
    except TimedOut:  # it did not finish in time
        result = None
    try:
        found = json.loads(result.stdout.strip().splitlines()[-1]) if result else None
    except (ValueError, IndexError):  # it printed no answer
        found = None
    if result is None or not isinstance(found, dict):
        tail = (result.stderr.strip().splitlines() or [f"exit code {result.returncode}"])[-1] if result else f"timed out after {RESOLVE_TIMEOUT} s"
        return [Finding(name, Check.RESOLUTION, "a plain import finds the installed files", tail, False, problem=Problem.NOT_ASKED,
                        detail="could not be asked", remedy="run verify with -v: the interpreter's own error says why it could not answer")
                for name in sorted(doc.distributions)]
    findings = []
    by_module = {m[0]: m[1] for m in modules}
    for module, installed, resolved in found["modules"]:
        if resolved == installed:
            findings.append(Finding(by_module[module], Check.RESOLVES_TO, installed, resolved, True, subject=module))
        else:
            findings.append(Finding(by_module[module], Check.RESOLVES_TO, installed, resolved, False, subject=module, problem=Problem.SHADOWED,
                                    remedy=REMEDY[Problem.SHADOWED]))
    for dist, path, what in found["leftovers"]:
        findings.append(Finding(dist, Check.LEFTOVER, "no .pth / egg-link of another install", what, False, subject=path,
                                problem=Problem.LEFTOVER, remedy=f"delete {path}"))
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
    ok = found == torch.version and not (torch.standin and require_pinned)
    findings = [Finding("torch", Check.VERSION, label, found, ok, remedy="" if ok else f"install the closure's torch: {restore_command(doc)}")]
    adapter = doc.environment.maxtext_vllm_adapter
    if adapter and _maxtext_installed():
        # With MaxText, its vLLM plugin must be there (vLLM's engine processes
        # find MaxTextForCausalLM through it), built from the same release.
        found = _version(adapter.name)
        ok = found == adapter.version
        findings.append(Finding(adapter.name, Check.VERSION, adapter.version, found, ok, remedy="" if ok else _restore(doc)))
    return findings


def _version(name: str) -> str:
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return NOT_INSTALLED


def _maxtext_installed() -> bool:
    return _version("maxtext") != NOT_INSTALLED


def import_modules(doc: Manifest) -> dict[str, str]:
    """What the overlay vouches for, module -> distribution: every
    distribution's import package, and each module its series patches."""
    modules: dict[str, str] = {}
    for module, name, _ in _vouched(doc):
        if module == doc.distributions[name].import_package:
            modules[module] = name
        else:
            modules.setdefault(module, name)
    adapter = doc.environment.maxtext_vllm_adapter
    if adapter and _maxtext_installed():
        modules["maxtext_vllm_adapter"] = adapter.name
    return modules


def check_imports(doc: Manifest | None = None, *, python: str = sys.executable) -> list[Finding]:
    doc = doc if doc is not None else manifest.load_installed()
    modules = import_modules(doc)
    try:
        result = proc.run(probes.command(python, "importer", *modules), check=False, timeout=IMPORT_TIMEOUT, env={"PYTHONWARNINGS": "ignore"},
                          what="importing the stack in a fresh process")
    except TimedOut:  # it did not finish in time
        return [Finding(d, Check.IMPORT, "imported", f"timed out after {IMPORT_TIMEOUT} s", False, subject=m, problem=Problem.NOT_ASKED,
                        remedy="import it by hand (python -c 'import MODULE') to see where it hangs") for m, d in modules.items()]
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
            findings.append(Finding(dist, Check.IMPORT, "imported", tail, False, subject=module, problem=Problem.NOT_ASKED,
                                    detail="the interpreter died", remedy=f"import it by hand (python -c 'import {module}') to see why"))
        elif done[module]:
            findings.append(Finding(dist, Check.IMPORT, "imported", done[module], False, subject=module, problem=Problem.IMPORT_FAILED,
                                    remedy="install what the error names as missing, or the closure again: " + restore_command(doc)))
        else:
            findings.append(Finding(dist, Check.IMPORT, "imported", "imported", True, subject=module))
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
    rows += [(f.distribution, f.what, short(f.expected), short(f.shown), "ok" if f.ok else "DIFFERS") for f in findings]
    return tables.render(rows)


def explain(findings: list[Finding], doc: Manifest) -> list[str]:
    """What the user should know and do, in sentences, for what failed."""
    lines = []
    replaced = [f for f in findings if f.problem is Problem.REPLACED]
    if replaced:
        lines.append(
            f"{', '.join(f.distribution for f in replaced)} {'was' if len(replaced) == 1 else 'were'} replaced by builds "
            "that are not the overlay's, without its fixes. MaxText's install_tpu_post_train_extra_deps does this "
            "(it installs the upstreams from GitHub with --no-deps): the overlay replaces that step, so do not run it."
        )
        lines.append(f"Restore the overlay with (the constraints file you installed from): {restore_command(doc)}")
    left_out = [f.distribution for f in findings if f.problem is Problem.NOT_BUILT]
    if left_out:
        lines.append(
            f"This release was built without {', '.join(left_out)} (build --only): it is not the whole stack, and an install "
            f"from it cannot have the overlay's fixes there. {_sentence(REMEDY[Problem.NOT_BUILT])}"
        )
    shadowed = [f for f in findings if f.problem is Problem.SHADOWED]
    if shadowed:
        first = shadowed[0]
        lines.append(
            f"A plain import does not reach the overlay's files: {', '.join(f.subject for f in shadowed)} "
            f"resolve{'s' if len(shadowed) == 1 else ''} elsewhere ({first.subject}: {first.found}, not {first.expected}). "
            "An older copy comes first on the path (a PYTHONPATH entry such as a base image's /deps/src, the current directory, "
            "or a .pth line): remove that copy or that entry."
        )
    leftovers = [f for f in findings if f.problem is Problem.LEFTOVER]
    if leftovers:
        lines.append(
            f"Another install of {', '.join(sorted({f.distribution for f in leftovers}))} left "
            f"{', '.join(f.subject for f in leftovers)} behind: delete "
            f"{'it' if len(leftovers) == 1 else 'them'} (an editable or egg-link install the overlay's install did not remove)."
        )
    failed = [f for f in findings if f.check is Check.IMPORT and not f.ok]
    if failed:
        lines.append(f"The stack does not import: {failed[0].what} failed with {failed[0].shown}.")
    return lines


#: What a finding accepted as a host's deviation says (verify --host-deviations).
DEVIATION = "a HOST DEVIATION from the release"


def host_deviations(closure: pathlib.Path) -> list[str]:
    """What this environment runs that differs from the release's closure
    (`closure`: the TPU cell's bundle's release-closure.txt, whose header
    names the release's Python), as probes/host_facts.py's `deviations`
    gives them (the TPU cell's account too), with the distributions whose
    Requires-Python excludes this Python. Said, never accepted silently:
    verify --host-deviations names each one in its verdict."""
    try:
        text = closure.read_text()
    except OSError as exc:
        raise OverlayError(f"--host-deviations {closure}: cannot read it ({exc.strerror}).") from None
    if not host_facts.release_pins(text):
        raise OverlayError(f"--host-deviations {closure}: no name==version lines (give the bundle's release-closure.txt).")
    return host_facts.deviations(text, excludes=_excludes)


def _excludes(_name: str, requires_python: str, python: str) -> bool:
    try:
        return not SpecifierSet(requires_python).contains(python, prereleases=True)
    except InvalidSpecifier:
        return False


def accept_deviations(findings: list[Finding], deviations: list[str]) -> list[Finding]:
    """The closure's findings that only a named deviation fails (torch at
    the host's version) accepted, saying so; the overlay's own never are."""
    named = {line.split()[0] for line in deviations}
    return [dataclasses.replace(f, problem=Problem.DEVIATION, ok=True, remedy="")
            if not f.ok and f.check is Check.VERSION and f.distribution == "torch" and f.distribution in named else f for f in findings]


# -- the command: verify [--json FILE] ------------------------------------------


@dataclasses.dataclass(frozen=True)
class VerifyOptions:
    require_pinned: bool = False
    imports: bool = True  # --no-imports: False
    files_only: bool = False
    host_deviations: pathlib.Path | None = None  # the release's closure (the TPU cell's release-closure.txt)
    json: pathlib.Path | None = None  # where the report goes (docs/reports.md)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> VerifyOptions:
        return cls(require_pinned=args.require_pinned, imports=not args.no_imports, files_only=args.files_only,
                   host_deviations=args.host_deviations, json=args.json)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """verify's answer: every finding, the host's deviations, what to do
    about what failed, and the verdict line."""

    findings: list[Finding]
    deviations: list[str]
    explanation: list[str]
    line: str
    opts: VerifyOptions
    resolution_cutoff: str = ""  # the registry's moment the release's closure was resolved against (its manifest); "" for none recorded

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.findings)


def verify(opts: VerifyOptions) -> Verdict:
    """The installed stack checked as `opts` asks."""
    doc = manifest.load_installed()
    findings = check(doc, require_pinned=opts.require_pinned, environment=not opts.files_only)
    if opts.imports and not opts.files_only:
        findings += check_imports(doc)
    deviations = host_deviations(opts.host_deviations) if opts.host_deviations else []
    findings = accept_deviations(findings, deviations)
    bad = [f for f in findings if not f.ok]
    return Verdict(findings, deviations, explain(findings, doc) if bad else [], verdict_line(findings, deviations, opts), opts,
                   doc.environment.resolution_cutoff)


def command(opts: VerifyOptions) -> int:
    """`verify`: the table on stdout; the verdict on stdout (yes) or stderr
    (NO, with what to do); with opts.json, the report written (also on a NO;
    until the end it says verify did not finish); the exit status."""
    return Command("verify", opts.json, lambda: verify(opts), lambda verdict: render(verdict.findings),
                   lambda verdict: Said(verdict.ok, verdict.line, tuple(verdict.explanation)), json_document)()


def verdict_line(findings: list[Finding], deviations: list[str], opts: VerifyOptions) -> str:
    """verify's last line: yes or NO, and what it covered."""
    # A host that deviates from the release is never called the release: its deviations are in the verdict.
    on_host = f"on a host that deviates from the release: {'; '.join(deviations)}" if deviations else ""
    bad = [f for f in findings if not f.ok]
    if bad:
        return f"verify: NO - {len(bad)} check(s) failed" + (f"; {on_host}" if on_host else "") + "."
    what = "the installed distributions are the overlay builds, patched files intact"
    if opts.files_only:
        what += "; the closure (torch) and the imports NOT checked (--files-only)"
    what += "." if not opts.imports or opts.files_only else "; the stack imports."
    return f"verify: yes, {on_host}. Otherwise: {what}" if on_host else f"verify: yes - {what}"


def json_document(verdict: Verdict | None) -> reports.VerifyDocument:
    """verify's report (docs/reports.md); None: verify has not finished."""
    if verdict is None:
        return {"report_version": reports.VERSIONS["verify"], "kind": "verify", "finished": False, "ok": False,
                "verdict": "verify did not finish", "findings": [], "explanation": [], "deviations": [], "closure_checked": False,
                "imports_checked": False, "resolution_cutoff": ""}
    findings: list[reports.FindingDocument] = [
        {"distribution": f.distribution, "check": f.check.value, "subject": f.subject, "expected": f.expected, "found": f.found,
         "shown": f.shown, "ok": f.ok, "problem": f.problem.value if f.problem else None, "remedy": f.remedy}
        for f in verdict.findings]
    opts = verdict.opts
    return {"report_version": reports.VERSIONS["verify"], "kind": "verify", "finished": True, "ok": verdict.ok, "verdict": verdict.line,
            "findings": findings, "explanation": verdict.explanation, "deviations": verdict.deviations,
            "closure_checked": not opts.files_only, "imports_checked": opts.imports and not opts.files_only,
            "resolution_cutoff": verdict.resolution_cutoff}


def write_json(path: pathlib.Path, verdict: Verdict | None) -> None:
    """verify --json FILE (verdict.write_report: whole or not at all; an
    existing FILE only where it is empty or a verify report)."""
    write_report("verify", path, json_document(verdict))
