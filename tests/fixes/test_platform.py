"""The devices the suite runs on are the ones the matrix names."""

import jax
import pytest
from matrix import DEVICES, MESHES, PLATFORM


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
