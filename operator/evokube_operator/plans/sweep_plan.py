"""An ERLSweep's next step, as a pure function: what the watches saw in, a SweepPlan out.

`plan_sweep` reads a sweep (its spec and the status the operator wrote last), the children
that carry its label, and the time, and says which children to create now, the status to
write and the Events to post. sweep_reconcile.py carries the plan out.

- Children have deterministic names (`child_name`) and the sweep as their controller owner:
  a child that exists is adopted (an operator restart loses nothing and duplicates nothing);
  a namesake the sweep does not own blocks the sweep (condition Blocked) and is left alone.
- At most `spec.maxParallel` children are unfinished (any phase but Succeeded and Failed,
  none yet included) at a time; the next ones are created in index order.
- Before the first child, every child is admitted in a dry run (the plan's `admit`): one the
  API server refuses makes the sweep Invalid, naming the child and the server's message,
  and no child is created half of a sweep. An expansion error is Invalid too. The plan holds
  the children's assignments, not their manifests (`Children`): each manifest, a copy of the
  template, is built as the reconciler sends it, so a reconcile holds one at a time.
- A child the sweep's status records as finished is never created again (a child's
  ttlSecondsAfterFinished deletes it; its last configuration stays in the summary).
- The summary's figures (a child's fitness moves every few seconds) are written at most every
  STATUS_SECONDS; phases, counts and conditions at once.
- The status is bounded by construction: an assignment value longer than STATUS_VALUE_CHARS
  (as compact JSON) is cut, with a marker; the child's annotation keeps it whole. A status
  write the API server refuses all the same becomes a condition and an Event (sweep_reconcile).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import evokube_sweeps as sweeps
from evokube_contract import sweep as contract
from evokube_operator import api
from evokube_operator import conditions as cond
from evokube_operator.plans.decide import BLOCKED_REQUEUE_SECONDS, Event
from evokube_operator.reading.observe import SweepChildView
from evokube_operator.reading.ownership import NameConflict
from evokube_operator.reading.spec import format_time
from evokube_operator.rules.refusal import Refusal

STATUS_SECONDS = 10.0
# An assignment value's compact JSON in status.configurations: 256 children of 16 parameters
# each stay near half a MiB, far below the 1.5 MiB etcd takes in one write.
STATUS_VALUE_CHARS = 64
# Status fields that only move figures of the summary: written at most every STATUS_SECONDS.
FIGURES = frozenset({"configurations", "bestConfiguration"})
FIELDS = ("phase", "observedGeneration", "children", "counts", "configurations")
FIELDS += ("bestConfiguration", "conditions")


@dataclass(frozen=True)
class SweepObservation:
    sweep: Mapping[str, Any]  # observe.sweep_body
    children: tuple[SweepChildView, ...]  # the ERLExperiments labelled with the sweep's name
    now: datetime
    admitted: bool = False  # every child passed the dry run (this generation)
    refused: Refusal | None = None  # the API server refused a child (dry run or creation)
    conflicts: tuple[NameConflict, ...] = ()  # namesakes found by creating
    written_at: datetime | None = None  # this process's last status write of the sweep


@dataclass(frozen=True)
class Children:
    """Some children of a sweep, in index order, each manifest built (a copy of the template)
    only as it is iterated to: the reconciler holds one at a time, whatever their number."""

    sweep: Mapping[str, Any]
    assignments: tuple[tuple[int, Mapping[str, Any]], ...] = ()  # (index, assignment)

    def __len__(self) -> int:
        return len(self.assignments)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for index, assignment in self.assignments:
            manifest = sweeps.child_manifest(self.sweep, index, assignment)
            manifest["metadata"]["ownerReferences"] = [owner_reference(self.sweep)]
            yield manifest


NO_CHILDREN = Children({})


@dataclass(frozen=True)
class SweepPlan:
    status: dict[str, Any]  # the operator's whole status of the sweep
    patch: dict[str, Any]  # the merge patch to write now ({}: nothing)
    create: Children = NO_CHILDREN  # children to create, in index order
    admit: Children = NO_CHILDREN  # dry-run every child first, then plan again
    events: tuple[Event, ...] = ()
    requeue_after: float | None = None


def owner_reference(sweep: Mapping[str, Any]) -> dict[str, Any]:
    """Makes the sweep own a child: deleting the sweep deletes its children."""
    meta = sweep["metadata"]
    return {
        "apiVersion": api.API_VERSION,
        "kind": contract.SWEEP_KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def plan_sweep(obs: SweepObservation) -> SweepPlan:
    sweep, old = obs.sweep, dict(obs.sweep.get("status") or {})
    meta = sweep["metadata"]
    generation = int(meta.get("generation") or 0)
    if meta.get("deletionTimestamp"):  # the garbage collector takes the children
        return SweepPlan(old, {})
    if old.get("phase") == api.INVALID and old.get("observedGeneration") == generation:
        return SweepPlan(old, {})  # until the spec changes
    try:
        assignments = tuple(enumerate(sweeps.expand(sweep["spec"])))
    except sweeps.SweepError as err:
        return _invalid(obs, old, api.REASON_INVALID_SPEC, str(err))
    refused = obs.refused
    if refused is not None and refused.final:
        return _invalid(obs, old, refused.reason, refused.message)
    names = [sweeps.child_name(meta["name"], index) for index, _ in assignments]
    owned = {c.name: c for c in obs.children if c.owner_uid == meta["uid"]}
    foreign = {c.name for c in obs.children if c.owner_uid != meta["uid"] and c.name in names}
    foreign |= {c.name for c in obs.conflicts}
    recorded = _finished_configurations(old)
    unfinished = sum(1 for c in owned.values() if c.phase not in api.FINISHED_PHASES)
    taken = owned.keys() | recorded
    missing = [a for a, name in zip(assignments, names, strict=True) if name not in taken]
    slots = max(0, int(sweep["spec"].get("maxParallel", 1)) - unfinished)
    blocker = _blocker(foreign, refused)
    create = Children(sweep, () if blocker else tuple(missing[:slots]))
    if create and not owned and not obs.admitted:
        return SweepPlan(old, {}, admit=Children(sweep, assignments))
    status = _status(sweep, generation, names, owned, recorded)
    finished = not missing and unfinished == 0
    conditions, events = _conditions(obs, old, status, blocker, finished)
    status["conditions"] = [dict(c) for c in conditions]
    patch, requeue = _patch(obs, old, status)
    if blocker is not None:
        requeue = BLOCKED_REQUEUE_SECONDS if requeue is None else requeue
    return SweepPlan(status, patch, create=create, events=events, requeue_after=requeue)


def _finished_configurations(old: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        c["name"]: c
        for c in old.get("configurations") or []
        if c.get("phase") in api.FINISHED_PHASES and c.get("name")
    }


def _status(sweep, generation, names, owned, recorded) -> dict[str, Any]:
    """The summary of the children there, and the last one written of finished ones gone."""
    summary = sweeps.summarize([owned[n].body() for n in names if n in owned])
    present = {c["name"]: _bounded(c) for c in summary["configurations"]}
    configurations = [present.get(n) or recorded[n] for n in names if n in present or n in recorded]
    return {
        "observedGeneration": generation,
        "children": len(names),
        **sweeps.tally(configurations),
    }


def _bounded(configuration: dict[str, Any]) -> dict[str, Any]:
    """`configuration` with each assignment value longer than STATUS_VALUE_CHARS cut to a
    string that ends in how long it was: "[1,2,3,...]…[8190 chars]"."""
    if "assignment" not in configuration:
        return configuration
    assignment = {}
    for path, value in configuration["assignment"].items():
        text = json.dumps(value, separators=(",", ":"))
        if len(text) > STATUS_VALUE_CHARS:
            value = f"{text[: STATUS_VALUE_CHARS - 20]}…[{len(text)} chars]"
        assignment[path] = value
    return {**configuration, "assignment": assignment}


def _blocker(foreign: set[str], refused: Refusal | None) -> cond.Condition | None:
    if foreign:
        taken = ", ".join(f"{api.KIND}/{name}" for name in sorted(foreign))
        message = (
            f"{taken} already exists and is not owned by this sweep: rename or remove it, "
            "or rename the sweep"
        )
        return cond.Condition(api.COND_BLOCKED, True, api.REASON_NAME_CONFLICT, message)
    if refused is not None:  # one that may pass: a quota, say
        return cond.Condition(api.COND_BLOCKED, True, refused.reason, refused.message)
    return None


def _conditions(obs, old, status, blocker, finished) -> tuple[cond.Conditions, tuple[Event, ...]]:
    """The sweep's conditions and phase (into `status`), and the Events of what changed."""
    now, generation = format_time(obs.now), status["observedGeneration"]
    conditions: cond.Conditions = tuple(old.get("conditions") or ())
    conditions = cond.clear(conditions, api.COND_INVALID, api.REASON_UNBLOCKED, "", generation, now)
    conditions = cond.clear_beside_plan(conditions, generation, now)
    events: list[Event] = []
    if blocker is not None:
        if not cond.is_true(conditions, api.COND_BLOCKED):
            events.append(Event("Warning", blocker.reason, blocker.message))
        conditions = cond.set_condition(conditions, blocker, generation, now)
    else:
        conditions = cond.clear(
            conditions, api.COND_BLOCKED, api.REASON_UNBLOCKED, "", generation, now
        )
    counts = status["counts"]
    status["phase"] = api.RUNNING
    if finished:
        succeeded = counts.get(api.SUCCEEDED, 0)
        told = f"{status['children']} children: {succeeded} succeeded, "
        told += f"{counts.get(api.FAILED, 0)} failed"
        if "bestConfiguration" in status:
            best = status["bestConfiguration"]
            told += f"; best {best['name']} ({best['best']['mean']:.6g} mean best fitness)"
        if succeeded:
            status["phase"] = api.SUCCEEDED
            done = cond.Condition(api.COND_SUCCEEDED, True, api.REASON_COMPLETED, told)
        else:
            status["phase"] = api.FAILED
            done = cond.Condition(api.COND_FAILED, True, api.REASON_ALL_CHILDREN_FAILED, told)
        if old.get("phase") != status["phase"]:
            events.append(Event("Normal" if succeeded else "Warning", done.reason, told))
        conditions = cond.set_condition(conditions, done, generation, now)
    return conditions, tuple(events)


