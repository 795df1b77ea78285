"""Benchmark: tpu-inference's sample() and gather_logprobs on vocab-sharded
logits: in the engine's configuration (patch 0006 against upstream) and, for
gather_logprobs, under Explicit axes (patch 0002).

    VENV/bin/python tests/bench/bench_logprobs.py

VENV must hold the installed overlay wheels (scripts/test-matrix.sh with
MRL_KEEP=1 leaves one in <work>/cells/py312/venv). One process, an 8-device
CPU simulation of a TPU v6e-8, mesh (1, 8) = ("data", "model"), float32
logits [B, V]. For B in {8, 256}, V = 128256, k in {1, 20, 64} it prints the
median wall time of `compute_and_gather_logprobs` (jitted, compiled once,
RUNS runs after WARMUP) and the bytes the collectives yield (summed over the
compiled HLO's all-gather / all-reduce / all-to-all / collective-permute /
reduce-scatter result shapes), in two configurations:

  engine    the mesh the runner builds (TPUModelRunner._init_mesh given
            Tunix's device_indexes: Auto axes, the backport of 984b29c49),
            logits P(MLP_DATA, MLP_TENSOR) and token ids P(), as the
            runner's precompilation places them; variants:
              overlay   the installed module
              upstream  upstream's file (support/fixes/unpatched.py)
  explicit  jax.make_mesh's default (Explicit axes), logits P("data", "model")
            as in the MaxText report, token ids P(); variants:
              patched   the installed module (0001 + 0002: shard-local top-k)
              reshard   0001 only: upstream's file with the patches before 0002

and `single`: the installed module on one device, unsharded inputs; then
`sample` (the sampled case: temperature 0.9, top_k = k, top_p 0.95 on every
row, as an RL rollout samples) in the engine configuration, overlay against
upstream, exact meaning the same tokens and processed logits as upstream's
for the same key. exact:
same ids and ranks as `single`, logprobs to float rounding. `same_program`
says whether the overlay's program in the engine configuration is
upstream's (its StableHLO text): then 0002 does not engage there. The last
line gives ratios measured in this run, for B=256, k=20:

  engine: same_program=<bool> overlay/upstream time=<x> | explicit: reshard/patched time=<x> patched/reshard bytes=<y> |
  engine overlay / explicit patched: time=<x> bytes=<y> exact=<bool>

and a table of the engine configuration's overlay/upstream ratios (bytes,
time) for every B, k and program.

Asserts nothing; times are of this machine, shared or not.
"""

from __future__ import annotations

import os
from typing import Any

from support.fixes.matrix import simulate_v6e_8  # tests/ on PYTHONPATH (the scripts/bench-*.sh wrapper)

simulate_v6e_8()  # the 8-device CPU simulation, before jax is imported

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
THIS_PATCH = "0002-"  # the reshard-only module: the patches before it
FN = "compute_and_gather_logprobs"
V = 128256
BATCHES = (8, 256)
KS = (1, 20, 64)
MESH = (1, 8)
WARMUP, RUNS = 2, int(os.environ.get("BENCH_RUNS", "15"))
#: sample() at B=256 takes seconds a call upstream on the CPU simulation.
SAMPLE_RUNS = int(os.environ.get("BENCH_SAMPLE_RUNS", "3"))


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


def lowered_text(fn, *args) -> str:
    return fn.lower(*args).as_text()


def run_variants(variants, x, t, k, want, mesh) -> dict:
    stats = {}
    with jax.set_mesh(mesh):
        for variant, module in variants:
            fn = getattr(module, FN)
            # The overlay's takes the runner's mesh as the runner passes it (patch 0006).
            compiled = (fn.lower(x, t, k, mesh) if variant == "overlay" else fn.lower(x, t, k)).compile()
            stats[variant] = (median_seconds(compiled, x, t), collective_bytes(compiled), same(result(compiled(x, t)), want))
    return stats


def sampling_metadata(mesh, b: int, k: int):
    """The runner's metadata for a batch sampled as an RL rollout samples."""
    from tpu_inference.layers.common.sharding import ShardingAxisName
    from tpu_inference.layers.jax.sample.sampling_metadata import TPUSupportedSamplingMetadata

    rows = NamedSharding(mesh, P(ShardingAxisName.ATTN_DATA))
    return TPUSupportedSamplingMetadata(
        temperature=jax.device_put(np.full(b, 0.9, np.float32), rows),
        top_k=jax.device_put(np.full(b, k, np.int32), rows),
        top_p=jax.device_put(np.full(b, 0.95, np.float32), rows),
        _cache_collision_dummy=jax.device_put(np.zeros(2, np.int32), NamedSharding(mesh, P())),
        do_sampling=True,
    )


def run_sample(patched, upstream, mesh, x, k) -> dict:
    """sample()'s sampled case, overlay and upstream, on the engine's mesh."""
    md = sampling_metadata(mesh, x.shape[0], k)
    key = jax.random.key(0)
    stats, outputs = {}, {}
    with jax.set_mesh(mesh):
        for variant, module in (("overlay", patched), ("upstream", upstream)):
            compiled = module.sample.lower(key, mesh, x, md).compile()
            for _ in range(1):  # compiled already: one call to warm up (upstream's take seconds at B=256)
                jax.block_until_ready(compiled(key, x, md))
            times = []
            for _ in range(SAMPLE_RUNS):
                start = time.perf_counter()
                jax.block_until_ready(compiled(key, x, md))
                times.append(time.perf_counter() - start)
            outputs[variant] = [np.asarray(a) for a in compiled(key, x, md)]
            stats[variant] = [statistics.median(times), collective_bytes(compiled), None]
    exact = np.array_equal(outputs["overlay"][0], outputs["upstream"][0]) and np.allclose(outputs["overlay"][1], outputs["upstream"][1], rtol=1e-6)
    for variant in stats:
        stats[variant][2] = exact
    return {variant: tuple(v) for variant, v in stats.items()}


