"""Shared set-up of the patched-behaviour suite.

These tests import the INSTALLED overlay wheels (tpu_inference, tunix), never
a source tree. The 8-chip TPU v6e mesh is simulated on CPU unless the suite
runs on the real chips (MRL_PLATFORM=tpu), and the flag must be set before jax
is first imported, which is why it lives here.
"""

import os

if os.environ.get("MRL_PLATFORM", "cpu") == "cpu":
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()
# tpu_inference asks the GCE metadata server for these at import time and logs
# errors when it cannot; on a TPU VM the real values are already set.
os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v6e-8")
os.environ.setdefault("TPU_NAME", "local")
os.environ.setdefault("TPU_WORKER_ID", "0")
