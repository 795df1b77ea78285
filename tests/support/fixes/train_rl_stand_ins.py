"""The train_rl run's stand-ins for what CPU devices lack (never on a TPU):
the devices' memory statistics, the TPU kernels in Pallas TPU interpret mode
(the tool's maxtext_rl_overlay/smoke/pallas_interpret.py), and Tunix's weight
sync entered as on a TPU. The run records each under "stand_ins"; the test
reads TRANSFER_GUARD_STAND_IN from here (importing this module imports no jax).
"""

from __future__ import annotations

from support.fixes.matrix import PLATFORM

#: The memory a CPU device says it has. Small: vLLM sizes its KV cache from
#: it (hbm_utilization_vllm of it, less the live arrays), and the interpreted
#: attention kernel's cost grows with the cache (1 GiB gave 26059 blocks).
HBM_STAND_IN = 16 << 20


def live_bytes(devices) -> list[int]:
    """The bytes jax's live arrays hold on each of `devices` (what a CPU
    device, which keeps no memory statistics, has in use)."""
    import jax

    used: dict = {}
    for array in jax.live_arrays():
        for shard in array.addressable_shards:
            used[shard.data.device] = used.get(shard.data.device, 0) + shard.data.nbytes
    return [used.get(d, 0) for d in devices]


def cpu_stand_ins(recorded: list[str], replaced: set[str]) -> None:
    """What the CPU lacks, stood in for (never on a TPU): each stand-in is
    appended to `recorded` as it is installed, and the names it replaces are
    added to `replaced`, which the replaced-functions check reports apart."""
    if PLATFORM != "cpu":
        return
    import tpu_inference.utils as tpu_utils

    def hbm_usage_bytes(devices):
        return [(used, HBM_STAND_IN) for used in live_bytes(devices)]

    tpu_utils.hbm_usage_bytes = hbm_usage_bytes
    replaced.add("tpu_inference.utils.hbm_usage_bytes")
    recorded.append(f"tpu_inference.utils.hbm_usage_bytes: live arrays against {HBM_STAND_IN >> 20} MiB a device")
    from maxtext_rl_overlay.smoke import pallas_interpret  # the TPU kernels in Pallas interpret mode

    recorded += [f"{pallas_interpret.LABEL}: {name}" for name in pallas_interpret.activate()]
    replaced.update(f"{m}.get_tpu_version" for m in pallas_interpret._TPU_VERSION_USERS)
    replaced.update(f"{m}.get_step_fn_compiler_options" for m in pallas_interpret._STEP_JITTERS)
    replaced.add(f"{pallas_interpret._DEVICE_PUT_MODULE}.general_device_put")  # the runner's inputs, copied


#: Tunix's RLCluster.sync_weights, on a backend that is neither TPU nor GPU
#: (so on the CPU simulation), syncs under
#: `jax.transfer_guard_{host_to_device,device_to_host}("disallow_explicit")`
#: (rl_cluster.py, since 94b00481), and the sync puts scalars on the devices
#: (MaxText's unroll_qwen_scanned_weights' jnp.take with a Python int for
#: maxtext_on_vllm, Tunix's transfer_state_with_mappings for vllm_native),
#: which the guard refuses: no GRPO step would end on the CPU. On a TPU the
#: same code enters no guard. TRANSFER_GUARD_LEVEL is the level this stand-in
#: turns into TPU's branch (no guard), and only inside sync_weights.
TRANSFER_GUARD_LEVEL = "disallow_explicit"
TRANSFER_GUARD_STAND_IN = ("transfer-guard-as-on-tpu: RLCluster.sync_weights' CPU-only "
                           f"jax.transfer_guard_*({TRANSFER_GUARD_LEVEL!r}) entered as on a TPU (no guard)")


def sync_weights_as_on_tpu(sync_weights, entered: list[str]):
    """`sync_weights` (the RLCluster's bound method) run as on a TPU: the
    jax.transfer_guard_* context managers it enters at TRANSFER_GUARD_LEVEL
    are no-ops for the call (each such call is appended to `entered`, so the
    result shows the stand-in engaged). jax's functions are put back after
    each call; nothing of the upstreams is replaced."""
    import contextlib

    import jax

    if PLATFORM != "cpu":
        return sync_weights
    names = ("transfer_guard_host_to_device", "transfer_guard_device_to_host")

    def as_on_tpu(name, original):
        def guard(level):
            if level == TRANSFER_GUARD_LEVEL:
                entered.append(name)
                return contextlib.nullcontext()
            return original(level)

        return guard

    def call():
        originals = {name: getattr(jax, name) for name in names}
        for name, original in originals.items():
            setattr(jax, name, as_on_tpu(name, original))
        try:
            return sync_weights()
        finally:
            for name, original in originals.items():
                setattr(jax, name, original)

    return call
