"""The CPU stand-in for the TPU kernels (the tool's maxtext_rl_overlay/smoke/pallas_interpret.py)
against tpu-inference's own reference implementation.

tpu-inference's `ragged_paged_attention` (v3, the Pallas TPU kernel of the
model backbone), called as the model calls it (`sharded_ragged_paged_attention`:
shard_map over the KV heads of the runner's ("data": 1, "model": 8) mesh), on
the CPU in Pallas TPU interpret mode, is compared with
`ref_ragged_paged_attention` (plain jnp, in the same kernel module) on the
request layouts the runner builds. The runner orders a batch decode requests
first and passes `request_distribution = (d, d, n)`: `d` decode-only
sequences, no "chunked-prefill-only" segment, and the rest mixed
(`persistent_batch_manager._reorder_batch`, `tpu_runner._prepare_inputs`;
the engine test records every distribution it gave the kernel). So the
runner's prefill-only batch is (0, 0, n), and its layouts are:

- decode-only (n, n, n), mixed (d, d, n), prefill-only (0, 0, n).

An earlier measurement found a prefill-only layout 3.9 off the reference. It
was the kernel's other meaning of "prefill-only": a distribution (0, n, n)
puts every sequence in the chunked-prefill-only segment, which the kernel
computes only when given `chunk_prefill_size` (all its sequences that long);
without it (the model never passes one) the kernel skips them and their
output is the query, unchanged. The last test pins that, so the layout is
known for what it is; the runner never builds it.

Tolerances (outputs are softmax-weighted means of N(0, 1) values, |x| < 4):
float32 1e-5 absolute (measured: 6e-7 at most); bfloat16 2**-5 (measured:
2**-6, one bfloat16 step at that size). The updated KV cache is compared
exactly: the kernel only copies the new keys and values into their pages.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from maxtext_rl_overlay.smoke import pallas_interpret
from support.fixes import kernel_mode
from support.fixes.matrix import DTYPES

TOLERANCE = {"float32": 1e-5, "bfloat16": 2.0**-5}
#: q heads, kv heads, head dim: the tiny Llama's (head dim 16, padded to 128 by the kernel).
HEADS, KV_HEADS, HEAD_DIM = 8, 8, 16
PAGE, PAGES_PER_SEQ, MAX_SEQS, MAX_TOKENS, TOTAL_PAGES = 16, 4, 8, 32, 32
#: layout -> (request_distribution, query lengths, KV lengths), as the runner builds them.
LAYOUTS = {
    "decode-only": ((4, 4, 4), [1, 1, 1, 1], [5, 17, 33, 9]),
    "mixed": ((3, 3, 4), [1, 1, 1, 13], [12, 3, 20, 13]),  # a chunked prefill beside 3 decodes
    "prefill-only": ((0, 0, 3), [6, 11, 3], [6, 30, 3]),  # the second continues after 19 cached tokens
}
KERNELS = pytest.mark.parametrize("kernels", [kernel_mode.kernels_id()])


@pytest.fixture(scope="module", autouse=True)
def stand_in():
    return pallas_interpret.activate()


@functools.cache
def attention():
    """The model's attention call, jitted once (every layout has the same shapes)."""
    import jax
    from jax.sharding import Mesh
    from tpu_inference.layers.common.attention_interface import sharded_ragged_paged_attention

    mesh = Mesh(np.array(jax.devices()).reshape(1, 8), ("data", "model"))
    return jax.jit(lambda *a: sharded_ragged_paged_attention(mesh, *a, None, HEAD_DIM**-0.5))


def inputs(layout, dtype, seed=0):
    import jax.numpy as jnp
    from tpu_inference.kernels.ragged_paged_attention.v3.kernel import get_kv_cache_shape

    distribution, q_lens, kv_lens = layout
    rng = np.random.default_rng(seed)
    tokens = sum(q_lens)

    def normal(*shape):
        return jnp.asarray(rng.standard_normal(shape, dtype=np.float32), dtype=dtype)

    q, k, v = normal(MAX_TOKENS, HEADS, HEAD_DIM), normal(MAX_TOKENS, KV_HEADS, HEAD_DIM), normal(MAX_TOKENS, KV_HEADS, HEAD_DIM)
    cache = normal(*get_kv_cache_shape(TOTAL_PAGES, PAGE, KV_HEADS, HEAD_DIM, jnp.dtype(dtype)))
    kv = np.zeros(MAX_SEQS, np.int32)
    kv[: len(kv_lens)] = kv_lens
    cu = np.full(MAX_SEQS + 1, tokens, np.int32)
    cu[: len(q_lens) + 1] = np.concatenate([[0], np.cumsum(q_lens)])
    pages = rng.permutation(TOTAL_PAGES)[: MAX_SEQS * PAGES_PER_SEQ].astype(np.int32)
    return tokens, [q, k, v, cache, *(jnp.asarray(a) for a in (kv, pages, cu, np.array(distribution, np.int32)))]


