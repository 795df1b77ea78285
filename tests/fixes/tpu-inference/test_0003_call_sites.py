"""tpu-inference: the remaining CPU-runnable `constrain_sharding` call sites under
Explicit mesh axes (patches/tpu-inference/0003).

Sites (the installed files, `grep -n constrain_sharding`):

- tpu_inference/layers/common/linear.py: `sharded_matmul`,
  `sharded_quantized_matmul`, `sharded_quantized_batched_matmul`;
- tpu_inference/layers/jax/moe/dense_moe.py: `dense_moe_fwd` and
  `dense_moe_fwd_preapply_router_weights` (both reached through
  `dense_moe_func`);
- tpu_inference/layers/jax/moe/moe.py: `Router.__call__`;
- tpu_inference/layers/common/process_weights/moe_weights.py:
  `_process_moe_weights_no_requant` and `_process_quantized_moe_weights_impl`
  (both reached through `process_quantized_moe_weights`, the entry point the
  fp8/nvfp4/w4a8 MoE loaders call).

For each, as in test_0003_sample.py::test_layers_call_sites_explicit:
the upstream module (the installed file with the series reverse-applied, see
support/fixes/unpatched.py) fails under Explicit axes with `with_sharding_constraint`'s
AssertionError, raised from that very function; the INSTALLED code runs under
Explicit axes, gives the numbers it gives under Auto axes, and under Auto axes
the very numbers upstream gives. Every input is sharded so that each
constraint has to move data (which is also why upstream's assert fires: it
only fires when the sharding differs). Called without a mesh set (a
NamedSharding on a concrete Explicit mesh), upstream's constraint raises a
ValueError instead ("... can only refer to Auto axes of the mesh"): shown for
moe_weights.py, whose callers may load weights outside `jax.set_mesh`.

Not run here: the Pallas gmm_v2 branch of `sharded_quantized_matmul` (3-D/4-D
scales; TPU only). Its constraint is the same line as the XLA branch's, which
is run.
"""

from __future__ import annotations

import contextlib
import importlib
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from support.fixes import maxtext_shims
from support.fixes.meshes import WSC_ASSERT, make_mesh, mesh_ids
from support.fixes.unpatched import load_unpatched

LINEAR = "tpu_inference.layers.common.linear"
DENSE_MOE = "tpu_inference.layers.jax.moe.dense_moe"
MOE = "tpu_inference.layers.jax.moe.moe"
MOE_WEIGHTS = "tpu_inference.layers.common.process_weights.moe_weights"
MESH = (2, 4)  # data x model: both axes > 1, so every target spec moves data


def rand(seed, shape, scale=1.0):
    return (np.random.default_rng(seed).normal(size=shape) * scale).astype(np.float32)


def put(x, mesh, spec):
    return jax.device_put(x, NamedSharding(mesh, spec))


def assert_upstream_fails(fn, mesh_shape, module_name, *functions, exc=AssertionError, match=WSC_ASSERT):
    """Upstream, Explicit axes: the constraint's assert, raised in `functions` of
    the rebuilt upstream file (not somewhere else that happens to assert).
    Under MaxText's session-wide shims nothing is asserted of upstream (see
    maxtext_shims.upstream_failure)."""
    with maxtext_shims.upstream_failure(exc, match=re.escape(match)) as excinfo:
        fn(make_mesh(mesh_shape, "explicit"))
    if excinfo is None:
        return None
    upstream_file = module_name + "__unpatched.py"
    entries = [e for e in excinfo.traceback if e.path.name == upstream_file]
    frames = {e.frame.code.name for e in entries}
    for name in functions:
        assert name in frames, (name, frames)
    # the innermost upstream line is the constraint itself (JAX hides its own frames)
    assert entries and "jax.lax.with_sharding_constraint(" in str(entries[-1].statement), entries[-1].statement
    return entries[-1].frame.code.name


