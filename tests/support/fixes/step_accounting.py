"""What each GRPO step of the train_rl run is made of (issue 61): the XLA
programs compiled in each phase, the devices' memory, and the devices' busy
time in each phase of the steps a profiler trace covers; plus the chip's
bf16 matmul rate measured in the same run and the actor update's model
FLOPs, for the achieved-rate ratio.

Used by support/programs/train_rl_run.py (its RESULT.json's "compiles",
"memory", "device_time", "matmul_rate", "model_flops"). Imports jax only
inside its functions (the test process imports this module for nothing).

What each measure is, and where it cannot be had:

- compiles: jax.monitoring's '/jax/core/compile/backend_compile_duration'
  events (as maxtext_rl_overlay/smoke/engine.py records the engine's), each
  put in the phase its thread was in (rollout and logprobs run in Tunix's
  executor thread, the actor update and the sync in the main one), with the
  program's name; outside every phase: "other".
- garbage collections: Python's own (gc.callbacks), timed from start to
  stop and put in a phase the same way: host time that no device trace
  shows (Tunix's sync_weights runs a full gc.collect() every step). One in a
  thread in no phase (the engine's own threads) is the step's "other" though
  it overlaps the phases' wall: it holds the interpreter's lock meanwhile.
  Each full collection (generation 2) also measures what it freed: the
  devices' bytes in use (as memory below) before it and after it, summed by
  phase as "freed_bytes": whether the sync's gc.collect() still frees device
  memory once the sync frees its old buffers itself.
- memory: each device's `memory_stats()` (bytes_in_use, peak_bytes_in_use,
  bytes_limit) where the backend gives them (a TPU); where it gives none (the
  CPU) the bytes of jax's live arrays, summed (no peak, no limit: said).
- device time: a jax.profiler trace of the steps asked for, read back with
  jax.profiler.ProfileData (jax 0.10.2 and 0.11.0 both have it). Each phase
  call is a TraceAnnotation `mrl-phase:PHASE:STEP`; a device's busy time in
  a phase is the union of its program executions that lie in the phase's
  window (a program dispatched in one phase and run in the next counts in
  the next). On a TPU the executions are the device plane's "XLA Modules"
  line ("XLA Ops" where that line is missing); the CPU backend has no device
  plane: there the ops XLA's CPU client ran on the host's threads (events
  with an `hlo_module` stat) stand in, and the result says so.
"""

from __future__ import annotations

import contextlib
import gc
import glob
import os
import tempfile
import threading
import time
from typing import Any

# At import, not in memory(): a full collection's callback reads the memory (no import inside a collection).
from support.fixes.train_rl_stand_ins import live_bytes

COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
ANNOTATION = "mrl-phase"


class Compiles:
    """The programs compiled, by GRPO step and phase: `current` maps a thread
    to the (step, phase) it is in; a compile in a thread in none is the
    running step's "other", before the first step "setup", after the last
    "after" (the run sets `step`, 0-based, and `finished`). Python's garbage
    collections are kept the same way, by the same phases, in `collections`."""

    def __init__(self) -> None:
        self.by_step: list[dict[str, dict[str, Any]]] = []
        self.setup: dict[str, Any] = _entry()
        self.after: dict[str, Any] = _entry()
        self.collections: dict[str, Any] = {"setup": _entry(), "steps": [], "after": _entry()}
        self.current: dict[int, tuple[int, str]] = {}
        self.step = -1  # the GRPO step now running (0-based); -1 before the first
        self.finished = False
        self._collecting: dict[int, float] = {}  # thread -> when its collection began
        self._in_use: dict[int, int] = {}  # thread -> the devices' bytes in use as its full collection began
        self.collected: dict[int, float] = {}  # thread -> the seconds its collections took so far
        # Reentrant: a collection can start inside _add, in the thread holding the lock.
        self._lock = threading.RLock()

    def install(self) -> None:
        import jax

        jax.monitoring.register_event_duration_secs_listener(self._event)
        gc.callbacks.append(self._collection)

    def uninstall(self) -> None:
        import jax

        jax.monitoring.unregister_event_duration_listener(self._event)
        if self._collection in gc.callbacks:
            gc.callbacks.remove(self._collection)

    def _event(self, event: str, seconds: float, **kwargs: Any) -> None:
        if event == COMPILE_EVENT:
            self._add(self.setup, self.by_step, self.after, str(kwargs.get("fun_name")), seconds)

    def _collection(self, stage: str, info: dict[str, Any]) -> None:
        ident = threading.get_ident()
        full = info.get("generation") == 2
        if stage == "start":
            if full:  # measured before the clock starts: the collection's seconds are its own
                self._in_use[ident] = in_use_bytes()
            self._collecting[ident] = time.perf_counter()
            return
        began = self._collecting.pop(ident, None)
        if began is not None:
            seconds = time.perf_counter() - began
            self.collected[ident] = self.collected.get(ident, 0.0) + seconds
            before = self._in_use.pop(ident, None)
            freed = before - in_use_bytes() if full and before is not None else None
            c = self.collections
            # Only the collections worth naming (a young generation's take microseconds, thousands a step).
            self._add(c["setup"], c["steps"], c["after"], f"generation {info.get('generation')}", seconds,
                      named=seconds >= 0.001, freed=freed)

    def _add(self, setup: dict, by_step: list, after: dict, name: str, seconds: float, named: bool = True,
             freed: int | None = None) -> None:
        where = self.current.get(threading.get_ident())
        with self._lock:
            if where is None and self.step < 0:
                entry = setup
            elif where is None and self.finished:
                entry = after
            else:
                step, phase = where if where is not None else (self.step, "other")
                while len(by_step) <= step:
                    by_step.append({})
                entry = by_step[step].setdefault(phase, _entry())
            entry["count"] += 1
            entry["seconds"] = round(entry["seconds"] + seconds, 3)
            if freed is not None:
                entry["freed_bytes"] = entry.get("freed_bytes", 0) + freed
            if named and len(entry["programs"]) < 40:
                entry["programs"].append([name, round(seconds, 3)])

    @contextlib.contextmanager
    def phase(self, step: int, phase: str):
        ident = threading.get_ident()
        before = self.current.get(ident)
        self.current[ident] = (step, phase)
        try:
            yield
        finally:
            if before is None:
                self.current.pop(ident, None)
            else:
                self.current[ident] = before

    def result(self) -> dict[str, Any]:
        return {"setup": self.setup, "steps": self.by_step, "after": self.after}


