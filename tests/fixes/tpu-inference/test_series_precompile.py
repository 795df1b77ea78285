"""tpu-inference: the engine's own precompilation of the sampler under Explicit
mesh axes (patches/tpu-inference/0001-0005).

When the vLLM engine starts, `TPUWorker.initialize_from_config` precompiles the
sampler before it allocates the KV caches (`_precompile_sampling`,
`_precompile_gather_logprobs`, `_flush_compilations` of
`tpu_inference/runner/compilation_manager.py`), and `capture_model` later
precompiles the rejection samplers of speculative decoding
(`_precompile_rejection_sampler`). The mesh is the runner's own
(support/fixes/runner.py), given the `device_indexes` that Tunix's vLLM
rollout always names: Auto axes as the overlay's runner builds it (the
backport of 984b29c49, test_backport_984b29c49_device_indexes_mesh.py);
Explicit as the pin's runner built it with `jax.make_mesh`, whose axes are
Explicit by default in JAX 0.11, the axes of every mesh a caller builds with
that default.

These tests run those very methods of the INSTALLED `CompilationManager` on a
runner-like object holding only the attributes they read, computed as
`TPUModelRunner._init_inputs` computes them (paddings from
`tpu_inference.runner.utils`, the vocab aligned to the tensor-parallel size,
the sampling key as `load_model` places it, a real `RejectionSampler`), so the
dummy inputs and the sampling metadata are built by the compilation manager's
own code. Each compilation is run and warmed up on its own, so that every one
has its outcome:

- upstream (sampling.py, binary_search.py and rejection_sampler.py with the
  series reverse-applied, see support/fixes/unpatched.py, bound where the compilation
  manager and the runner look them up): every compilation fails under Explicit
  axes, with the report's AssertionError / ShardingTypeError, and for the
  rejection samplers shard_map's ValueError;
- upstream under MaxText 0.2.4's run-time shims: still fails (greedy `sample`
  passes, nothing else does);
- the overlay: every compilation passes, under Explicit and Auto axes.

The compiled programs are run on real inputs in each patch's own tests: the
logprobs in test_0001_gather_logprobs.py and test_0002_topk_shard_by_shard.py,
`sample()` in test_0003_sample.py and test_0004_sampling_parameters.py, the
rejection samplers in test_0005_rejection_sampler.py. The real engine start
(vLLM's `LLM`) is in test_series_engine_start.py.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import re
import traceback
import types

import jax
import jax.numpy as jnp
import pytest
from jax._src.core import ShardingTypeError  # not exported publicly; the report's class
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from support.fixes import maxtext_shims
from support.fixes.matrix import AXIS_TYPES
from support.fixes.meshes import WSC_ASSERT, mesh_ids
from support.fixes.runner import SHARD_MAP_SPECS, runner_mesh, takes_the_runners_mesh

CM = "tpu_inference.runner.compilation_manager"
VOCAB = 1000  # aligned up to the tensor-parallel size, as the runner does
MAX_NUM_SEQS = 8
MAX_NUM_BATCHED_TOKENS = 32
NUM_SPECULATIVE_TOKENS = 1
MAX_LOGPROBS = 20

# What makes the sampler fail at the pin, under Explicit axes.
TOP_K_SHARDED = "should be unsharded over the axis along which to compute the top_k values"
SELECT_CASES = "select cases must have the same shardings"
SAME_SHARDING = "All operands should have the same sharding"

axis_ids = pytest.mark.parametrize("axis_type", AXIS_TYPES)


@pytest.fixture(autouse=True)
def _no_persistent_compile_cache(monkeypatch):
    # CompilationManager.__init__ points JAX's persistent compilation cache at
    # vLLM's cache folder unless this is set: keep the suite's state to itself.
    monkeypatch.setenv("VLLM_DISABLE_COMPILE_CACHE", "1")



def runner_like(mesh: jax.sharding.Mesh, rejection_sampler_cls) -> types.SimpleNamespace:
    """What CompilationManager's sampler precompilation reads from the runner,
    computed as TPUModelRunner computes it (_init_inputs, load_model,
    _init_speculative_decoding), for one request padding (8) and speculative
    decoding with one draft token."""
    from flax import nnx
    from tpu_inference import envs
    from tpu_inference import utils as common_utils
    from tpu_inference.runner import utils as runner_utils

    tp = mesh.shape["model"]
    max_num_reqs = max(MAX_NUM_SEQS, runner_utils.MIN_NUM_SEQS)  # dp_size 1
    return types.SimpleNamespace(
        mesh=mesh,
        rank=0,
        vllm_config=types.SimpleNamespace(parallel_config=types.SimpleNamespace(tensor_parallel_size=tp)),
        model_config=types.SimpleNamespace(max_logprobs=MAX_LOGPROBS, dtype=jnp.bfloat16),
        vocab_size=common_utils.align_to(VOCAB, tp),
        num_reqs_paddings=runner_utils.get_req_paddings(min_req_size=runner_utils.MIN_NUM_SEQS, max_req_size=max_num_reqs),
        num_tokens_paddings=runner_utils.get_token_paddings(
            min_token_size=envs.MIN_TOKEN_BUCKET,
            max_token_size=MAX_NUM_BATCHED_TOKENS,
            padding_gap=envs.VLLM_TPU_BUCKET_PADDING_GAP,
        ),
        speculative_config=types.SimpleNamespace(num_speculative_tokens=NUM_SPECULATIVE_TOKENS, method="ngram"),
        num_logits_paddings=runner_utils.get_token_paddings(
            min_token_size=runner_utils.MIN_NUM_SEQS,
            max_token_size=max_num_reqs * (NUM_SPECULATIVE_TOKENS + 1),
            padding_gap=0,
        ),
        rejection_sampler=rejection_sampler_cls(mesh),
        rng_params_for_sampling=common_utils.device_array(
            mesh, nnx.Rngs(jax.random.key(0)).params(), sharding=NamedSharding(mesh, P())
        ),
    )


# --------------------------------------------------------------------------
# The code under test: upstream's modules or the installed overlay's.


@contextlib.contextmanager
def sampler_bound(cmm, code):
    """`code`'s sampler functions bound in the compilation manager's module,
    where its _precompile_* methods look them up; the installed ones after."""
    functions = {
        "sample": code.sampling.sample,
        "compute_and_gather_logprobs": takes_the_runners_mesh(code.sampling.compute_and_gather_logprobs),
        "compute_and_gather_prompt_logprobs": takes_the_runners_mesh(code.sampling.compute_and_gather_prompt_logprobs),
    }
    saved = {name: getattr(cmm, name) for name in functions}
    try:
        for name, fn in functions.items():
            setattr(cmm, name, fn)
        yield
    finally:
        for name, fn in saved.items():
            setattr(cmm, name, fn)


def compilation_label(name: str, kwargs: dict) -> str:
    """A compilation's label: its name without the worker prefix, and the
    shapes it is made for (the keyword arguments that are not the
    compilation manager's own)."""
    shapes = {k: v for k, v in kwargs.items() if k not in ("call_kwargs", "warmup_handler", "aot", "compile_only")}
    return f"{name.split(' ', 1)[1]}({', '.join(f'{k}={v}' for k, v in shapes.items())})"


def precompile(code, mesh) -> dict[str, BaseException | None]:
    """Run the sampler precompilation as the engine does, with `code`'s
    sampler; return each compilation's outcome (None: lowered, compiled and
    warmed up)."""
    cmm = importlib.import_module(CM)
    manager = cmm.CompilationManager(runner_like(mesh, code.rejection.RejectionSampler))
    outcomes: dict[str, BaseException | None] = {}
    run_compilation = manager._run_compilation

    def run_one(name, fn, *args, **kwargs):
        # The compilation manager's own call, then its own flush (the warmup
        # call, where a failure to lower surfaces for compile_only=False), so
        # that one failure does not hide the next compilation.
        label = compilation_label(name, kwargs)
        try:
            run_compilation(name, fn, *args, **kwargs)
            manager._flush_compilations()
            outcomes[label] = None
        except Exception as e:  # noqa: BLE001 - recorded, asserted on below
            manager._warmup_tasks.clear()
            manager._compile_futures.clear()
            outcomes[label] = e

    try:
        with sampler_bound(cmm, code):
            manager._run_compilation = run_one
            # TPUWorker.initialize_from_config, before the KV caches are allocated:
            manager._precompile_sampling()
            manager._precompile_gather_logprobs()
            manager._flush_compilations()
            # capture_model, for speculative decoding (inside jax.set_mesh there):
            with jax.set_mesh(mesh):
                manager._precompile_rejection_sampler()
                manager._flush_compilations()
    finally:
        manager._finalize_compilation()
    return outcomes


# What each compilation the engine makes must give on upstream code under
# Explicit axes: (exception class, message).
def upstream_failure(label: str, shims: bool):
    if label.startswith("sample("):
        sampling = "do_sampling=True" in label
        if shims:  # MaxText's fallback to reshard: greedy works, the top-k search does not
            return (ShardingTypeError, SELECT_CASES) if sampling else None
        # without: the first constraint (sampling) or the last (greedy) asserts
        return AssertionError, WSC_ASSERT
    if label.startswith("gather_logprobs_spec("):
        # logits replicated, token ids batch-sharded: concatenated with the
        # replicated top-k (a one-device batch axis still names "data").
        return ShardingTypeError, SAME_SHARDING
    if label.startswith(("gather_logprobs(", "compute_and_gather_prompt_logprobs(")):
        # MaxText's _compat_top_k reshards an operand whose `.sharding` it can
        # read: a tracer's it cannot, so under jit top_k fails as before.
        return ShardingTypeError, TOP_K_SHARDED
    if "rejection_sampler(" in label:
        return ValueError, SHARD_MAP_SPECS
    raise AssertionError(f"no expectation for {label}")


def table(outcomes) -> str:
    return "\n".join(f"  {label}: {'ok' if e is None else f'{type(e).__name__}: {str(e)[:160]}'}" for label, e in outcomes.items())


EXPECTED_LABELS = {
    "sample(num_reqs=8, do_sampling=True, logprobs=True)",
    "sample(num_reqs=8, do_sampling=True, logprobs=False)",
    "sample(num_reqs=8, do_sampling=False, logprobs=True)",
    "sample(num_reqs=8, do_sampling=False, logprobs=False)",
    "gather_logprobs(num_reqs=8)",
    "gather_logprobs_spec(num_logits=8, num_reqs=8)",
    "gather_logprobs_spec(num_logits=16, num_reqs=8)",
    "compute_and_gather_prompt_logprobs(num_tokens=16)",
    "compute_and_gather_prompt_logprobs(num_tokens=32)",
    "greedy_rejection_sampler(num_logits=8, num_reqs=8, do_sampling=False)",
    "random_rejection_sampler(num_logits=8, num_reqs=8, do_sampling=True)",
    "greedy_rejection_sampler(num_logits=16, num_reqs=8, do_sampling=False)",
    "random_rejection_sampler(num_logits=16, num_reqs=8, do_sampling=True)",
}


@mesh_ids
def test_unpatched_precompile_fails_explicit(upstream, mesh_shape):
    mesh = runner_mesh(mesh_shape, "explicit")
    for shims in (False, True):
        with maxtext_shims.maxtext_shims() if shims else contextlib.nullcontext():
            jax.clear_caches()  # the shims act at trace time
            outcomes = precompile(upstream, mesh)
        jax.clear_caches()
        assert set(outcomes) == EXPECTED_LABELS, table(outcomes)
        for label, error in outcomes.items():
            # In the session-wide shims run MaxText's shims are active either way.
            want = upstream_failure(label, shims or maxtext_shims.GLOBAL)
            what = f"{'with' if shims else 'without'} MaxText's shims, {label}:\n{table(outcomes)}"
            if want is None:
                assert error is None, what
                continue
            cls, message = want
            assert isinstance(error, cls), what
            assert (message.search(str(error)) if isinstance(message, re.Pattern) else message in str(error)), what
        if not (shims or maxtext_shims.GLOBAL):
            # the failures are upstream's, in the sampler, not in the compilation manager
            frames = {f.name for f in _frames(outcomes["sample(num_reqs=8, do_sampling=True, logprobs=True)"])}
            assert "sample" in frames, frames
            frames = {f.name for f in _frames(outcomes["gather_logprobs(num_reqs=8)"])}
            assert "gather_logprobs" in frames, frames
            frames = {f.name for f in _frames(outcomes["random_rejection_sampler(num_logits=8, num_reqs=8, do_sampling=True)"])}
            assert "forward" in frames, frames


@mesh_ids
@axis_ids
def test_precompile_passes(overlay, upstream, mesh_shape, axis_type):
    mesh = runner_mesh(mesh_shape, axis_type)
    outcomes = precompile(overlay, mesh)
    assert set(outcomes) == EXPECTED_LABELS, table(outcomes)
    assert all(e is None for e in outcomes.values()), f"overlay, {axis_type}:\n{table(outcomes)}"
    if axis_type == "auto":
        # the control: upstream's sampler precompiles under Auto axes
        outcomes = precompile(upstream, mesh)
        assert all(e is None for e in outcomes.values()), f"upstream, auto:\n{table(outcomes)}"


def _frames(error: BaseException | None):
    assert error is not None, "the step raised"
    return traceback.extract_tb(error.__traceback__)


def lowered_programs(code, mesh) -> dict[str, str]:
    """Each jitted compilation of the sampler precompilation, lowered as the
    compilation manager lowers it (inside jax.set_mesh of the runner's mesh),
    with `code`'s sampler: its StableHLO text, by label."""
    cmm = importlib.import_module(CM)
    manager = cmm.CompilationManager(runner_like(mesh, code.rejection.RejectionSampler))
    programs: dict[str, str] = {}

    def lower_one(name, fn, *args, call_kwargs=None, **kwargs):
        call_kwargs = dict(call_kwargs or {})
        while isinstance(fn, functools.partial):  # as _run_compilation unwraps it
            args, call_kwargs, fn = fn.args + args, {**fn.keywords, **call_kwargs}, fn.func
        label = compilation_label(name, kwargs)
        if not hasattr(fn, "lower"):  # the rejection sampler, which the warm-up calls: traced as one program
            fn = jax.jit(fn)
        with jax.set_mesh(mesh):
            programs[label] = fn.lower(*args, **call_kwargs).as_text()

    with sampler_bound(cmm, code):
        manager._run_compilation = lower_one
        manager._precompile_sampling()
        manager._precompile_gather_logprobs()
        with jax.set_mesh(mesh):
            manager._precompile_rejection_sampler()
    return programs


@mesh_ids
def test_series_leaves_the_engine_mesh_programs_as_upstreams(overlay, upstream, mesh_shape):
    """On the mesh the engine builds now (the runner's, Auto axes: the backport),
    0001-0005 change nothing the engine compiles: the rejection sampler's
    programs lower to upstream's StableHLO, text for text. The sampling and
    logprobs programs are patch 0006's where the mesh partitions the vocab (it
    does on every mesh here: "model" > 1), and upstream's text where it does
    not (test_0006_vocab_sharded_sampling.py shows both). Where 0001-0005
    still act is under Explicit axes (each patch's own tests)."""
    mesh = runner_mesh(mesh_shape, "auto")
    ours, theirs = lowered_programs(overlay, mesh), lowered_programs(upstream, mesh)
    assert set(ours) == set(theirs) == EXPECTED_LABELS, sorted(ours)
    sharded = {label for label in EXPECTED_LABELS if "rejection_sampler(" not in label}
    assert [label for label in sorted(ours) if ours[label] != theirs[label]] == sorted(sharded)
    assert all("shard_map" in ours[label] or "sdy.manual_computation" in ours[label] for label in sharded), sorted(sharded)
