"""The CPU simulation of a TPU v6e-8: jax sees its 8 chips as 8 host
devices. `smoke --cpu-simulation` and the test suite run in it, with the TPU
kernels interpreted (pallas_interpret.py). No jax here: the environment must
be set before jax is first imported (the device count is read once)."""

from __future__ import annotations

import os
from collections.abc import MutableMapping

#: The chips of a TPU v6e-8, and so the CPU devices that simulate them;
#: every mesh of the test matrix spans them all (testmatrix.DEVICES, held
#: equal by tests/unit/test_matrix_report.py).
DEVICES = 8
#: Said on every line of output a CPU simulation produced.
NOTICE = "CPU simulation: not a hardware qualification"


def simulate_v6e_8(env: MutableMapping[str, str] = os.environ) -> None:
    """Set, in `env`, what makes jax run on 8 CPU devices as a v6e-8's chips."""
    env["JAX_PLATFORMS"] = "cpu"
    flags = env.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        env["XLA_FLAGS"] = (flags + f" --xla_force_host_platform_device_count={DEVICES}").strip()
    # tpu_inference asks the GCE metadata server for these at import time and
    # logs errors when it cannot; on a TPU VM the real values are set.
    env.setdefault("TPU_ACCELERATOR_TYPE", "v6e-8")
    env.setdefault("TPU_NAME", "local")
    env.setdefault("TPU_WORKER_ID", "0")
