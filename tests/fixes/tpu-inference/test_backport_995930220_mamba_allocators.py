"""tpu-inference: the Mamba state allocators across `reinitialize_kv_cache`
(patches/tpu-inference/backport-995930220-*, upstream's 995930220, #3336).

Tunix's vLLM rollout reinitializes the KV cache after every weight sync
(`collective_rpc("reinitialize_kv_cache")`), which runs
`KVCacheManager.initialize_kv_cache` again.

- At the pin it jits a new allocator for every Mamba state array (conv and
  SSM state of hybrid models: Qwen3-Next / Qwen3.5), so every reinit
  compiles them all again;
- with the backport the allocators are cached by shape, dtype and sharding:
  only the first initialization compiles.

`initialize_kv_cache` and `reinitialize_kv_cache` are the real methods (the
pin's: kv_cache_manager.py with the series reverse-applied,
support/fixes/unpatched.py), on a bare KVCacheManager holding what they read,
over the runner's ("data", "model") mesh; the layers' specs are vLLM's own
MambaSpec. XLA compilations are counted with jax.monitoring.
"""

from __future__ import annotations

import importlib
import types

import jax
import pytest
import torch
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, KVCacheTensor, MambaSpec

from support.fixes.runner import runner_mesh
from support.fixes.unpatched import load_unpatched

MODULE = "tpu_inference.runner.kv_cache_manager"
LAYERS = ("layer.0", "layer.1", "layer.2")
COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@pytest.fixture(scope="module", params=["pin", "overlay"])
def version(request):
    module = load_unpatched("tpu-inference", MODULE) if request.param == "pin" else importlib.import_module(MODULE)
    return request.param, module


def _manager(module):
    spec = MambaSpec(block_size=16, shapes=((4, 128), (8, 64, 32)), dtypes=(torch.bfloat16, torch.float32))
    blocks = 16
    config = KVCacheConfig(
        num_blocks=blocks,
        kv_cache_tensors=[KVCacheTensor(size=blocks * spec.page_size_bytes, shared_by=[name]) for name in LAYERS],
        kv_cache_groups=[KVCacheGroupSpec(layer_names=list(LAYERS), kv_cache_spec=spec)],
    )
    runner = types.SimpleNamespace(
        kv_caches=[], layer_name_to_kvcache_index={}, mesh=runner_mesh((1, 8), "auto"),
        cache_config=types.SimpleNamespace(num_gpu_blocks_override=None), vllm_config=None, kv_cache_config=config)
    manager = module.KVCacheManager.__new__(module.KVCacheManager)
    manager.runner, manager.use_mla, manager.shared_kv_cache_layers = runner, False, {}
    manager._mamba_num_blocks, manager.actual_mamba_num_blocks = None, None
    manager.maybe_reinitialize_input_batch = lambda config: None
    return manager, config


def test_reinit_compiles_the_mamba_allocators_only_at_the_pin(version, monkeypatch):
    name, module = version
    # No vLLM config is current outside an engine: no KV connector, no config to enter.
    monkeypatch.setattr(module, "get_kv_connector_cache_layout", lambda: None)
    monkeypatch.setattr(module, "set_current_vllm_config", lambda config: _Null())
    # Its log lines read HBM usage, which CPU devices do not report.
    monkeypatch.setattr(module.utils, "hbm_usage_gb", lambda devices: 0.0)
    compiles = []
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, secs, **kw: compiles.append(event) if event == COMPILE_EVENT else None)
    manager, config = _manager(module)
    manager.initialize_kv_cache(config)
    assert len(manager.runner.kv_caches) == len(LAYERS)
    first = len(compiles)
    for _ in range(2):  # two weight syncs
        manager.delete_kv_cache()
        manager.reinitialize_kv_cache()
    again = len(compiles) - first
    assert len(manager.runner.kv_caches) == len(LAYERS)
    if name == "pin":
        assert again >= 2 * 2, f"at the pin each reinit compiles the conv and SSM allocators again ({again} compiles)"
    else:
        assert again == 0, f"with the backport a reinit compiles nothing ({again} compiles)"


class _Null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
