"""tpu-inference: `gather_logprobs` under Explicit mesh axes (patches/tpu-inference/0001).

MaxText 0.2.4 train_rl dies while tpu-inference precompiles
`compute_and_gather_logprobs` ("ShardingTypeError in gather_logprobs on JAX
0.11"): with Explicit mesh axes (jax.make_mesh's default in JAX 0.11) the
vocab-sharded logprobs reach `jax.lax.top_k`, then `jnp.take_along_axis`, and
the replicated token ids meet the batch-sharded top-k in `jnp.concatenate`.

Each test first shows the failure on the upstream module (the installed file
with the series reverse-applied, see support/fixes/unpatched.py), then runs the INSTALLED,
patched module: the real jitted `compute_and_gather_logprobs` and
`compute_and_gather_prompt_logprobs`, lowered and run inside `jax.set_mesh` as
tpu-inference's compilation manager does, and compared with the same function
run unsharded on one device. Sharded log_softmax reduces in another order, so
logprob values agree to float rounding; selections (top-k indices, ranks) must
be identical, ties included (they are exact ties in both runs).
"""

from __future__ import annotations

import contextlib
import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.core import ShardingTypeError  # not exported publicly; the report's class
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from support.fixes import maxtext_shims
from support.fixes.logprobs import COLLECTIVES, assert_same_result
from support.fixes.matrix import AXIS_TYPES, DTYPES, TOP_K
from support.fixes.meshes import make_mesh, mesh_ids
from support.fixes.unpatched import load_unpatched

MODULE = "tpu_inference.layers.jax.sample.sampling"
FUNCTIONS = ("compute_and_gather_logprobs", "compute_and_gather_prompt_logprobs")
B = 8  # the report's batch: float32[8@data,128256@model]
V_REPORT = 128256  # Llama 3.1 vocabulary, the report's shape
V_SMALL = 2048
_COLLECTIVE_OP = re.compile(r"\s(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")

# How the logits are laid out on the mesh. `VOCAB` is the mesh axis (or tuple
# of axes) the vocab axis is sharded over, like ShardingAxisName.VOCAB.
#   model        the report: P("data", "model") on a ("data", "model") mesh
#   data+model   vocab over two axes, batch replicated: P(None, ("data", "model"))
#   dp+model     3-axis mesh, batch and a 2-axis vocab: P("data", ("attn_dp", "model"))
#   unsharded    vocab unsharded, batch sharded: P("data", None)
LAYOUTS = {
    "model": (("data", "model"), P("data", "model")),
    "data+model": (("data", "model"), P(None, ("data", "model"))),
    "dp+model": (("data", "attn_dp", "model"), P("data", ("attn_dp", "model"))),
    "unsharded": (("data", "model"), P("data", None)),
}


@pytest.fixture(scope="module")
def upstream():
    return load_unpatched("tpu-inference", MODULE)


def vocab_size(layout: str, dtype: str) -> int:
    """The report's [8, 128256] float32 at its layout; small elsewhere, to keep the suite fast."""
    return V_REPORT if (layout, dtype) == ("model", "float32") else V_SMALL