def main() -> None:
    from tpu_inference.layers.common.sharding import ShardingAxisName

    from support.fixes.runner import create_2d_mesh, overlay_runner
    from support.fixes.unpatched import load_unpatched

    patched = importlib.import_module(MODULE)
    upstream = load_unpatched("tpu-inference", MODULE)
    bsearch = load_unpatched("tpu-inference", "tpu_inference.layers.common.binary_search")
    upstream.topk_mask, upstream.topp_mask = bsearch.topk_mask, bsearch.topp_mask  # the pin's sample()
    reshard = load_reshard_only()
    engine_mesh = create_2d_mesh(overlay_runner(), MESH, list(range(MESH[0] * MESH[1])))
    explicit_mesh = jax.make_mesh(MESH, ("data", "model"))  # Explicit axes: jax 0.11's default
    engine_spec = P(ShardingAxisName.MLP_DATA, ShardingAxisName.MLP_TENSOR)
    device = jax.devices()[0]
    rng = np.random.default_rng(0)
    print(f"jax {jax.__version__}, {len(jax.devices())} {jax.devices()[0].platform} devices, mesh {MESH}, logits float32 [B, {V}], "
          f"median of {RUNS} runs")
    print(f"engine: mesh axis types {tuple(str(t) for t in engine_mesh.axis_types)}, logits {engine_spec}; "
          f"explicit: {tuple(str(t) for t in explicit_mesh.axis_types)}, logits P('data', 'model')")
    print(f"{'B':>4} {'k':>3} {'config':>8} {'variant':>8} {'median_ms':>10} {'collective_bytes':>17} {'exact':>6}")
    last: tuple[Any, Any] | None = None
    ratios: dict = {}
    for b in BATCHES:
        logits = rng.standard_normal((b, V), dtype=np.float32) * 4
        tokens = rng.integers(0, V, b).astype(np.int32)
        x1, t1 = jax.device_put(logits, device), jax.device_put(tokens, device)
        xa = jax.device_put(logits, NamedSharding(engine_mesh, engine_spec))
        ta = jax.device_put(tokens, NamedSharding(engine_mesh, P()))
        xe = jax.device_put(logits, NamedSharding(explicit_mesh, P("data", "model")))
        te = jax.device_put(tokens, NamedSharding(explicit_mesh, P()))
        for k in KS:
            single = getattr(patched, FN).lower(x1, t1, k).compile()
            want = result(single(x1, t1))
            stats = {
                "engine": run_variants((("overlay", patched), ("upstream", upstream)), xa, ta, k, want, engine_mesh),
                "explicit": run_variants((("patched", patched), ("reshard", reshard)), xe, te, k, want, explicit_mesh),
                "single": {"single": (median_seconds(single, x1, t1), collective_bytes(single), True)},
            }
            with jax.set_mesh(engine_mesh):
                same_program = lowered_text(getattr(patched, FN), xa, ta, k, engine_mesh) == lowered_text(getattr(upstream, FN), xa, ta, k)
            for config, variants in stats.items():
                for variant, (seconds, nbytes, exact) in variants.items():
                    print(f"{b:>4} {k:>3} {config:>8} {variant:>8} {seconds * 1e3:>10.2f} {nbytes:>17} {str(exact).lower():>6}")
            print(f"{b:>4} {k:>3}   engine: overlay's program is upstream's: {str(same_program).lower()}")
            ratios[b, k, "gather_logprobs"] = (stats["engine"]["overlay"][1] / stats["engine"]["upstream"][1],
                                               stats["engine"]["overlay"][0] / stats["engine"]["upstream"][0],
                                               stats["engine"]["overlay"][2])
            sampled = run_sample(patched, upstream, engine_mesh, xa, k)
            for variant, (seconds, nbytes, exact) in sampled.items():
                print(f"{b:>4} {k:>3} {'sample':>8} {variant:>8} {seconds * 1e3:>10.2f} {nbytes:>17} {str(exact).lower():>6}")
            ratios[b, k, "sample"] = (sampled["overlay"][1] / sampled["upstream"][1], sampled["overlay"][0] / sampled["upstream"][0],
                                      sampled["overlay"][2])
            if (b, k) == (256, 20):
                last = stats, same_program
    assert last is not None, "the (256, 20) case ran"
    stats, same_program = last
    (o_s, o_b, o_x), (u_s, _, _) = stats["engine"]["overlay"], stats["engine"]["upstream"]
    (p_s, p_b, p_x), (r_s, r_b, _) = stats["explicit"]["patched"], stats["explicit"]["reshard"]
    print(f"engine: same_program={str(same_program).lower()} overlay/upstream time={o_s / u_s:.2f} | "
          f"explicit: reshard/patched time={r_s / p_s:.1f} patched/reshard bytes={p_b / r_b:.4f} | "
          f"engine overlay / explicit patched: time={o_s / p_s:.1f} bytes={o_b / p_b:.0f} exact={str(o_x and p_x).lower()}")
    print("engine configuration, overlay / upstream (patch 0006), measured in this run:")
    print(f"{'B':>4} {'k':>3} {'program':>16} {'bytes':>10} {'time':>7} {'exact':>6}")
    for (b, k, program), (nbytes, seconds, exact) in ratios.items():
        print(f"{b:>4} {k:>3} {program:>16} {nbytes:>10.5f} {seconds:>7.3f} {str(exact).lower():>6}")


if __name__ == "__main__":
    main()
