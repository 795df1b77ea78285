"""support/fixes/step_accounting.py, the account of each GRPO step that the
user-shape train_rl run gives (issue 61), checked on small jitted programs
in seconds, where the run itself costs minutes: a compile lands in the
phase of the thread that made it (rollout and logprobs run in Tunix's
executor thread, the update and the sync in the main one), outside any phase
in the running step's "other", before the first step in "setup", after the
last in "after"; a profiler trace's busy time lands in the phase window the
program ran in, and a window without device work reads zero.

Quick matrix: jax's own compile events and profiler, no MaxText.
"""

from __future__ import annotations

import threading
import time

import pytest

from support.fixes import step_accounting


def _compiled(name: str, x):
    """A new program (each call a new function, so jax compiles it) run on `x`."""
    import jax
    import jax.numpy as jnp

    def program(x):
        return jnp.sin(x) * 2 + 1

    program.__name__ = program.__qualname__ = name
    return jax.jit(program)(x).block_until_ready()


def _counts(entry: dict) -> tuple[int, list[str]]:
    """The compiles' count and their programs' names (jax's: `jit(NAME)`)."""
    return entry["count"], [name for name, _ in entry["programs"]]


def test_each_compile_lands_in_the_phase_of_its_thread():
    import jax.numpy as jnp

    x = jnp.arange(8.0).block_until_ready()  # its own program, before the count
    compiles = step_accounting.Compiles()
    compiles.install()
    try:
        _compiled("before_the_steps", x)
        compiles.step = 0
        with compiles.phase(0, "actor_update"):
            _compiled("in_the_update", x)

        def rollout():
            with compiles.phase(0, "rollout"):
                _compiled("in_the_rollout", x)

        worker = threading.Thread(target=rollout)
        with compiles.phase(0, "weight_sync"):  # the main thread's phase does not reach the worker's compile
            worker.start()
            worker.join()
        _compiled("between_the_phases", x)
        compiles.finished = True
        _compiled("after_the_steps", x)
    finally:
        compiles.uninstall()
    result = compiles.result()
    step = result["steps"][0]
    assert _counts(step["actor_update"]) == (1, ["jit(in_the_update)"]), step
    assert _counts(step["rollout"]) == (1, ["jit(in_the_rollout)"]), step
    assert _counts(step["other"]) == (1, ["jit(between_the_phases)"]), step
    assert "weight_sync" not in step, step
    assert _counts(result["setup"]) == (1, ["jit(before_the_steps)"]), result["setup"]
    assert _counts(result["after"]) == (1, ["jit(after_the_steps)"]), result["after"]


def test_each_garbage_collection_lands_in_the_phase_of_its_thread():
    """Python's full collections (Tunix's sync_weights runs one every step)
    are host time no device trace shows: each is timed and put in the phase
    of the thread that ran it, as a compile is."""
    import gc

    garbage = [[i] for i in range(200_000)]  # enough objects that a full collection takes over a millisecond
    compiles = step_accounting.Compiles()
    compiles.install()
    try:
        compiles.step = 0
        threads = {}

        def rollout():
            threads["worker"] = threading.get_ident()
            with compiles.phase(0, "rollout"):
                gc.collect()

        worker = threading.Thread(target=rollout)
        with compiles.phase(0, "weight_sync"):  # the main thread's phase does not reach the worker's collection
            worker.start()
            worker.join()
        with compiles.phase(0, "actor_update"):
            gc.collect()
    finally:
        compiles.uninstall()
    del garbage
    step = compiles.collections["steps"][0]
    for phase in ("rollout", "actor_update"):
        full = [s for name, s in step[phase]["programs"] if name == "generation 2"]
        assert full and step[phase]["seconds"] >= sum(full) > 0, step
    assert not [p for p in step.get("weight_sync", {}).get("programs", []) if p[0] == "generation 2"], step
    # Also summed by thread, whatever the phase (the run reads it around a call within one).
    assert compiles.collected[threads["worker"]] == pytest.approx(step["rollout"]["seconds"], abs=2e-3), compiles.collected
    assert compiles.collected[threading.get_ident()] >= step["actor_update"]["seconds"] - 1e-3, compiles.collected
    assert compiles._collection not in gc.callbacks


def test_a_full_collection_says_what_device_memory_it_freed():
    """What Tunix's per-sync gc.collect() is for: arrays only a reference
    cycle holds, which only a full collection frees. Each full collection
    measures the devices' bytes in use before and after it, by phase."""
    import gc

    import jax
    import jax.numpy as jnp

    compiles = step_accounting.Compiles()
    compiles.install()
    gc.collect()  # nothing of earlier tests' garbage left for the collections below
    try:
        compiles.step = 0
        with compiles.phase(0, "weight_sync"):
            cycle: list = [jnp.ones((1 << 18,), jnp.float32)]  # 1 MiB
            cycle.append(cycle)
            jax.block_until_ready(cycle[0])
            del cycle
            gc.collect()
        with compiles.phase(0, "actor_update"):
            gc.collect()  # nothing left to free
    finally:
        compiles.uninstall()
    step = compiles.collections["steps"][0]
    assert step["weight_sync"]["freed_bytes"] >= 1 << 20, step
    assert abs(step["actor_update"]["freed_bytes"]) < 1 << 20, step


def test_the_traces_busy_time_lands_in_the_window_the_program_ran_in():
    import jax
    import jax.numpy as jnp

    @jax.jit
    def work(x):
        return jax.lax.fori_loop(0, 40, lambda _, a: jnp.tanh(a @ x), x)

    x = jnp.ones((512, 512), jnp.float32) / 512
    work(x).block_until_ready()  # compiled before the trace
    trace = step_accounting.Trace(1, 1)
    trace.start()
    assert trace.running, trace.error
    with trace.annotate(1, "actor_update"):
        work(x).block_until_ready()
    with trace.annotate(1, "weight_sync"):
        time.sleep(0.2)  # the host's time, no program
    trace.stop()
    read = trace.read()
    assert "error" not in read, read
    phases = read["steps"]["1"]
    [(device, update_busy)] = phases["actor_update"]["device_s"].items()
    assert 0 < update_busy <= phases["actor_update"]["wall_s"] + 1e-3, (device, phases)
    assert phases["weight_sync"]["device_s"][device] == 0.0, phases
    assert phases["weight_sync"]["wall_s"] >= 0.2, phases
    if jax.default_backend() == "cpu":
        assert "no device plane" in read["source"], read["source"]


def test_union_seconds_counts_overlaps_once_and_clips_to_the_window():
    s = 1e9  # intervals are nanoseconds
    intervals = [(0, 2 * s), (1 * s, 3 * s), (5 * s, 6 * s), (10 * s, 11 * s)]
    assert step_accounting.union_seconds(intervals, float("-inf"), float("inf")) == 5.0
    assert step_accounting.union_seconds(intervals, 2.5 * s, 5.5 * s) == 1.0
    assert step_accounting.union_seconds(intervals, 7 * s, 9 * s) == 0.0
