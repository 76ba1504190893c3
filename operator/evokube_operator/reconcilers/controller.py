"""A work queue of experiments to reconcile: coalesced, one at a time per experiment.

Kopf handlers (handlers.py) only say "look at experiment X again" - when it
changes, when one of its Jobs or pods changes, when a deadline or TTL comes
due. Requests for the same experiment coalesce; an experiment is never
reconciled twice at once; a failed reconcile is retried with backoff. The
reconcile itself (blocking API calls) runs in worker threads, one per worker
(asyncio's default pool has only CPUs + 4 threads, which capped the workers),
reading the experiment, its Jobs and its pods from Kopf's in-memory indices.

Only the leader runs workers (see leader.py): until `start()`, requests are
dropped, and `start()` then looks at every experiment the indices know.

ERLSweeps have a queue of their own, the same class over their own indices (the sweep and
the experiments labelled with its name) and reconciler (sweep_reconcile.py).
"""

from __future__ import annotations

import asyncio
import copy
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from evokube_operator.cluster.kube import ApiError
from evokube_operator.cluster.metrics import Metrics
from evokube_operator.reconcilers.reconcile import Key, Outcome, Reconciler
from evokube_operator.reconcilers.sweep_reconcile import SweepReconciler

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Indices:
    """Read-only views of Kopf's indices: (namespace, experiment) -> stored values."""

    experiments: Mapping[Key, Any]  # ExperimentViews
    jobs: Mapping[Key, Any]
    pods: Mapping[Key, Any]
    jobsets: Mapping[Key, Any] = field(default_factory=dict)  # JobViews of multislice gangs

    def snapshot(self, key: Key) -> tuple[dict | None, tuple, tuple]:
        """The experiment's body (parsed afresh from its view) and copies of its Jobs and
        pods, taken on the event loop, so that worker threads never see them change."""
        views = list(self.experiments.get(key, ()))
        return (
            views[0].body() if views else None,
            (*self.jobs.get(key, ()), *self.jobsets.get(key, ())),
            tuple(self.pods.get(key, ())),
        )

    def known(self) -> list[Key]:
        return list(self.experiments)


@dataclass(frozen=True)
class SweepIndices:
    """Read-only views of Kopf's sweep indices: (namespace, sweep) -> stored values."""

    sweeps: Mapping[Key, Any]  # observe.sweep_body of each sweep
    children: Mapping[Key, Any]  # SweepChildViews of the experiments labelled with its name

    def snapshot(self, key: Key) -> tuple[dict | None, tuple]:
        """A deep copy of the sweep's body and its children, taken on the event loop."""
        bodies = list(self.sweeps.get(key, ()))
        return (copy.deepcopy(bodies[0]) if bodies else None, tuple(self.children.get(key, ())))

    def known(self) -> list[Key]:
        return list(self.sweeps)


@dataclass
class Backoff:
    """Retry delays after failed reconciles: base * 2^n, capped."""

    base: float = 0.5
    cap: float = 60.0
    failures: dict[Key, int] = field(default_factory=dict)

    def next(self, key: Key) -> float:
        n = self.failures.get(key, 0)
        self.failures[key] = n + 1
        return min(self.cap, self.base * 2**n)

    def reset(self, key: Key) -> None:
        self.failures.pop(key, None)