def without_assignments(obs: SweepObservation, plan: SweepPlan, refusal: str) -> SweepPlan:
    """The plan whose status write the API server refused (`refusal`: its answer): the same
    status with the configurations' assignments left out (what finished stays recorded, so
    no child is created twice), the condition StatusIncomplete naming the refusal, and an
    Event the first time. The plan's next whole write clears the condition."""
    old = obs.sweep.get("status") or {}
    status = dict(plan.status)
    status["configurations"] = [
        {k: v for k, v in c.items() if k != "assignment"} for c in status["configurations"]
    ]
    message = (
        f"the API server refused the sweep's status ({refusal}); it is written without the "
        f"children's assignments (each child's annotation {contract.SWEEP_ASSIGNMENT_ANNOTATION} "
        "has its own)"
    )
    incomplete = cond.Condition(
        api.COND_STATUS_INCOMPLETE, True, api.REASON_STATUS_REFUSED, message
    )
    conditions = cond.set_condition(
        tuple(status.get("conditions") or ()),
        incomplete,
        int(obs.sweep["metadata"].get("generation") or 0),
        format_time(obs.now),
    )
    status["conditions"] = [dict(c) for c in conditions]
    events = plan.events
    if not cond.is_true(tuple(old.get("conditions") or ()), api.COND_STATUS_INCOMPLETE):
        events = (*events, Event("Warning", api.REASON_STATUS_REFUSED, message))
    return replace(plan, status=status, patch=_diff(old, status), events=events)