def check_site(patched_fn, upstream_fn, mesh_shape, module_name, functions, rtol=1e-5, atol=1e-5):
    """The whole story of one site: upstream fails under Explicit axes; the patched
    code gives under Explicit axes what it gives under Auto axes, which is
    exactly what upstream gives under Auto axes."""
    assert_upstream_fails(upstream_fn, mesh_shape, module_name, *functions)
    got = patched_fn(make_mesh(mesh_shape, "explicit"))
    want = patched_fn(make_mesh(mesh_shape, "auto"))
    upstream_auto = upstream_fn(make_mesh(mesh_shape, "auto"))
    assert got.keys() == want.keys() == upstream_auto.keys() and got
    for name in want:
        assert np.all(np.isfinite(want[name])), name
        assert np.any(want[name] != 0), name
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=name)
        np.testing.assert_array_equal(want[name], upstream_auto[name], err_msg=name)
    return got


@pytest.fixture(scope="module")
def modules():
    """(patched, upstream) for each module; the upstream copies share every other
    module with the patched install."""
    out = {}
    for name in (LINEAR, DENSE_MOE, MOE, MOE_WEIGHTS):
        patched = importlib.import_module(name)
        upstream = load_unpatched("tpu-inference", name)
        assert patched.__file__ is not None and "constrain_sharding" in pathlib.Path(patched.__file__).read_text()
        assert "constrain_sharding" not in pathlib.Path(upstream.__file__).read_text()
        out[name] = (patched, upstream)
    return out


# --------------------------------------------------------------------------
# tpu_inference/layers/common/linear.py


T, D, F = 16, 64, 32
N, H, A = 8, 16, 8  # heads, head dim, output features of the batched matmul


def _quantize(w):
    return np.clip(np.round(w * 1000), -127, 127).astype(np.int8)


def _linear_sites(linear, mesh):
    """The three matmuls, each called as the JAX layers call them (in jit).

    The activation comes in with its tokens sharded over "model"; each site
    constrains it to P(ATTN_DATA="data", <the weight's in axis>) before its
    shard_map. {name: (function the constraint is in, thunk)}."""
    x = put(rand(1, (T, D)), mesh, P("model", None))
    w = rand(2, (D, F), 0.1)
    w_q = _quantize(w)
    x3 = put(rand(3, (T, N, H)), mesh, P("model", None, None))
    w3_q = _quantize(rand(4, (A, N, H), 0.1))
    ws = NamedSharding(mesh, P("model", None))
    return {
        # sharded_matmul: contracting axis sharded (row parallel); the weight
        # sharding as a NamedSharding (mesh taken from it) and as a
        # PartitionSpec (mesh from the context). x -> P("data", "model").
        "sharded_matmul[named]": ("sharded_matmul", lambda: jax.jit(
            lambda a, b: linear.sharded_matmul(a, b, ws))(x, put(w, mesh, ws.spec))),
        "sharded_matmul[spec]": ("sharded_matmul", lambda: jax.jit(
            lambda a, b: linear.sharded_matmul(a, b, P("model", None)))(x, put(w, mesh, P("model", None)))),
        # sharded_quantized_matmul: int8 weight, channelwise scale: the XLA
        # path (3-D/4-D scales take the Pallas gmm_v2 kernel, TPU only; the
        # constraint is the same line before either). Column parallel:
        # x -> P("data", None).
        "sharded_quantized_matmul[channelwise]": ("sharded_quantized_matmul", lambda: jax.jit(
            lambda a, q, s: linear.sharded_quantized_matmul(a, q, s, P(None, "model"), mesh=mesh))(
                x, put(w_q, mesh, P(None, "model")), put(np.linspace(0.5e-3, 2e-3, F, dtype=np.float32), mesh, P("model")))),
        # ... and a 2-D block scale (requantization disabled), row parallel:
        # x -> P("data", "model").
        "sharded_quantized_matmul[2d-block]": ("sharded_quantized_matmul", lambda: jax.jit(
            lambda a, q, s: linear.sharded_quantized_matmul(a, q, s, P("model", None), mesh=mesh))(
                x, put(w_q, mesh, P("model", None)),
                put(np.linspace(0.5e-3, 2e-3, 8 * 2, dtype=np.float32).reshape(8, 2), mesh, P("model", None)))),
        # sharded_quantized_batched_matmul: "TNH,ANH->NTA" (an MLA-style
        # projection), heads sharded over "model": x -> P("data", "model", None).
        "sharded_quantized_batched_matmul": ("sharded_quantized_batched_matmul", lambda: jax.jit(
            lambda a, q, s: linear.sharded_quantized_batched_matmul(a, q, s, "TNH,ANH->NTA", P(None, "model", None), mesh=mesh))(
                x3, put(w3_q, mesh, P(None, "model", None)), put(np.linspace(0.5e-3, 2e-3, A, dtype=np.float32), mesh, P()))),
    }