def layout_mesh(shape: tuple[int, ...], layout: str, axis_type: str) -> jax.sharding.Mesh:
    """The matrix's (data, model) mesh shape with the axes `layout` names."""
    names = LAYOUTS[layout][0]
    data, model = shape
    if len(names) == 3:  # split the model axis in two: ("data", "attn_dp", "model")
        dp = 2 if model % 2 == 0 else 1
        shape = (data, dp, model // dp)
    return make_mesh(shape, axis_type, names)


@functools.cache
def host_inputs(v: int, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic logits with exact ties and -1e12-masked entries, and token ids.

    Values lie on a 1/4 grid and planted maxima are distinct multiples of 1/4,
    so they are exact in bfloat16 too and stay distinct (or tied) after
    log_softmax in either dtype.
    """
    rng = np.random.default_rng(20261129)
    x = rng.integers(-16, 17, size=(B, v)).astype(np.float32) / 4  # [-4, 4]: many exact ties
    tokens = np.zeros(B, np.int32)
    for b in range(B):
        top = rng.choice(v, 32, replace=False)  # spread over every vocab shard
        x[b, top] = 5 + np.arange(32) / 4  # distinct planted maxima
        tokens[b] = top[rng.integers(32)]
    x[0, rng.choice(v, 3, replace=False)] = x[0].max()  # a 4-way tie for the maximum
    x[1, rng.choice(v, 40, replace=False)] = 20.0  # 40 tied maxima: cut by every k <= 20
    keep = rng.choice(v, 10, replace=False)  # fewer unmasked than the largest k
    masked = np.full(v, -1e12, np.float32)
    masked[keep] = x[2, keep]
    x[2] = masked
    tokens[2] = next(i for i in range(v) if i not in keep)  # a masked token: rank v
    x[3, rng.choice(v, v // 2, replace=False)] = -1e12  # top-p style: half masked
    tokens[4] = 0
    tokens[5] = v - 1
    tokens[6] = int(np.argmin(x[6]))  # lowest-ranked token (ranked with all its ties)
    return x.astype(jnp.dtype(dtype)), tokens


def to_numpy(out) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.asarray(out.logprob_token_ids),
        np.asarray(out.logprobs).astype(np.float32),
        np.asarray(out.selected_token_ranks),
    )


@functools.cache
def reference(fn_name: str, v: int, dtype: str, k: int):
    """The same (patched) function run unsharded on one device."""
    from tpu_inference.layers.jax.sample import sampling

    logits, tokens = host_inputs(v, dtype)
    device = jax.devices()[0]
    out = getattr(sampling, fn_name)(jax.device_put(logits, device), jax.device_put(tokens, device), k)
    return to_numpy(out)


def collectives(compiled) -> dict[str, int]:
    counts = dict.fromkeys(COLLECTIVES, 0)
    for m in _COLLECTIVE_OP.finditer(compiled.as_text()):
        counts[m.group(1)] += 1
    return counts


def vocab_all_gathers(compiled, v: int) -> int:
    """All-gathers along dimension 1 (vocab) of a [B, V] array in the compiled HLO."""
    return len(re.findall(rf"\[\d+,{v}\]\S*\s+all-gather(?:-start)?\([^\n]*\sdimensions=\{{1\}}", compiled.as_text()))


def type_str(dtype: str, spec: P, v: int) -> str:
    """How ShardingTypeError prints an Explicit-sharded [B, v] type."""

    def dim(n, entry):
        if entry is None:
            return str(n)
        if isinstance(entry, tuple):
            return f"{n}@({','.join(entry)})" if len(entry) > 1 else f"{n}@{entry[0]}"
        return f"{n}@{entry}"

    return f"{dtype}[{dim(B, spec[0])},{dim(v, spec[1])}]"


def sharded_inputs(mesh, spec: P, v: int, dtype: str):
    logits, tokens = host_inputs(v, dtype)
    # token ids replicated, as sample() returns them and the precompilation passes them
    return (
        jax.device_put(logits, NamedSharding(mesh, spec)),
        jax.device_put(tokens, NamedSharding(mesh, P())),
    )


# --------------------------------------------------------------------------
# The report, exactly.


def test_unpatched_reproduces_report(upstream, patched):
    """The precompilation of the report: mesh (1, 8), logits P("data", "model"), Explicit."""
    mesh = jax.make_mesh((1, 8), ("data", "model"))  # Explicit: jax 0.11's default
    assert mesh.axis_types == (AxisType.Explicit, AxisType.Explicit)
    logits = jax.ShapeDtypeStruct((B, V_REPORT), jnp.float32, sharding=NamedSharding(mesh, P("data", "model")))
    tokens = jax.ShapeDtypeStruct((B,), jnp.int32, sharding=NamedSharding(mesh, P()))
    message = (
        "The input should be unsharded over the axis along which to compute the top_k "
        "values. Got input type=float32[8@data,128256@model] and axis=1"
    )
    for fn_name in FUNCTIONS:
        with jax.set_mesh(mesh), pytest.raises(ShardingTypeError, match=re.escape(message)):
            getattr(upstream, fn_name).lower(logits, tokens, 1)
    # Concrete arrays (not just the precompilation's abstract ones) fail the same way.
    x, t = sharded_inputs(mesh, P("data", "model"), V_REPORT, "float32")
    with jax.set_mesh(mesh), pytest.raises(ShardingTypeError, match=re.escape(message)):
        upstream.compute_and_gather_logprobs(x, t, 1)
    # Patched: the same precompilation lowers and compiles, the call runs and is right.
    for fn_name in FUNCTIONS:
        with jax.set_mesh(mesh):
            getattr(patched, fn_name).lower(logits, tokens, 1).compile()
            out = to_numpy(getattr(patched, fn_name)(x, t, 1))
        assert_same_result(out, reference(fn_name, V_REPORT, "float32", 1), "float32", fn_name)


def test_unpatched_gather_logprobs_eager(upstream, patched, monkeypatch):
    """`gather_logprobs` outside jit, on concrete arrays. Upstream fails in top_k and,
    were top_k given an unsharded operand, next in take_along_axis."""
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    x, t = sharded_inputs(mesh, P("data", "model"), V_SMALL, "float32")
    with jax.set_mesh(mesh):
        logprobs = patched.compute_logprobs(x)
        assert jax.typeof(logprobs).sharding.spec == P("data", "model")
        with maxtext_shims.upstream_failure(ShardingTypeError, match="should be unsharded over the axis along which to compute the top_k"):
            upstream.gather_logprobs(logprobs, t, 5)
        orig_top_k = jax.lax.top_k
        with monkeypatch.context() as m:
            m.setattr(jax.lax, "top_k", lambda op, k, **kw: orig_top_k(jax.sharding.reshard(op, P("data", None)), k, **kw))
            # MaxText's eager top_k shim does the same: this failure remains under it.
            with pytest.raises(ShardingTypeError, match=re.escape("Use `.at[...].get(out_sharding=)`")) as excinfo:
                upstream.gather_logprobs(logprobs, t, 5)
        assert "float32[8@data,2048@model]" in str(excinfo.value)
        out = patched.gather_logprobs(logprobs, t, 5)
    assert jax.typeof(out.logprobs).sharding.spec == P("data", None)
    assert_same_result(
        to_numpy(out), reference("compute_and_gather_logprobs", V_SMALL, "float32", 5), "float32", "eager"
    )


# --------------------------------------------------------------------------
# Every mesh and layout: upstream fails under Explicit axes, patched matches.


@pytest.mark.parametrize("layout", LAYOUTS)
@mesh_ids
def test_unpatched_fails_explicit(upstream, mesh_shape, layout):
    mesh = layout_mesh(mesh_shape, layout, "explicit")
    _, spec = LAYOUTS[layout]
    for fn_name in FUNCTIONS:
        for dtype in DTYPES:
            v = vocab_size(layout, dtype)
            logits = jax.ShapeDtypeStruct((B, v), jnp.dtype(dtype), sharding=NamedSharding(mesh, spec))
            tokens = jax.ShapeDtypeStruct((B,), jnp.int32, sharding=NamedSharding(mesh, P()))
            if spec[1] is not None:  # top_k on the sharded vocab axis
                message = (
                    "The input should be unsharded over the axis along which to compute the top_k "
                    f"values. Got input type={type_str(dtype, spec, v)} and axis=1"
                )
            else:  # replicated token ids joined with batch-sharded top-k results
                message = "All operands should have the same sharding"
            with jax.set_mesh(mesh), pytest.raises(ShardingTypeError, match=re.escape(message)):
                getattr(upstream, fn_name).lower(logits, tokens, max(TOP_K))


@pytest.mark.parametrize("layout", LAYOUTS)
@mesh_ids
@pytest.mark.parametrize("axis_type", AXIS_TYPES)
def test_matches_single_device(patched, upstream, axis_type, mesh_shape, layout):
    mesh = layout_mesh(mesh_shape, layout, axis_type)
    _, spec = LAYOUTS[layout]
    batch = spec[0] if axis_type == "explicit" else None
    for fn_name in FUNCTIONS:
        fn = getattr(patched, fn_name)
        for dtype in DTYPES:
            v = vocab_size(layout, dtype)
            x, t = sharded_inputs(mesh, spec, v, dtype)
            for k in TOP_K:
                what = f"{fn_name} {dtype} k={k}"
                with jax.set_mesh(mesh):
                    lowered = fn.lower(x, t, k)
                    compiled = lowered.compile()
                    out = compiled(x, t)
                # the batch axis keeps its sharding, the vocab axis is gone
                assert jax.typeof(out.logprob_token_ids).sharding.spec == P(batch, None), what
                assert jax.typeof(out.logprobs).sharding.spec == P(batch, None), what
                assert jax.typeof(out.selected_token_ranks).sharding.spec == P(batch), what
                assert out.logprobs.shape == (B, k + 1), what
                assert out.logprobs.dtype == jnp.dtype(dtype), what
                assert_same_result(to_numpy(out), reference(fn_name, v, dtype, k), dtype, what)
                if axis_type == "explicit" and spec[1] is not None:
                    # the vocab axis is never gathered whole: patch 0002 gathers only the
                    # shards' top-k candidates (test_0002_topk_shard_by_shard.py). XLA on
                    # CPU also all-gathers the batch axis for top_k (dimensions={0}): not
                    # counted here.
                    assert vocab_all_gathers(compiled, v) == 0, what
        if axis_type == "auto":
            # Auto: upstream already works; the patch must change nothing at all.
            dtype, k = DTYPES[0], max(TOP_K)
            v = vocab_size(layout, dtype)
            x, t = sharded_inputs(mesh, spec, v, dtype)
            with jax.set_mesh(mesh):
                mine = fn.lower(x, t, k)
                theirs = getattr(upstream, fn_name).lower(x, t, k)
                assert mine.as_text() == theirs.as_text(), fn_name
                mine_c, theirs_c = mine.compile(), theirs.compile()
                assert collectives(mine_c) == collectives(theirs_c), fn_name
                upstream_out = to_numpy(theirs_c(x, t))
            assert_same_result(upstream_out, reference(fn_name, v, dtype, k), dtype, "upstream " + fn_name)


def test_unsharded_input_is_noop(patched, upstream):
    """One device, or every array replicated on an Explicit mesh: same program as upstream."""
    mesh = jax.make_mesh((2, 4), ("data", "model"))
    logits, tokens = host_inputs(V_SMALL, "float32")
    device = jax.devices()[0]
    cases = {
        "one device": (jax.device_put(logits, device), jax.device_put(tokens, device)),
        "replicated": sharded_inputs(mesh, P(), V_SMALL, "float32"),
    }
    for name, (x, t) in cases.items():
        for fn_name in FUNCTIONS:
            with jax.set_mesh(mesh) if name == "replicated" else contextlib.nullcontext():
                mine = getattr(patched, fn_name).lower(x, t, 5).as_text()
                theirs = getattr(upstream, fn_name).lower(x, t, 5).as_text()
            assert mine == theirs, f"{name} {fn_name}"