def reference(args):
    from tpu_inference.kernels.ragged_paged_attention.v3.kernel import ref_ragged_paged_attention

    return ref_ragged_paged_attention(*args, sm_scale=HEAD_DIM**-0.5)


@KERNELS
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_attention_kernel_matches_the_reference_on_the_runner_layouts(kernels, layout, dtype, record_property):
    kernel_mode.record(record_property)
    tokens, args = inputs(LAYOUTS[layout], dtype)
    out, cache = attention()(*args)
    ref_out, ref_cache = reference(args)
    diff = float(np.max(np.abs(np.asarray(out[:tokens], np.float32) - np.asarray(ref_out, np.float32))))
    record_property("max_abs_difference", f"{diff:.3g}")
    assert diff <= TOLERANCE[dtype], f"{layout} {dtype}: the kernel's output is {diff} off the reference (tolerance {TOLERANCE[dtype]})"
    assert np.array_equal(np.asarray(cache), np.asarray(ref_cache)), f"{layout} {dtype}: the updated KV caches differ"


@KERNELS
def test_a_chunked_prefill_only_segment_is_skipped_without_chunk_prefill_size(kernels, record_property):
    """The layout behind the earlier 3.9: distribution (0, n, n). Not one the runner builds."""
    kernel_mode.record(record_property)
    distribution, q_lens, kv_lens = LAYOUTS["prefill-only"]
    tokens, args = inputs(((0, 3, 3), q_lens, kv_lens), "float32")
    out, _ = attention()(*args)
    ref_out, _ = reference(args)
    out = np.asarray(out[:tokens])
    # Never computed: the output is the query as it came in ...
    assert np.array_equal(out, np.asarray(args[0][:tokens])), "the kernel computed a chunked-prefill-only segment without chunk_prefill_size"
    # ... so it is far from the attention (the earlier 3.9).
    diff = float(np.max(np.abs(out - np.asarray(ref_out))))
    record_property("max_abs_difference", f"{diff:.3g}")
    assert diff > 1, diff


#: The runner's step inputs as one host buffer (`DeviceBuffer`): 64 Ki int32,
#: the size at which jax on the CPU shares or copies later rather than at once.
STEP_INPUTS = 1 << 16


def test_the_runners_step_inputs_reach_the_devices_as_they_were_put():
    """The runner packs each step's inputs in one host buffer it reuses and
    puts it on the devices (`device_array`); with async scheduling it packs
    the next step's while the step is still queued. The arrays already put
    must keep what they were given. On the CPU, jax's `device_put` of such a
    buffer shares its memory or copies it later (jax issue #37830), which
    made `smoke` fail at random on a loaded machine. Measured without the
    stand-in's copy (pallas_interpret's fifth intervention): all 20 puts
    here saw the next step's inputs."""
    import jax
    from jax.sharding import Mesh
    from tpu_inference.utils import DeviceBuffer, device_array

    mesh = Mesh(np.array(jax.devices()).reshape(1, 8), ("data", "model"))
    buffer = DeviceBuffer(initial_capacity=STEP_INPUTS)
    seen = []
    for step in range(20):
        buffer.reset()
        buffer.get_view(STEP_INPUTS, key="inputs")[:] = step
        blob, _ = buffer.build()
        put = device_array(mesh, blob)
        buffer.reset()
        buffer.get_view(STEP_INPUTS, key="inputs")[:] = -1  # the next step's, packed at once
        seen.append(sorted({int(v) for v in np.unique(np.asarray(put))}))
    assert seen == [[step] for step in range(20)], f"arrays put on the devices changed with the host buffer after the put: {seen}"
