"""The suite's ("data", "model") meshes, by the matrix's axis-type names.

Apart from matrix.py because it imports jax, which must come after the CPU
simulation's environment is set (tests/fixes/conftest.py)."""

from __future__ import annotations

import jax
import pytest
from jax.sharding import AxisType

from support.fixes.matrix import MESHES

#: The matrix's axis-types entries ("explicit", "auto") as JAX's.
AXIS_TYPE = {"explicit": AxisType.Explicit, "auto": AxisType.Auto}
#: What jax.lax.with_sharding_constraint raises (AssertionError) on a mesh
#: whose axes are all Explicit: upstream's failure at most call sites.
WSC_ASSERT = "acts as an assert when all axes of mesh are of type `Explicit`"
#: A test once per mesh shape of the matrix, its id "DATAxMODEL" (a mark, not
#: a fixture: a fixture's parameter would come first in the ids of the tests
#: it joins other parameters in, and move them).
mesh_ids = pytest.mark.parametrize("mesh_shape", MESHES, ids=lambda m: "x".join(map(str, m)))


def make_mesh(shape, axis_type: str = "explicit", names=("data", "model")) -> jax.sharding.Mesh:
    """A mesh of `shape` whose every axis is of `axis_type`. Explicit is
    jax.make_mesh's own default in JAX 0.11, and what the runner builds."""
    return jax.make_mesh(shape, names, axis_types=(AXIS_TYPE[axis_type],) * len(names))
