"""tpu-inference: the runner's mesh under Tunix's `device_indexes`
(patches/tpu-inference/backport-984b29c49-*, upstream's 984b29c49, #3286).

Tunix's vLLM rollout always names `device_indexes` in the sharding strategy
(`VllmSampler._vllm_config`). With them, `TPUModelRunner._init_mesh` builds
the ("data", "model") mesh in `_create_2d_mesh`:

- at the pin with `jax.make_mesh(..., devices=...)`, whose axes are Explicit by
  default since JAX 0.11: the rollout engine runs under Explicit axes, which
  tpu-inference's model code does not support (test_series_engine_start.py);
- with the backport, with the `jax.sharding.Mesh` constructor over those
  devices in the given order: Auto axes, device order kept.

The runner is the real class (the pin's: tpu_runner.py with the series
reverse-applied, support/fixes/unpatched.py; the overlay's: installed), its
`_init_mesh` called on a bare instance holding what it reads.
"""

from __future__ import annotations

import inspect

import pytest
from jax.sharding import AxisType

from support.fixes.matrix import DEVICES
from support.fixes.meshes import mesh_ids
from support.fixes.runner import create_2d_mesh, overlay_runner, pin_runner

# The order Tunix passes (its devices in order) and one no mesh helper would
# choose: the given order is the point of device_indexes (#3089).
ORDERS = {"in-order": list(range(DEVICES)), "permuted": [5, 2, 7, 0, 3, 6, 1, 4]}
order_ids = pytest.mark.parametrize("order", ORDERS)


def test_tunix_rollout_passes_device_indexes():
    from tunix.generate.vllm_sampler import VllmSampler

    assert '"device_indexes": device_indexes' in inspect.getsource(VllmSampler._vllm_config)


@mesh_ids
def test_unpatched_runner_mesh_is_explicit(mesh_shape):
    mesh = create_2d_mesh(pin_runner(), mesh_shape, ORDERS["in-order"])
    assert dict(mesh.shape) == {"data": mesh_shape[0], "model": mesh_shape[1]}
    assert mesh.axis_types == (AxisType.Explicit, AxisType.Explicit), mesh


@mesh_ids
@order_ids
def test_runner_mesh_is_auto_in_the_given_device_order(mesh_shape, order):
    indexes = ORDERS[order]
    mesh = create_2d_mesh(overlay_runner(), mesh_shape, indexes)
    assert dict(mesh.shape) == {"data": mesh_shape[0], "model": mesh_shape[1]}
    assert mesh.axis_types == (AxisType.Auto, AxisType.Auto), mesh
    assert [d.id for d in mesh.devices.flat] == indexes, "row-major over the given order, as TPUWorker picked the devices"