def _linear_outputs(linear, mesh):
    with jax.set_mesh(mesh):
        return {name: np.asarray(thunk()) for name, (_, thunk) in _linear_sites(linear, mesh).items()}


@mesh_ids
def test_linear_call_sites(modules, mesh_shape):
    patched, upstream = modules[LINEAR]
    # upstream fails at each variant of each site on its own
    sites = {name: fn for name, (fn, _) in _linear_sites(upstream, make_mesh(mesh_shape, "auto")).items()}
    assert set(sites.values()) == {"sharded_matmul", "sharded_quantized_matmul", "sharded_quantized_batched_matmul"}
    for name, fn in sites.items():
        def one(mesh, name=name):
            with jax.set_mesh(mesh):
                return _linear_sites(upstream, mesh)[name][1]()
        # the innermost upstream frame is the constraint in that very function
        # (None: MaxText's session-wide shims are active, see upstream_failure)
        assert assert_upstream_fails(one, mesh_shape, LINEAR, fn) == (None if maxtext_shims.GLOBAL else fn), name
    # the first site reached by the whole set is sharded_matmul
    got = check_site(lambda m: _linear_outputs(patched, m), lambda m: _linear_outputs(upstream, m), mesh_shape, LINEAR,
                     ("sharded_matmul",))
    # and the numbers are the matmuls': against numpy on the host
    x, w = rand(1, (T, D)), rand(2, (D, F), 0.1)
    for name in ("sharded_matmul[spec]", "sharded_matmul[named]"):
        np.testing.assert_allclose(got[name], x @ w, rtol=1e-4, atol=1e-4, err_msg=name)
    w_deq = _quantize(w).astype(np.float32)
    channel = w_deq * np.linspace(0.5e-3, 2e-3, F, dtype=np.float32)
    # the activation is quantized to int8 (per shard): about 1% off
    np.testing.assert_allclose(got["sharded_quantized_matmul[channelwise]"], x @ channel, rtol=0.05, atol=0.05)
    block = w_deq * np.repeat(np.repeat(np.linspace(0.5e-3, 2e-3, 16, dtype=np.float32).reshape(8, 2), 8, 0), 16, 1)
    # a 2-D block scale: the activation is not quantized
    np.testing.assert_allclose(got["sharded_quantized_matmul[2d-block]"], x @ block, rtol=1e-4, atol=1e-4)
    x3, w3 = rand(3, (T, N, H)), _quantize(rand(4, (A, N, H), 0.1)).astype(np.float32)
    want3 = np.einsum("tnh,anh->nta", x3, w3 * np.linspace(0.5e-3, 2e-3, A, dtype=np.float32)[:, None, None])
    np.testing.assert_allclose(got["sharded_quantized_batched_matmul"], want3, rtol=0.05, atol=0.05)


# --------------------------------------------------------------------------
# tpu_inference/layers/jax/moe/dense_moe.py and moe.py (Router)