def _invalid(obs: SweepObservation, old: dict[str, Any], reason: str, message: str) -> SweepPlan:
    meta = obs.sweep["metadata"]
    generation = int(meta.get("generation") or 0)
    invalid = cond.Condition(api.COND_INVALID, True, reason, message)
    conditions = cond.set_condition(
        tuple(old.get("conditions") or ()), invalid, generation, format_time(obs.now)
    )
    status = {
        **old,
        "phase": api.INVALID,
        "observedGeneration": generation,
        "conditions": [dict(c) for c in conditions],
    }
    events = (Event("Warning", reason, message),) if old.get("phase") != api.INVALID else ()
    return SweepPlan(status, _diff(old, status), events=events)


def _diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch turning `old` into `new` (None deletes; `counts` key by key)."""
    patch: dict[str, Any] = {}
    for key in FIELDS:
        if old.get(key) == new.get(key):
            continue
        if key == "counts":
            before, after = old.get(key) or {}, new.get(key) or {}
            patch[key] = {**dict.fromkeys(before), **after}
        else:
            patch[key] = new.get(key)
    return patch


def _patch(obs: SweepObservation, old, status) -> tuple[dict[str, Any], float | None]:
    """What to write now, and when to look again for figures held back."""
    patch = _diff(old, status)
    if not patch or patch.keys() - FIGURES or obs.written_at is None:
        return patch, None
    waited = (obs.now - obs.written_at).total_seconds()
    if waited >= STATUS_SECONDS:
        return patch, None
    return {}, STATUS_SECONDS - waited
