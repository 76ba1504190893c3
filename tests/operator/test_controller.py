"""The work queue: requests coalesce, one reconcile per experiment at a time, retries back off."""

import asyncio
import threading
import time

from evokube_operator.cluster.kube import ApiError
from evokube_operator.cluster.metrics import Metrics
from evokube_operator.reading.observe import ExperimentView
from evokube_operator.reconcilers.controller import Backoff, Controller, Indices
from evokube_operator.reconcilers.reconcile import Outcome
from tests.operator.factories import body

A, B = ("ns", "a"), ("ns", "b")
VIEW_A, VIEW_B = (ExperimentView.from_body(body(name=key[1])) for key in (A, B))


class ScriptedReconciler:
    """Records calls; each key answers from its script (an Outcome or an exception)."""

    def __init__(self, scripts=None, seconds=0.0):
        self.scripts = scripts or {}
        self.seconds = seconds
        self.calls: list = []
        self.running: set = set()
        self.overlaps: list = []
        self.lock = threading.Lock()
        self.reported: list = []

    def report_failure(self, key, body, err):
        self.reported.append((key, body["metadata"]["name"], type(err).__name__))

    def reconcile(self, key, body, jobs, pods):
        with self.lock:
            if key in self.running:
                self.overlaps.append(key)
            self.running.add(key)
        time.sleep(self.seconds)
        with self.lock:
            self.running.discard(key)
            self.calls.append(key)
        script = self.scripts.get(key, [])
        answer = script.pop(0) if script else Outcome("Running")
        if isinstance(answer, Exception):
            raise answer
        return answer

    def forget(self, key):
        pass


async def until(predicate, what, timeout=10.0):
    """Poll the event loop until predicate() holds (a busy machine only makes it slower)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


def run(reconciler, scenario, workers=4):
    async def main():
        indices = Indices({A: [VIEW_A], B: [VIEW_B]}, {}, {})
        controller = Controller(reconciler, indices, Metrics(), workers=workers, resync_seconds=0)
        controller.backoff = Backoff(base=0.01)
        controller.start()
        try:
            await scenario(controller)
        finally:
            await controller.stop()

    asyncio.run(main())


def test_requests_coalesce_and_one_experiment_is_never_reconciled_twice_at_once():
    rec = ScriptedReconciler(seconds=0.05)

    async def scenario(controller):
        for _ in range(10):
            controller.request(A)
        controller.request(B)
        await asyncio.sleep(0.02)
        controller.request(A)  # arrives while A is being reconciled: once more, after
        controller.request(A)
        await until(lambda: rec.calls.count(A) >= 2 and B in rec.calls, "the reconciles")
        await asyncio.sleep(0.1)  # and no third one comes

    run(rec, scenario)
    assert rec.calls.count(A) == 2
    assert rec.calls.count(B) == 1
    assert rec.overlaps == []


def test_a_failed_reconcile_is_retried_with_backoff():
    rec = ScriptedReconciler({A: [RuntimeError("boom"), RuntimeError("boom")]})

    async def scenario(controller):
        controller.request(A)
        await until(lambda: rec.calls.count(A) >= 3, "two retries")
        assert controller.alive

    run(rec, scenario)
    assert rec.calls.count(A) == 3
    # No API answer explains it: each failure is reported on the object (ReconcileFailing).
    assert rec.reported == [(A, "a", "RuntimeError")] * 2


def test_a_reconcile_failed_by_the_api_server_is_retried_without_a_report():
    rec = ScriptedReconciler({A: [ApiError(503, "the server is shutting down")]})

    async def scenario(controller):
        controller.request(A)
        await until(lambda: rec.calls.count(A) >= 2, "a retry")

    run(rec, scenario)
    assert rec.reported == []


def test_requeue_after_brings_an_experiment_back_and_the_earliest_timer_wins():
    rec = ScriptedReconciler({A: [Outcome("Running", requeue_after=0.05)]})

    async def scenario(controller):
        controller.request(A, delay=10)  # a later timer is replaced by an earlier one
        controller.request(A)
        await until(lambda: rec.calls.count(A) >= 2, "the requeue")

    run(rec, scenario)
    assert rec.calls.count(A) == 2


def test_metrics_count_reconciles_by_result_and_phase():
    rec = ScriptedReconciler({A: [RuntimeError("boom")], B: [Outcome("Failed")]})
    metrics_text = {}

    async def scenario(controller):
        controller.request(A)
        controller.request(B)
        text = controller.metrics.exposition
        await until(lambda: b'result="error"} 1.0' in text(), "the failed reconcile counted")
        await until(lambda: b'phase="Failed"} 1.0' in text(), "the phase recorded")
        metrics_text["out"] = text().decode()

    run(rec, scenario)
    text = metrics_text["out"]
    assert 'evokube_operator_reconciles_total{result="error"} 1.0' in text
    assert 'evokube_operator_experiments{phase="Failed"} 1.0' in text
    assert "evokube_operator_reconcile_errors_total 1.0" in text
    assert "evokube_operator_reconcile_duration_seconds_count" in text


def test_an_experiment_that_is_gone_is_forgotten_in_the_metrics():
    rec = ScriptedReconciler({A: [Outcome("Running"), Outcome(None)]})
    seen = {}

    async def scenario(controller):
        text = controller.metrics.exposition
        running = b'evokube_operator_experiments{phase="Running"}'
        controller.request(A)
        await until(lambda: running + b" 1.0" in text(), "the phase recorded")
        seen["before"] = text().decode()
        controller.request(A)
        await until(lambda: running + b" 0.0" in text(), "the experiment forgotten")
        seen["after"] = text().decode()

    run(rec, scenario)
    assert 'evokube_operator_experiments{phase="Running"} 1.0' in seen["before"]
    assert 'evokube_operator_experiments{phase="Running"} 0.0' in seen["after"]


def test_every_worker_reconciles_at_once():
    """As many reconciles run together as there are workers (API calls are waits, not work):
    more than asyncio's default thread pool (CPUs + 4) would allow."""
    workers = 16
    arrived = threading.Barrier(workers, timeout=10)

    class Gathering(ScriptedReconciler):
        def reconcile(self, key, body, jobs, pods):
            arrived.wait()  # breaks (and fails the reconcile) unless all run together
            return super().reconcile(key, body, jobs, pods)

    rec = Gathering()
    keys = [("ns", f"e{i}") for i in range(workers)]

    async def scenario(controller):
        for key in keys:
            controller.request(key)
        await until(lambda: len(rec.calls) == workers, "every reconcile", timeout=20)

    run(rec, scenario, workers=workers)
    assert sorted(rec.calls) == sorted(keys)
    assert not arrived.broken