E, K, FF = 4, 2, 32  # experts, experts per token, expert intermediate size


def _moe_weights(mesh):
    """Unfused expert weights sharded over experts, as llama4/gpt_oss shard them
    (edf/efd_sharding ("model", None, None))."""
    from tpu_inference.layers.common.process_weights.moe_weights import (
        UnfusedMoEWeights,
    )

    es = P("model", None, None)
    return UnfusedMoEWeights(
        w1_weight=put(rand(10, (E, D, FF), 0.1), mesh, es), w1_weight_scale=None, w1_bias=None,
        w2_weight=put(rand(11, (E, D, FF), 0.1), mesh, es), w2_weight_scale=None, w2_bias=None,
        w3_weight=put(rand(12, (E, FF, D), 0.1), mesh, es), w3_weight_scale=None, w3_bias=None,
    )


def _gating():
    logits = rand(13, (T, E))
    idx = np.argsort(-logits, axis=-1)[:, :K].astype(np.int32)
    top = np.take_along_axis(logits, idx, -1)
    w = np.exp(top - top.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)).astype(np.float32), idx


def _dense_moe_outputs(dense_moe, mesh, preapply):
    """dense_moe_func (the DENSE_MAT backend) with tokens sharded over "model":
    dense_moe_fwd constrains x_TD to activation_ffw_td P("data", None), and
    dense_moe_fwd_preapply_router_weights x_TED to P("data", None, None)."""
    x = put(rand(1, (T, D)), mesh, P("model", None))
    weights_TX, indices_TX = _gating()
    gating = (put(weights_TX, mesh, P()), put(indices_TX, mesh, P()))
    with jax.set_mesh(mesh):
        fn = jax.jit(lambda w, a, g: dense_moe.dense_moe_func(
            weights=w, x_TD=a, gating_output=g, cast_dtype=jnp.float32, num_local_experts=E,
            apply_expert_weight_before_computation=preapply, activation_ffw_td=("data", None),
            activation_ffw_ted=("data", None, None), hidden_act="silu", mesh=mesh))
        return {"out": np.asarray(fn(_moe_weights(mesh), x, gating))}


def _dense_moe_reference(preapply):
    x = rand(1, (T, D))
    w1, w2, w3 = rand(10, (E, D, FF), 0.1), rand(11, (E, D, FF), 0.1), rand(12, (E, FF, D), 0.1)
    weights_TX, indices_TX = _gating()
    full = np.zeros((T, E), np.float32)
    np.put_along_axis(full, indices_TX, weights_TX, -1)
    silu = lambda v: v / (1 + np.exp(-v))  # noqa: E731
    if preapply:
        xe = x[:, None, :] * full[..., None]
        h = silu(np.einsum("ted,edf->tef", xe, w1)) * np.einsum("ted,edf->tef", xe, w2)
        return np.einsum("tef,efd->ted", h, w3).sum(1)
    h = silu(np.einsum("td,edf->tef", x, w1)) * np.einsum("td,edf->tef", x, w2)
    return np.einsum("ted,te->td", np.einsum("tef,efd->ted", h, w3), full)


@pytest.mark.parametrize("preapply", [False, True], ids=["dense_moe_fwd", "dense_moe_fwd_preapply_router_weights"])
def test_dense_moe_call_sites(modules, preapply):
    patched, upstream = modules[DENSE_MOE]
    site = "dense_moe_fwd_preapply_router_weights" if preapply else "dense_moe_fwd"
    got = check_site(lambda m: _dense_moe_outputs(patched, m, preapply), lambda m: _dense_moe_outputs(upstream, m, preapply),
                     MESH, DENSE_MOE, ("dense_moe_func", site))
    np.testing.assert_allclose(got["out"], _dense_moe_reference(preapply), rtol=1e-4, atol=1e-4)


