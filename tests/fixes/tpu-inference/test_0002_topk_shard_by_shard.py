"""tpu-inference: vocab-sharded top-k in `gather_logprobs` (patches/tpu-inference/0002).

Patch 0001 makes `gather_logprobs` work under Explicit mesh axes by
resharding the logprobs so that the vocab axis is whole before `top_k`: an
all-gather of the whole [B, V] array on every step. Patch 0002 takes the top-k
shard by shard instead and gathers only the n*k candidates of a row (values
and global indices); the token's logprob and rank are summed over the shards.

These tests run the INSTALLED wheel: the real jitted
`compute_and_gather_logprobs` and `compute_and_gather_prompt_logprobs`,
lowered, compiled and run inside `jax.set_mesh`, against the same function run
unsharded on one device (which is upstream's code path): same top-k ids (ties
across shard boundaries broken like `jax.lax.top_k`, lower index first), same
ranks, logprobs equal to float rounding. The bytes moved by collectives are
read from the compiled HLO, never timed. The 0001-only module ("reshard") is
rebuilt from the installed file: upstream's file (support/fixes/unpatched.py)
with the patches before 0002 applied again.
"""

from __future__ import annotations

import functools
import importlib
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from support.fixes.logprobs import assert_same_result, collective_bytes, collective_shapes
from support.fixes.matrix import AXIS_TYPES, DTYPES, TOP_K
from support.fixes.meshes import make_mesh, mesh_ids
from support.fixes.unpatched import load_before

MODULE = "tpu_inference.layers.jax.sample.sampling"
THIS_PATCH = "0002-"  # the series' patch under test, by its number
FUNCTIONS = ("compute_and_gather_logprobs", "compute_and_gather_prompt_logprobs")
B = 8
V = 512  # small, to keep the suite fast; a multiple of every shard count here
B_REPORT, V_REPORT = 256, 128256  # a decode batch with the Llama 3 vocabulary
# The vocab axis over one mesh axis (batch sharded too) and over two (batch replicated).
LAYOUTS = {"model": P("data", "model"), "data+model": P(None, ("data", "model"))}


# --------------------------------------------------------------------------
# Helpers


@pytest.fixture(scope="module")
def reshard():
    """The 0001-only module, imported beside the installed one (shares every other module)."""
    mod = load_before("tpu-inference", MODULE, THIS_PATCH, MODULE + "__reshard")
    assert "_gather_logprobs_vocab_sharded" not in vars(mod)
    assert "jax.sharding.reshard(" in pathlib.Path(mod.__file__).read_text()  # 0001 is there
    return mod


def vocab_shards(mesh, spec: P) -> int:
    axes = spec[1] if isinstance(spec[1], tuple) else (spec[1],)
    return int(np.prod([mesh.shape[a] for a in axes]))


