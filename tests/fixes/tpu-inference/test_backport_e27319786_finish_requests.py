"""tpu-inference: what `DPScheduler.finish_requests` returns
(patches/tpu-inference/backport-e27319786-*, upstream's e27319786, #3362,
and patches/tpu-inference/0007-*, which reads either form vLLM returns).

vLLM's pause (mode "abort") and its shutdown abort path do
`aborted = scheduler.finish_requests(None, FINISHED_ABORTED)` and then
`EngineCoreProc._send_abort_outputs(aborted)`, which tells each client its
requests ended. Under data parallelism the scheduler is tpu-inference's
`DPScheduler`:

- at the pin it returns None (its rank workers answer None too): nothing is
  sent, and the clients of the aborted requests wait for ever;
- with the backport it returns each finished request's id and client index,
  from its pending queue and from every rank's scheduler, read as attributes
  of what each rank's vLLM Scheduler returned: vLLM 0.26's `list[Request]`.
  vLLM 0.25 (the CI stand-in of the vLLM pin) returns `(request_id,
  client_index)` tuples, on which the rank worker fails;
- with 0007 too (the overlay) either form is read.

The DPScheduler is the real class on a bare instance, talking over real pipes
to the real rank worker loop (`_scheduler_worker_process`, in a thread here,
not a process); each rank's scheduler is a stand-in that finishes what it
holds and returns the finished requests in one of vLLM's two forms. The abort outputs are vLLM's own
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

from support.fixes.unpatched import load_before, load_unpatched

MODULE = "tpu_inference.core.sched.dp_scheduler"
#: Two ranks; what each rank's scheduler holds (request id -> client index),
#: and one request still in the DPScheduler's pending queue.
RANKS = {0: {"a0": 0, "a1": 1}, 1: {"b0": 0}}
PENDING = ("p0", 1)
#: Every pipe end, kept open for the session: a worker whose pipe closes
#: loops on EOFError, so each stays blocked on its open pipe instead.
_PIPES: list = []


#: What vLLM's Scheduler.finish_requests returns for each finished request.
FORMS = {
    "requests": lambda rid, client: types.SimpleNamespace(request_id=rid, client_index=client),  # 0.26: list[Request]
    "tuples": lambda rid, client: (rid, client),  # 0.25: list[tuple[str, int]]
}


class _RankScheduler:
    """Stands in for vLLM's Scheduler in a rank worker: holds requests, and
    finish_requests returns those it finished, in the form `entry` makes."""

    held: dict = {}
    entry = staticmethod(FORMS["requests"])

    def __init__(self, **kwargs):
        self.requests = dict(self.held)

    def finish_requests(self, request_ids, finished_status):
        ids = list(self.requests) if request_ids is None else list(request_ids)
        return [self.entry(i, self.requests.pop(i)) for i in ids if i in self.requests]


def test_the_installed_vllm_returns_one_of_the_two_forms():
    """The forms this test gives the rank schedulers are vLLM's own: the
    installed vLLM's Scheduler.finish_requests is annotated with one."""
    from vllm.v1.core.sched.scheduler import Scheduler

    returns = str(Scheduler.finish_requests.__annotations__.get("return"))
    assert returns in ("list[tuple[str, int]]", "list[vllm.v1.request.Request]", "list[Request]"), returns


def _dp_scheduler(module, monkeypatch, form):
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
        rank_cls = type(f"Rank{rank}Scheduler", (_RankScheduler,), {"held": held, "entry": staticmethod(FORMS[form])})
        threading.Thread(
            target=module._scheduler_worker_process,
            args=(rank, to_worker, from_worker, None, None, None, 16, 16, None, False, False, rank_cls),
            daemon=True,  # blocked on its pipe when the test ends
        ).start()
        _PIPES.extend((to_worker, from_sched, to_sched, from_worker))
        sched.input_conns.append(from_sched)
        sched.output_conns.append(to_sched)
    return sched


@pytest.fixture(scope="module", params=["pin", "backport", "overlay"])
def version(request):
    if request.param == "pin":
        module = load_unpatched("tpu-inference", MODULE)
    elif request.param == "backport":  # the series up to 0007: the backport as upstream wrote it
        module = load_before("tpu-inference", MODULE, "0007", MODULE + "__before_0007")
    else:
        module = importlib.import_module(MODULE)
    return request.param, module


@pytest.mark.parametrize("form", FORMS)
def test_pause_abort_tells_every_client(version, form, monkeypatch):
    name, module = version
    sched = _dp_scheduler(module, monkeypatch, form)
    if name == "backport" and form == "tuples":
        with pytest.raises(module.SchedulerWorkerError, match="'tuple' object has no attribute 'request_id'"):
            sched.finish_requests(None, RequestStatus.FINISHED_ABORTED)
        return
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
