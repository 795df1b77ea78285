"""Benchmark: tpu-inference's sample() and gather_logprobs on vocab-sharded
logits: in the engine's configuration (patch 0006 against upstream) and, for
gather_logprobs, under Explicit axes (patch 0002).

    VENV/bin/python tests/bench/bench_logprobs.py [--platform auto|cpu|tpu] [--one-device]

VENV must hold the installed overlay wheels (scripts/test-matrix.sh with
MRL_KEEP=1 leaves one in <work>/cells/py312/venv). `--platform` (default
auto, or MRL_PLATFORM): cpu, tpu, or auto: tpu where the machine has TPU
device files (/dev/accel*, /dev/vfio/N), else cpu. The first line names
the platform, the devices and jax's version.

On ONE device (a one-chip host such as a TPU v5e; `--one-device` rehearses
it on one CPU device) the runner's mesh (1, 1) partitions nothing, so the
overlay's callers keep upstream's full-vocabulary programs. For B in {8,
256}, k in {1, 20, 64} it times, against upstream's (the pin's sampling.py,
same inputs), compute_and_gather_logprobs, sample() greedy and sample()
sampled (temperature 0.9, top_k = k, top_p 0.95), each as:

  plain   the installed sampling.py as the runner calls it on that mesh
  forced  patch 0006's vocab-sharded path, engaged by building its
          vocab_sharded.VocabLayout directly with num_vocab_shards=1
          (vocab_layout gives None on one device): labelled forced

exact: the same ids, ranks and tokens as upstream's, logprobs and processed
logits to float rounding. The last lines give the ratios (variant /
upstream time) measured in that run, per B, k and program, then B=256 k=20
on one line.

On the CPU platform (no --one-device), as before: one process, an 8-device
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

import argparse
import glob
import os
from typing import Any

from maxtext_rl_overlay.smoke import cpu_simulation

_parser = argparse.ArgumentParser(description="gather_logprobs and sample(), overlay against upstream")
_parser.add_argument("--platform", choices=("auto", "cpu", "tpu"), default=os.environ.get("MRL_PLATFORM", "auto"),
                     help="cpu: the 8-device CPU simulation (one CPU device with --one-device); tpu: this machine's chips; "
                          "auto (default; MRL_PLATFORM): tpu where the machine has TPU device files, else cpu")
_parser.add_argument("--one-device", action="store_true",
                     help="the one-device cases even on the CPU (a rehearsal of a one-chip host's run)")
ARGS = _parser.parse_args()


def _platform(asked: str) -> tuple[str, str]:
    """The platform to run on and why, decided before jax is imported."""
    if asked != "auto":
        return asked, "asked"
    found = glob.glob("/dev/accel*") + glob.glob("/dev/vfio/[0-9]*")
    return ("tpu", f"found {found[0]}") if found else ("cpu", "no TPU device files (/dev/accel*, /dev/vfio/N)")


PLATFORM, PLATFORM_WHY = _platform(ARGS.platform)
if PLATFORM == "cpu":
    if ARGS.one_device:
        os.environ["JAX_PLATFORMS"] = "cpu"
    else:
        cpu_simulation.simulate_v6e_8()  # the 8-device CPU simulation, before jax is imported

import dataclasses  # noqa: E402
import functools  # noqa: E402
import importlib  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
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


def forced_layout(mesh):
    """patch 0006's VocabLayout with one vocab shard, built directly (the
    runner's `vocab_layout` gives None where nothing partitions the vocab):
    the vocab-sharded path, forced on one device."""
    from tpu_inference.layers.common.sharding import ShardingAxisName
    from tpu_inference.layers.jax.sample import vocab_sharded

    entry = ShardingAxisName.MLP_TENSOR
    axes = tuple(a for a in (entry if isinstance(entry, (tuple, list)) else (entry,)) if a in mesh.shape)
    return vocab_sharded.VocabLayout(mesh, batch_axes=(), vocab_axes=axes, num_vocab_shards=1)


def forced_logprobs(patched, layout, k, x, t):
    """vocab_sharded's compute_and_gather_logprobs, as sampling.py returns it."""
    from tpu_inference.layers.jax.sample import vocab_sharded

    return patched.LogprobsTensors(*vocab_sharded.compute_and_gather_logprobs(layout, x, t, k))