@functools.cache
def host_inputs(dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """Logits with exact ties across every shard boundary, -1e12-masked rows, and token ids.

    Values lie on a 1/4 grid, exact in bfloat16 too, so ties stay exact ties
    after log_softmax in both runs. Every boundary of 2, 4 or 8 shards is a
    multiple of V/8.
    """
    rng = np.random.default_rng(20261129)
    x = rng.integers(-16, 17, size=(B, V)).astype(np.float32) / 4  # many exact ties in every row
    edges = np.arange(V // 8, V, V // 8)
    x[0, np.concatenate([[0], edges - 1, edges, [V - 1]])] = 9.0  # 16 tied maxima on shard edges
    x[1] = 1.0  # one tie over the whole row: top-k is 0..k-1 and every rank is V
    x[2] = -1e12  # masked but for 10 entries (fewer than the largest k), 2 ties on an edge
    x[2, [V // 2 - 1, V // 2]] = 3.0
    x[2, rng.choice(V, 8, replace=False)] = rng.integers(-8, 8, 8) / 4
    x[3, rng.choice(V, V // 2, replace=False)] = -1e12  # top-p style: half masked
    x[4, V // 2 :] = -1e12  # whole shards masked
    tokens = rng.integers(0, V, B).astype(np.int32)
    tokens[0] = V // 2  # a tied maximum, first of a shard
    tokens[1] = V // 2 - 1
    tokens[2] = int(np.flatnonzero(x[2] == -1e12)[-1])  # a masked token: rank V
    tokens[4] = V // 2  # masked, first of a masked shard
    tokens[5] = 0
    tokens[6] = V - 1
    tokens[7] = int(np.argmin(x[7]))  # ranked with all its ties
    return x.astype(jnp.dtype(dtype)), tokens


def sharded_inputs(mesh, spec: P, dtype: str):
    x, t = host_inputs(dtype)
    # token ids replicated, as sample() returns them and the precompilation passes them
    return jax.device_put(x, NamedSharding(mesh, spec)), jax.device_put(t, NamedSharding(mesh, P()))


def to_numpy(out):
    return (
        np.asarray(out.logprob_token_ids),
        np.asarray(out.logprobs).astype(np.float32),
        np.asarray(out.selected_token_ranks),
    )


@functools.cache
def reference(fn_name: str, dtype: str, k: int):
    """The same function run unsharded on one device: upstream's code path."""
    module = importlib.import_module(MODULE)
    x, t = host_inputs(dtype)
    device = jax.devices()[0]
    return to_numpy(getattr(module, fn_name)(jax.device_put(x, device), jax.device_put(t, device), k))


def largest_collective(compiled) -> int:
    """Elements of the largest array a collective yields."""
    return max((n for _, n in collective_shapes(compiled)), default=0)


# --------------------------------------------------------------------------
# Exactness: every mesh, the vocab over one mesh axis and over two.


@pytest.mark.parametrize("layout", LAYOUTS)
@mesh_ids
def test_matches_single_device(patched, reshard, mesh_shape, layout):
    mesh = make_mesh(mesh_shape)
    spec = LAYOUTS[layout]
    n = vocab_shards(mesh, spec)
    shard = V // n
    ks = sorted(set(TOP_K) | {shard + 3} if n > 1 else set(TOP_K))  # and k larger than a shard
    for fn_name in FUNCTIONS:
        for dtype in DTYPES:
            x, t = sharded_inputs(mesh, spec, dtype)
            for k in ks:
                what = f"{fn_name} {dtype} k={k} shards={n}"
                with jax.set_mesh(mesh):
                    lowered = getattr(patched, fn_name).lower(x, t, k)
                    compiled = lowered.compile()
                    out = compiled(x, t)
                    if n == 1:  # one shard: 0001's path, unchanged
                        theirs = getattr(reshard, fn_name).lower(x, t, k)
                        assert lowered.as_text() == theirs.as_text(), what
                assert_same_result(to_numpy(out), reference(fn_name, dtype, k), dtype, what)
                batch = spec[0]
                assert jax.typeof(out.logprobs).sharding.spec == P(batch, None), what
                assert jax.typeof(out.logprob_token_ids).sharding.spec == P(batch, None), what
                assert jax.typeof(out.selected_token_ranks).sharding.spec == P(batch), what
                assert out.logprobs.dtype == jnp.dtype(dtype), what
                if n > 1:
                    assert "sdy.manual_computation" in lowered.as_text(), what  # the shard_map
                    if k < shard:
                        # no collective yields as much as a row's vocabulary: only candidates
                        assert largest_collective(compiled) <= B * n * k, what


def test_inputs_tie_across_shard_boundaries():
    """The inputs do what the test above needs: ties that the top-k cuts, on shard edges."""
    x, t = host_inputs("float32")
    edges = np.arange(V // 8, V, V // 8)
    row0 = np.sort(np.flatnonzero(x[0] == x[0].max()))
    assert set(edges - 1) | set(edges) <= set(row0) and len(row0) > max(TOP_K[:-1] + [5])
    assert (x[1] == x[1, 0]).all()
    assert (x[2] > -1e12).sum() < max(TOP_K)
    assert x[4, t[4]] == -1e12 and x[2, t[2]] == -1e12


# --------------------------------------------------------------------------
# Where the shard-local top-k cannot apply, 0001's path runs unchanged.


@mesh_ids
@pytest.mark.parametrize("axis_type", AXIS_TYPES)
def test_fallback_is_reshard_path(patched, reshard, axis_type, mesh_shape):
    """Auto axes (types carry no sharding) and a single vocab shard: the same program as 0001."""
    mesh = make_mesh(mesh_shape, axis_type)
    for layout, spec in LAYOUTS.items():
        if axis_type == "explicit" and vocab_shards(mesh, spec) > 1:
            continue  # the shard-local path: test_matches_single_device
        x, t = sharded_inputs(mesh, spec, "float32")
        for fn_name in FUNCTIONS:
            with jax.set_mesh(mesh):
                mine = getattr(patched, fn_name).lower(x, t, max(TOP_K)).as_text()
                theirs = getattr(reshard, fn_name).lower(x, t, max(TOP_K)).as_text()
            assert "sdy.manual_computation" not in mine, f"{axis_type} {layout} {fn_name}"
            assert mine == theirs, f"{axis_type} {layout} {fn_name}"


def test_num_vocab_shards(patched, monkeypatch):
    """When the shard-local path applies: Explicit axes, more than one shard, even splits."""
    explicit, auto = make_mesh((2, 4)), make_mesh((2, 4), "auto")

    def count(mesh, spec, shape=(B, V)):
        aval = jax.ShapeDtypeStruct(shape, jnp.float32, sharding=NamedSharding(mesh, spec))
        seen = []
        with jax.set_mesh(mesh):
            jax.jit(lambda a: seen.append(patched._num_vocab_shards(a)) or a).trace(aval)  # type: ignore[func-returns-value]
        return seen[0]

    assert count(explicit, P("data", "model")) == 4
    assert count(explicit, P(None, ("data", "model"))) == 8
    assert count(explicit, P(None, ("model", "data"))) == 8
    assert count(explicit, P("model", "data")) == 2
    assert count(explicit, P("data", None)) == 1
    assert count(explicit, P()) == 1
    assert count(auto, P("data", "model")) == 1  # Auto: the type carries no sharding
    assert patched._num_vocab_shards(jnp.zeros((B, V))) == 1  # one device, no mesh

    # An uneven split (jax refuses such arrays today, and shard_map would): fall back.
    class Uneven:
        shape = (B, V - 2)
        sharding = NamedSharding(explicit.abstract_mesh, P("data", "model"))

    monkeypatch.setattr(jax, "typeof", lambda a: a)
    assert patched._num_vocab_shards(Uneven) == 1
    Uneven.shape = (B, V)
    assert patched._num_vocab_shards(Uneven) == 4


# --------------------------------------------------------------------------
# Collective bytes, from the compiled HLO: no collective moves [B, V].


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spec", [LAYOUTS["model"], LAYOUTS["data+model"]], ids=list(LAYOUTS))
@pytest.mark.parametrize("mesh_shape", [(1, 8), (2, 4)], ids=["1x8", "2x4"])
def test_collective_bytes(patched, reshard, mesh_shape, spec, dtype):
    """A decode step at B=256 with the Llama 3 vocabulary (compiled, not run).

    0002 moves about n*k*B*(itemsize + 4) bytes (the candidates' values and
    indices) plus [B]-sized reductions; 0001 all-gathers at least B*V*itemsize.
    """
    mesh = make_mesh(mesh_shape)
    n = vocab_shards(mesh, spec)
    itemsize = jnp.dtype(dtype).itemsize
    logits = jax.ShapeDtypeStruct((B_REPORT, V_REPORT), jnp.dtype(dtype), sharding=NamedSharding(mesh, spec))
    tokens = jax.ShapeDtypeStruct((B_REPORT,), jnp.int32, sharding=NamedSharding(mesh, P()))
    whole = B_REPORT * V_REPORT * itemsize
    for k in TOP_K:
        candidates = n * k * B_REPORT * (itemsize + 4)
        for fn_name in FUNCTIONS:
            what = f"{fn_name} k={k}"
            with jax.set_mesh(mesh):
                mine = collective_bytes(getattr(patched, fn_name).lower(logits, tokens, k).compile())
                theirs = collective_bytes(getattr(reshard, fn_name).lower(logits, tokens, k).compile())
            assert theirs >= whole, what  # 0001 gathers the whole [B, V]
            assert mine <= 2 * candidates + 64 * B_REPORT, (what, mine, candidates)
            assert mine * 100 < whole, (what, mine, whole)
