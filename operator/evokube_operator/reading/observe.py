"""Small immutable summaries of the experiments, Jobs and pods the operator watches.

Kopf keeps these in its in-memory indices (handlers.py), so a reconcile reads
the state of a gang without a single API call. Only what the policies need is
kept: a pod is its attempt, index, phase, exit code, disruption, why it has not
started yet (a waiting trainer container, an unschedulable pod) and, once it
is being deleted, the time by which it should be gone; an experiment is its
identity, spec and the operator's part of its status, as compact JSON. Job
events are not watched: the reconciler lists a Job's FailedCreate events only
when decide asks (a gang that has fewer pods than hosts), as JobEvents.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from evokube_contract import sweep
from evokube_operator import api
from evokube_operator.reading.spec import identity, parse_time
from evokube_operator.util import plain


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _true_condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    return _condition(status, kind, "True")


def _condition(status: Mapping[str, Any], kind: str, value: str) -> Mapping[str, Any] | None:
    for condition in status.get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == value:
            return condition
    return None


# What the trainer writes into status, which the operator never reads (docs/architecture.md).
TRAINER_STATUS = ("progress", "result")


@dataclass(frozen=True)
class ExperimentView:
    """What the operator keeps of an experiment between reconciles (issue 22: a thousand
    experiments of the largest admitted size must fit the chart's memory limit).

    Only what a reconcile reads: identity, deletion, spec, and status without the trainer's
    fields. Metadata the operator never reads (labels, annotations: up to 256 KiB,
    managedFields) is dropped, and spec and status are kept as one compact JSON document,
    a third of the memory of the same dicts and lists; `body()` parses it for each reconcile.
    """

    name: str
    namespace: str
    uid: str
    generation: int
    resource_version: str
    deletion_timestamp: str | None
    document: bytes  # {"spec": ..., "status": ...} as UTF-8 JSON

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ExperimentView:
        status = {k: v for k, v in (body.get("status") or {}).items() if k not in TRAINER_STATUS}
        document = {"spec": body.get("spec") or {}, "status": status}
        return cls(
            **identity(body),
            deletion_timestamp=(body.get("metadata") or {}).get("deletionTimestamp"),
            document=json.dumps(
                document, separators=(",", ":"), ensure_ascii=False, default=dict
            ).encode(),
        )

    def body(self) -> dict[str, Any]:
        """A fresh object shaped like the API server's, with what the view kept."""
        metadata: dict[str, Any] = {
            "name": self.name,
            "namespace": self.namespace,
            "uid": self.uid,
            "generation": self.generation,
            "resourceVersion": self.resource_version,
        }
        if self.deletion_timestamp:
            metadata["deletionTimestamp"] = self.deletion_timestamp
        return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": metadata} | (
            json.loads(self.document)
        )

    def inputs(self) -> bytes:
        """A digest of what a reconcile decides on: all but the resourceVersion, which every
        write moves (the trainer's progress patches included)."""
        identity = f"{self.uid}\0{self.generation}\0{self.deletion_timestamp}\0".encode()
        return hashlib.sha256(identity + self.document).digest()


