"""What a failed gang means, following the exit-code contract of docs/architecture.md.

A jax.distributed group cannot take a replacement host, so any failure of
any host ends the whole attempt. What happens next depends on why:

| observed on a pod of the current Job | verdict |
|---|---|
| exit code 78 (permanent) | the experiment fails at once |
| condition DisruptionTarget (evicted, preempted) | gang restart, not counted |
| any other non-zero exit (75, 137, ...) | gang restart, counted against maxRestarts |

Exit code 78 wins over a disruption, which wins over other codes: a
preempted trainer gets SIGTERM and exits 75, and that must not count. When
the pods are already gone, the Job's Failed condition says which rule of its
pod failure policy fired.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from evokube_operator import api
from evokube_operator.reading.observe import JobView, PodView

PERMANENT = "permanent"
DISRUPTION = "disruption"
RETRIABLE = "retriable"
DEADLINE = "deadline"

# Indices of the Job's pod failure policy rules (pod_failure_policy); read back from the Job's
# Failed condition when the pods themselves are gone.
RULE_PERMANENT_EXIT = 0
RULE_DISRUPTION = 1
_RULE_INDEX = re.compile(r"rule at index (\d+)")


def pod_failure_policy() -> dict[str, Any]:
    """Exit code 78 and disruptions fail the Job at once, with a reason saying which.

    Any other failure fails it too (backoffLimit 0): a jax.distributed group
    cannot take a replacement host, so the operator restarts the whole gang.
    """
    rules: list[dict[str, Any]] = [{}, {}]
    rules[RULE_PERMANENT_EXIT] = {
        "action": "FailJob",
        "onExitCodes": {
            "containerName": api.CONTAINER,
            "operator": "In",
            "values": [api.EXIT_PERMANENT],
        },
    }
    rules[RULE_DISRUPTION] = {
        "action": "FailJob",
        "onPodConditions": [{"type": api.DISRUPTION_TARGET, "status": "True"}],
    }
    return {"rules": rules}


@dataclass(frozen=True)
class GangFailure:
    kind: str  # PERMANENT | DISRUPTION | RETRIABLE | DEADLINE
    message: str


def _exit_message(pod: PodView) -> str:
    detail = f": {pod.exit_message}" if pod.exit_message else ""
    if pod.exit_code is None:
        return f"{pod.host} failed without an exit code{detail}"
    return f"{pod.host} exited with code {pod.exit_code}{detail}"


def classify(job: JobView, pods: Sequence[PodView]) -> GangFailure | None:
    """Why the gang of `job` (with its `pods`) failed, or None while it has not."""
    failed = [p for p in pods if p.phase == "Failed"]
    for pod in failed:
        if pod.exit_code == api.EXIT_PERMANENT:
            return GangFailure(PERMANENT, _exit_message(pod))
    for pod in pods:
        if pod.disruption:
            return GangFailure(DISRUPTION, f"{pod.host} was disrupted ({pod.disruption})")
    if failed:
        return GangFailure(RETRIABLE, _exit_message(failed[0]))
    if job.failure is None:
        return None
    return _from_job_condition(job)


def _from_job_condition(job: JobView) -> GangFailure:
    failure = job.failure
    assert failure is not None
    text = f"Job {job.name} failed ({failure.reason}): {failure.message}".rstrip(": ")
    if failure.reason == "DeadlineExceeded":
        return GangFailure(DEADLINE, text)
    if failure.reason == "PodFailurePolicy":
        match = _RULE_INDEX.search(failure.message)
        rule = int(match.group(1)) if match else None
        if rule == RULE_PERMANENT_EXIT:
            return GangFailure(PERMANENT, text)
        if rule == RULE_DISRUPTION:
            return GangFailure(DISRUPTION, text)
    return GangFailure(RETRIABLE, text)


@dataclass(frozen=True)
class Verdict:
    restart: bool  # True: start a new attempt; False: the experiment fails
    counted: bool  # the restart counts against maxRestarts
    reason: str
    message: str


def verdict(failure: GangFailure, restarts: int, max_restarts: int) -> Verdict:
    """What to do about a failed gang, given the restarts used so far."""
    if failure.kind == PERMANENT:
        return Verdict(False, False, api.REASON_PERMANENT_FAILURE, failure.message)
    if failure.kind == DEADLINE:
        return Verdict(False, False, api.REASON_DEADLINE, failure.message)
    if failure.kind == DISRUPTION:
        return Verdict(True, False, api.REASON_PREEMPTED, failure.message)
    if restarts < max_restarts:
        message = f"{failure.message}; gang restart {restarts + 1} of {max_restarts}"
        return Verdict(True, True, api.REASON_RETRIABLE_FAILURE, message)
    message = f"{failure.message}; all {max_restarts} restarts used"
    return Verdict(False, False, api.REASON_MAX_RESTARTS, message)
