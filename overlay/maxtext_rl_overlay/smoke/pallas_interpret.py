"""A CPU stand-in for tpu-inference's TPU Pallas kernels: Pallas TPU interpret mode.

On the CPU simulation of a v6e-8 the model backbone's attention is still the
TPU Pallas kernel `ragged_paged_attention` (v3), which cannot be compiled for
CPU. JAX's Pallas TPU interpret mode runs a TPU kernel on the host, simulating
its memories (HBM, VMEM, SMEM), DMAs and semaphores, so the real kernel code
runs, only interpreted. With jax 0.11 and tpu-inference at the pin, four
obstacles stand between interpret mode and the engine's model step; each has
one small intervention below, named after what it does:

1. `tpu_info_answers_v6e`: `pltpu.get_tpu_info()` raises "Unsupported TPU
   device kind: cpu" and the kernel's `get_tpu_version()` answers -1 on CPU.
   The CPU device kind is registered in jax's own TPU-info registry with the
   v6e's info, and the kernels' `get_tpu_version` answers 6.
2. `step_compiler_options_dropped`: the model step is jitted with TPU-only XLA
   options (`get_step_fn_compiler_options`), which XLA:CPU rejects ("No such
   compile option: 'xla_tpu_all_gather_collective_matmul_mode'"); on CPU the
   step gets none.
3. `interpret_callbacks_on_host_operands`: interpret mode runs every memory
   access of the kernel as an `io_callback`, whose implementation first
   `device_put`s its operands on CPU device 0. Under the 8-device mesh every
   device thread runs the kernel at once, and device 0 is busy running its own
   part of the step, so all 8 threads wait for each other for ever. The
   callbacks of interpret mode are given their operands as host arrays
   instead (on the CPU they are host memory already): no transfer, no wait.
4. `ref_views_in_get_swap_store`: jax 0.11's interpret mode reads and writes
   refs through indexing transforms only (`interpret_utils.to_range`), while
   the kernel loads, stores and DMAs through `ref.bitcast(...)` and
   `ref.reshape(...)` ("'BitcastTransform' object has no attribute
   'indices'"). Its `get`, `swap` and `store` read the buffer region that the
   leading indexers name, and apply the remaining transforms on the host as
   the TPU defines them (`jax._src.state.utils.bitcast`: a bitcast to a wider
   type packs the second-minor dimension).

One more intervention keeps the engine's inputs what a TPU would see:

5. `engine_inputs_copied_to_the_devices`: on the CPU, `jax.device_put` of
   a numpy array the size of the runner's step inputs shares its memory
   instead of copying it (jax issue #37830; on a TPU the array is copied
   into HBM). The runner packs each step's inputs (token ids, positions,
   block tables) into one host buffer it reuses (`DeviceBuffer`), and with
   async scheduling it packs step N+1 while step N is still queued: step N
   then reads step N+1's inputs. That happened only when the machine was
   loaded, and made `smoke` fail at random (a sampled row outside top-k at
   the step a new KV page was taken; the first decode after a sync apart).
   The runner's `device_array` is given copies of its numpy inputs instead,
   which nothing else holds.

`activate()` does all five and sets Pallas' TPU interpret mode, only where
jax runs on the CPU; on a TPU it does nothing and the kernels run compiled.
It is part of the tool for `smoke --cpu-simulation` (and the test suite's
CPU simulation), never active otherwise. Wherever it is active it says so:
`LABEL` goes into smoke's output, the test ids (`[pallas-interpret]`), a JUnit
property of the tests (the matrix's table shows it) and the engine's result
JSON. Results obtained with it prove what the kernel code computes, not how
fast a TPU computes it: CPU timings say nothing of TPU timings.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

#: Where the stand-in is active, test ids and reports carry this label.
LABEL = "pallas-interpret"
#: What the label means, for reports (JUnit property, result JSON).
DESCRIPTION = "TPU Pallas kernels run in Pallas TPU interpret mode on the CPU (a CPU stand-in for the TPU kernels)"
#: The TPU whose answers the CPU gives (the matrix simulates a v6e-8).
TPU_VERSION = 6

_active: list[str] = []


def active() -> bool:
    return bool(_active)


def activate() -> list[str]:
    """Where jax runs on the CPU, make the TPU Pallas kernels run interpreted
    (the five interventions, then interpret mode); returns the interventions
    made. Idempotent; a no-op on a TPU. Call before the engine or a kernel is
    traced."""
    import jax

    if _active or jax.default_backend() != "cpu":
        return list(_active)
    from jax.experimental.pallas import tpu as pltpu

    for intervention in (
        tpu_info_answers_v6e,
        step_compiler_options_dropped,
        interpret_callbacks_on_host_operands,
        ref_views_in_get_swap_store,
        engine_inputs_copied_to_the_devices,
    ):
        intervention()
        _active.append(intervention.__name__)
    pltpu.set_tpu_interpret_mode(pltpu.InterpretParams())
    return list(_active)


# 1 -------------------------------------------------------------------------

#: The tpu-inference modules that import the kernels' `get_tpu_version` by name.
_TPU_VERSION_USERS = (
    "tpu_inference.kernels.ragged_paged_attention.v3.util",
    "tpu_inference.kernels.ragged_paged_attention.v3.kernel",
    "tpu_inference.kernels.ragged_paged_attention.v3.tuned_block_sizes",
    "tpu_inference.kernels.ragged_paged_attention.v3.tuned_block_sizes_hd64",
    "tpu_inference.kernels.ragged_paged_attention.v3.kernel_hd64",
)


def tpu_info_answers_v6e() -> None:
    import importlib

    import jax
    from jax._src.pallas.mosaic import tpu_info

    kind = jax.devices()[0].device_kind  # "cpu"
    # jax's own hook for device kinds it does not know (get_tpu_info consults it).
    tpu_info.registry[kind] = functools.partial(tpu_info.get_tpu_info_for_chip, tpu_info.ChipVersion.TPU_V6E, 1)
    util = importlib.import_module(_TPU_VERSION_USERS[0])
    original = getattr(util, "get_tpu_version")  # noqa: B009 - tpu_inference's modules are read as Any
    for name in _TPU_VERSION_USERS:
        module = importlib.import_module(name)
        if getattr(module, "get_tpu_version", None) is original:
            setattr(module, "get_tpu_version", lambda: TPU_VERSION)  # noqa: B010 - its modules are read as Any


# 2 -------------------------------------------------------------------------

#: The modules that import `get_step_fn_compiler_options` by name and jit the step with it.
_STEP_JITTERS = (
    "tpu_inference.models.common.compiler_options",
    "tpu_inference.models.common.model_loader",
    "tpu_inference.models.vllm.vllm_model_wrapper",
)


def step_compiler_options_dropped() -> None:
    import importlib

    for name in _STEP_JITTERS:
        module = importlib.import_module(name)
        if hasattr(module, "get_step_fn_compiler_options"):
            # No options: XLA:CPU knows none of the TPU ones.
            setattr(module, "get_step_fn_compiler_options", dict)  # noqa: B010 - its modules are read as Any


# 3 -------------------------------------------------------------------------

_INTERPRET_MODULES = ("jax._src.pallas.mosaic.interpret.", __name__)


def _is_interpret_callback(callback: Any) -> bool:
    func = getattr(callback, "callback_func", None)
    while isinstance(func, functools.partial):
        func = func.func
    return getattr(func, "__module__", "").startswith(_INTERPRET_MODULES)


def interpret_callbacks_on_host_operands() -> None:
    import numpy as np
    from jax._src import callback as jax_callback
    from jax._src import tree_util

    original = jax_callback.io_callback_impl

    def io_callback_impl(*args: Any, result_avals: Any, callback: Any, sharding: Any, ordered: Any) -> Any:
        if not _is_interpret_callback(callback):
            return original(*args, result_avals=result_avals, callback=callback, sharding=sharding, ordered=ordered)
        # What the original does, less its device_put onto CPU device 0.
        return tree_util.tree_map(np.asarray, callback(*(np.asarray(a) for a in args)))

    # io_callback_lowering looks the implementation up by this name at run time.
    jax_callback.io_callback_impl = io_callback_impl


# 4 -------------------------------------------------------------------------


def _np_bitcast(x: Any, dtype: Any) -> Any:
    """`jax._src.state.utils.bitcast` (a ref bitcast as a TPU lays it out) in numpy."""
    import numpy as np

    dtype = np.dtype(dtype)
    x = np.ascontiguousarray(x)
    ratio_up, ratio_down = dtype.itemsize // x.dtype.itemsize, x.dtype.itemsize // dtype.itemsize
    if ratio_up > 1:  # narrower to wider: pack `ratio` rows of the second-minor dimension
        y = x.reshape(*x.shape[:-2], x.shape[-2] // ratio_up, ratio_up, x.shape[-1]).swapaxes(-1, -2)
        return np.ascontiguousarray(y).view(dtype)[..., 0]
    if ratio_down > 1:  # wider to narrower: unpack into the second-minor dimension
        y = x.view(dtype).reshape(*x.shape, ratio_down).swapaxes(-1, -2)
        return np.ascontiguousarray(y).reshape(*x.shape[:-2], x.shape[-2] * ratio_down, x.shape[-1])
    return x.view(dtype)


def _split(transforms: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The leading indexers (which interpret mode handles) and the rest."""
    from jax._src.state.indexing import NDIndexer

    transforms = tuple(transforms)
    n = 0
    while n < len(transforms) and isinstance(transforms[n], NDIndexer):
        n += 1
    return transforms[:n], transforms[n:]


