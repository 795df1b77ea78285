"""MaxText 0.2.4's run-time shims, to test the overlay under them.

MaxText 0.2.4 (the PyPI wheel) patches tpu-inference and Tunix at run time:

* `maxtext/integration/tunix/tunix_adapter.py`, at import and for the rest of
  the process: `jax.lax.with_sharding_constraint` and `jax.lax.top_k` are
  replaced by fallbacks that catch any Exception from the original and retry
  with `jax.sharding.reshard` (top_k: of the operand, with the reduced axis
  unsharded, read from `operand.sharding`);
* `maxtext/trainers/post_train/rl/train_rl.py`, `_tpu_inference_compat_patches`,
  a context manager around the whole of `rl_train`: `with_sharding_constraint`
  (by then already the adapter's fallback) falls back to `reshard` on
  AssertionError; Tunix's `_apply_dtype_cast` skips bfloat16 -> float32;
  `_bulk_align_and_unstack` and `_unstack_scanned_param` clamp `scan_axis` to
  the leaf's last axis, and a length-1 unstack result of a leaf shaped like its
  target is repeated 256 times.

Where maxtext is installed (the matrix's MaxText cell), the REAL shims are
used: the adapter's own `_compat_wsc`/`_compat_top_k` and train_rl's own
context manager, imported from the installed release. Where it is not (the
overlay-alone cell: MaxText is not part of that environment), the same things
are re-created below, written from reading that published source (not a copy
of it). `SOURCE` says which. `maxtext_shims()` nests them as a MaxText
rl_train run does: the adapter's replacements first, train_rl's context inside.

With MRL_MAXTEXT_SHIMS=1 (the matrix's second run of the MaxText cell) the
adapter is imported once at session start and its replacements stay for the
whole session, as in a MaxText process.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
from unittest import mock

import jax
import jax.numpy as jnp
import pytest

from support.fixes.matrix import MAXTEXT_SHIMS

#: The session keeps the adapter's replacements for all its tests.
GLOBAL = MAXTEXT_SHIMS


def _import_real(name: str):
    """Import a MaxText module; with GLOBAL off, undo the replacements the
    adapter makes at import (the contexts below apply them), so that importing
    it does not change the tests that follow."""
    if importlib.util.find_spec("maxtext") is None:
        return None  # not installed: re-create (an installed maxtext that fails to import is an error)
    before = (jax.lax.with_sharding_constraint, jax.lax.top_k)
    module = importlib.import_module(name)
    if not GLOBAL:
        jax.lax.with_sharding_constraint, jax.lax.top_k = before
    return module


ADAPTER = _import_real("maxtext.integration.tunix.tunix_adapter")
_TRAIN_RL_INSTALLED = _import_real("maxtext.trainers.post_train.rl.train_rl") if ADAPTER else None
SOURCE = "maxtext (installed)" if ADAPTER and _TRAIN_RL_INSTALLED else "re-created (maxtext is not installed)"


@functools.cache
def stock_train_rl():
    """MaxText 0.2.4's own train_rl module, whose `_tpu_inference_compat_patches`
    the contexts below enter: the installed one where it has them (MaxText's
    release), else the release's code rebuilt from the overlay's MaxText
    (its series reverse-applied: support/fixes/unpatched.py; the overlay's
    deletes them, as 0.2.5 does). None without maxtext."""
    if _TRAIN_RL_INSTALLED is None:
        return None
    if hasattr(_TRAIN_RL_INSTALLED, "_tpu_inference_compat_patches"):
        return _TRAIN_RL_INSTALLED
    from support.fixes.unpatched import load_unpatched

    return load_unpatched("maxtext", "maxtext.trainers.post_train.rl.train_rl")


@contextlib.contextmanager
def upstream_failure(exc: type[BaseException], match: str | None = None):
    """`pytest.raises(exc, match=match)` for a failure of upstream's code that
    the test shows before it checks the overlay; yields the ExceptionInfo.

    In the session-wide shims run (GLOBAL), MaxText's replacements are active
    for every test, and they exist to rescue exactly such failures (a failing
    with_sharding_constraint becomes a reshard; an eager top_k reshards its
    operand): upstream may then pass, or fail further on. There this asserts
    nothing about upstream and yields None; the test goes on to check the
    overlay under the shims. The runs without them assert the failure."""
    if not GLOBAL:
        with pytest.raises(exc, match=match) as info:
            yield info
        return
    try:
        yield None
    except Exception:  # noqa: BLE001 - either outcome is upstream's under MaxText's shims
        pass


@contextlib.contextmanager
def tunix_adapter_shims():
    """What importing maxtext.integration.tunix.tunix_adapter installs."""
    if ADAPTER is not None:
        before = (jax.lax.with_sharding_constraint, jax.lax.top_k)
        jax.lax.with_sharding_constraint, jax.lax.top_k = ADAPTER._compat_wsc, ADAPTER._compat_top_k
        try:
            yield
        finally:
            jax.lax.with_sharding_constraint, jax.lax.top_k = before
        return
    orig_wsc = jax.lax.with_sharding_constraint
    orig_top_k = jax.lax.top_k

    def compat_wsc(x, shardings):
        try:
            return orig_wsc(x, shardings)
        except Exception:  # MaxText catches everything here
            return jax.sharding.reshard(x, shardings)

    def compat_top_k(operand, k, axis=-1):
        try:
            return orig_top_k(operand, k, axis=axis)
        except Exception:
            sharding = getattr(operand, "sharding", None)
            if sharding is not None and hasattr(sharding, "spec") and hasattr(sharding, "mesh"):
                spec = list(sharding.spec)
                idx = axis if axis >= 0 else len(spec) + axis
                if 0 <= idx < len(spec):
                    spec[idx] = None
                    target = jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*spec))
                    try:
                        operand = orig_wsc(operand, target)
                    except Exception:
                        operand = jax.sharding.reshard(operand, target)
            return orig_top_k(operand, k, axis=axis)

    jax.lax.with_sharding_constraint = compat_wsc
    jax.lax.top_k = compat_top_k
    try:
        yield
    finally:
        jax.lax.with_sharding_constraint = orig_wsc
        jax.lax.top_k = orig_top_k


@contextlib.contextmanager
def train_rl_patches():
    """What train_rl._tpu_inference_compat_patches does around rl_train."""
    train_rl = stock_train_rl()
    if train_rl is not None:
        with train_rl._tpu_inference_compat_patches():
            yield
        return
    import tunix.generate.utils as tunix_utils

    orig_wsc = jax.lax.with_sharding_constraint
    orig_cast = tunix_utils._apply_dtype_cast
    orig_bulk = tunix_utils._bulk_align_and_unstack
    orig_unstack = tunix_utils._unstack_scanned_param

    def compat_wsc(x, shardings):
        try:
            return orig_wsc(x, shardings)
        except AssertionError:
            return jax.sharding.reshard(x, shardings)

    def no_bf16_to_f32_cast(val, tgt_dtype, src_key):
        if hasattr(val, "dtype") and val.dtype == jnp.bfloat16 and tgt_dtype == jnp.float32:
            return val
        return orig_cast(val, tgt_dtype, src_key)

    def clamp(shape, scan_axis):
        if len(shape) <= scan_axis:
            return len(shape) - 1 if shape else 0
        return scan_axis

    def compat_bulk(arr, scan_axis, per_layer, key_path):
        if hasattr(arr, "shape"):
            scan_axis = clamp(arr.shape, scan_axis)
        return orig_bulk(arr, scan_axis, per_layer, key_path)

    def compat_unstack(src_val, tgt_val, key_path, scan_axis=None):
        if scan_axis is not None and hasattr(src_val, "shape"):
            scan_axis = clamp(src_val.shape, scan_axis)
        result = orig_unstack(src_val, tgt_val, key_path, scan_axis=scan_axis)
        if (
            isinstance(result, tuple)
            and len(result) == 1
            and hasattr(src_val, "shape")
            and src_val.shape == tgt_val.shape
        ):
            return result * 256
        return result

    jax.lax.with_sharding_constraint = compat_wsc
    tunix_utils._apply_dtype_cast = no_bf16_to_f32_cast
    tunix_utils._bulk_align_and_unstack = compat_bulk
    tunix_utils._unstack_scanned_param = compat_unstack
    try:
        yield
    finally:
        jax.lax.with_sharding_constraint = orig_wsc
        tunix_utils._apply_dtype_cast = orig_cast
        tunix_utils._bulk_align_and_unstack = orig_bulk
        tunix_utils._unstack_scanned_param = orig_unstack


@contextlib.contextmanager
def train_rl_patches_on(module):
    """MaxText's real train_rl patches, made on `module` (e.g. upstream's
    tunix.generate.utils, support/fixes/unpatched.py) instead of the installed
    one: the context manager patches whatever its module global `tunix_utils`
    names. Needs maxtext installed."""
    train_rl = stock_train_rl()
    if train_rl is None:
        raise RuntimeError("train_rl_patches_on needs maxtext installed (the matrix's MaxText cell).")
    with mock.patch.object(train_rl, "tunix_utils", module), train_rl._tpu_inference_compat_patches():
        yield


@contextlib.contextmanager
def maxtext_shims():
    """Every shim, nested as in a MaxText 0.2.4 rl_train run."""
    with tunix_adapter_shims(), train_rl_patches():
        yield
