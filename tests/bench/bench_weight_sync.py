"""Benchmark: the weight sync of a scanned MaxText-like state into an unrolled
rollout target, Tunix's `transfer_state_directly` on the overlay against
upstream under MaxText 0.2.4's shims and against the param-only path.

    VENV/bin/python tests/bench/bench_weight_sync.py     (scripts/bench-weight-sync.sh)

VENV: the matrix's MaxText cell venv (maxtext 0.2.4 + the overlay wheels):
MaxText's real shims and pre-unroll are used. One process, 8-device CPU
simulation. For L in {32, 80} layers a llama3-shaped state (tiny dims: D=256,
F=512, 8 heads of 32, float32): every parameter stacked at axis 1 on an fsdp
mesh of 8, the Flax NNX rng state (count and key of 3 streams, 3 modules a
layer) stacked on axis 0, as MaxText's scanned actor holds it; the target is
unrolled layers_0..L-1 on a data=2 x model=4 mesh, per-layer rng leaves and a
decoder-wide nnx.Rngs listed once under layers_0, as MaxText's vLLM model
holds it. Variants, on the same state:

  param-only          nnx.Param only, upstream Tunix (what MaxText 0.2.4 passes)
  param-only+unroll   the same after MaxText's own pre-unroll (MaxTextVllmSampler)
  shim                the whole state, upstream under train_rl's
                      _tpu_inference_compat_patches (MaxText's real shim)
  overlay             the whole state, the installed (patched) Tunix
  overlay param-only  nnx.Param only, the installed Tunix

For each: the median wall time of RUNS syncs (after one warm-up; each into a
fresh copy of the target, blocked until ready) and the peak resident memory
the sync adds (VmHWM reset through /proc/self/clear_refs before it; the
wrapper sets MALLOC_MMAP_THRESHOLD_ so freed arrays leave the resident set),
then both as ratios to param-only, measured in this run. Asserts nothing.
"""

from __future__ import annotations

import os

from support.fixes.matrix import simulate_v6e_8  # tests/ on PYTHONPATH (the scripts/bench-*.sh wrapper)

simulate_v6e_8()  # the 8-device CPU simulation, before jax is imported

import gc  # noqa: E402
import logging  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402
from jax.sharding import NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from support.fixes import maxtext_shims  # noqa: E402  (tests/ on PYTHONPATH: scripts/bench-weight-sync.sh)
from support.fixes.unpatched import load_unpatched  # noqa: E402

LAYERS = (32, 80)
D, F, N, H = 256, 512, 8, 32
RUNS = int(os.environ.get("BENCH_RUNS", "5"))
STREAMS = ("aqt", "dropout", "params")
LAYER_RNGS = (("dropout",), ("mlp", "dropout"), ("self_attention", "attention_op"))


def _put(mesh, value, *spec):
    return jax.device_put(value, NamedSharding(mesh, P(*spec)))


def _rng(mesh, shape, seed):
    leaves = {}
    for s, stream in enumerate(STREAMS):
        n = int(np.prod(shape)) if shape else 1
        keys = jax.random.split(jax.random.key(seed * 10 + s), n).reshape(shape)
        leaves[(stream, "count")] = nnx.RngCount(_put(mesh, jnp.arange(n, dtype=jnp.uint32).reshape(shape) + 3))
        leaves[(stream, "key")] = nnx.RngKey(_put(mesh, keys))
    return leaves


def source(mesh, L):
    """MaxText's scanned actor state (TunixMaxTextAdapter: under 'base')."""
    key = iter(jax.random.split(jax.random.key(0), 16))
    flat = {}

    def param(path, shape, spec):
        flat[("base", "decoder", "layers") + path] = nnx.Param(_put(mesh, jax.random.normal(next(key), shape), *spec))

    for name in ("query", "key", "value"):
        param(("self_attention", name, "kernel"), (D, L, N, H), ("fsdp", None, None, None))
    param(("self_attention", "out", "kernel"), (N, L, H, D), (None, None, None, "fsdp"))
    for name in ("wi_0", "wi_1"):
        param(("mlp", name, "kernel"), (D, L, F), ("fsdp", None, None))
    param(("mlp", "wo", "kernel"), (F, L, D), ("fsdp", None, None))
    for name in ("pre_self_attention_layer_norm", "post_self_attention_layer_norm"):
        param((name, "scale"), (D, L), (None, None))
    flat[("base", "decoder", "decoder_norm", "scale")] = nnx.Param(_put(mesh, jnp.ones((D,)), None))
    flat[("base", "token_embedder", "embedding")] = nnx.Param(_put(mesh, jax.random.normal(next(key), (128, D)), None, "fsdp"))
    for i, module in enumerate(LAYER_RNGS):
        for leaf, var in _rng(mesh, (L,), i).items():
            flat[("base", "decoder", "layers") + module + ("rngs",) + leaf] = var
    for leaf, var in _rng(mesh, (), 9).items():
        flat[("base", "decoder", "rngs") + leaf] = var
        flat[("base", "decoder", "dropout", "rngs") + leaf] = var
    return nnx.from_flat_state(flat)


