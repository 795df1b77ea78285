"""The test matrix, declared once in pyproject.toml and read here.

`scripts/test-matrix.sh` and pytest parametrization read the same table
([tool.maxtext-rl-overlay.matrix]) through the tool's own loader, which
validates it; MRL_QUICK=1 selects its `quick` subset.

No jax here: tests/fixes/conftest.py and engine_start.py import this module
to set up the CPU simulation before jax is first imported.
"""

from __future__ import annotations

import os

from maxtext_rl_overlay.config.pins import load_project
from maxtext_rl_overlay.maintain.testmatrix import DEVICES as DEVICES  # the tests read the chip count here
from maxtext_rl_overlay.maintain.testmatrix import load_matrix
from maxtext_rl_overlay.smoke import cpu_simulation
from support import ROOT

#: Where the suite runs (scripts/test-matrix.sh --platform): "cpu" simulates
#: the 8 chips of a TPU v6e-8, "tpu" is a real one.
PLATFORM = os.environ.get("MRL_PLATFORM", "cpu")
#: The TPU cell (docs/tpu-cell.md): the suite's tests marked `tpu_cell` on a
#: TPU host's own chips, however many (one v5e included), which the cell
#: counts first and names in MRL_TPU_CHIPS: the suite's own process must not
#: open the chips to count them, or the engines smoke starts could not.
TPU_CELL = PLATFORM == "tpu" and "MRL_TPU_CHIPS" in os.environ
#: The matrix's maxtext-shims run: MaxText's own run-time replacements kept
#: for the whole session (support/fixes/maxtext_shims.py applies them; read
#: here so that a test that only needs to know, test_train_rl, does not
#: import MaxText to collect: 66 s on the TPU cell's host).
MAXTEXT_SHIMS = os.environ.get("MRL_MAXTEXT_SHIMS") == "1"
#: The chips this run's engines start on.
CHIPS = int(os.environ["MRL_TPU_CHIPS"]) if TPU_CELL else DEVICES

_PROJECT = load_project(ROOT)
MATRIX = load_matrix(_PROJECT.options.matrix, where=str(ROOT / "pyproject.toml"), quick=os.environ.get("MRL_QUICK") == "1")
# Lists, as the tests index, slice and extend them.
MESHES: list[tuple[int, int]] = list(MATRIX.meshes)
AXIS_TYPES: list[str] = list(MATRIX.axis_types)
TOP_K: list[int] = list(MATRIX.k)
DTYPES: list[str] = list(MATRIX.dtypes)


def simulate_v6e_8() -> None:
    """On the CPU platform, the tool's CPU simulation of a v6e-8 (as `smoke
    --cpu-simulation` sets it); a no-op on a real TPU. Must run before jax
    is first imported (the device count is read once)."""
    if PLATFORM == "cpu":
        cpu_simulation.simulate_v6e_8()