def main_one_device() -> None:
    """One device (a one-chip host): the runner's mesh partitions nothing, so
    the overlay's callers keep upstream's full-vocabulary programs (`plain`);
    the vocab-sharded path of patch 0006 runs only where forced (`forced`:
    vocab_sharded.VocabLayout with num_vocab_shards=1, built directly).
    Each against upstream's (the pin's sampling.py), same inputs."""
    from tpu_inference.layers.common.sharding import ShardingAxisName
    from tpu_inference.layers.jax.sample import vocab_sharded

    from support.fixes.runner import create_2d_mesh, overlay_runner
    from support.fixes.unpatched import load_unpatched

    patched = importlib.import_module(MODULE)
    upstream = load_unpatched("tpu-inference", MODULE)
    bsearch = load_unpatched("tpu-inference", "tpu_inference.layers.common.binary_search")
    upstream.topk_mask, upstream.topp_mask = bsearch.topk_mask, bsearch.topp_mask  # the pin's sample()
    mesh = create_2d_mesh(overlay_runner(), (1, 1), [0])
    spec = P(ShardingAxisName.MLP_DATA, ShardingAxisName.MLP_TENSOR)
    layout = forced_layout(mesh)
    eps = patched._SAMPLING_EPS
    rng = np.random.default_rng(0)
    device = jax.devices()[0]
    print(f"jax {jax.__version__}, platform {device.platform} ({PLATFORM_WHY}), {len(jax.devices())} device: {device.device_kind}; "
          f"the runner's mesh {dict(mesh.shape)} axis types {tuple(str(t) for t in mesh.axis_types)}, logits {spec}, "
          f"float32 [B, {V}], median of {RUNS} runs")
    print(f"vocab_layout on this mesh: {vocab_sharded.vocab_layout(mesh, (8, V))} (None: the overlay keeps upstream's "
          f"full-vocabulary path); forced: {layout.spec} with num_vocab_shards=1")
    print(f"{'B':>4} {'k':>3} {'program':>15} {'variant':>8} {'median_ms':>10} {'exact':>6}")
    ratios: dict = {}
    with jax.set_mesh(mesh):
        for b in BATCHES:
            logits = rng.standard_normal((b, V), dtype=np.float32) * 4
            tokens = rng.integers(0, V, b).astype(np.int32)
            x = jax.device_put(logits, NamedSharding(mesh, spec))
            t = jax.device_put(tokens, NamedSharding(mesh, P()))
            key = jax.random.key(0)
            for k in KS:
                rows: dict = {}
                # gather_logprobs (the decode loop's compute_and_gather_logprobs)
                up = getattr(upstream, FN).lower(x, t, k).compile()
                want = result(up(x, t))
                ov = getattr(patched, FN).lower(x, t, k, mesh).compile()
                fo = jax.jit(functools.partial(forced_logprobs, patched, layout, k)).lower(x, t).compile()
                same_program = (getattr(patched, FN).lower(x, t, k, mesh).as_text() == getattr(upstream, FN).lower(x, t, k).as_text())
                rows["gather_logprobs"] = {
                    "upstream": (median_seconds(up, x, t), True),
                    "plain": (median_seconds(ov, x, t), same(result(ov(x, t)), want)),
                    "forced": (median_seconds(fo, x, t), same(result(fo(x, t)), want)),
                }
                # sample(): greedy, and sampled as an RL rollout samples (temperature 0.9, top_k = k, top_p 0.95)
                sampled = sampling_metadata(mesh, b, k)
                for name, md in (("sample_greedy", dataclasses.replace(sampled, do_sampling=False)), ("sample", sampled)):
                    up = upstream.sample.lower(key, mesh, x, md).compile()
                    ov = patched.sample.lower(key, mesh, x, md).compile()
                    if md.do_sampling:
                        fo = jax.jit(lambda key, x, md: vocab_sharded.sample(layout, key, x, md.temperature, md.top_k, md.top_p, eps))
                    else:
                        fo = jax.jit(lambda key, x, md: (vocab_sharded.greedy(layout, x), x.astype(jnp.float32)))
                    fo = fo.lower(key, x, md).compile()
                    want = [np.asarray(a) for a in up(key, x, md)]

                    def exact(got, want=want):
                        got = [np.asarray(a) for a in got]
                        return bool(np.array_equal(got[0], want[0]) and np.allclose(got[1], want[1], rtol=1e-6, atol=1e-6))

                    rows[name] = {
                        "upstream": (median_seconds(up, key, x, md), True),
                        "plain": (median_seconds(ov, key, x, md), exact(ov(key, x, md))),
                        "forced": (median_seconds(fo, key, x, md), exact(fo(key, x, md))),
                    }
                for program, variants in rows.items():
                    for variant, (seconds, ok) in variants.items():
                        print(f"{b:>4} {k:>3} {program:>15} {variant:>8} {seconds * 1e3:>10.3f} {str(ok).lower():>6}")
                    u = variants["upstream"][0]
                    ratios[b, k, program] = (variants["plain"][0] / u, variants["forced"][0] / u,
                                             variants["plain"][1] and variants["forced"][1])
                print(f"{b:>4} {k:>3}   gather_logprobs: overlay's plain program is upstream's: {str(same_program).lower()}")
    print("one device, overlay / upstream time, measured in this run (plain: the overlay's sampling.py as the runner calls it "
          "on this mesh; forced: patch 0006's vocab-sharded path, one shard, forced):")
    print(f"{'B':>4} {'k':>3} {'program':>15} {'plain':>7} {'forced':>7} {'exact':>6}")
    for (b, k, program), (plain, forced, ok) in ratios.items():
        print(f"{b:>4} {k:>3} {program:>15} {plain:>7.3f} {forced:>7.3f} {str(ok).lower():>6}")
    plain, forced, ok = ratios[256, 20, "sample"]
    g_plain, g_forced, g_ok = ratios[256, 20, "gather_logprobs"]
    print(f"one device, B=256 k=20: sample plain/upstream time={plain:.3f} forced/upstream time={forced:.3f} | "
          f"gather_logprobs plain/upstream time={g_plain:.3f} forced/upstream time={g_forced:.3f} | exact={str(ok and g_ok).lower()}")


if __name__ == "__main__":
    if len(jax.devices()) == 1:
        main_one_device()
    elif PLATFORM == "cpu" or len(jax.devices()) == MESH[0] * MESH[1]:
        main()
    else:
        raise SystemExit(f"bench-logprobs: {len(jax.devices())} devices: runs on one device or on {MESH[0] * MESH[1]}")