def test_a_follower_drops_requests_and_on_becoming_leader_looks_at_every_experiment():
    rec = ScriptedReconciler()

    async def main():
        indices = Indices({A: [VIEW_A], B: [VIEW_B]}, {}, {})
        controller = Controller(rec, indices, Metrics(), workers=2, resync_seconds=0)
        controller.changed(A)  # a follower: Kopf's call says the indices are complete
        controller.request(B, delay=0.01)
        await asyncio.sleep(0.05)
        assert rec.calls == [] and controller.alive
        controller.start()
        try:
            await until(lambda: sorted(rec.calls) == [A, B], "a reconcile of each experiment")
        finally:
            await controller.stop()

    asyncio.run(main())


def test_a_leader_started_before_kopfs_first_call_waits_for_kopf_to_name_experiments():
    """Before Kopf's first call the indices may still be filling: reconciling from them could
    miss a running gang's pods."""
    rec = ScriptedReconciler()

    async def main():
        controller = Controller(rec, Indices({A: [VIEW_A]}, {}, {}), Metrics(), resync_seconds=0)
        controller.start()
        try:
            await asyncio.sleep(0.05)
            assert rec.calls == []
            controller.changed(B)
            await until(lambda: rec.calls == [B], "the named experiment only")
        finally:
            await controller.stop()

    asyncio.run(main())


def test_stop_waits_for_the_reconcile_in_flight():
    rec = ScriptedReconciler(seconds=0.3)

    async def scenario(controller):
        controller.request(A)
        await until(lambda: A in rec.running, "the reconcile to start")
        await controller.stop()
        assert rec.calls == [A]  # it ended before stop() returned

    run(rec, scenario)