def _entry() -> dict[str, Any]:
    return {"count": 0, "seconds": 0.0, "programs": []}


def memory() -> dict[str, Any]:
    """Every device's memory, as its backend reports it (or jax's live arrays)."""
    import jax

    devices = jax.local_devices()
    stats = [d.memory_stats() for d in devices]
    if all(stats):
        keys = ("bytes_in_use", "peak_bytes_in_use", "bytes_limit", "largest_alloc_size")
        return {"source": "device.memory_stats()",
                "devices": [{k: s.get(k) for k in keys if k in s} for s in stats]}
    return {"source": f"jax.live_arrays() (the {devices[0].platform} backend reports no memory statistics: no peak, no limit)",
            "devices": [{"bytes_in_use": used} for used in live_bytes(devices)]}


def in_use_bytes() -> int:
    """The bytes in use on all local devices, as memory() reads them."""
    return sum(d.get("bytes_in_use") or 0 for d in memory()["devices"])


def gib(n: float | None) -> str:
    return "-" if n is None else f"{n / 2**30:.2f} GiB"


class Trace:
    """A jax.profiler trace of the GRPO steps from `first` to `last` (1-based,
    inclusive), started as the first's first phase starts and stopped as the
    last's weight sync ends; each phase call annotated."""

    def __init__(self, first: int, last: int) -> None:
        self.first, self.last = first, last
        self.folder = tempfile.mkdtemp(prefix="mrl-trace-")
        self.running = False
        self.error: str | None = None

    def wanted(self, step: int) -> bool:
        return self.first <= step <= self.last

    def start(self) -> None:
        import jax

        if self.running or self.error:
            return
        options = jax.profiler.ProfileOptions()
        options.python_tracer_level = 0  # no Python frames: the trace stays small
        options.host_tracer_level = 1  # the annotations and the runtime's own
        try:
            jax.profiler.start_trace(self.folder, profiler_options=options)
            self.running = True
        except Exception as error:  # noqa: BLE001 - recorded: the run goes on untraced
            self.error = f"start_trace: {type(error).__name__}: {error}"

    def stop(self) -> None:
        import jax

        if not self.running:
            return
        self.running = False
        try:
            jax.profiler.stop_trace()
        except Exception as error:  # noqa: BLE001
            self.error = f"stop_trace: {type(error).__name__}: {error}"

    @contextlib.contextmanager
    def annotate(self, step: int, phase: str):
        if not self.running:
            yield
            return
        import jax

        with jax.profiler.TraceAnnotation(f"{ANNOTATION}:{phase}:{step}"):
            yield

    def read(self) -> dict[str, Any]:
        """Each traced step's phases: their windows' wall seconds and each
        device's busy seconds in them (see the module's docstring)."""
        if self.error:
            return {"error": self.error}
        files = glob.glob(os.path.join(self.folder, "**", "*.xplane.pb"), recursive=True)
        if not files:
            return {"error": f"no .xplane.pb written under the trace folder ({self.folder})"}
        began = time.monotonic()
        from jax.profiler import ProfileData

        data = ProfileData.from_file(max(files, key=os.path.getmtime))
        windows: list[tuple[str, int, float, float]] = []  # (phase, step, start, end), ns
        devices: dict[str, list[tuple[float, float]]] = {}
        planes_seen = []
        cpu_ops: list[tuple[float, float]] = []
        for plane in data.planes:
            lines = list(plane.lines)
            planes_seen.append([plane.name, [line.name for line in lines][:12]])
            if plane.name.startswith("/device:") and "CUSTOM" not in plane.name:
                chosen = next((line for line in lines if line.name == "XLA Modules"), None) or next(
                    (line for line in lines if line.name == "XLA Ops"), None)
                if chosen is not None:
                    devices[f"{plane.name} ({chosen.name})"] = [(e.start_ns, e.start_ns + e.duration_ns) for e in chosen.events]
                continue
            if plane.name.startswith("/host:"):
                for line in lines:
                    for event in line.events:
                        name = event.name
                        if name.startswith(ANNOTATION + ":"):
                            _, phase, step = name.split(":")
                            windows.append((phase, int(step), event.start_ns, event.start_ns + event.duration_ns))
                        elif line.name.startswith("tf_XLA") and any(k == "hlo_module" for k, _ in event.stats):
                            cpu_ops.append((event.start_ns, event.start_ns + event.duration_ns))
        source = "device planes"
        if not devices and cpu_ops:
            devices = {"host CPU threads (XLA's CPU client ops; no device plane)": cpu_ops}
            source = ("the CPU backend has no device plane: the ops XLA's CPU client ran on the host's threads stand in "
                      "for device time (they overlap the host's own work: not a chip's measure)")
        steps: dict[int, dict[str, Any]] = {}
        for phase, step, start, end in sorted(windows, key=lambda w: w[2]):
            entry = steps.setdefault(step, {}).setdefault(phase, {"wall_s": 0.0, "device_s": {}})
            entry["wall_s"] = round(entry["wall_s"] + (end - start) / 1e9, 4)
            for name, intervals in devices.items():
                busy = union_seconds(intervals, start, end)
                entry["device_s"][name] = round(entry["device_s"].get(name, 0.0) + busy, 4)
        total = {name: round(union_seconds(iv, float("-inf"), float("inf")), 4) for name, iv in devices.items()}
        return {"source": source, "steps": {str(k): v for k, v in sorted(steps.items())}, "device_busy_s_in_trace": total,
                "planes": planes_seen, "read_s": round(time.monotonic() - began, 1),
                "trace_bytes": sum(os.path.getsize(f) for f in files)}


