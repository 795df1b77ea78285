"""The text the rebase command prints: the outcome table, and --find-base's answer."""

from __future__ import annotations

import re

from .findbase import BaseFound
from .report import Report
from .state import Outcome


def render(report: Report) -> str:
    width = max([len(p.name) for p in report.patches] + [5])
    old, new = report.old, report.new
    lines = [
        f"rebase {report.name}: {old.commit[:12]} -> {new.commit[:12]}"
        + (f"   version {old.version} -> {new.version}" if new.version else ""),
        "",
        f"  {'patch':<{width}}  outcome",
    ]
    for p in report.patches:
        detail = p.detail if p.outcome != Outcome.APPLIED_CLEANLY else ""
        if p.outcome.dropped and re.fullmatch(r"[0-9a-f]{40}", detail or ""):
            detail = f"Applied-Upstream: {detail[:12]}"
        lines.append(f"  {p.name:<{width}}  {p.outcome}" + (f"  ({detail})" if detail else ""))
    if not report.patches:
        lines.append("  (empty series)")
    lines.append("")
    lines += [f"  note: {n}" for n in report.notes]
    if report.tests:
        lines.append(f"  fast tests (tests/unit): {'passed' if report.tests_ok else 'FAILED'}: {report.tests}")
    lines.append(f"  time: {report.seconds:.1f}s")
    if report.message:
        lines += ["", report.message]
    return "\n".join(lines)


def render_base(name: str, result: BaseFound) -> str:
    lines = [
        f"find-base {name}: newest first-parent commit on which the whole series applies (git am -3, no conflict):",
        f"  {result['base_line']}",
        f"  ({result['position']} of {result['commits']} first-parent commits after the pin; {result['tried']} tried by bisection)",
    ]
    if "first_conflict" in result:
        lines.append(f"  the next one conflicts: {result['first_conflict']}")
    lines.append(f"  rebase onto it: scripts/rebase.sh {name} {result['base'][:12]}")
    return "\n".join(lines)
