"""tpu-inference's `sample()` called as the runner calls it, on fixed logits:
shared by the tests of patch 0003 (constraints and the top-k/top-p search
under Explicit axes, test_0003_sample.py) and patch 0004 (where the sampling
parameters are placed, test_0004_sampling_parameters.py)."""

from __future__ import annotations

import pathlib

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from support.fixes.unpatched import load_before, load_unpatched

SAMPLING = "tpu_inference.layers.jax.sample.sampling"
BSEARCH = "tpu_inference.layers.common.binary_search"
B, V = 8, 1024
SELECT_ERROR = "select cases must have the same shardings"


def upstream_sampling(upstream_bsearch):
    """Upstream sampling.py wired to upstream binary_search.py: the pin's sample()."""
    mod = load_unpatched("tpu-inference", SAMPLING)
    mod.topk_mask, mod.topp_mask = upstream_bsearch.topk_mask, upstream_bsearch.topp_mask
    assert "constrain_sharding" not in pathlib.Path(mod.__file__).read_text()
    return mod


def before_0006():
    """sampling.py as the series leaves it before patch 0006, which changes
    the programs of Auto meshes that partition the vocab: what the tests of
    0003 and 0004 compare with upstream's there (0006's tests compare the
    installed one)."""
    return load_before("tpu-inference", SAMPLING, "0006-", SAMPLING + "__before_0006")


def host_logits() -> np.ndarray:
    rng = np.random.default_rng(20261129)
    x = (rng.normal(size=(B, V)) * 3).astype(np.float32)
    x[0, [3, 700]] = x[0].max() + 1  # a tie for the maximum: argmax takes the first
    return x


# temperature 0 (greedy row), top_k 0 (off), top_p 1 (off), and every mix.
TEMPERATURE = np.array([0.7, 1.0, 0.0, 1.3, 0.5, 1.0, 2.0, 0.9], np.float32)
TOP_K = np.array([5, 0, 3, 50, 1, 0, 10, 20], np.int32)
TOP_P = np.array([0.9, 0.8, 1.0, 1.0, 0.5, 1.0, 0.95, 0.7], np.float32)


def metadata(mesh, do_sampling: bool, spec=None):
    """As the runner builds it: per-request arrays sharded P(ATTN_DATA) (or
    placed as `spec` says), dummy replicated."""
    from tpu_inference.layers.common.sharding import ShardingAxisName
    from tpu_inference.layers.jax.sample.sampling_metadata import (
        TPUSupportedSamplingMetadata,
    )

    def put(a, spec):
        return jax.device_put(a, NamedSharding(mesh, spec) if mesh is not None else jax.devices()[0])

    dummy = put(np.zeros((2,), np.int32), P())
    if not do_sampling:
        return TPUSupportedSamplingMetadata(do_sampling=False, _cache_collision_dummy=dummy)
    batch = P(ShardingAxisName.ATTN_DATA) if spec is None else spec
    return TPUSupportedSamplingMetadata(
        temperature=put(TEMPERATURE, batch),
        top_k=put(TOP_K, batch),
        top_p=put(TOP_P, batch),
        _cache_collision_dummy=dummy,
        do_sampling=True,
    )


def run_sample(module, mesh, do_sampling: bool, key=0, logits_spec=P("data", "model"), metadata_spec=None):
    x = jax.device_put(host_logits(), NamedSharding(mesh, logits_spec))
    with jax.set_mesh(mesh):
        tokens, logits = module.sample(jax.random.key(key), mesh, x, metadata(mesh, do_sampling, metadata_spec))
    assert jax.typeof(tokens).sharding.spec in (P(), P(None)), jax.typeof(tokens)
    return np.asarray(tokens), np.asarray(logits)


def unsharded_sample(module, do_sampling: bool, key=0):
    """The same sample() on one device, no mesh set (mesh=None is only used for constraints)."""
    device_mesh = jax.make_mesh((1, 1), ("data", "model"), devices=jax.devices()[:1])
    return run_sample(module, device_mesh, do_sampling, key)