class Controller:
    """The queue of one kind: experiments (Reconciler, Indices) or sweeps (SweepReconciler,
    SweepIndices); `phases` counts its objects' phases in evokube_operator_experiments."""

    def __init__(
        self,
        reconciler: Reconciler | SweepReconciler,
        indices: Indices | SweepIndices,
        metrics: Metrics,
        workers: int = 4,
        resync_seconds: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        phases: bool = True,
    ):
        self.reconciler = reconciler
        self.indices = indices
        self.metrics = metrics
        self.phases = phases
        self.workers = workers
        self.resync_seconds = resync_seconds
        self.backoff = Backoff()
        self._clock = clock
        self._ready: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()
        self._active: set[Key] = set()
        self._again: set[Key] = set()  # requested while being reconciled
        self._timers: dict[Key, tuple[float, asyncio.TimerHandle]] = {}
        self._tasks: list[asyncio.Task] = []
        self._indices_complete = False
        self._threads = ThreadPoolExecutor(workers, thread_name_prefix="evokube-reconcile")

    # -- requests ---------------------------------------------------------------------------
    def changed(self, key: Key) -> None:
        """Kopf saw `key` or one of its Jobs or pods change.

        Kopf calls handlers only once every index has been filled by its first
        listing, so from the first call on the indices are complete.
        """
        self._indices_complete = True
        self.request(key)

    def request(self, key: Key, delay: float = 0.0) -> None:
        """Reconcile `key` after `delay` seconds (the earliest request wins); not before start."""
        if not self._tasks:
            return
        if delay > 0:
            self._schedule(key, delay)
            return
        if key in self._active:
            self._again.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._ready.put_nowait(key)

    def _schedule(self, key: Key, delay: float) -> None:
        due = self._clock() + delay
        current = self._timers.get(key)
        if current is not None:
            if current[0] <= due:
                return
            current[1].cancel()
        handle = asyncio.get_running_loop().call_later(delay, self._fire, key)
        self._timers[key] = (due, handle)

    def _fire(self, key: Key) -> None:
        self._timers.pop(key, None)
        self.request(key)

    def forget(self, key: Key) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer[1].cancel()
        self.backoff.reset(key)
        if self.phases:
            self.metrics.forget(key)
        self.reconciler.forget(key)

    # -- running ----------------------------------------------------------------------------
    def start(self) -> None:
        """Run the workers, and look at every known experiment (a new leader catches up)."""
        for i in range(self.workers):
            self._tasks.append(asyncio.create_task(self._worker(), name=f"evokube-worker-{i}"))
        if self.resync_seconds > 0:
            self._tasks.append(asyncio.create_task(self._resync(), name="evokube-resync"))
        if self._indices_complete:  # else Kopf's first calls will name every experiment
            for key in self.indices.known():
                self.request(key)

    async def stop(self) -> None:
        """Stop the workers and wait for the reconciles in flight (their writes) to end."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        await asyncio.to_thread(self._threads.shutdown, wait=True, cancel_futures=True)

    @property
    def alive(self) -> bool:
        """Every worker started still runs (a crashed worker would silently stall experiments)."""
        return not any(t.done() for t in self._tasks)

    async def _resync(self) -> None:
        """A slow safety net: look at every known experiment now and then."""
        while True:
            await asyncio.sleep(self.resync_seconds)
            for key in self.indices.known():
                self.request(key)

    async def _worker(self) -> None:
        while True:
            key = await self._ready.get()
            self._queued.discard(key)
            self._active.add(key)
            try:
                await self._process(key)
            finally:
                self._active.discard(key)
                if key in self._again:
                    self._again.discard(key)
                    self.request(key)

    def _report_failure(self, key: Key, body: dict | None, err: Exception) -> None:
        try:
            self.reconciler.report_failure(key, body, err)
        except Exception:  # never let the report stop the retries
            log.warning("%s/%s: the failure could not be reported", *key, exc_info=True)

    async def _process(self, key: Key) -> None:
        snapshot = self.indices.snapshot(key)
        started = time.perf_counter()
        try:
            outcome: Outcome = await asyncio.get_running_loop().run_in_executor(
                self._threads, self.reconciler.reconcile, key, *snapshot
            )
        except Exception as err:
            delay = self.backoff.next(key)
            self.metrics.reconciled(key, None, time.perf_counter() - started, error=True)
            log.warning("%s/%s: reconcile failed (%s); retrying in %.1fs", *key, err, delay)
            if isinstance(err, ApiError):  # the API server's answer: passing, or named there
                log.debug("reconcile failure", exc_info=True)
            else:  # no answer explains it: shown on the object, not in the log alone
                log.error("%s/%s: reconcile failed", *key, exc_info=True)
                await asyncio.get_running_loop().run_in_executor(
                    self._threads, self._report_failure, key, snapshot[0], err
                )
            self.request(key, delay)
            return
        self.backoff.reset(key)
        phase = outcome.phase if self.phases else None
        self.metrics.reconciled(key, phase, time.perf_counter() - started)
        self.metrics.gang_restarts(outcome.restarts, outcome.preemptions)
        if outcome.phase is None:
            self.forget(key)
        elif outcome.requeue_after is not None:
            self.request(key, max(0.0, outcome.requeue_after))
