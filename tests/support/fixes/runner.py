"""The engine's view of the sampler: the runner's mesh as TPUModelRunner builds
it, and the sampler modules (sampling.py, rejection_sampler.py) upstream or
the installed overlay's. Shared by the precompilation tests of the whole
series (test_series_precompile.py) and the rejection sampler's (patch 0005,
test_0005_rejection_sampler.py)."""

from __future__ import annotations

import importlib
import pathlib
import re
import types

import jax
from jax.sharding import AxisType

from support.fixes.meshes import make_mesh
from support.fixes.sampling import BSEARCH, SAMPLING
from support.fixes.unpatched import load_unpatched

REJECTION = "tpu_inference.layers.jax.sample.rejection_sampler"
# How upstream's rejection samplers fail under Explicit axes: their inputs
# reach shard_map sharded otherwise than its in_specs.
SHARD_MAP_SPECS = re.compile(r"in_specs passed to shard_map: P\('data',?\) does not match the specs of the input")


def runner_mesh(shape: tuple[int, int], axis_type: str) -> jax.sharding.Mesh:
    """The runner's ("data", "model") mesh.

    Explicit: built by TPUModelRunner._create_2d_mesh itself, given the
    device_indexes that Tunix passes. Auto: what make_optimized_mesh builds
    (jax.make_mesh with Auto axes; it sorts the devices by their TPU
    coordinates, which CPU devices do not have).
    """
    from tpu_inference.layers.common.sharding import ShardingConfigManager, ShardingStrategy
    from tpu_inference.runner.tpu_runner import TPUModelRunner

    data, model = shape
    if axis_type == "auto":
        return make_mesh(shape, "auto")
    device_indexes = list(range(data * model))
    by_id = {d.id: d for d in jax.local_devices()}
    runner = types.SimpleNamespace(
        vllm_config=types.SimpleNamespace(
            sharding_config=ShardingConfigManager(
                ShardingStrategy(tensor_parallelism=model, data_parallelism=data), device_indexes=device_indexes
            )
        ),
        devices=[by_id[i] for i in device_indexes],  # as TPUWorker.init_device picks them
    )
    mesh = TPUModelRunner._create_2d_mesh(runner)
    assert mesh.axis_types == (AxisType.Explicit, AxisType.Explicit), mesh
    return mesh


def upstream_sampler() -> types.SimpleNamespace:
    """The pin's sampling.py and rejection_sampler.py, wired to the pin's binary_search.py."""
    bsearch = load_unpatched("tpu-inference", BSEARCH)
    sampling = load_unpatched("tpu-inference", SAMPLING)
    rejection = load_unpatched("tpu-inference", REJECTION)
    for mod in (sampling, rejection):
        mod.topk_mask, mod.topp_mask = bsearch.topk_mask, bsearch.topp_mask
        assert "constrain_sharding" not in pathlib.Path(mod.__file__).read_text()
    return types.SimpleNamespace(sampling=sampling, rejection=rejection)


def overlay_sampler() -> types.SimpleNamespace:
    """The installed overlay's sampling.py and rejection_sampler.py."""
    return types.SimpleNamespace(sampling=importlib.import_module(SAMPLING), rejection=importlib.import_module(REJECTION))
