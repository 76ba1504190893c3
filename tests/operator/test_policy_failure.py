"""The failure policy: what a failed host means for the gang (docs/architecture.md)."""

import pytest

from evokube_operator import api
from evokube_operator.rules import failure
from tests.operator.factories import job, pod

POLICY_MESSAGE = (
    "Container trainer for pod ns/demo-0-1-x failed with exit code 78"
    " matching FailJob rule at index {}"
)


@pytest.mark.parametrize(
    ("pods", "job_failure", "kind"),
    [
        ([pod(0), pod(1)], None, None),
        ([pod(0), pod(1, "Succeeded", exit_code=0)], None, None),
        ([pod(0), pod(1, "Failed", exit_code=75)], None, failure.RETRIABLE),
        ([pod(0), pod(1, "Failed", exit_code=137)], None, failure.RETRIABLE),
        ([pod(0), pod(1, "Failed", exit_code=1)], None, failure.RETRIABLE),
        ([pod(0), pod(1, "Failed")], None, failure.RETRIABLE),  # no exit code at all
        ([pod(0), pod(1, "Failed", exit_code=78)], None, failure.PERMANENT),
        # 78 wins over a retriable code elsewhere in the gang
        ([pod(0, "Failed", exit_code=75), pod(1, "Failed", exit_code=78)], None, failure.PERMANENT),
        ([pod(0, disruption="PreemptionByScheduler"), pod(1)], None, failure.DISRUPTION),
        # a preempted trainer exits 75 after SIGTERM: still a preemption
        (
            [pod(0, "Failed", exit_code=75, disruption="EvictionByEvictionAPI"), pod(1)],
            None,
            failure.DISRUPTION,
        ),
        # the pods are gone; the Job's condition tells
        (
            [],
            ("DeadlineExceeded", "Job was active longer than specified deadline"),
            failure.DEADLINE,
        ),
        (
            [],
            ("BackoffLimitExceeded", "Job has reached the specified backoff limit"),
            failure.RETRIABLE,
        ),
        (
            [],
            ("PodFailurePolicy", POLICY_MESSAGE.format(failure.RULE_PERMANENT_EXIT)),
            failure.PERMANENT,
        ),
        (
            [],
            ("PodFailurePolicy", POLICY_MESSAGE.format(failure.RULE_DISRUPTION)),
            failure.DISRUPTION,
        ),
    ],
)
def test_classify(pods, job_failure, kind):
    found = failure.classify(job(failure=job_failure), pods)
    assert (found.kind if found else None) == kind


def test_the_message_names_the_host_and_the_code():
    found = failure.classify(job(), [pod(0), pod(3, "Failed", exit_code=78)])
    assert found.message == "host 3 (pod demo-0-3-abcde) exited with code 78"


@pytest.mark.parametrize(
    ("kind", "restarts", "max_restarts", "restart", "counted", "reason"),
    [
        (failure.RETRIABLE, 0, 3, True, True, api.REASON_RETRIABLE_FAILURE),
        (failure.RETRIABLE, 2, 3, True, True, api.REASON_RETRIABLE_FAILURE),
        (failure.RETRIABLE, 3, 3, False, False, api.REASON_MAX_RESTARTS),
        (failure.RETRIABLE, 0, 0, False, False, api.REASON_MAX_RESTARTS),
        (failure.DISRUPTION, 3, 3, True, False, api.REASON_PREEMPTED),  # never runs out
        (failure.PERMANENT, 0, 3, False, False, api.REASON_PERMANENT_FAILURE),
        (failure.DEADLINE, 0, 3, False, False, api.REASON_DEADLINE),
    ],
)
def test_verdict(kind, restarts, max_restarts, restart, counted, reason):
    verdict = failure.verdict(failure.GangFailure(kind, "why"), restarts, max_restarts)
    assert (verdict.restart, verdict.counted, verdict.reason) == (restart, counted, reason)
    assert verdict.message.startswith("why")
