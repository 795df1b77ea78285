"""tpu-inference: what `DPScheduler.finish_requests` returns
(patches/tpu-inference/backport-e27319786-*, upstream's e27319786, #3362).

vLLM's pause (mode "abort") and its shutdown abort path do
`aborted = scheduler.finish_requests(None, FINISHED_ABORTED)` and then
`EngineCoreProc._send_abort_outputs(aborted)`, which tells each client its
requests ended. Under data parallelism the scheduler is tpu-inference's
`DPScheduler`:

- at the pin it returns None (its rank workers answer None too): nothing is
  sent, and the clients of the aborted requests wait for ever;
- with the backport it returns each finished request's id and client index,
  from its pending queue and from every rank's scheduler.

The DPScheduler is the real class on a bare instance, talking over real pipes
to the real rank worker loop (`_scheduler_worker_process`, in a thread here,
not a process); each rank's scheduler is a stand-in that finishes what it
holds and returns the finished requests, as vLLM's SchedulerInterface says
(`list[Request]`). The abort outputs are vLLM's own
`EngineCoreProc._send_abort_outputs`, on a bare instance recording what it
would send.
"""

from __future__ import annotations

import atexit
import importlib
import multiprocessing
import threading
import types

import pytest
from vllm.v1.engine.core import EngineCoreProc
from vllm.v1.request import RequestStatus

from support.fixes.unpatched import load_unpatched

MODULE = "tpu_inference.core.sched.dp_scheduler"
#: Two ranks; what each rank's scheduler holds (request id -> client index),
#: and one request still in the DPScheduler's pending queue.
RANKS = {0: {"a0": 0, "a1": 1}, 1: {"b0": 0}}
PENDING = ("p0", 1)
#: Every pipe end, kept open for the session: a worker whose pipe closes
#: loops on EOFError, so each stays blocked on its open pipe instead.
_PIPES: list = []


class _RankScheduler:
    """Stands in for vLLM's Scheduler in a rank worker: holds requests, and
    finish_requests returns those it finished (vLLM's list[Request])."""

    held: dict = {}

    def __init__(self, **kwargs):
        self.requests = dict(self.held)

    def finish_requests(self, request_ids, finished_status):
        ids = list(self.requests) if request_ids is None else list(request_ids)
        return [types.SimpleNamespace(request_id=i, client_index=self.requests.pop(i)) for i in ids if i in self.requests]


def _dp_scheduler(module, monkeypatch):
    sched = module.DPScheduler.__new__(module.DPScheduler)
    sched.dp_size = len(RANKS)
    sched._schedule_step_count = 0
    sched.input_conns, sched.output_conns = [], []
    sched.assigned_dp_rank = {rid: rank for rank, held in RANKS.items() for rid in held}
    sched._pending_new_requests = [types.SimpleNamespace(request_id=PENDING[0], client_index=PENDING[1])]
    monkeypatch.setattr(atexit, "_clear", lambda: None)  # the worker clears atexit: its process's, not ours
    for rank, held in RANKS.items():
        to_worker, from_sched = multiprocessing.Pipe(duplex=False)
        to_sched, from_worker = multiprocessing.Pipe(duplex=False)
        rank_cls = type(f"Rank{rank}Scheduler", (_RankScheduler,), {"held": held})
        threading.Thread(
            target=module._scheduler_worker_process,
            args=(rank, to_worker, from_worker, None, None, None, 16, 16, None, False, False, rank_cls),
            daemon=True,  # blocked on its pipe when the test ends
        ).start()
        _PIPES.extend((to_worker, from_sched, to_sched, from_worker))
        sched.input_conns.append(from_sched)
        sched.output_conns.append(to_sched)
    return sched


@pytest.fixture(scope="module", params=["pin", "overlay"])
def version(request):
    module = load_unpatched("tpu-inference", MODULE) if request.param == "pin" else importlib.import_module(MODULE)
    return request.param, module


def test_pause_abort_tells_every_client(version, monkeypatch):
    name, module = version
    sched = _dp_scheduler(module, monkeypatch)
    aborted = sched.finish_requests(None, RequestStatus.FINISHED_ABORTED)

    sent: dict = {}
    engine = EngineCoreProc.__new__(EngineCoreProc)
    engine._send_abort_outputs_to_client = lambda req_ids, client: sent.setdefault(client, set()).update(req_ids)
    engine._send_abort_outputs(aborted)

    if name == "pin":
        assert aborted is None
        assert sent == {}, "at the pin no client hears of its aborted requests"
    else:
        assert sorted(tuple(r) for r in aborted) == [("a0", 0), ("a1", 1), ("b0", 0), ("p0", 1)]
        assert sent == {0: {"a0", "b0"}, 1: {"a1", "p0"}}
    assert sched._pending_new_requests == [], "the pending request is dropped in both"
