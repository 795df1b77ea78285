"""tpu-inference: the mesh context of `get_model`'s flax_nnx branch
(patches/tpu-inference/backport-9cfd2bd29-*, upstream's 9cfd2bd29, #3423).

`get_model` with MODEL_IMPL_TYPE flax_nnx tries the JAX model
(`get_flax_model`) and falls back to vLLM's torch model through torchax
(`get_vllm_model`) when the architecture has no JAX implementation, and at
once under pipeline parallelism for the models that need it.

- At the pin, `jax.set_mesh(mesh)` spans the whole branch: the vLLM model is
  built inside the mesh context too (what crashed multi-host upstream);
- with the backport, the mesh is set around `get_flax_model` only.

The multi-host crash itself needs several hosts (see the patch); one host
shows where the context reaches. `get_model` is the real function (the pin's:
model_loader.py with the series reverse-applied, support/fixes/unpatched.py;
the overlay's: installed); the two model builders it calls are replaced by
recorders of the current mesh, the JAX one raising the error of an
architecture it lacks.
"""

from __future__ import annotations

import types

import jax
import pytest

from support.fixes.meshes import make_mesh
from support.fixes.unpatched import load_unpatched

MODULE = "tpu_inference.models.common.model_loader"


@pytest.fixture(scope="module")
def mesh():
    return make_mesh((2, 4), "auto")


@pytest.fixture(scope="module", params=["pin", "overlay"])
def loader(request):
    if request.param == "pin":
        return request.param, load_unpatched("tpu-inference", MODULE)
    import importlib

    return request.param, importlib.import_module(MODULE)


def _current_mesh():
    mesh = jax.sharding.get_abstract_mesh()
    return None if mesh.empty else dict(mesh.shape)


def _record(module, monkeypatch, *, flax_raises: bool) -> dict:
    seen: dict = {}

    def get_flax_model(vllm_config, rng, mesh, is_draft_model=False):
        seen["get_flax_model"] = _current_mesh()
        if flax_raises:
            raise module.UnsupportedArchitectureError("no JAX implementation of TestForCausalLM")
        return "flax model"

    def get_vllm_model(vllm_config, rng, mesh, is_draft_model=False, shared_params=None):
        seen["get_vllm_model"] = _current_mesh()
        return "vllm model"

    monkeypatch.setattr(module, "get_flax_model", get_flax_model)
    monkeypatch.setattr(module, "get_vllm_model", get_vllm_model)
    monkeypatch.setenv("MODEL_IMPL_TYPE", "flax_nnx")
    return seen


def _config(arch="TestForCausalLM", pipeline_parallel_size=1):
    return types.SimpleNamespace(
        model_config=types.SimpleNamespace(hf_config=types.SimpleNamespace(architectures=[arch])),
        parallel_config=types.SimpleNamespace(pipeline_parallel_size=pipeline_parallel_size),
    )


def test_fallback_to_the_vllm_model(loader, mesh, monkeypatch):
    version, module = loader
    seen = _record(module, monkeypatch, flax_raises=True)
    assert module.get_model(_config(), None, mesh) == "vllm model"
    assert seen["get_flax_model"] == {"data": 2, "model": 4}, "the JAX model is built under the mesh, in both"
    if version == "pin":
        assert seen["get_vllm_model"] == {"data": 2, "model": 4}, "at the pin the vLLM fallback runs inside jax.set_mesh"
    else:
        assert seen["get_vllm_model"] is None, "with the backport the vLLM fallback runs outside the mesh context"
    assert _current_mesh() is None, "the context ends with get_model"


def test_pipeline_parallel_fallback(loader, mesh, monkeypatch):
    version, module = loader
    arch = next(iter(module._PP_DISABLED_MODELS))
    seen = _record(module, monkeypatch, flax_raises=False)
    assert module.get_model(_config(arch, pipeline_parallel_size=2), None, mesh) == "vllm model"
    assert "get_flax_model" not in seen
    assert seen["get_vllm_model"] == ({"data": 2, "model": 4} if version == "pin" else None)


def test_the_flax_model_is_built_under_the_mesh(loader, mesh, monkeypatch):
    _, module = loader
    seen = _record(module, monkeypatch, flax_raises=False)
    assert module.get_model(_config(), None, mesh) == "flax model"
    assert seen == {"get_flax_model": {"data": 2, "model": 4}}