def _router_outputs(moe, mesh):
    """Router as deepseek_v3/llama4 build it (ed_sharding (None, None),
    activation_ffw_td P("data", None)), called on tokens sharded over "model"."""
    from flax import nnx

    x = put(rand(1, (T, D)), mesh, P("model", None))
    with jax.set_mesh(mesh):
        router = moe.Router(
            dtype=jnp.float32, hidden_size=D, num_experts=E, num_experts_per_tok=K, router_act="softmax",
            rngs=nnx.Rngs(0), activation_ffw_td=("data", None), ed_sharding=(None, None), random_init=True, mesh=mesh,
        )
        weights_TX, experts_TX = router(x)
        kernel = np.asarray(router.kernel_DE.value)
    return {"weights": np.asarray(weights_TX), "experts": np.asarray(experts_TX), "kernel": kernel}


def test_router_call_site(modules):
    patched, upstream = modules[MOE]
    got = check_site(lambda m: _router_outputs(patched, m), lambda m: _router_outputs(upstream, m), MESH, MOE, ("__call__",))
    logits = rand(1, (T, D)) @ got["kernel"]
    np.testing.assert_array_equal(got["experts"], np.argsort(-logits, axis=-1, kind="stable")[:, :K])
    top = np.take_along_axis(logits, got["experts"], -1)
    want = np.exp(top - top.max(-1, keepdims=True))
    np.testing.assert_allclose(got["weights"], want / want.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------
# tpu_inference/layers/common/process_weights/moe_weights.py

ME, MD, MI, BLOCK = 4, 64, 128, 32  # experts, hidden, intermediate, fp8 block size
FIELDS = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale")
# GMM_TP's targets (_get_moe_weight_shardings) on the ("data", "model") mesh.
GMM_TP_SPECS = {
    "w13_weight": P(None, None, "model"),
    "w13_weight_scale": P(None, None, None, "model"),
    "w2_weight": P(None, "model", None),
}


def _fp8_moe_weights():
    """Block-quantized fp8 MoE weights as a checkpoint holds them (on the host):
    w13 (E, 2I, D) with scales (E, 2I/B, D/B), w2 (E, D, I) with (E, D/B, I/B)."""
    q = lambda seed, shape: np.asarray(jnp.asarray(rand(seed, shape, 50.0)).astype(jnp.float8_e4m3fn))  # noqa: E731
    s = lambda seed, shape: (np.random.default_rng(seed).uniform(0.5, 2.0, shape) * 1e-3).astype(np.float32)  # noqa: E731
    return {
        "w13_weight": q(20, (ME, 2 * MI, MD)), "w13_weight_scale": s(21, (ME, 2 * MI // BLOCK, MD // BLOCK)),
        "w2_weight": q(22, (ME, MD, MI)), "w2_weight_scale": s(23, (ME, MD // BLOCK, MI // BLOCK)),
    }


def _moe_weights_outputs(moe_weights, mesh, requantize, monkeypatch, set_mesh=True):
    """process_quantized_moe_weights for the GMM_TP backend, as the fp8 MoE
    loaders call it. It puts the experts on the expert axis ("model"), then
    (jitted) either only re-lays the weights out (_process_moe_weights_no_requant,
    DISABLE_WEIGHT_REQUANTIZATION=1) or requantizes them expert by expert in a
    shard_map (_process_quantized_moe_weights_impl); both end by constraining
    every field to GMM_TP's sharding: from experts sharded to the
    intermediate dimension sharded."""
    from tpu_inference import envs
    from tpu_inference.layers.common.moe import MoEBackend

    monkeypatch.delenv("MOE_REQUANTIZE_WEIGHT_DTYPE", raising=False)
    monkeypatch.delenv("MOE_REQUANTIZE_BLOCK_SIZE", raising=False)
    monkeypatch.delenv("MOE_REQUANTIZE_CLIP_PERCENTILE", raising=False)
    monkeypatch.setenv("DISABLE_WEIGHT_REQUANTIZATION", "0" if requantize else "1")
    assert envs.DISABLE_WEIGHT_REQUANTIZATION is (not requantize)
    weights = moe_weights.FusedMoEWeights(w13_bias=None, w2_bias=None, **_fp8_moe_weights())
    # The flax_nnx loader loads weights under jax.set_mesh(mesh); a caller
    # without a mesh set sees another error upstream (below).
    with jax.set_mesh(mesh) if set_mesh else contextlib.nullcontext():
        out = moe_weights.process_quantized_moe_weights(
            weights, moe_backend=MoEBackend.GMM_TP, mesh=mesh, activation="silu", weight_block_size=(BLOCK, BLOCK),
        )
    result = {}
    for name in FIELDS:
        arr = getattr(out, name)
        if name in GMM_TP_SPECS:
            spec = tuple(arr.sharding.spec) + (None,) * (arr.ndim - len(arr.sharding.spec))
            assert spec == tuple(GMM_TP_SPECS[name]), (name, arr.sharding)
        result[name] = np.asarray(arr.astype(jnp.float32))
    assert out.w13_bias is None and out.w2_bias is None
    return result


@pytest.mark.parametrize("requantize", [False, True], ids=["_process_moe_weights_no_requant", "_process_quantized_moe_weights_impl"])
def test_moe_weights_call_sites(modules, requantize, monkeypatch):
    patched, upstream = modules[MOE_WEIGHTS]
    site = "_process_quantized_moe_weights_impl" if requantize else "_process_moe_weights_no_requant"
    got = check_site(lambda m: _moe_weights_outputs(patched, m, requantize, monkeypatch),
                     lambda m: _moe_weights_outputs(upstream, m, requantize, monkeypatch),
                     MESH, MOE_WEIGHTS, ("process_quantized_moe_weights", site), rtol=0, atol=0)
    host = _fp8_moe_weights()
    w2 = host["w2_weight"].astype(np.float32)
    if not requantize:
        # GMM_TP leaves w2 as it is but for putting its contracting axis last
        np.testing.assert_array_equal(got["w2_weight"], np.swapaxes(w2, 1, 2))
    else:
        # requantized per output row (block = the whole intermediate axis): the
        # dequantized weight is the checkpoint's, to fp8 precision
        deq = w2 * np.repeat(np.repeat(host["w2_weight_scale"], BLOCK, 1), BLOCK, 2)
        requant = got["w2_weight"] * np.swapaxes(got["w2_weight_scale"][:, :, 0, :], 1, 2).reshape(ME, 1, MD)
        np.testing.assert_allclose(requant, np.swapaxes(deq, 1, 2), rtol=0.07, atol=1e-6)


# Upstream, without a mesh set (the target NamedSharding's mesh is concrete):
# with_sharding_constraint refuses a spec naming Explicit axes outright.
WSC_EXPLICIT_SPEC = "The spec of NamedSharding passed to with_sharding_constraint can only refer to Auto axes of the mesh."


def test_moe_weights_call_site_without_mesh_context(modules, monkeypatch):
    patched, upstream = modules[MOE_WEIGHTS]
    for requantize, site in ((False, "_process_moe_weights_no_requant"), (True, "_process_quantized_moe_weights_impl")):
        assert_upstream_fails(lambda m, rq=requantize: _moe_weights_outputs(upstream, m, rq, monkeypatch, set_mesh=False),
                              MESH, MOE_WEIGHTS, "process_quantized_moe_weights", site,
                              exc=ValueError, match=WSC_EXPLICIT_SPEC)
    # the patched code: the same numbers as with the mesh set, Explicit or Auto
    explicit = _moe_weights_outputs(patched, make_mesh(MESH, "explicit"), False, monkeypatch, set_mesh=False)
    auto = _moe_weights_outputs(patched, make_mesh(MESH, "auto"), False, monkeypatch, set_mesh=True)
    for name in FIELDS:
        np.testing.assert_array_equal(explicit[name], auto[name], err_msg=name)
