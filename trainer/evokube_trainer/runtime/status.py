"""Report training progress into the ERLExperiment's `status.progress`, and the best exported
policy into `status.result`.

Only process 0 reports, and only these two fields: the operator owns the rest
of the status (docs/architecture.md), and the chart's admission policy refuses
anything else from the trainer (docs/security.md). Only host 0's pod gets an
API token at all; without one (the policy that mounts it is not installed)
the reporter says so once and training goes on unreported. Patches are rate-limited and sent from
a background thread, so a slow or unreachable API server never slows or
stops training; the newest progress simply waits for the next try.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from evokube_contract import GROUP, PLURAL, VERSION
from evokube_trainer import metric_names as names
from evokube_trainer.runtime.manifest import crd_schema
from evokube_trainer.workflows import replica_seed, replica_values

log = logging.getLogger(__name__)


class NoCredentials(Exception):
    """Neither a ServiceAccount token in the pod nor a kubeconfig: nothing to report with."""


def default_api_client():
    """In a pod: the ServiceAccount's in-cluster config; elsewhere: $KUBECONFIG."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as err:
            raise NoCredentials(str(err)) from None
    return client.ApiClient()


class StatusReporter:
    """Rate-limited, fire-and-forget merge patches of status.progress and status.result."""

    def __init__(
        self,
        name: str,
        namespace: str,
        *,
        min_interval_s: float = 5.0,
        api_client_factory: Callable[[], Any] = default_api_client,
        timeout_s: float = 5.0,
    ):
        self.name, self.namespace = name, namespace
        self.min_interval_s = min_interval_s
        self.timeout_s = timeout_s
        self._factory = api_client_factory
        self._api: Any = None  # a CustomObjectsApi, made on first use
        self._pending: dict | None = None  # status fields to send: progress, result
        self._wake = threading.Condition()
        self._closed = False
        self.patches_sent = 0
        self.failures = 0
        self.disabled = False  # no credentials: reports are dropped
        self._thread = threading.Thread(target=self._run, name="status-reporter", daemon=True)
        self._thread.start()

    def report(self, **progress: Any) -> None:
        """Queue the newest progress (generation, envSteps, bestFitness, ...); numbers that
        are not finite are left out (JSON cannot carry them, and the API server would refuse
        the whole patch), and so are hyperparameters beyond the CRD's bound."""
        progress = {k: v for k, v in progress.items() if v is not None and _finite(v)}
        if "hyperparameters" in progress:
            finite = {k: v for k, v in sorted(progress["hyperparameters"].items()) if _finite(v)}
            kept = dict(list(finite.items())[: max_hyperparameters()])
            progress["hyperparameters"] = kept
            if not kept:
                del progress["hyperparameters"]
        self._queue("progress", {**progress, "updatedAt": _now()})

    def report_result(
        self,
        *,
        bestReturn: float,
        generation: int,
        policyURI: str,
        pipeline: str | None = None,
    ) -> None:
        """Queue the best exported policy: its evaluation return, generation and URI, and the
        physics pipeline it was trained and evaluated on (None: an env without one)."""
        result = {"bestReturn": bestReturn, "generation": generation, "policyURI": policyURI}
        self._queue("result", result if pipeline is None else {**result, "pipeline": pipeline})

    def _queue(self, field: str, value: dict) -> None:
        with self._wake:
            self._pending = {**(self._pending or {}), field: value}
            self._wake.notify()

    def close(self, flush_timeout_s: float = 10.0) -> None:
        """Send what is pending (once more, best effort) and stop the thread."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._thread.join(flush_timeout_s)

    def _run(self) -> None:
        next_allowed = float("-inf")
        while True:
            with self._wake:
                while not self._closed and (
                    self._pending is None or time.monotonic() < next_allowed
                ):
                    self._wake.wait(
                        None if self._pending is None else next_allowed - time.monotonic()
                    )
                fields, self._pending = self._pending, None
                closing = self._closed
            if fields is not None and not self._send(fields):
                with self._wake:  # retry it later, each field unless a newer one came meanwhile
                    self._pending = {**fields, **(self._pending or {})}
            next_allowed = time.monotonic() + self.min_interval_s
            if closing:
                return

    def _send(self, fields: dict) -> bool:
        """True when done with `fields`: sent, or dropped for want of credentials."""
        if self.disabled:
            return True
        body = {"status": fields}
        try:
            from kubernetes import client

            if self._api is None:
                self._api = client.CustomObjectsApi(self._factory())
            self._api.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                self.namespace,
                PLURAL,
                self.name,
                body,
                _request_timeout=self.timeout_s,
            )
            self.patches_sent += 1
            return True
        except NoCredentials as err:  # hosts 1..N-1 never get here: they do not report
            self.disabled = True
            log.warning(
                "progress is not reported to %s/%s: no API credentials (%s)",
                self.namespace,
                self.name,
                err,
            )
            return True
        except Exception as err:  # training must never die of this
            self.failures += 1
            log.warning("could not report progress to %s/%s: %s", self.namespace, self.name, err)
            return False


@dataclass
class SeedProgress:
    """Each replica's entry of `status.progress.seeds` (and of the per-seed metrics), kept
    from generation to generation on the host: a merge patch replaces the whole list, so the
    newest evaluation return and the best fitness so far must be remembered here. The best
    is over the generations this process saw: a restart begins it again at the resumed
    generation."""

    root_seed: int
    seeds: int
    best: list[float] = field(init=False)
    fitness: list[float | None] = field(init=False)
    eval_return: list[float | None] = field(init=False)

    def __post_init__(self):
        self.best = [-math.inf] * self.seeds
        self.fitness = [None] * self.seeds
        self.eval_return = [None] * self.seeds

    def update(self, metrics: Mapping[str, float]) -> None:
        """Take one generation's host metrics (`Workflow.learn`'s)."""
        self.fitness = replica_values(metrics, names.BEST_FITNESS, self.seeds)
        self.best = [
            best if value is None or not value > best else value
            for best, value in zip(self.best, self.fitness, strict=True)
        ]
        evaluated = replica_values(metrics, names.EVAL_RETURN, self.seeds)
        self.eval_return = [
            old if new is None else new
            for old, new in zip(self.eval_return, evaluated, strict=True)
        ]

    def entries(self) -> list[dict[str, Any]]:
        """`status.progress.seeds`: `{seed, bestFitness, fitness, evalReturn}` per replica, in
        order; values not known yet or not finite are left out."""
        entries = []
        for i in range(self.seeds):
            entry = {
                "seed": replica_seed(self.root_seed, i),
                "bestFitness": self.best[i],
                "fitness": self.fitness[i],
                "evalReturn": self.eval_return[i],
            }
            entries.append({k: v for k, v in entry.items() if v is not None and _finite(v)})
        return entries


def max_hyperparameters() -> int:
    """How many hyperparameters status.progress may hold (the CRD's maxProperties)."""
    progress = crd_schema()["properties"]["status"]["properties"]["progress"]
    return progress["properties"]["hyperparameters"]["maxProperties"]


def _finite(value: Any) -> bool:
    return not isinstance(value, float) or math.isfinite(value)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
