"""Shared set-up of the patched-behaviour suite.

These tests import the INSTALLED overlay wheels (tpu_inference, tunix), never
a source tree. MRL_PLATFORM says where they run: "cpu" (the default) simulates
the 8 chips of a TPU v6e-8 on the host, which must be set before jax is first
imported, hence here; "tpu" uses the real chips, and the session stops at once
unless it sees a v6e-8.
"""

import pytest

# The suite's helpers are the support.fixes package (tests/support/fixes).
from support.fixes.matrix import CHIPS, DEVICES, MAXTEXT_SHIMS, PLATFORM, TPU_CELL, simulate_v6e_8

if PLATFORM not in ("cpu", "tpu"):
    raise pytest.UsageError(f"MRL_PLATFORM must be cpu or tpu, not {PLATFORM!r}")
simulate_v6e_8()


def pytest_configure(config):
    # The MaxText cell's second run: MaxText's module-level shims replace
    # jax.lax functions for the whole process, as importing its Tunix adapter
    # does in a train_rl run. Installed now, before any test module imports.
    if MAXTEXT_SHIMS:
        from support.fixes import maxtext_shims

        if maxtext_shims.ADAPTER is None:
            raise pytest.UsageError("MRL_MAXTEXT_SHIMS=1 needs maxtext installed (the MaxText cell of the matrix).")


def pytest_collection_modifyitems(config, items):
    """The TPU cell runs only the tests marked `tpu_cell`: the rest need the
    matrix's meshes, a v6e-8's 8 chips."""
    if not TPU_CELL:
        return
    skip = pytest.mark.skip(reason=f"needs the matrix's meshes (a v6e-8's 8 chips, or their CPU simulation); the TPU cell runs on "
                                   f"this host's {CHIPS} chip(s) the tests marked tpu_cell")
    for item in items:
        if item.get_closest_marker("tpu_cell") is None:
            item.add_marker(skip)


def pytest_sessionstart(session):
    """Refuse to run the suite on the wrong devices: a result on anything but
    8 simulated CPU devices, or a real v6e-8, would not be the matrix's. The
    TPU cell counted its chips before (MRL_TPU_CHIPS) and runs only what
    holds on any number of them."""
    if TPU_CELL:
        return
    import jax

    devices = jax.devices()
    kinds = sorted({d.device_kind for d in devices})
    if PLATFORM == "tpu":
        ok = len(devices) == DEVICES and all(d.platform == "tpu" for d in devices) and all("v6" in k.lower() for k in kinds)
        want = "8 TPU v6e devices (a v6e-8)"
    else:
        ok = len(devices) == DEVICES and all(d.platform == "cpu" for d in devices)
        want = "8 simulated CPU devices"
    if not ok:
        pytest.exit(
            f"--platform {PLATFORM}: this suite needs {want}, but jax sees {len(devices)} "
            f"{devices[0].platform if devices else 'no'} device(s) of kind {', '.join(kinds) or 'none'}.",
            returncode=3,
        )


@pytest.fixture(scope="session")
def family_models():
    """`family_models(name)`: the FamilyModels of that family of
    support/fixes/maxtext_models.py (a tiny real MaxText actor moved as
    training moves it, its rollout target, the values the target must
    receive), built once a session at the first test that asks: the
    weight-sync tests of several files share them (each costs MaxText's
    configuration and model creation)."""
    from support.fixes import maxtext_models

    if not maxtext_models.AVAILABLE:
        pytest.skip("needs MaxText 0.2.4 (the matrix's maxtext-0.2.4 cell): would have synced tiny real MaxText models")
    built: dict = {}

    def get(name: str):
        if name not in built:
            built[name] = maxtext_models.FamilyModels(maxtext_models.FAMILIES[name])
        return built[name]

    return get