@dataclass(frozen=True)
class PodView:
    name: str
    uid: str
    job_name: str | None
    job_uid: str | None
    attempt: int | None
    index: int | None
    phase: str  # Pending | Running | Succeeded | Failed | Unknown
    exit_code: int | None = None
    exit_message: str = ""
    disruption: str | None = None  # reason of a DisruptionTarget=True condition
    node: str | None = None
    deleting: bool = False
    # metadata.deletionTimestamp: the delete request's time plus the grace period, that is
    # when the pod should be gone (None while not deleted, or if it cannot be parsed).
    deletion_timestamp: datetime | None = None
    # The trainer container has not started: the kubelet's reason (ErrImagePull, ...) and message.
    waiting_reason: str | None = None
    waiting_message: str = ""
    started_at: datetime | None = None  # status.startTime: the kubelet took the pod on
    # PodScheduled=False with reason Unschedulable: since when, and the scheduler's message.
    unschedulable_since: datetime | None = None
    unschedulable_message: str = ""
    created_at: datetime | None = None
    # A multislice pod's slice (JobSet's job index); its index counts within the slice, and its
    # job_name and job_uid are the JobSet's, the gang's. None: the gang's one Job.
    slice: int | None = None

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> PodView:
        meta = body.get("metadata") or {}
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        status = body.get("status") or {}
        exit_code, message, waiting = None, "", {}
        for container in status.get("containerStatuses") or []:
            if container.get("name") != api.CONTAINER:
                continue
            state = container.get("state") or {}
            terminated = state.get("terminated")
            if terminated:
                exit_code = _int_or_none(terminated.get("exitCode"))
                message = (terminated.get("message") or terminated.get("reason") or "").strip()
            waiting = state.get("waiting") or {}
        disrupted = _true_condition(status, api.DISRUPTION_TARGET)
        unscheduled = _condition(status, "PodScheduled", "False")
        if unscheduled is not None and unscheduled.get("reason") != "Unschedulable":
            unscheduled = None
        return cls(
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            job_name=labels.get(api.JOBSET_NAME_LABEL)
            or labels.get(api.JOB_NAME_LABEL)
            or labels.get("job-name"),
            job_uid=labels.get(api.JOBSET_UID_LABEL)
            or labels.get(api.JOB_UID_LABEL)
            or labels.get("controller-uid"),
            attempt=_int_or_none(labels.get(api.LABEL_ATTEMPT)),
            index=_int_or_none(annotations.get(api.COMPLETION_INDEX_ANNOTATION)),
            phase=status.get("phase") or "Pending",
            exit_code=exit_code,
            exit_message=message[-500:],
            disruption=(disrupted.get("reason") or api.DISRUPTION_TARGET) if disrupted else None,
            node=(body.get("spec") or {}).get("nodeName"),
            deleting=bool(meta.get("deletionTimestamp")),
            deletion_timestamp=parse_time(meta.get("deletionTimestamp")),
            created_at=parse_time(meta.get("creationTimestamp")),
            waiting_reason=waiting.get("reason") or None,
            waiting_message=(waiting.get("message") or "").strip()[:500],
            started_at=parse_time(status.get("startTime")),
            unschedulable_since=parse_time(unscheduled.get("lastTransitionTime"))
            if unscheduled
            else None,
            unschedulable_message=(unscheduled.get("message") or "").strip()[:500]
            if unscheduled
            else "",
            slice=_int_or_none(labels.get(api.JOB_INDEX_LABEL)),
        )

    @property
    def host_key(self) -> tuple[int, int] | None:
        """Which host of the gang this pod is: (slice, index); None before it has an index."""
        return None if self.index is None else (self.slice or 0, self.index)

    @property
    def host(self) -> str:
        index = "?" if self.index is None else self.index
        where = "" if self.slice is None else f"slice {self.slice} "
        return f"{where}host {index} (pod {self.name})"


@dataclass(frozen=True)
class JobFailure:
    reason: str
    message: str


@dataclass(frozen=True)
class JobView:
    """A gang's Job, or a multislice gang's JobSet (kind JobSet: its conditions read the same)."""

    name: str
    uid: str
    attempt: int | None
    suspended: bool = False
    complete: bool = False
    failure: JobFailure | None = None
    completion_time: str | None = None
    deleting: bool = False
    owner_uid: str | None = None  # uid of the controlling ERLExperiment
    created_at: datetime | None = None
    # When the Job was last unsuspended (Kueue's admission): deleted pods created before belong
    # to a gang that Kueue evicted, and their exits are not failures of this one.
    resumed_at: datetime | None = None
    kind: str = "Job"

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> JobView:
        meta = body.get("metadata") or {}
        status = body.get("status") or {}
        # FailureTarget comes first (1.31+): the Job is decided to fail, pods still stopping.
        failed = _true_condition(status, "Failed") or _true_condition(status, "FailureTarget")
        owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
        return cls(
            name=meta.get("name", ""),
            uid=meta.get("uid", ""),
            attempt=_int_or_none((meta.get("labels") or {}).get(api.LABEL_ATTEMPT)),
            suspended=bool((body.get("spec") or {}).get("suspend")),
            # A JobSet's is Completed.
            complete=(_true_condition(status, "Complete") or _true_condition(status, "Completed"))
            is not None,
            failure=JobFailure(failed.get("reason") or "", failed.get("message") or "")
            if failed
            else None,
            completion_time=status.get("completionTime"),
            deleting=bool(meta.get("deletionTimestamp")),
            owner_uid=owner.get("uid") if owner else None,
            created_at=parse_time(meta.get("creationTimestamp")),
            resumed_at=parse_time(
                (_condition(status, "Suspended", "False") or {}).get("lastTransitionTime")
            ),
            kind=body.get("kind") or "Job",
        )


