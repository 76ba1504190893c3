"""Operator metrics (Prometheus) and the HTTP endpoints that serve them and the probes.

One small aiohttp server, on the operator's event loop:

| path | answers |
|---|---|
| `/metrics` | the `evokube_operator_*` metrics below |
| `/healthz` | liveness: 200 while the event loop answers and every reconcile worker runs |
| `/readyz` | readiness: 200 once started and the API server answered recently |

`/readyz` answers `ok: leader` or `ok: follower`: a follower is ready, it stands by.

Everything lives in one Metrics object with its own registry (no global
state), created at startup and kept in Kopf's memo.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter as Tally
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from evokube_operator import api

log = logging.getLogger(__name__)
ALL_PHASES = (
    api.PENDING,
    api.QUEUED,
    api.RUNNING,
    api.RESTARTING,
    api.SUSPENDED,
    api.SUCCEEDED,
    api.FAILED,
)


class _PhaseCollector:
    """evokube_operator_experiments{phase}: computed when scraped from the last reconciles."""

    def __init__(self, phases: dict[Any, str]):
        self._phases = phases

    def collect(self):
        family = GaugeMetricFamily(
            "evokube_operator_experiments",
            "Experiments this operator manages, by status.phase.",
            labels=["phase"],
        )
        counts = Tally(self._phases.values())
        for phase in ALL_PHASES:
            family.add_metric([phase], counts.get(phase, 0))
        yield family


class _SweepCollector:
    """evokube_operator_sweep_children{namespace, sweep, phase} and
    evokube_operator_sweep_best_fitness{namespace, sweep}: from each sweep's last status."""

    def __init__(self, sweeps: dict[Any, Mapping[str, Any]]):
        self._sweeps = sweeps

    def collect(self):
        children = GaugeMetricFamily(
            "evokube_operator_sweep_children",
            "A sweep's children, by phase (status.counts).",
            labels=["namespace", "sweep", "phase"],
        )
        best = GaugeMetricFamily(
            "evokube_operator_sweep_best_fitness",
            "The mean over seeds of the best fitness of a sweep's best configuration.",
            labels=["namespace", "sweep"],
        )
        for (namespace, name), status in sorted(self._sweeps.items()):
            for phase, n in sorted((status.get("counts") or {}).items()):
                children.add_metric([namespace, name, phase], n)
            top = status.get("bestConfiguration")
            if top:
                best.add_metric([namespace, name], top["best"]["mean"])
        yield children
        yield best


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._phases: dict[Any, str] = {}
        self._sweeps: dict[Any, Mapping[str, Any]] = {}
        self.registry.register(_PhaseCollector(self._phases))
        self.registry.register(_SweepCollector(self._sweeps))
        self.reconciles = Counter(
            "evokube_operator_reconciles",
            "Reconciles of experiments, by result (success or error).",
            ["result"],
            registry=self.registry,
        )
        self.reconcile_errors = Counter(
            "evokube_operator_reconcile_errors",
            "Reconciles that failed and will be retried with backoff.",
            registry=self.registry,
        )
        self.reconcile_duration = Histogram(
            "evokube_operator_reconcile_duration_seconds",
            "Time one reconcile took, API calls included.",
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.restarts = Counter(
            "evokube_operator_gang_restarts",
            "Gang restarts started, by kind: counted (retriable failure) or preemption.",
            ["kind"],
            registry=self.registry,
        )
        for kind in ("counted", "preemption"):  # both series from the start, at 0: a panel
            self.restarts.labels(kind)  # has data, and increase() sees the first restart
        self.api_requests = Counter(
            "evokube_operator_api_requests",
            "Kubernetes API requests of reconciles and readiness checks (not Kopf's watches),"
            " by verb, kind and HTTP status (0: no answer).",
            ["verb", "kind", "code"],
            registry=self.registry,
        )
        self.leader = Gauge(
            "evokube_operator_leader",
            "1 while this replica holds the Lease and reconciles, 0 while it stands by.",
            registry=self.registry,
        )

    # -- recording ---------------------------------------------------------------------------
    def reconciled(self, key: Any, phase: str | None, seconds: float, error: bool = False):
        self.reconcile_duration.observe(seconds)
        self.reconciles.labels("error" if error else "success").inc()
        if error:
            self.reconcile_errors.inc()
        elif phase is not None:
            self._phases[key] = phase

    def gang_restarts(self, counted: int, preemptions: int) -> None:
        if counted > 0:
            self.restarts.labels("counted").inc(counted)
        if preemptions > 0:
            self.restarts.labels("preemption").inc(preemptions)

    def api_request(self, verb: str, kind: str, code: int) -> None:
        self.api_requests.labels(verb, kind, str(code)).inc()

    def forget(self, key: Any) -> None:
        self._phases.pop(key, None)

    def sweep(self, key: Any, status: Mapping[str, Any]) -> None:
        """A sweep's status as last planned: its children per phase and its best fitness."""
        self._sweeps[key] = {k: status.get(k) for k in ("counts", "bestConfiguration")}

    def forget_sweep(self, key: Any) -> None:
        self._sweeps.pop(key, None)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


class Server:
    """/metrics, /healthz and /readyz on one port."""

    def __init__(
        self,
        metrics: Metrics,
        alive: Callable[[], bool],
        api_reachable: Callable[[], Awaitable[bool]],
        recheck_seconds: float = 10.0,
        role: Callable[[], str] = lambda: "leader",
    ):
        self.metrics = metrics
        self._role = role
        self._alive = alive
        self._api_reachable = api_reachable
        self._recheck = recheck_seconds
        self._ready_until = 0.0
        self._runner: web.AppRunner | None = None
        self.started = False

    async def start(self, host: str, port: int) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        log.info("metrics and probes on http://%s:%d", host, port)

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _metrics(self, _: web.Request) -> web.Response:
        body = self.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, _: web.Request) -> web.Response:
        if self._alive():
            return web.Response(text="ok\n")
        return web.Response(status=500, text="a reconcile worker stopped\n")

    async def _readyz(self, _: web.Request) -> web.Response:
        if not self.started:
            return web.Response(status=503, text="starting\n")
        now = time.monotonic()
        if now >= self._ready_until:
            try:
                reachable = await asyncio.wait_for(self._api_reachable(), timeout=5)
            except Exception:
                reachable = False
            if not reachable:
                return web.Response(status=503, text="the API server does not answer\n")
            self._ready_until = now + self._recheck
        return web.Response(text=f"ok: {self._role()}\n")