def _steps(transforms: Any) -> list[tuple[str, Any]]:
    from jax._src.pallas.mosaic.interpret import utils as interpret_utils
    from jax._src.state.indexing import NDIndexer, Slice
    from jax._src.state.types import BitcastTransform, ReshapeTransform

    steps: list[tuple[str, Any]] = []
    for t in transforms:
        if isinstance(t, NDIndexer):
            index = (i if isinstance(i, Slice) else int(i) for i in t.indices)
            steps.append(("index", tuple(interpret_utils._transform_slice_or_index(i) for i in index)))
        elif isinstance(t, BitcastTransform):
            steps.append(("bitcast", t.dtype))
        elif isinstance(t, ReshapeTransform):
            steps.append(("reshape", tuple(t.shape)))
        else:
            raise NotImplementedError(f"pallas_interpret: ref transform {type(t).__name__} is not handled on the CPU")
    return steps


def _views(base: Any, steps: list[tuple[str, Any]]) -> list[Any]:
    """base, then the value after each step (copies where numpy cannot view)."""
    values = [base]
    for kind, arg in steps:
        x = values[-1]
        values.append(x[arg] if kind == "index" else _np_bitcast(x, arg) if kind == "bitcast" else x.reshape(arg))
    return values


def _write_back(values: list[Any], steps: list[tuple[str, Any]], val: Any) -> Any:
    """The base array with the last value of the chain replaced by `val`."""
    import numpy as np

    cur = np.broadcast_to(np.asarray(val, dtype=values[-1].dtype), values[-1].shape)
    for (kind, arg), prev in zip(reversed(steps), reversed(values[:-1]), strict=True):
        if kind == "index":
            prev = prev.copy()
            prev[arg] = cur
            cur = prev
        elif kind == "bitcast":
            cur = _np_bitcast(cur, prev.dtype)
        else:
            cur = np.ascontiguousarray(cur).reshape(prev.shape)
        assert cur.shape == prev.shape and cur.dtype == prev.dtype, (cur.shape, prev.shape)
    return cur


