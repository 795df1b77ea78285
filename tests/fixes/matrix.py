"""The test matrix, declared once in pyproject.toml and read here.

`scripts/test-matrix.sh` and pytest parametrization read the same table
([tool.maxtext-rl-overlay.matrix]); MRL_QUICK=1 selects its `quick` subset.
"""

from __future__ import annotations

import os
import pathlib
import tomllib

_PYPROJECT = pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml"


def load() -> dict:
    table = tomllib.loads(_PYPROJECT.read_text())["tool"]["maxtext-rl-overlay"]["matrix"]
    quick = table.pop("quick")
    if os.environ.get("MRL_QUICK") == "1":
        table.update(quick)
    return table


#: Where the suite runs (scripts/test-matrix.sh --platform): "cpu" simulates
#: the 8 chips of a TPU v6e-8, "tpu" is a real one.
PLATFORM = os.environ.get("MRL_PLATFORM", "cpu")
DEVICES = 8

MATRIX = load()
MESHES: list[tuple[int, int]] = [tuple(m) for m in MATRIX["meshes"]]
AXIS_TYPES: list[str] = MATRIX["axis-types"]
TOP_K: list[int] = MATRIX["k"]
DTYPES: list[str] = MATRIX["dtypes"]