@dataclass(frozen=True)
class QueueView:
    """What Kueue says about a Job's Workload: why it waits, and why it was last evicted."""

    found: bool  # False: no Workload for the Job (Kueue absent, or not there yet)
    reason: str = ""
    message: str = ""
    evicted: str = ""  # while Evicted=True: "<reason>: <message>"

    @classmethod
    def from_workloads(cls, bodies: list[Mapping[str, Any]]) -> QueueView:
        if not bodies:
            return cls(False)
        status = bodies[0].get("status") or {}
        evicted = _true_condition(status, "Evicted")
        why = (
            f"{evicted.get('reason') or 'Evicted'}: {evicted.get('message') or ''}"
            if evicted
            else ""
        )
        waiting = _condition(status, "QuotaReserved", "False") or _condition(
            status, "Admitted", "False"
        )
        if waiting is None:
            return cls(True, "Pending", "the Workload waits for Kueue", why.strip(": ")[:500])
        return cls(
            True,
            waiting.get("reason") or "Pending",
            (waiting.get("message") or "").strip()[:500],
            why.strip(": ")[:500],
        )


@dataclass(frozen=True)
class JobEvent:
    """A core/v1 Event about a Job (the Job controller's FailedCreate, say)."""

    reason: str
    message: str
    last_seen: datetime | None = None

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> JobEvent:
        series = body.get("series") or {}
        seen = (
            series.get("lastObservedTime")
            or body.get("lastTimestamp")
            or body.get("eventTime")
            or (body.get("metadata") or {}).get("creationTimestamp")
        )
        return cls(
            reason=body.get("reason") or "",
            message=(body.get("message") or body.get("note") or "").strip(),
            last_seen=parse_time(seen),
        )


def gang_pods(job: JobView, pods: tuple[PodView, ...] | list[PodView]) -> list[PodView]:
    """The pods of this very Job (not of an earlier Job that had the same name)."""
    return [
        p
        for p in pods
        if p.job_name == job.name and (not p.job_uid or not job.uid or p.job_uid == job.uid)
    ]


@dataclass(frozen=True)
class SweepChildView:
    """What a sweep keeps of a child ERLExperiment: whose it is, and what `summarize` reads
    (its index, assignment, phase and per-seed outcome), not its spec."""

    name: str
    owner_uid: str | None  # the controller ownerReference's uid
    index: str  # SWEEP_INDEX_LABEL
    assignment: str | None  # SWEEP_ASSIGNMENT_ANNOTATION, compact JSON
    phase: str | None
    seeds: bytes  # status.progress.seeds as compact JSON

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> SweepChildView:
        meta = body.get("metadata") or {}
        status = body.get("status") or {}
        seeds = (status.get("progress") or {}).get("seeds") or []
        owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), {})
        return cls(
            name=meta["name"],
            owner_uid=owner.get("uid"),
            index=(meta.get("labels") or {}).get(sweep.SWEEP_INDEX_LABEL, ""),
            assignment=(meta.get("annotations") or {}).get(sweep.SWEEP_ASSIGNMENT_ANNOTATION),
            phase=status.get("phase"),
            seeds=json.dumps(seeds, separators=(",", ":"), default=dict).encode(),
        )

    def body(self) -> dict[str, Any]:
        """The child as `summarize` reads it."""
        metadata: dict[str, Any] = {
            "name": self.name,
            "labels": {sweep.SWEEP_INDEX_LABEL: self.index},
        }
        if self.assignment is not None:
            metadata["annotations"] = {sweep.SWEEP_ASSIGNMENT_ANNOTATION: self.assignment}
        status: dict[str, Any] = {"progress": {"seeds": json.loads(self.seeds)}}
        if self.phase:
            status["phase"] = self.phase
        return {"metadata": metadata, "status": status}


def sweep_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """A sweep as its controller reads it: identity, spec and status (no managedFields)."""
    meta = body.get("metadata") or {}
    kept = ("name", "namespace", "uid", "generation", "resourceVersion", "deletionTimestamp")
    return {
        "apiVersion": api.API_VERSION,
        "kind": sweep.SWEEP_KIND,
        "metadata": {k: meta[k] for k in kept if k in meta},
        "spec": plain(body.get("spec") or {}),
        "status": plain(body.get("status") or {}),
    }