Op = Callable[..., Any]


def _through_views(get: Op, store: Op, swap: Op) -> tuple[Op, Op, Op]:
    """get, store and swap that take any chain of ref transforms, made from
    interpret mode's own, which take leading indexers only."""
    import numpy as np

    def get_through_views(token: Any, device_id: Any, local_core_id: Any, memory_space: Any, buffer_id: Any, transforms: Any,
                          *args: Any, **kwargs: Any) -> Any:
        lead, rest = _split(transforms)
        if not rest:
            return get(token, device_id, local_core_id, memory_space, buffer_id, transforms, *args, **kwargs)
        token, base = get(token, device_id, local_core_id, memory_space, buffer_id, lead, *args, **kwargs)
        return token, np.ascontiguousarray(_views(base, _steps(rest))[-1])

    def store_through_views(token: Any, device_id: Any, local_core_id: Any, memory_space: Any, buffer_id: Any, transforms: Any,
                            val: Any, *args: Any, **kwargs: Any) -> Any:
        lead, rest = _split(transforms)
        if not rest:
            return store(token, device_id, local_core_id, memory_space, buffer_id, transforms, val, *args, **kwargs)
        steps = _steps(rest)
        token, base = get(token, device_id, local_core_id, memory_space, buffer_id, lead, source_info=kwargs.get("source_info"))
        return store(token, device_id, local_core_id, memory_space, buffer_id, lead, _write_back(_views(base, steps), steps, val), *args, **kwargs)

    def swap_through_views(token: Any, device_id: Any, local_core_id: Any, memory_space: Any, buffer_id: Any, transforms: Any,
                           val: Any, mask: Any, **kwargs: Any) -> Any:
        lead, rest = _split(transforms)
        if not rest:
            return swap(token, device_id, local_core_id, memory_space, buffer_id, transforms, val, mask, **kwargs)
        if mask is not None:
            raise NotImplementedError("pallas_interpret: a masked swap through a bitcast or reshape is not handled")
        steps = _steps(rest)
        token, base = get(token, device_id, local_core_id, memory_space, buffer_id, lead, **kwargs)
        values = _views(base, steps)
        old = np.ascontiguousarray(values[-1])
        token = store(token, device_id, local_core_id, memory_space, buffer_id, lead, _write_back(values, steps, val), **kwargs)
        return token, old

    return get_through_views, store_through_views, swap_through_views


