"""One reconcile of one ERLSweep: plan (pure), then act.

    observe ─► plan ⇄ dry-run every child (before the first one only), name conflicts and
                      refusals found by creating: plan again (Invalid, Blocked)
            ─► create the plan's children (Event ChildCreated each)
            ─► write status (one merge patch, resourceVersion-guarded; a conflict: read the
               sweep again, plan again; refused as too large or invalid: written without
               the children's assignments, condition StatusIncomplete) ─► post Events

The sweep and its children come from the operator's watch caches. Creating a child is safe on
a stale read: names are deterministic, a child that exists is adopted (never a duplicate),
and a stale cache only lags (fewer children, earlier phases), so it never lets more than
maxParallel run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from evokube_contract import sweep as contract
from evokube_operator import api
from evokube_operator import conditions as cond
from evokube_operator.cluster.kube import ApiError, Kube, refused_write
from evokube_operator.cluster.metrics import Metrics
from evokube_operator.plans.sweep_plan import (
    SweepObservation,
    SweepPlan,
    plan_sweep,
    without_assignments,
)
from evokube_operator.reading.observe import SweepChildView, sweep_body
from evokube_operator.reading.ownership import NameConflict
from evokube_operator.reconcilers.reconcile import (
    MAX_CONFLICTS,
    Key,
    Outcome,
    mark_beside_plan,
    post_event,
)
from evokube_operator.rules.refusal import Refusal

log = logging.getLogger(__name__)


@dataclass
class _Memory:
    """What one operator process remembers about one sweep (lost on restart, by design)."""

    admitted: tuple[str, int] | None = None  # (uid, generation) whose children passed a dry run
    written_at: datetime | None = None  # our last status write


@dataclass
class SweepReconciler:
    kube: Kube
    metrics: Metrics
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    _memory: dict[Key, _Memory] = field(default_factory=dict)

    def forget(self, key: Key) -> None:
        self._memory.pop(key, None)
        self.metrics.forget_sweep(key)

    def reconcile(
        self, key: Key, body: dict[str, Any] | None, children: tuple[SweepChildView, ...]
    ) -> Outcome:
        if body is None:
            self.forget(key)
            return Outcome(None)
        memory = self._memory.setdefault(key, _Memory())
        for _ in range(MAX_CONFLICTS):
            obs, plan = self._plan(body, children, memory)
            if not plan.patch:
                break
            try:
                self._write(body, plan)
            except ApiError as err:
                if err.status == 404:
                    self.forget(key)
                    return Outcome(None)
                if refused_write(err):  # the whole status does not fit: what does, and why
                    log.warning("%s/%s: sweep status refused: %s", *key, err)
                    plan = without_assignments(obs, plan, str(err))
                    try:
                        self._write(body, plan)
                    except ApiError as again:
                        if again.status != 409:
                            raise
                    else:
                        memory.written_at = self.clock()
                        break
                elif err.status != 409:
                    raise
                log.debug("%s/%s: sweep status conflict, reading again", *key)
                body = sweep_body(self.kube.get(contract.SWEEP_KIND, *key))
                continue
            memory.written_at = self.clock()
            break
        else:
            raise ApiError(409, f"the status of sweep {key[0]}/{key[1]} kept changing")
        for event in plan.events:
            post_event(self.kube, body, event.type, event.reason, event.message)
        self.metrics.sweep(key, plan.status)
        return Outcome(plan.status.get("phase"), requeue_after=plan.requeue_after)

    def report_failure(self, key: Key, body: dict[str, Any] | None, err: Exception) -> None:
        """A reconcile raised what no API error explains (the controller retries it)."""
        if body is not None:
            mark_beside_plan(self.kube, body, contract.SWEEP_KIND, cond.failing(err), self.clock())

    def _write(self, body: dict[str, Any], plan: SweepPlan) -> None:
        meta = body["metadata"]
        self.kube.patch_status(
            meta["namespace"],
            meta["name"],
            plan.patch,
            meta.get("resourceVersion", ""),
            kind=contract.SWEEP_KIND,
        )

    def _plan(
        self, body: dict[str, Any], children, memory: _Memory
    ) -> tuple[SweepObservation, SweepPlan]:
        """Plan, and carry out the dry run and the creations, until nothing stops them; the
        last observation and its plan."""
        meta = body["metadata"]
        generation = (meta["uid"], int(meta.get("generation") or 0))
        obs = SweepObservation(
            body,
            tuple(children),
            self.clock(),
            admitted=memory.admitted == generation,
            written_at=memory.written_at,
        )
        for _ in range(MAX_CONFLICTS):
            plan = plan_sweep(obs)
            if plan.admit:
                obs = self._admit(obs, plan.admit)
                if obs.admitted:
                    memory.admitted = generation
                continue
            stopped = self._create(obs, plan)
            if stopped is None:
                return obs, plan
            obs = stopped
        return obs, plan

    def _admit(self, obs: SweepObservation, manifests) -> SweepObservation:
        """Every child created in a dry run: admitted, or the first refusal or conflicts."""
        uid = obs.sweep["metadata"]["uid"]
        conflicts = []
        for manifest in manifests:
            try:
                self.kube.create_owned(manifest, uid, update=False, dry_run=True)
            except NameConflict as conflict:
                conflicts.append(conflict)
            except Refusal as refused:
                log.warning("%s: %s", manifest["metadata"]["namespace"], refused.message)
                return replace(obs, refused=refused)
        if conflicts:
            return replace(obs, conflicts=tuple(conflicts))
        return replace(obs, admitted=True)

    def _create(self, obs: SweepObservation, plan: SweepPlan) -> SweepObservation | None:
        """Create the plan's children; None, or the observation with what stopped it."""
        body = obs.sweep
        meta = body["metadata"]
        total = plan.status.get("children")
        for manifest in plan.create:
            name = manifest["metadata"]["name"]
            try:
                _, created = self.kube.create_owned(manifest, meta["uid"], update=False)
            except NameConflict as conflict:
                return replace(obs, conflicts=(*obs.conflicts, conflict))
            except Refusal as refused:
                log.warning("%s/%s: %s", meta["namespace"], meta["name"], refused.message)
                return replace(obs, refused=refused)
            if created:
                index = int(manifest["metadata"]["labels"][contract.SWEEP_INDEX_LABEL])
                assignment = manifest["metadata"]["annotations"][
                    contract.SWEEP_ASSIGNMENT_ANNOTATION
                ]
                message = f"created {manifest['kind']} {name} ({index + 1} of {total}): "
                log.info("%s/%s: %s", meta["namespace"], meta["name"], message + assignment)
                post_event(
                    self.kube, body, "Normal", api.REASON_CHILD_CREATED, message + assignment
                )
        return None
