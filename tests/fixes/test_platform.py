"""The devices the suite runs on are the ones the matrix names."""

import os

import jax
import pytest

from support.fixes import maxtext_shims
from support.fixes.matrix import DEVICES, MESHES, PLATFORM


def test_eight_devices_make_every_mesh_of_the_matrix():
    assert len(jax.devices()) == DEVICES
    for shape in MESHES:
        mesh = jax.make_mesh(shape, ("data", "model"))
        assert mesh.devices.size == DEVICES


@pytest.mark.tpu
@pytest.mark.skipif(PLATFORM != "tpu", reason="needs a real TPU v6e-8 (scripts/test-matrix.sh --platform tpu): "
                    "would have checked that jax sees 8 TPU v6e chips and that the suite ran on them, not on the CPU simulation")
def test_runs_on_a_real_v6e_8():
    devices = jax.devices()
    assert {d.platform for d in devices} == {"tpu"}
    assert all("v6" in d.device_kind.lower() for d in devices)


def test_maxtext_shims_are_the_installed_ones_where_maxtext_is():
    """In the MaxText cell the shims the suite wraps the overlay in are MaxText's
    own (imported from the installed release); elsewhere maxtext is absent by
    design and the re-created ones stand in. Neither may fall back silently."""
    in_maxtext_cell = os.environ.get("MRL_MAXTEXT") == "1"
    assert (maxtext_shims.SOURCE == "maxtext (installed)") == in_maxtext_cell, maxtext_shims.SOURCE
    if maxtext_shims.GLOBAL:
        assert jax.lax.top_k is maxtext_shims.ADAPTER._compat_top_k
        assert jax.lax.with_sharding_constraint is maxtext_shims.ADAPTER._compat_wsc
    elif maxtext_shims.ADAPTER is not None:
        assert jax.lax.top_k is maxtext_shims.ADAPTER._orig_top_k  # imported, its replacements undone