def ref_views_in_get_swap_store() -> None:
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    # _interpret_jaxpr calls these by their module names (in io_callbacks);
    # a DMA calls the undecorated ones, `get.__wrapped__` and `store.__wrapped__`.
    outer = _through_views(ipc.get, ipc.store, ipc.swap)
    inner = _through_views(ipc.get.__wrapped__, ipc.store.__wrapped__, ipc.swap.__wrapped__)
    for name, wrapper, undecorated in zip(("get", "store", "swap"), outer, inner, strict=True):
        wrapper.__wrapped__ = undecorated  # type: ignore[attr-defined]
        setattr(ipc, name, wrapper)


# 5 -------------------------------------------------------------------------

#: The tpu-inference function every runner input goes through (its module's
#: `device_array` calls it by this name).
_DEVICE_PUT_MODULE = "tpu_inference.utils"


def engine_inputs_copied_to_the_devices() -> None:
    import importlib

    import jax
    import numpy as np

    utils = importlib.import_module(_DEVICE_PUT_MODULE)
    original = getattr(utils, "general_device_put")  # noqa: B009 - tpu_inference's modules are read as Any

    def general_device_put(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        # A copy nothing else holds: the runner may rewrite its buffer at once.
        owned = jax.tree_util.tree_map(lambda t: np.array(t, copy=True) if isinstance(t, np.ndarray) else t, tensor)
        return original(owned, *args, **kwargs)

    setattr(utils, "general_device_put", general_device_put)  # noqa: B010 - tpu_inference's modules are read as Any
