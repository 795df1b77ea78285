"""smoke's answer, as the command gives it: the table (one row per check,
with its configuration's chips and seconds; every row of a CPU simulation
says so), the verdict line, the --json report (docs/reports.md) and the exit
status (`command`)."""

from __future__ import annotations

import dataclasses
import pathlib

from ..checks import reports
from ..checks.verdict import Command, Said, write_report
from ..core import tables
from ..core.errors import OverlayError
from . import checks, configurations
from .cpu_simulation import NOTICE
from .engine import HOST_STAND_IN
from .run import BrokenStack, CannotRun, Configuration, SmokeOptions, SmokeReport, smoke


def _seconds(value: float | None) -> str:
    return f"{value:.1f}" if value is not None else "-"


def render(report: SmokeReport) -> str:
    rows = [("configuration", "chips", "engine start s", "generate s", "sync s", "check", "result", "seen")]
    for config in report.configurations:
        host = [s.split(": ")[1] for s in config.stand_ins if s.startswith(HOST_STAND_IN + ": ")]
        marks = (f"  [{NOTICE}]" if report.cpu_simulation else "") + (f"  [host stand-ins: {', '.join(host)}]" if host else "")
        generates = [v for k, v in config.seconds.items() if k not in ("engine_start", "sync")]
        for check in config.checks:
            rows.append(
                (
                    config.name,
                    str(config.chips or "-"),
                    _seconds(config.seconds.get("engine_start")),
                    _seconds(sum(generates) if generates else None),
                    _seconds(config.seconds.get("sync")),
                    check.name,
                    "pass" if check.ok else "FAIL",
                    check.detail + marks,
                )
            )
    for name, why in report.skipped.items():  # a configuration this install cannot run is a row too, not silence
        rows.append((name, "-", "-", "-", "-", "-", "skipped", why + (f"  [{NOTICE}]" if report.cpu_simulation else "")))
    lines = [tables.render(rows)]
    lines += [f"{c.name}: the second model synced by {c.sync_path}" for c in report.configurations if c.sync_path]
    lines += [_precision_line(c) for c in report.configurations if c.precision and c.precision != "default"]
    stand_ins = sorted({s for c in report.configurations for s in c.stand_ins if not s.startswith(HOST_STAND_IN + ": ")})
    if stand_ins:
        lines.append(f"\n{NOTICE}: the TPU kernels ran interpreted on the CPU ({'; '.join(stand_ins)}).")
    host = sorted({s for c in report.configurations for s in c.stand_ins if s.startswith(HOST_STAND_IN + ": ")})
    if host:
        lines.append(f"\nThe TPU cell's host stand-ins were active (docs/tpu-cell.md): {'; '.join(host)}.")
    return "\n".join(lines)


def _precision_line(config: Configuration) -> str:
    """What precision a configuration's checks ran at, and whether it was
    measured at jax's default too (train_rl's)."""
    pinned = f"{config.name}: the checks ran at matmul precision {config.precision!r}, pinned by smoke"
    at_build = configurations.named(config.name).precision_at_build
    if at_build:
        return f"{pinned}; no row at jax's default: {at_build}, so a started engine keeps it"
    return f"{pinned}; the '{checks.DEFAULT_PRECISION}' rows at jax's default (train_rl's), within {checks.DEFAULT_PRECISION_BOUND}"


#: How smoke ended: its report, or the error that ended it before one; None: not yet.
Outcome = SmokeReport | CannotRun | BrokenStack | None


def json_document(outcome: Outcome, *, cpu_simulation: bool) -> reports.SmokeDocument:
    """smoke's --json report for each way it ends (docs/reports.md)."""
    doc: reports.SmokeDocument = {"report_version": reports.VERSIONS["smoke"], "kind": "smoke", "finished": outcome is not None, "ok": False,
                                  "failed": [], "cannot_run": None, "cpu_simulation": cpu_simulation,
                                  "notice": NOTICE if cpu_simulation else None, "configurations": [], "skipped": {}}
    if outcome is None:
        doc["failed"] = ["smoke did not finish"]
    elif isinstance(outcome, CannotRun):
        doc["cannot_run"] = str(outcome)
    elif isinstance(outcome, BrokenStack):
        doc["failed"] = [str(outcome)]
    else:
        doc["ok"], doc["failed"], doc["skipped"] = not outcome.failed, outcome.failed, outcome.skipped
        doc["configurations"] = [dataclasses.asdict(c) for c in outcome.configurations]
    return doc


def write_json(path: pathlib.Path, outcome: Outcome, *, cpu_simulation: bool) -> None:
    """smoke --json FILE (verdict.write_report: whole or not at all; an
    existing FILE only where it is empty or smoke's own)."""
    write_report("smoke", path, json_document(outcome, cpu_simulation=cpu_simulation))


def verdict(report: SmokeReport) -> str:
    """smoke's last line: yes or NO, each failed check, each configuration skipped."""
    where = " (CPU simulation: not a hardware qualification)" if report.cpu_simulation else ""
    skipped = "".join(f"; {name} skipped: {why}" for name, why in report.skipped.items())
    if report.failed:
        return f"smoke: NO{where} - {len(report.failed)} check(s) failed: {'; '.join(report.failed)}{skipped}"
    return f"smoke: yes{where} - every check passed{skipped}."


def _stopped(exc: OverlayError) -> str:
    """smoke's two ways to end before a report, in its own words (the status is the error's)."""
    if isinstance(exc, CannotRun):
        return f"smoke: cannot run here: {exc}"
    return f"smoke: NO - the installed stack is broken: {exc}"


def command(opts: SmokeOptions) -> int:
    """`smoke`: run it, print the table and the verdict, write the report
    (opts.json: until the end it says smoke did not finish; its two ways to
    end before a report are in it too); the exit status."""
    return Command(
        "smoke", opts.json, lambda: smoke(opts), render, lambda report: Said(not report.failed, verdict(report)),
        lambda outcome: json_document(outcome, cpu_simulation=opts.cpu_simulation), stops=(CannotRun, BrokenStack), stopped=_stopped,
    )()
