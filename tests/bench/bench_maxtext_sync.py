"""Benchmark: the weight sync train_rl runs between real MaxText models, of
growing size, against a one-program copy of the same bytes, in one run.

    PYTHON tests/bench/bench_maxtext_sync.py [--platform cpu|tpu] [--sizes S,M,...] [--runs N] [--json FILE]

(tests/ on PYTHONPATH; PYTHON sees maxtext 0.2.4 and the installed overlay:
the matrix's MaxText cell venv, or the TPU cell's install.) `--platform cpu`
(the default) runs on the 8-device CPU simulation, `tpu` on the machine's
chips, however many.

For each size (SIZES: llama3-shaped MaxText models, bfloat16 weights, from a
few million parameters to about a billion, and MaxText's qwen3-0.6b) it
builds, by MaxText's own code (support/fixes/maxtext_models.py), train_rl's
actor (scanned layers, the Tunix adapter, fsdp over the devices) and the
rollout's target (MaxText's vLLM model after its own load_weights: unrolled
layers, on the rollout's mesh), then times, after one warm-up, the median of
RUNS of each, every one blocked until the target's arrays are ready:

  overlay sync   the sync train_rl runs on the overlay (maxtext_on_vllm):
                 MaxText's sampler hands nnx.state(actor, nnx.Param) to
                 Tunix's transfer_state_directly as Tunix's VllmSampler
                 calls it (reshard_pytree, the old buffers deleted, every
                 weight required), which runs it as one compiled program
                 (google-tunix 0006); its first call, which traces and
                 compiles that program, is timed apart (first sync)
  leaf-by-leaf sync
                 the same call through the series before 0006: the
                 mapping dispatched leaf by leaf, then reshard_pytree
  pins' sync     what train_rl ran at the pins: MaxText 0.2.4's eager
                 pre-unroll (one jnp.take per layer per weight), then the
                 pins' transfer_state_directly
  copy           a plain on-device copy of the target's parameters, array
                 by array (jnp.array(x, copy=True))
  one-program copy
                 the same copy compiled as one program (jax.jit of
                 jnp.copy over every array): the same bytes moved once, at
                 the memory's speed (the row says whether its outputs are
                 new buffers: that it copied)

and gives each as GB/s of the target's parameter bytes, and each sync's
seconds as a ratio to the one-program copy's (the headline) and to the
overlay sync's. The three syncs' targets are checked equal, leaf by leaf. A
size that does not fit the devices' memory is said (with the error) and the
larger ones are not tried. Asserts nothing.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import statistics
import sys
import time
from typing import Any

#: name -> MaxText overrides (llama3.1-8b's structure; tied to nothing).
SIZES: dict[str, dict[str, Any]] = {
    "5M": dict(base_emb_dim=256, base_num_query_heads=4, base_num_kv_heads=4, head_dim=64, base_mlp_dim=1024,
               vocab_size=1024, layers=4),
    "180M": dict(base_emb_dim=1024, base_num_query_heads=16, base_num_kv_heads=8, head_dim=64, base_mlp_dim=3584,
                 vocab_size=32000, layers=8),
    "470M": dict(base_emb_dim=1536, base_num_query_heads=12, base_num_kv_heads=4, head_dim=128, base_mlp_dim=5376,
                 vocab_size=32000, layers=12),
    "1.1B": dict(base_emb_dim=2048, base_num_query_heads=16, base_num_kv_heads=8, head_dim=128, base_mlp_dim=8192,
                 vocab_size=32000, layers=16),
    # The user shape's maxtext_on_vllm model (tests/support/fixes/train_rl_inputs.py's USER_MODELS): MaxText's
    # qwen3-0.6b, its own dims (its configs/models/qwen3-0.6b.yml's, given again: the test models' tiny ones
    # are the defaults); at the pins train_rl synced it through MaxText's qwen pre-unroll (pins' sync).
    "qwen3-0.6b": dict(family="qwen3", model_name="qwen3-0.6b", base_emb_dim=1024, base_num_query_heads=16,
                       base_num_kv_heads=8, head_dim=128, base_mlp_dim=3072, vocab_size=151936, layers=28),
}
DEFAULT_SIZES = {"cpu": ("5M", "180M"), "tpu": ("5M", "qwen3-0.6b", "1.1B")}


def _args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--platform", choices=("cpu", "tpu"), default="cpu")
    parser.add_argument("--sizes", help=f"comma-separated, of {', '.join(SIZES)} (default: cpu {DEFAULT_SIZES['cpu']}, tpu all)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=pathlib.Path)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _args(argv)
    os.environ["MRL_PLATFORM"] = args.platform
    sizes = args.sizes.split(",") if args.sizes else list(DEFAULT_SIZES[args.platform])
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        raise SystemExit(f"bench_maxtext_sync: unknown size(s) {unknown}; the sizes are {', '.join(SIZES)}")
    from support.fixes.matrix import simulate_v6e_8

    simulate_v6e_8()  # a no-op on the TPU; before jax is imported
    import jax

    devices = jax.devices()
    doc: dict[str, Any] = {"platform": devices[0].platform, "devices": len(devices), "device_kind": devices[0].device_kind,
                           "runs": args.runs, "sizes": []}
    print(f"bench_maxtext_sync: {len(devices)} {devices[0].platform} device(s) ({devices[0].device_kind}), median of {args.runs}",
          flush=True)
    for name in sizes:
        began = time.monotonic()
        try:
            row = measure(name, args.runs)
            gc.collect()  # this size's models, before the next one's
        except Exception as error:  # noqa: BLE001 - said, and the larger sizes are not tried
            row = {"size": name, "error": f"{type(error).__name__}: {str(error)[:500]}"}
        row["seconds"] = round(time.monotonic() - began, 1)
        doc["sizes"].append(row)
        print(render(row), flush=True)
        if args.json:
            args.json.write_text(json.dumps(doc, indent=1))
        if "error" in row:
            print(f"bench_maxtext_sync: {name} did not fit or failed; the larger sizes are not tried", flush=True)
            break
    return 0


def render(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"{row['size']:>6}  {row['error']}"
    gb = row["bytes"] / 1e9

    def rate(label: str) -> str:
        return f"{row[label]:.4f} s ({gb / row[label]:.2f} GB/s)"

    return (f"{row['size']:>10}  {row['params'] / 1e6:8.1f} M params  {gb:6.3f} GB  {row['leaves']} target arrays\n"
            f"{'':>12}overlay sync {rate('overlay_sync_s')}, first sync {row['first_sync_s']:.2f} s; "
            f"leaf-by-leaf sync {rate('leaf_sync_s')}; pins' sync {rate('pins_sync_s')}; "
            f"copy {rate('copy_s')}; one-program copy {rate('copy_program_s')}"
            f"{'' if row['copy_program_copied'] else ' (NOT a copy: its outputs are its inputs)'}\n"
            f"{'':>12}targets {'equal' if row['syncs_equal'] else 'NOT equal'} across the three syncs; "
            f"sync / one-program copy: overlay {row['overlay_sync_per_copy_program']:.2f}x, "
            f"leaf-by-leaf {row['leaf_sync_per_copy_program']:.1f}x, pins' {row['pins_sync_per_copy_program']:.1f}x; "
            f"against the overlay's: leaf-by-leaf {row['leaf_sync_s'] / row['overlay_sync_s']:.1f}x, "
            f"pins' {row['pins_sync_s'] / row['overlay_sync_s']:.1f}x")


def measure(name: str, runs: int) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from tunix.rl import reshard

    from support.fixes import maxtext_models, unpatched

    pins, leaf_by_leaf, overlay = unpatched.tunix_sync_modules("0006", "_SyncProgram")
    dims = dict(SIZES[name])
    family = maxtext_models.Family(dims.pop("family", "llama3"), dims.pop("model_name", "llama3.1-8b"), dims.pop("layers"))
    dims |= {"weight_dtype": "bfloat16", "dtype": "bfloat16"}
    actor, _ = maxtext_models.actor(family, **dims)
    target = maxtext_models.target(family, **dims)

    def target_params() -> list[Any]:
        return [v[...] for _, v in nnx.to_flat_state(target) if isinstance(v, nnx.Param)]

    size = sum(int(x.size) for x in target_params())
    nbytes = sum(int(x.size) * x.dtype.itemsize for x in target_params())

    def block() -> None:
        jax.block_until_ready([v[...] for _, v in nnx.to_flat_state(target)])

    # As Tunix's VllmSampler.update_params calls it for a direct sync.
    sampler_args = dict(reshard_fn=reshard.reshard_pytree, delete_dst_buffers=True, **unpatched.weights_required())

    def overlay_sync() -> None:
        overlay.transfer_state_directly(maxtext_models.param_state(actor), target, **sampler_args)
        block()

    def leaf_sync() -> None:
        leaf_by_leaf.transfer_state_directly(maxtext_models.param_state(actor), target, **sampler_args)
        block()

    def pins_sync() -> None:
        source = maxtext_models.maxtext_pre_unroll(maxtext_models.param_state(actor))
        pins.transfer_state_directly(source, target, reshard_fn=reshard.reshard_pytree)
        block()

    def copy() -> None:
        jax.block_until_ready([jnp.array(x, copy=True) for x in target_params()])

    # The same copy as one compiled program: no dispatch per array, so the
    # memory's bandwidth, not the host, is what bounds it.
    copy_all = jax.jit(lambda xs: [jnp.copy(x) for x in xs])

    def copy_program() -> None:
        jax.block_until_ready(copy_all(target_params()))

    row: dict[str, Any] = {"size": name, "params": size, "bytes": nbytes, "layers": family.layers, **dims,
                           "leaves": len(target_params())}
    began = time.perf_counter()
    overlay_sync()  # traces and compiles the program
    row["first_sync_s"] = time.perf_counter() - began
    # The three syncs write the same target, leaf by leaf.
    written = [jnp.array(x, copy=True) for x in target_params()]
    equal = True
    for other in (leaf_sync, pins_sync):
        other()
        equal = equal and all(bool(jnp.array_equal(a, b)) for a, b in zip(written, target_params(), strict=True))
    row["syncs_equal"] = equal
    del written
    timed: list[tuple[str, Any]] = [("overlay_sync_s", overlay_sync), ("leaf_sync_s", leaf_sync),
                                     ("pins_sync_s", pins_sync), ("copy_s", copy), ("copy_program_s", copy_program)]
    for label, run in timed:
        run()  # warm-up: the programs compiled
        seconds = []
        for _ in range(runs):
            gc.collect()
            began = time.perf_counter()
            run()
            seconds.append(time.perf_counter() - began)
        row[label] = statistics.median(seconds)
    for label in ("overlay_sync_s", "leaf_sync_s", "pins_sync_s"):
        row[label.removesuffix("_s") + "_per_copy_program"] = row[label] / row["copy_program_s"]
    # The program's outputs are new buffers (not its inputs handed back): it copied.
    params, copies = target_params(), copy_all(target_params())
    row["copy_program_copied"] = all(_buffer(a) != _buffer(b) for a, b in zip(params, copies, strict=True))
    return row


def _buffer(array: Any) -> int:
    return int(array.addressable_shards[0].data.unsafe_buffer_pointer())


if __name__ == "__main__":
    sys.exit(main())
