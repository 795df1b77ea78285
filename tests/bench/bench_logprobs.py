"""Benchmark: vocab-sharded top-k in tpu-inference's gather_logprobs (patch 0002)
against the reshard-only patch (0001) and the same computation on one device.

    VENV/bin/python tests/bench/bench_logprobs.py

VENV must hold the installed overlay wheels (scripts/test-matrix.sh with
MRL_KEEP=1 leaves one in <work>/cells/py312/venv). One process, an 8-device
CPU simulation of a TPU v6e-8, mesh (1, 8) = ("data", "model"), Explicit axes,
float32 logits [B, V] sharded P("data", "model") as in the MaxText report,
token ids replicated. For B in {8, 256}, V = 128256, k in {1, 20} it prints the
median wall time of `compute_and_gather_logprobs` (jitted, compiled once,
RUNS runs after WARMUP) for:

  patched   the installed module (0001 + 0002: shard-local top-k)
  reshard   0001 only: upstream's file rebuilt from the installed one
            (tests/support/fixes/unpatched.py) with the patches before 0002 applied
  single    the installed module on one device, unsharded inputs

and the bytes the collectives yield, summed over the compiled HLO's
all-gather / all-reduce / all-to-all / collective-permute / reduce-scatter
result shapes. exact: same ids and ranks as `single`, logprobs to float
rounding. The last line is for B=256, k=20:

  speedup_vs_reshard=<reshard/patched> bytes_ratio=<patched/reshard bytes> exact=<true|false>

Asserts nothing; times are of this machine, shared or not.
"""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
    os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
for _key, _value in (("TPU_ACCELERATOR_TYPE", "v6e-8"), ("TPU_NAME", "local"), ("TPU_WORKER_ID", "0")):
    os.environ.setdefault(_key, _value)

import importlib  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from support.fixes.logprobs import collective_bytes  # noqa: E402  (tests/ on PYTHONPATH: scripts/bench-logprobs.sh)
from support.fixes.unpatched import load_before  # noqa: E402

MODULE = "tpu_inference.layers.jax.sample.sampling"
THIS_PATCH = "0002-"
V = 128256
BATCHES = (8, 256)
KS = (1, 20)
MESH = (1, 8)
WARMUP, RUNS = 2, int(os.environ.get("BENCH_RUNS", "15"))


def load_reshard_only():
    """sampling.py as 0001 left it: upstream + the series' patches before 0002."""
    mod = load_before("tpu-inference", MODULE, THIS_PATCH, MODULE + "__reshard")
    assert "_gather_logprobs_vocab_sharded" not in vars(mod)
    return mod





def median_seconds(compiled, *args) -> float:
    for _ in range(WARMUP):
        jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def result(out):
    return (np.asarray(out.logprob_token_ids), np.asarray(out.logprobs), np.asarray(out.selected_token_ranks))


def same(got, want) -> bool:
    return (
        np.array_equal(got[0], want[0])
        and np.array_equal(got[2], want[2])
        and np.allclose(got[1], want[1], rtol=1e-6, atol=1e-5)
    )


def main() -> None:
    patched = importlib.import_module(MODULE)
    reshard = load_reshard_only()
    fn_name = "compute_and_gather_logprobs"
    mesh = jax.make_mesh(MESH, ("data", "model"))  # Explicit axes: jax 0.11's default
    device = jax.devices()[0]
    rng = np.random.default_rng(0)
    print(f"jax {jax.__version__}, {len(jax.devices())} {jax.devices()[0].platform} devices, mesh {MESH} "
          f"Explicit, logits float32 [B, {V}] P('data', 'model'), median of {RUNS} runs")
    print(f"{'B':>4} {'k':>3} {'variant':>8} {'median_ms':>10} {'collective_bytes':>17} {'exact':>6}")
    last = None
    for b in BATCHES:
        logits = rng.standard_normal((b, V), dtype=np.float32) * 4
        tokens = rng.integers(0, V, b).astype(np.int32)
        x = jax.device_put(logits, NamedSharding(mesh, P("data", "model")))
        t = jax.device_put(tokens, NamedSharding(mesh, P()))
        x1, t1 = jax.device_put(logits, device), jax.device_put(tokens, device)
        for k in KS:
            single = getattr(patched, fn_name).lower(x1, t1, k).compile()
            want = result(single(x1, t1))
            stats = {}
            with jax.set_mesh(mesh):
                for variant, module in (("patched", patched), ("reshard", reshard)):
                    compiled = getattr(module, fn_name).lower(x, t, k).compile()
                    stats[variant] = (
                        median_seconds(compiled, x, t),
                        collective_bytes(compiled),
                        same(result(compiled(x, t)), want),
                    )
            stats["single"] = (median_seconds(single, x1, t1), collective_bytes(single), True)
            for variant, (seconds, nbytes, exact) in stats.items():
                print(f"{b:>4} {k:>3} {variant:>8} {seconds * 1e3:>10.2f} {nbytes:>17} {str(exact).lower():>6}")
            if (b, k) == (256, 20):
                last = stats
    (p_s, p_b, p_x), (r_s, r_b, _) = last["patched"], last["reshard"]
    print(f"speedup_vs_reshard={r_s / p_s:.1f} bytes_ratio={p_b / r_b:.4f} exact={str(p_x).lower()}")


if __name__ == "__main__":
    main()
