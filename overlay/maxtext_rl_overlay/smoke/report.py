"""smoke's table: one row per check, with its configuration's chips and
seconds; every row of a CPU simulation says so."""

from __future__ import annotations

from .. import tables
from . import checks
from .cpu_simulation import NOTICE
from .engine import HOST_STAND_IN
from .run import SmokeReport


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
    lines += [f"{c.name}: the checks ran at matmul precision {c.precision!r}, pinned by smoke; the '{checks.DEFAULT_PRECISION}' rows "
              f"at jax's default (train_rl's), within {checks.DEFAULT_PRECISION_BOUND}"
              for c in report.configurations if c.precision and c.precision != "default"]
    stand_ins = sorted({s for c in report.configurations for s in c.stand_ins if not s.startswith(HOST_STAND_IN + ": ")})
    if stand_ins:
        lines.append(f"\n{NOTICE}: the TPU kernels ran interpreted on the CPU ({'; '.join(stand_ins)}).")
    host = sorted({s for c in report.configurations for s in c.stand_ins if s.startswith(HOST_STAND_IN + ": ")})
    if host:
        lines.append(f"\nThe TPU cell's host stand-ins were active (docs/tpu-cell.md): {'; '.join(host)}.")
    return "\n".join(lines)
