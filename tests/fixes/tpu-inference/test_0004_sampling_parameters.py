"""tpu-inference: the sampling parameters placed otherwise than the logits' rows,
under Explicit mesh axes (patches/tpu-inference/0004).

With 0001-0003, `sample()` works under Explicit axes when temperature, top-k
and top-p are sharded as the runner shards them, P(ATTN_DATA), like the rows
of the logits. Placed otherwise, e.g. replicated, they still fail in
`jnp.where(is_greedy, ...)` ("select `which` must be scalar or have the same
sharding as cases"), which Auto axes accept: 0004 reshards them like the rows.

The failure is first shown on upstream (the installed file with the series
reverse-applied, see support/fixes/unpatched.py) and on sampling.py as the
series leaves it before 0004; then the INSTALLED code draws the tokens of one
device for every placement, and lowers to the very same program wherever
`sample()` already worked (Auto axes: upstream's; Explicit axes with the
runner's placement: that of 0001-0003). The rest of `sample()` under Explicit
axes is patch 0003's (test_0003_sample.py).
"""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest
from jax._src.core import ShardingTypeError  # not exported publicly
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from support.fixes import maxtext_shims
from support.fixes.matrix import AXIS_TYPES
from support.fixes.meshes import WSC_ASSERT, make_mesh, mesh_ids
from support.fixes.sampling import (
    BSEARCH,
    SAMPLING,
    SELECT_ERROR,
    before_0006,
    host_logits,
    metadata,
    run_sample,
    unsharded_sample,
    upstream_sampling,
)
from support.fixes.unpatched import load_before, load_unpatched

SELECT_WHICH = "select `which` must be scalar or have the same sharding as cases"
# Where callers may put temperature/top-k/top-p: the runner's P(ATTN_DATA),
# replicated (device_array's default is P(None)), or P().
METADATA_SPECS = {"attn_data": None, "replicated": P(None), "P()": P()}
LOGITS_SPECS = {"vocab": P("data", "model"), "rows": P("data", None), "replicated": P()}


@pytest.fixture(scope="module")
def upstream():
    return upstream_sampling(load_unpatched("tpu-inference", BSEARCH))


@pytest.fixture(scope="module")
def before_0004():
    """sampling.py as the series leaves it before patch 0004 (0001-0003 applied)."""
    return load_before("tpu-inference", SAMPLING, "0004", SAMPLING + "__before_0004")


@mesh_ids
def test_unpatched_sample_replicated_metadata_fails_explicit(upstream, before_0004, mesh_shape):
    """Sampling parameters not sharded like the rows (here: replicated) under
    Explicit axes: the pin fails as for any placement (AssertionError, and under
    MaxText's shims in the top-k search); with 0001-0003 it fails next in the
    final jnp.where(is_greedy, ...). Auto axes accept the same arrays."""
    mesh = make_mesh(mesh_shape, "explicit")
    for name in ("replicated", "P()"):
        spec = METADATA_SPECS[name]
        with maxtext_shims.upstream_failure(AssertionError, match=re.escape(WSC_ASSERT)):
            run_sample(upstream, mesh, True, metadata_spec=spec)
        with maxtext_shims.maxtext_shims():
            jax.clear_caches()
            with pytest.raises(ShardingTypeError, match=re.escape(SELECT_ERROR)):
                run_sample(upstream, mesh, True, metadata_spec=spec)
        jax.clear_caches()
        for logits_name, logits_spec in LOGITS_SPECS.items():
            with pytest.raises(ShardingTypeError, match=re.escape(SELECT_WHICH)) as excinfo:
                run_sample(before_0004, mesh, True, logits_spec=logits_spec, metadata_spec=spec)
            lines = [str(e.statement).strip() for e in excinfo.traceback if e.frame.code.name == "sample"]
            assert any(line.startswith("ret_tokens = jnp.where(is_greedy") for line in lines), (name, logits_name, lines)
        # the runner's placement works there: only the placement differs
        run_sample(before_0004, mesh, True)
        # Auto axes: any placement works, upstream too
        auto = make_mesh(mesh_shape, "auto")
        np.testing.assert_array_equal(
            run_sample(upstream, auto, True, metadata_spec=spec)[0], run_sample(upstream, auto, True)[0]
        )


@mesh_ids
def test_sample_any_metadata_placement(patched, mesh_shape):
    """Patch 0004: every placement of the sampling parameters and of the logits,
    under Explicit and Auto axes, draws the tokens of one device."""
    want_tokens, want_logits = unsharded_sample(patched, True)
    for axis_type in AXIS_TYPES:
        mesh = make_mesh(mesh_shape, axis_type)
        for metadata_name, metadata_spec in METADATA_SPECS.items():
            for logits_name, logits_spec in LOGITS_SPECS.items():
                what = f"{axis_type}, parameters {metadata_name}, logits {logits_name}"
                tokens, logits = run_sample(patched, mesh, True, logits_spec=logits_spec, metadata_spec=metadata_spec)
                np.testing.assert_array_equal(tokens, want_tokens, err_msg=what)
                np.testing.assert_allclose(logits, want_logits, rtol=1e-6, err_msg=what)
                if metadata_name == "P()" and logits_name == "vocab":  # greedy: the metadata is not read
                    np.testing.assert_array_equal(run_sample(patched, mesh, False, metadata_spec=metadata_spec)[0],
                                                  np.argmax(host_logits(), axis=-1), err_msg=what)


def test_sample_programs_unchanged_by_0004(patched, upstream, before_0004):
    """Patch 0004 changes no program where sample() already worked: Auto axes
    (any placement: upstream's program) and Explicit axes with the runner's
    placement (the program of 0001-0003)."""
    # (Patch 0006 changes the Auto programs where the mesh partitions the
    # vocab, as (2, 4) does: the series before it is compared there.)
    for axis_type, reference in (("auto", upstream), ("explicit", before_0004)):
        mesh = make_mesh((2, 4), axis_type)
        x = jax.device_put(host_logits(), NamedSharding(mesh, P("data", "model")))
        specs = METADATA_SPECS if axis_type == "auto" else {"attn_data": None}
        series = before_0006() if axis_type == "auto" else patched
        for name, spec in specs.items():
            md = metadata(mesh, True, spec)
            with jax.set_mesh(mesh):
                mine = series.sample.lower(jax.random.key(0), mesh, x, md).as_text()
                theirs = reference.sample.lower(jax.random.key(0), mesh, x, md).as_text()
            assert mine == theirs, (axis_type, name)