def union_seconds(intervals: list[tuple[float, float]], start: float, end: float) -> float:
    """Seconds covered by the union of `intervals` (ns) clipped to [start, end]."""
    clipped = sorted((max(a, start), min(b, end)) for a, b in intervals if b > start and a < end)
    total = 0.0
    current: tuple[float, float] | None = None
    for a, b in clipped:
        if current is None or a > current[1]:
            if current is not None:
                total += current[1] - current[0]
            current = (a, b)
        else:
            current = (current[0], max(current[1], b))
    if current is not None:
        total += current[1] - current[0]
    return total / 1e9


def matmul_rate(n: int, iterations: int = 10, repeats: int = 3) -> dict[str, Any]:
    """The devices' bf16 matmul rate, measured here: one jitted program of
    `iterations` chained [n, n] @ [n, n] bfloat16 matmuls (float32
    accumulation, as XLA does on a TPU) on the first device, timed with
    block_until_ready after a warm-up; the best of `repeats`."""
    import jax
    import jax.numpy as jnp

    device = jax.devices()[0]
    a = jax.device_put(jnp.ones((n, n), jnp.bfloat16) * 0.001, device)
    b = jax.device_put(jnp.eye(n, dtype=jnp.bfloat16), device)

    @jax.jit
    def chain(x, y):
        def body(_, acc):
            return jnp.dot(acc, y, preferred_element_type=jnp.float32).astype(jnp.bfloat16)

        return jax.lax.fori_loop(0, iterations, body, x)

    chain(a, b).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        chain(a, b).block_until_ready()
        best = min(best, time.perf_counter() - began)
    flops = 2.0 * n**3 * iterations
    return {"n": n, "iterations": iterations, "seconds": best, "flops": flops, "flop_per_s": flops / best,
            "device_kind": device.device_kind}


def model_flops(config: Any, tokens: int) -> dict[str, Any]:
    """The actor update's model FLOPs for `tokens` tokens of training (forward
    and backward: 6 per weight a token, the attention's score and value
    matmuls over the sequence, the logits' matmul), from a MaxText config;
    the forward that full rematerialisation repeats is not counted (the usual
    model-FLOPs convention), nor the loss's elementwise work."""
    d, layers = config.emb_dim, config.num_decoder_layers
    q, kv, hd, mlp, vocab = config.num_query_heads, config.num_kv_heads, config.head_dim, config.mlp_dim, config.vocab_size
    seq = config.max_target_length
    per_layer = d * q * hd + 2 * d * kv * hd + q * hd * d + 3 * d * mlp  # q, k, v, o, the gated MLP
    matmul_weights = layers * per_layer + d * vocab  # the logits' matmul (tied or not)
    dense = 6.0 * matmul_weights * tokens
    attention = 6.0 * 2 * layers * q * hd * seq * tokens  # QK^T and AV, forward 2x2, backward twice that
    return {"tokens": tokens, "matmul_weights": matmul_weights, "flops": dense + attention,
            "remat": getattr(config, "remat_policy", None)}
