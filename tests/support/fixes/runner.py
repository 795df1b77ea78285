"""The engine's view of the sampler: the runner's mesh as TPUModelRunner builds
it (the pin's runner or the installed overlay's), and the sampler modules
(sampling.py, rejection_sampler.py) upstream or the installed overlay's.
Shared by the backport's mesh test (test_backport_984b29c49_device_indexes_mesh.py),
the precompilation tests of the whole series (test_series_precompile.py) and
the rejection sampler's (patch 0005, test_0005_rejection_sampler.py)."""

from __future__ import annotations

import functools
import importlib
import pathlib
import re
import types
from typing import Any

import jax

from support.fixes.meshes import AXIS_TYPE
from support.fixes.sampling import BSEARCH, SAMPLING
from support.fixes.unpatched import load_unpatched

REJECTION = "tpu_inference.layers.jax.sample.rejection_sampler"
# How upstream's rejection samplers fail under Explicit axes: their inputs
# reach shard_map sharded otherwise than its in_specs.
SHARD_MAP_SPECS = re.compile(r"in_specs passed to shard_map: P\('data',?\) does not match the specs of the input")


RUNNER = "tpu_inference.runner.tpu_runner"


def create_2d_mesh(runner_cls, shape: tuple[int, int], device_indexes: list[int]) -> jax.sharding.Mesh:
    """The mesh `runner_cls._init_mesh` makes, as TPUModelRunner.__init__ calls
    it (NEW_MODEL_DESIGN unset: `_create_2d_mesh`), given the sharding strategy
    of Tunix's vLLM rollout (tensor and data parallelism, `device_indexes`) and
    the devices TPUWorker.init_device picks for those indexes, in their order.
    The runner is bare (no __init__): _init_mesh reads nothing else."""
    from tpu_inference import envs
    from tpu_inference.layers.common.sharding import ShardingConfigManager, ShardingStrategy

    assert not envs.NEW_MODEL_DESIGN, "NEW_MODEL_DESIGN makes the runner build its 7-axis mesh instead"
    data, model = shape
    by_id = {d.id: d for d in jax.local_devices()}
    runner = object.__new__(runner_cls)
    runner.vllm_config = types.SimpleNamespace(
        sharding_config=ShardingConfigManager(
            ShardingStrategy(tensor_parallelism=model, data_parallelism=data), device_indexes=device_indexes
        )
    )
    runner.devices = [by_id[i] for i in device_indexes]
    runner._init_mesh()
    return runner.mesh


def pin_runner() -> Any:
    """The pin's TPUModelRunner: tpu_runner.py with the series reverse-applied
    (the series changes it in the backports of 984b29c49, the mesh, and
    e27319786, reset_encoder_cache)."""
    return load_unpatched("tpu-inference", RUNNER).TPUModelRunner


def overlay_runner() -> Any:
    """The installed overlay's TPUModelRunner."""
    return importlib.import_module(RUNNER).TPUModelRunner


def runner_mesh(shape: tuple[int, int], axis_type: str) -> jax.sharding.Mesh:
    """The runner's ("data", "model") mesh, built by TPUModelRunner._create_2d_mesh
    itself, given the device_indexes that Tunix passes.

    Auto: the installed runner's, the engine's mesh now (the backport of
    984b29c49 builds it with the jax.sharding.Mesh constructor). Explicit: the
    pin's runner's (jax.make_mesh, Explicit by default since JAX 0.11), the
    axes that any caller building its mesh with jax.make_mesh's default gets.
    """
    runner_cls = overlay_runner() if axis_type == "auto" else pin_runner()
    mesh = create_2d_mesh(runner_cls, shape, list(range(shape[0] * shape[1])))
    assert mesh.axis_types == (AXIS_TYPE[axis_type],) * 2, mesh
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


def takes_the_runners_mesh(fn):
    """The pin's `compute_and_gather_logprobs` or `..._prompt_logprobs`,
    callable as the overlay's callers call them: patch 0006 has the runner,
    the decode loop and the compilation manager pass the runner's mesh as a
    fourth (static) argument, which the pin's functions do not take. A jit
    (so that the compilation manager can lower it) that drops the mesh and
    calls the pin's function: the same computation, one call deeper."""
    import inspect

    if "mesh" in inspect.signature(fn).parameters:
        return fn

    @functools.partial(jax.jit, static_argnames=("max_logprobs", "mesh"))
    def with_mesh(logits, token_ids, max_logprobs, mesh=None):
        return fn(logits, token_ids, max_logprobs)

    return with_mesh
