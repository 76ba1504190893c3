"""Why the pods of a gang cannot be created or cannot start, and whether that may pass.

Asked only while the current Job's gang is not all running. Each cause is said
where it happens: the Job controller posts a FailedCreate event when the API
server refuses a pod, the kubelet sets the trainer container's waiting state,
the scheduler sets the condition PodScheduled=False.

| observed | verdict |
|---|---|
| FailedCreate: refused for good (PodSecurity, a policy said no: rules/refusal.py) | Failed |
| FailedCreate: may pass (a ResourceQuota, a ServiceAccount not found yet, ...) | Blocked |
| trainer waiting: InvalidImageName | Failed |
| trainer waiting: ErrImagePull, ImagePullBackOff, ErrImageNeverPull | Blocked, then Failed |
| trainer waiting: CreateContainerConfigError, CreateContainerError | Blocked |
| PodScheduled=False (Unschedulable) for longer than the timeout | Blocked, never Failed |
| PodScheduled=False, within the timeout | waits: the scheduler's message in `waiting` |

The reasons: PodCreationRefused / PodCreationFailing, InvalidImage,
ImagePullBackOff (Failed once the pod started more than the image-pull timeout
ago), ContainerConfigError, Unschedulable.

A final cause anywhere wins over a blocking one; among equals, Job events come
first, then the pods by host index. Unschedulable is never final: a cluster
autoscaler or Kueue may still bring the nodes. An image that has not pulled for
the whole timeout is taken to never pull (a wrong name or tag, missing pull
credentials), as the experiment cannot start without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from evokube_operator import api
from evokube_operator.reading.observe import JobEvent, PodView
from evokube_operator.rules import refusal
from evokube_operator.util import clip

FAILED_CREATE = "FailedCreate"  # the Job controller's event when a pod is refused
IMAGE_PULL_WAITS = frozenset({"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull"})
CONFIG_WAITS = frozenset({"CreateContainerConfigError", "CreateContainerError"})


@dataclass(frozen=True)
class Timeouts:
    """How long a cause that may still pass is waited for (operator flags)."""

    image_pull: float = 600.0  # then the experiment fails
    unschedulable: float = 300.0  # then the experiment is Blocked


DEFAULT_TIMEOUTS = Timeouts()


@dataclass(frozen=True)
class Problem:
    final: bool  # True: the experiment fails; False: Blocked, and it waits on
    reason: str
    message: str


@dataclass(frozen=True)
class Diagnosis:
    problem: Problem | None = None
    recheck_after: float | None = None  # seconds until a timeout may change the verdict
    # No problem (yet), but what the gang waits for: an unschedulable pod within its timeout.
    # The Running condition says it, so `kubectl describe` tells why a gang stays Pending.
    waiting: str | None = None


def missing_pods(pods: Sequence[PodView], hosts: int) -> bool:
    """Fewer pods than hosts: the Job controller may be failing to create some."""
    return sum(1 for p in pods if not p.deleting) < hosts


def diagnose(
    events: Sequence[JobEvent], pods: Sequence[PodView], now: datetime, timeouts: Timeouts
) -> Diagnosis:
    found: list[Problem] = []
    waits: list[float] = []
    refused = _refused_creation(events)
    if refused is not None:
        found.append(refused)
    live = sorted((p for p in pods if not p.deleting), key=lambda p: (p.index is None, p.host_key))
    for pod in live:
        problem, wait = _pod_problem(pod, now, timeouts)
        if problem is not None:
            found.append(problem)
        if wait is not None:
            waits.append(wait)
    problem = next((p for p in found if p.final), found[0] if found else None)
    unscheduled = [p for p in live if p.unschedulable_since is not None]
    waiting = None
    if problem is None and unscheduled:
        first = unscheduled[0]
        waiting = clip(f"{first.host} is not scheduled yet: {first.unschedulable_message}")
    return Diagnosis(problem, min(waits, default=None), waiting)


def _refused_creation(events: Sequence[JobEvent]) -> Problem | None:
    failed = [e for e in events if e.reason == FAILED_CREATE]
    if not failed:
        return None
    latest = max(failed, key=lambda e: (e.last_seen is not None, e.last_seen))
    final = refusal.final(latest.message)
    reason = api.REASON_POD_CREATION_REFUSED if final else api.REASON_POD_CREATION_FAILING
    return Problem(final, reason, clip(f"the trainer pods cannot be created: {latest.message}"))


def _pod_problem(
    pod: PodView, now: datetime, timeouts: Timeouts
) -> tuple[Problem | None, float | None]:
    """(what is wrong with this pod, seconds until its timeout runs out)."""
    detail = f"{pod.host}: {pod.waiting_message or pod.waiting_reason}"
    if pod.waiting_reason == "InvalidImageName":
        return Problem(True, api.REASON_INVALID_IMAGE, clip(detail)), None
    if pod.waiting_reason in IMAGE_PULL_WAITS:
        left = _left(pod.started_at, timeouts.image_pull, now)
        if left is not None and left <= 0:
            message = f"{detail} (no image after {timeouts.image_pull:g}s)"
            return Problem(True, api.REASON_IMAGE_PULL_BACKOFF, clip(message)), None
        return Problem(False, api.REASON_IMAGE_PULL_BACKOFF, clip(detail)), left
    if pod.waiting_reason in CONFIG_WAITS:
        return Problem(False, api.REASON_CONTAINER_CONFIG_ERROR, clip(detail)), None
    if pod.unschedulable_since is not None:
        left = _left(pod.unschedulable_since, timeouts.unschedulable, now)
        if left is not None and left > 0:
            return None, left
        message = f"{pod.host} cannot be scheduled: {pod.unschedulable_message}"
        return Problem(False, api.REASON_UNSCHEDULABLE, clip(message)), None
    return None, None


def _left(since: datetime | None, timeout: float, now: datetime) -> float | None:
    """Seconds left of `timeout` counted from `since` (None when `since` is not known)."""
    return None if since is None else timeout - (now - since).total_seconds()
