"""Stage 5, on the target machine: are the installed distributions the
overlay builds, with every file the series touches intact?"""

from __future__ import annotations

import base64
import dataclasses
import importlib.metadata as md

from packaging.utils import canonicalize_name

from . import manifest


@dataclasses.dataclass(frozen=True)
class Finding:
    distribution: str
    what: str  # "version", a file path, or "source"
    expected: str
    found: str
    ok: bool


def _record_hash(dist: md.Distribution, relpath: str) -> str | None:
    """The sha256 the installer recorded for a file (RECORD), hex."""
    for f in dist.files or ():
        if str(f) == relpath and f.hash is not None and f.hash.mode == "sha256":
            return base64.urlsafe_b64decode(f.hash.value + "=" * (-len(f.hash.value) % 4)).hex()
    return None


def check(doc: dict | None = None, *, require_pinned: bool = False) -> list[Finding]:
    doc = doc if doc is not None else manifest.load_installed()
    findings: list[Finding] = []
    for name, want in sorted(doc["distributions"].items()):
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            findings.append(Finding(name, "version", want["version"], "not installed", False))
            continue
        if canonicalize_name(dist.metadata["Name"]) != canonicalize_name(name):
            findings.append(Finding(name, "name", name, dist.metadata["Name"], False))
        findings.append(Finding(name, "version", want["version"], dist.version, dist.version == want["version"]))
        if want["from_pin"]:
            findings.append(Finding(name, "source", f"pin {want['pin']['commit'][:12]}", f"pin {want['pin']['commit'][:12]}", True))
        else:
            findings.append(
                Finding(name, "source", f"pin {want['pin']['commit'][:12]}", f"UNPINNED stand-in tree {want['source']['tree'][:12]}", not require_pinned)
            )
        for relpath, sha in sorted(want["files"].items()):
            path = dist.locate_file(relpath)
            try:
                found = manifest.sha256_file(path)
            except OSError:
                found = "missing"
            recorded = _record_hash(dist, relpath)
            ok = found == sha and recorded == sha
            if found == sha and recorded != sha:
                found = f"{found[:12]} (RECORD says {recorded[:12] if recorded else 'nothing'}: not installed from the overlay wheel)"
            findings.append(Finding(name, relpath, sha, found, ok))
    return findings


def render(findings: list[Finding]) -> str:
    rows = [("distribution", "check", "expected", "found", "")]
    for f in findings:
        short = lambda s: s[:12] if len(s) == 64 else s  # noqa: E731 - sha256 columns stay readable
        rows.append((f.distribution, f.what, short(f.expected), short(f.found), "ok" if f.ok else "DIFFERS"))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)