def target(mesh, L):
    """The unrolled rollout model's state (the runner's, under 'model')."""
    flat = {}
    for i in range(L):
        layer = ("model", "decoder", f"layers_{i}")

        def param(path, shape, spec, layer=layer):
            flat[layer + path] = nnx.Param(_put(mesh, jnp.zeros(shape), *spec))

        for name in ("query", "key", "value"):
            param(("self_attention", name, "kernel"), (D, N, H), (None, "model", None))
        param(("self_attention", "out", "kernel"), (N, H, D), ("model", None, None))
        for name in ("wi_0", "wi_1"):
            param(("mlp", name, "kernel"), (D, F), (None, "model"))
        param(("mlp", "wo", "kernel"), (F, D), ("model", None))
        for name in ("pre_self_attention_layer_norm", "post_self_attention_layer_norm"):
            param((name, "scale"), (D,), (None,))
        for module in LAYER_RNGS[:2]:
            for leaf, var in _rng(mesh, (), 100 + i).items():
                if leaf[0] == "params":
                    flat[layer + module + ("rngs",) + leaf] = var
    # The decoder's nnx.Rngs, shared by every layer's attention_op: listed once.
    for leaf, var in _rng(mesh, (), 99).items():
        if leaf[0] == "params":
            flat[("model", "decoder", "layers_0") + LAYER_RNGS[2] + ("rngs",) + leaf] = var
            flat[("model", "decoder", "dropout", "rngs") + leaf] = var
    flat[("model", "decoder", "decoder_norm", "scale")] = nnx.Param(_put(mesh, jnp.zeros((D,)), None))
    flat[("model", "token_embedder", "embedding")] = nnx.Param(_put(mesh, jnp.zeros((128, D)), None, None))
    return nnx.from_flat_state(flat)


def _rss_kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def measure(sync, make_source, make_target):
    """(median seconds, peak KiB added) of `sync(source, target)`."""
    times, peak = [], 0
    for run in range(RUNS + 1):
        src, dst = make_source(), make_target()
        jax.block_until_ready(jax.tree.leaves(dst))
        gc.collect()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current resident set
        base = _rss_kib("VmRSS")
        start = time.perf_counter()
        sync(src, dst)
        jax.block_until_ready(jax.tree.leaves(dst))
        elapsed = time.perf_counter() - start
        if run:  # the first run compiles
            times.append(elapsed)
            peak = max(peak, _rss_kib("VmHWM") - base)
        del src, dst
    return statistics.median(times), peak


def main():
    from maxtext.integration.vllm import maxtext_vllm_rollout as mvr
    from tunix.generate import utils as overlay
    from tunix.rl import reshard

    logging.getLogger().setLevel(logging.ERROR)
    upstream = load_unpatched("google-tunix", "tunix.generate.utils")
    devices = np.array(jax.devices())
    src_mesh = jax.sharding.Mesh(devices, ("fsdp",))
    tgt_mesh = jax.sharding.Mesh(devices.reshape(2, 4), ("data", "model"))

    def run(module, shims=None):
        def sync(src, dst):
            if shims is None:
                module.transfer_state_directly(src, dst, reshard_fn=reshard.reshard_pytree)
            else:
                with shims():
                    module.transfer_state_directly(src, dst, reshard_fn=reshard.reshard_pytree)
        return sync

    print(f"weight sync, llama3-shaped, D={D} F={F} heads={N}x{H}, {RUNS} runs after 1 warm-up, 8 CPU devices")
    for L in LAYERS:
        def full(L=L):
            return source(src_mesh, L)

        def params(L=L):
            return nnx.state(source(src_mesh, L), nnx.Param)

        def unrolled(L=L):
            return mvr.unroll_gemma_scanned_weights(mvr.unroll_qwen_scanned_weights(params(L), scan_axis=1))

        variants = {
            "param-only": (run(upstream), params),
            "param-only+unroll": (run(upstream), unrolled),
            "shim": (run(upstream, lambda: maxtext_shims.train_rl_patches_on(upstream)), full),
            "overlay": (run(overlay), full),
            "overlay param-only": (run(overlay), params),
        }
        results = {}
        for name, (sync, make_source) in variants.items():
            results[name] = measure(sync, make_source, lambda L=L: target(tgt_mesh, L))
        base_t, base_m = results["param-only"]
        for name, (t, m) in results.items():
            print(f"L={L:3d} {name:20s} {t * 1000:9.1f} ms  x{t / base_t:5.2f}   peak +{m / 1024:8.1f} MiB  x{m / max(base_m, 1):5.2f}")
        t, m = results["overlay"]
        st, sm = results["shim"]
        print(f"L={L} overlay_vs_shim time={t / st:.2f} peak={m / max(sm, 1):.2f}; "
              f"overlay_vs_param_only time={t / base_t:.2f} peak={m / max(base_m, 1):.2f}")


if __name__ == "__main__":
    main()
