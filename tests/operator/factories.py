"""Small builders for operator tests: a valid experiment, its pods and Jobs, with overrides."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from typing import Any

from evokube_operator import api
from evokube_operator.reading.observe import JobFailure, JobView, PodView
from evokube_operator.reading.spec import Experiment

NOW = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
UID = "0000-uid"

BASE_SPEC: dict[str, Any] = {
    "image": "ghcr.io/evokube/trainer-cpu:0.1.0",
    "imagePullPolicy": "IfNotPresent",
    "seed": 0,
    "suspend": False,
    "algorithm": {"name": "openes"},
    "environment": {"name": "gymnax/Pendulum-v1"},
    "population": {"size": 64},
    "stopping": {"maxGenerations": 10},
    "accelerator": {"type": "cpu", "devicesPerHost": 1},
    "checkpoint": {"intervalGenerations": 10, "keep": 3},
    "maxRestarts": 3,
    "metricsPort": 9100,
    "coordinatorPort": 8476,
}
TPU = {"type": "tpu", "tpu": {"type": "tpu-v5-lite-podslice", "topology": "4x4", "chipsPerHost": 4}}
GPU = {"type": "gpu", "hosts": 2, "gpu": {"count": 8, "product": "nvidia-h100-80gb"}}


def spec(**overrides: Any) -> dict[str, Any]:
    out = copy.deepcopy(BASE_SPEC)
    out.update(copy.deepcopy(overrides))
    return out


def body(
    name: str = "demo",
    namespace: str = "ns",
    status: dict | None = None,
    generation: int = 1,
    resource_version: str = "100",
    uid: str = UID,
    **spec_overrides: Any,
) -> dict[str, Any]:
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "generation": generation,
            "resourceVersion": resource_version,
        },
        "spec": spec(**spec_overrides),
        "status": copy.deepcopy(status or {}),
    }


def experiment(**kwargs: Any) -> Experiment:
    return Experiment.from_body(body(**kwargs))


def pod(
    index: int,
    phase: str = "Running",
    *,
    attempt: int = 0,
    experiment: str = "demo",
    exit_code: int | None = None,
    disruption: str | None = None,
    job_uid: str = "job-uid-0",
    deletion_timestamp: datetime | None = None,
) -> PodView:
    job = f"{experiment}-{attempt}"
    return PodView(
        name=f"{job}-{index}-abcde",
        uid=f"pod-{attempt}-{index}",
        job_name=job,
        job_uid=job_uid,
        attempt=attempt,
        index=index,
        phase=phase,
        exit_code=exit_code,
        exit_message="",
        disruption=disruption,
        deleting=deletion_timestamp is not None,
        deletion_timestamp=deletion_timestamp,
    )


def gang(hosts: int, phase: str = "Running", attempt: int = 0, **kw: Any) -> tuple[PodView, ...]:
    return tuple(
        pod(i, phase, attempt=attempt, job_uid=f"job-uid-{attempt}", **kw) for i in range(hosts)
    )


def job(
    attempt: int = 0,
    *,
    experiment: str = "demo",
    complete: bool = False,
    failure: tuple[str, str] | None = None,
    suspended: bool = False,
    owner_uid: str | None = UID,
    completion_time: str | None = None,
) -> JobView:
    return JobView(
        name=f"{experiment}-{attempt}",
        uid=f"job-uid-{attempt}",
        attempt=attempt,
        suspended=suspended,
        complete=complete,
        failure=JobFailure(*failure) if failure else None,
        completion_time=completion_time,
        owner_uid=owner_uid,
    )


def running_status(attempt: int = 0, restarts: int = 0, preemptions: int | None = None, **kw):
    """The status an experiment has once attempt `attempt` runs on every host."""
    preemptions = attempt - restarts if preemptions is None else preemptions
    status = {
        "phase": api.RUNNING,
        "observedGeneration": 1,
        "hosts": 1,
        "restarts": restarts,
        "preemptions": preemptions,
        "startTime": "2026-01-02T03:00:00Z",
        "jobName": f"demo-{attempt}",
        "jobUID": f"job-uid-{attempt}",
        "coordinatorAddress": f"demo-{attempt}-0.demo:8476",
        "checkpointLocation": "/checkpoints",
        "conditions": [
            {
                "type": api.COND_RUNNING,
                "status": "True",
                "reason": api.REASON_ALL_HOSTS_RUNNING,
                "message": f"all 1 hosts of Job demo-{attempt} are running",
                "observedGeneration": 1,
                "lastTransitionTime": "2026-01-02T03:00:01Z",
            }
        ],
    }
    status.update(kw)
    return status
