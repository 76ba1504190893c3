"""What a refusal by the API server means (policies/refusal.py): refused for good, or it may
pass; and how soon it is tried again. The messages are the API server's own (v1.37)."""

from datetime import timedelta

import pytest

from evokube_operator import api
from evokube_operator.rules.refusal import (
    RETRY_MAX_SECONDS,
    RETRY_MIN_SECONDS,
    Refusal,
    retry_after,
)
from evokube_operator.util import MESSAGE_LIMIT
from tests.operator.factories import NOW

QUOTA = (
    'jobs.batch "demo-0" is forbidden: exceeded quota: nojobs, requested: count/jobs.batch=1, '
    "used: count/jobs.batch=0, limited: count/jobs.batch=0"
)
POLICY = (
    "services \"demo\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' denied "
    "request: services are not allowed here"
)
RBAC = (
    'networkpolicies.networking.k8s.io is forbidden: User "system:serviceaccount:evokube-system:'
    'evokube-operator" cannot create resource "networkpolicies" in API group '
    '"networking.k8s.io" in the namespace "ns"'
)
ESCALATION = (
    'roles.rbac.authorization.k8s.io "demo-trainer" is forbidden: user "evokube-operator" '
    "is attempting to grant RBAC permissions not currently held"
)
WEBHOOK_DOWN = 'Internal error occurred: failed calling webhook "w.example.com": EOF'


@pytest.mark.parametrize(
    ("code", "message", "final"),
    [
        (422, 'Service "demo" is invalid: spec.ports[1]: Duplicate value', True),
        (422, POLICY, True),  # a policy whose reason is Invalid answers 422
        (400, "the object is malformed", True),
        (413, "request entity too large", True),
        (422, QUOTA, True),  # the code says the object itself is wrong, whatever the words
        (403, POLICY, True),
        (403, 'jobs.batch "x" is forbidden: no way', True),
        (403, QUOTA, False),
        (403, RBAC, False),
        (403, ESCALATION, False),
        (403, WEBHOOK_DOWN, False),
        (403, "something new", False),
    ],
)
def test_a_refusal_is_final_only_when_no_change_elsewhere_can_lift_it(code, message, final):
    refusal = Refusal("Job", "demo-0", code, message)
    assert refusal.final is final
    reason = api.REASON_CREATION_REFUSED if final else api.REASON_CREATION_FAILING
    assert refusal.reason == reason


def test_the_message_names_the_object_and_quotes_the_api_server_clipped():
    assert Refusal("Job", "demo-0", 403, QUOTA).message == (
        f"the API server refused Job demo-0: {QUOTA}"
    )
    long = Refusal("Service", "demo", 422, "x" * 5000).message
    assert len(long) == MESSAGE_LIMIT and long.endswith("...")


@pytest.mark.parametrize(
    ("blocked_for", "wait"),
    [
        (None, RETRY_MIN_SECONDS),
        (0, RETRY_MIN_SECONDS),
        (3, RETRY_MIN_SECONDS),
        (40, 40),
        (3600, RETRY_MAX_SECONDS),
    ],
)
def test_the_wait_is_as_long_as_the_experiment_has_been_blocked_within_bounds(blocked_for, wait):
    since = None if blocked_for is None else NOW - timedelta(seconds=blocked_for)
    assert retry_after(since, NOW) == wait
