"""How the TPU kernels run in this test run, for test ids and JUnit records:
compiled on a TPU, or in Pallas TPU interpret mode on the CPU simulation
(the tool's maxtext_rl_overlay.smoke.pallas_interpret, which the tests
activate as `smoke --cpu-simulation` does)."""

from __future__ import annotations

from collections.abc import Callable

from maxtext_rl_overlay.smoke import pallas_interpret
from support.fixes.matrix import PLATFORM

#: The JUnit property (record_property) that names the stand-ins a test ran on.
PROPERTY = "stand-in"


def kernels_id() -> str:
    """The test-id part saying how the TPU kernels run here."""
    return pallas_interpret.LABEL if PLATFORM == "cpu" else "tpu-kernels"


def record(record_property: Callable[[str, str], None]) -> None:
    """Say in the test's JUnit record that it ran on the stand-in (where active)."""
    if pallas_interpret.active():
        record_property(PROPERTY, pallas_interpret.LABEL)
