"""Benchmark: the weight sync train_rl runs between real MaxText models, of
growing size, against a plain on-device copy of the same bytes, in one run.

    PYTHON tests/bench/bench_maxtext_sync.py [--platform cpu|tpu] [--sizes S,M,...] [--runs N] [--json FILE]

(tests/ on PYTHONPATH; PYTHON sees maxtext 0.2.4 and the installed overlay:
the matrix's MaxText cell venv, or the TPU cell's install.) `--platform cpu`
(the default) runs on the 8-device CPU simulation, `tpu` on the machine's
chips, however many.

For each size (SIZES: llama3-shaped MaxText models, bfloat16 weights, from a
few million parameters to about a billion) it builds, by MaxText's own code
(support/fixes/maxtext_models.py), train_rl's actor (scanned layers, the
Tunix adapter, fsdp over the devices) and the rollout's target (MaxText's
vLLM model after its own load_weights: unrolled layers, on the rollout's
mesh), then times, after one warm-up, the median of RUNS of each, every one
blocked until the target's arrays are ready:

  maxtext sync   MaxTextVllmSampler's sync for maxtext_on_vllm: MaxText's
                 pre-unroll of nnx.state(actor, nnx.Param), then Tunix's
                 transfer_state_directly with reshard_pytree
  stacked sync   the whole nnx.state(actor) (rng state too) through
                 transfer_state_directly, which unstacks the scanned layers
                 itself (smoke's MaxText sync)
  copy           a plain on-device copy of the target's parameters
                 (jnp.array(x, copy=True)): the same bytes, nothing else
  one-program copy
                 the same copy compiled as one program (jax.jit of
                 jnp.copy over every array): no dispatch per array, so
                 bounded by the memory's bandwidth; the row says whether
                 its outputs are new buffers (that it copied)
  one-program sync
                 a prototype, not the overlay's code: MaxText's sync
                 (its pre-unroll, then Tunix's transfer_state_directly)
                 traced once into one jitted program from the actor's
                 parameters to the target's (the reshard left to the
                 program's output shardings, the target's), then the
                 outputs put into the target's variables: what turning the
                 per-leaf sync into one compiled program would give; its
                 outputs are checked equal to MaxText's sync's
  walk           the Python part alone: the same sync with every array
                 operation abstract (jax.eval_shape of the traced program's
                 Python, traced anew each time: the walk, the key matching,
                 the tree rebuilding and jax's tracing of each op, no device
                 work)
  dispatch       MaxText's sync without waiting for its arrays: the host's
                 share of it (its walk and its per-array dispatches); the
                 rest of "maxtext sync" is the wait for the devices

and gives each as GB/s of the target's parameter bytes, and the syncs'
seconds as ratios to the one-program copy's (the headline: the same bytes
moved once, at the memory's speed) and to the array-by-array copy's. A size
that does not fit the devices' memory is said (with the error) and the
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
    # are the defaults), synced through MaxText's qwen pre-unroll as train_rl syncs it.
    "qwen3-0.6b": dict(family="qwen3", model_name="qwen3-0.6b", base_emb_dim=1024, base_num_query_heads=16,
                       base_num_kv_heads=8, head_dim=128, base_mlp_dim=3072, vocab_size=151936, layers=28),
}
DEFAULT_SIZES = {"cpu": ("5M", "180M"), "tpu": ("5M", "180M", "470M", "1.1B")}


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
    return (f"{row['size']:>6}  {row['params'] / 1e6:8.1f} M params  {gb:6.3f} GB  "
            f"maxtext sync {row['maxtext_sync_s']:.3f} s ({gb / row['maxtext_sync_s']:.2f} GB/s)  "
            f"stacked sync {row['stacked_sync_s']:.3f} s ({gb / row['stacked_sync_s']:.2f} GB/s)  "
            f"copy {row['copy_s']:.4f} s ({gb / row['copy_s']:.2f} GB/s)  "
            f"one-program copy {row['copy_program_s']:.4f} s ({gb / row['copy_program_s']:.2f} GB/s"
            f"{'' if row['copy_program_copied'] else ', NOT a copy: its outputs are its inputs'})  "
            f"one-program sync {row['program_sync_s']:.4f} s ({'equal' if row['program_sync_equal'] else 'NOT equal'} to MaxText's), "
            f"walk {row['walk_s']:.4f} s, dispatch {row['dispatch_s']:.4f} s ({row['leaves']} target arrays); "
            f"sync/copy: maxtext {row['maxtext_sync_s'] / row['copy_s']:.1f}x, stacked {row['stacked_sync_s'] / row['copy_s']:.1f}x; "
            f"sync/one-program copy: maxtext {row['maxtext_sync_per_copy_program']:.1f}x, stacked {row['stacked_sync_per_copy_program']:.1f}x, "
            f"one-program sync {row['program_sync_per_copy_program']:.1f}x")


def measure(name: str, runs: int) -> dict[str, Any]:
    import jax
    import jax.numpy as jnp
    from flax import nnx
    from tunix.generate import utils
    from tunix.rl import reshard

    from support.fixes import maxtext_models

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

    def maxtext_sync_dispatch() -> None:
        source = maxtext_models.maxtext_pre_unroll(maxtext_models.param_state(actor))
        utils.transfer_state_directly(source, target, reshard_fn=reshard.reshard_pytree)

    def maxtext_sync() -> None:
        maxtext_sync_dispatch()
        block()

    def dispatch() -> None:  # timed up to the return, then waited for outside the timing (below)
        maxtext_sync_dispatch()

    def stacked_sync() -> None:
        utils.transfer_state_directly(nnx.state(actor), target, reshard_fn=reshard.reshard_pytree)
        block()

    def copy() -> None:
        jax.block_until_ready([jnp.array(x, copy=True) for x in target_params()])

    # The same copy as one compiled program: no dispatch per array, so the
    # memory's bandwidth, not the host, is what bounds it.
    copy_all = jax.jit(lambda xs: [jnp.copy(x) for x in xs])

    def copy_program() -> None:
        jax.block_until_ready(copy_all(target_params()))

    program, assign, walk = one_program_sync(actor, target, maxtext_models)

    def program_sync() -> None:
        assign(program())
        block()

    row: dict[str, Any] = {"size": name, "params": size, "bytes": nbytes, "layers": family.layers, **dims,
                           "leaves": len(target_params())}
    # The prototype's outputs against MaxText's sync's (both from the same actor).
    maxtext_sync()
    expected = [jnp.array(x, copy=True) for x in target_params()]
    program_sync()
    row["program_sync_equal"] = all(bool(jnp.array_equal(a, b)) for a, b in zip(expected, target_params(), strict=True))
    del expected
    timed: list[tuple[str, Any]] = [("maxtext_sync_s", maxtext_sync), ("stacked_sync_s", stacked_sync), ("copy_s", copy),
                                     ("copy_program_s", copy_program), ("program_sync_s", program_sync), ("walk_s", walk),
                                     ("dispatch_s", dispatch)]
    for label, run in timed:
        run()  # warm-up: the programs compiled
        block()
        seconds = []
        for _ in range(runs):
            gc.collect()
            began = time.perf_counter()
            run()
            seconds.append(time.perf_counter() - began)
            block()  # the dispatch's devices' work, outside its timing
        row[label] = statistics.median(seconds)
    for label in ("maxtext_sync_s", "stacked_sync_s", "program_sync_s"):
        row[label.removesuffix("_s") + "_per_copy"] = row[label] / row["copy_s"]
        row[label.removesuffix("_s") + "_per_copy_program"] = row[label] / row["copy_program_s"]
    # The program's outputs are new buffers (not its inputs handed back): it copied.
    params, copies = target_params(), copy_all(target_params())
    row["copy_program_copied"] = all(_buffer(a) != _buffer(b) for a, b in zip(params, copies, strict=True))
    return row


def one_program_sync(actor: Any, target: Any, maxtext_models: Any) -> tuple[Any, Any, Any]:
    """The prototype (see the module's docstring): (program, assign, walk).
    `program()` runs MaxText's pre-unroll and Tunix's transfer_state_directly
    traced into one jitted program (traced once, on the first call) and
    returns the target's new arrays; `assign(arrays)` puts them into the
    target's variables; `walk()` runs the same Python under jax.eval_shape
    (no device work)."""
    import jax
    from flax import nnx
    from tunix.generate import utils

    def keep(source: Any, target: Any) -> Any:  # reshard_fn: the program's out_shardings reshard
        return source

    source_state = maxtext_models.param_state(actor)
    source_leaves, source_def = jax.tree_util.tree_flatten(source_state)
    target_vars = [v for _, v in nnx.to_flat_state(target)]
    target_leaves, target_def = jax.tree_util.tree_flatten(target)
    shardings = [x.sharding for x in target_leaves]

    def traced(source_leaves: list[Any]) -> list[Any]:
        source = maxtext_models.maxtext_pre_unroll(jax.tree_util.tree_unflatten(source_def, source_leaves))
        # A copy of the target's tree holding its (concrete) arrays: Tunix reads their shapes and shardings,
        # then puts the traced values into the copy's variables, never into the target's.
        dst = jax.tree_util.tree_unflatten(target_def, target_leaves)
        utils.transfer_state_directly(source, dst, reshard_fn=keep)
        return jax.tree_util.tree_leaves(dst)

    compiled = jax.jit(traced, out_shardings=shardings)

    def program() -> list[Any]:
        return compiled(jax.tree_util.tree_leaves(maxtext_models.param_state(actor)))

    def assign(arrays: list[Any]) -> None:
        for var, array in zip(target_vars, arrays, strict=True):
            var.value = array

    def walk() -> None:
        # A new function each time: jax caches a trace by its function, and the walk is what is timed.
        jax.eval_shape(lambda leaves: traced(leaves), source_leaves)

    return program, assign, walk


def _buffer(array: Any) -> int:
    return int(array.addressable_shards[0].data.unsafe_buffer_pointer())


if __name__ == "__main__":
    sys.exit(main())
