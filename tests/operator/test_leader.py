"""Leader election's pure decisions: who may take the Lease, how long a leader may write."""

from datetime import UTC, datetime

import pytest
from kubernetes.client import ApiClient, Configuration

from evokube_operator.cluster.kube import ApiError
from evokube_operator.cluster.leader import (
    FencedKube,
    LeaderElection,
    NotLeading,
    claimed,
    holder,
    may_take,
    released,
    still_leading,
)

ME, OTHER = "op-a-1234", "op-b-5678"
NOW = datetime(2026, 12, 3, 8, 0, 0, 500000, tzinfo=UTC)


def lease(holder_identity=OTHER, duration=15, version="7", transitions=2):
    spec = {"leaseDurationSeconds": duration, "leaseTransitions": transitions}
    if holder_identity is not None:
        spec["holderIdentity"] = holder_identity
    return {
        "metadata": {"name": "evokube-operator", "namespace": "ops", "resourceVersion": version},
        "spec": spec,
    }


@pytest.mark.parametrize(
    ("body", "first_seen", "now", "may"),
    [
        (None, 0.0, 0.0, True),  # no Lease yet: create it
        (lease(holder_identity=None), 100.0, 100.0, True),  # released on a clean stop
        (lease(holder_identity=""), 100.0, 100.0, True),
        (lease(holder_identity=ME), 100.0, 100.0, True),  # ours: renew
        (lease(), 100.0, 114.9, False),  # held, renewed within the lease duration
        (lease(), 100.0, 115.0, True),  # unchanged for leaseDurationSeconds: the holder is gone
        (lease(duration=3), 100.0, 102.0, False),  # the Lease's own duration counts
        (lease(duration=3), 100.0, 103.5, True),
    ],
)
def test_who_may_take_the_lease(body, first_seen, now, may):
    assert may_take(body, ME, first_seen, now) is may


@pytest.mark.parametrize(
    ("renewed_at", "now", "leading"),
    [(None, 5.0, False), (100.0, 100.0, True), (100.0, 109.9, True), (100.0, 110.0, False)],
)
def test_a_leader_may_write_only_until_the_renew_deadline(renewed_at, now, leading):
    assert still_leading(renewed_at, now, renew_deadline=10.0) is leading


def test_taking_a_lease_from_another_holder_counts_a_transition_and_keeps_its_version():
    election = LeaderElection(namespace="ops", lease_duration=15.4)
    body = claimed(lease(), ME, election, NOW)
    assert body["metadata"]["resourceVersion"] == "7"  # the update is guarded by it
    assert body["spec"] == {
        "holderIdentity": ME,
        "leaseDurationSeconds": 15,
        "acquireTime": "2026-12-03T08:00:00.500000Z",
        "renewTime": "2026-12-03T08:00:00.500000Z",
        "leaseTransitions": 3,
    }


def test_renewing_moves_only_the_renew_time():
    election = LeaderElection(namespace="ops")
    mine = lease(holder_identity=ME)
    mine["spec"]["acquireTime"] = "2026-12-03T07:00:00.000000Z"
    body = claimed(mine, ME, election, NOW)
    assert body["spec"]["acquireTime"] == "2026-12-03T07:00:00.000000Z"
    assert body["spec"]["renewTime"] == "2026-12-03T08:00:00.500000Z"
    assert body["spec"]["leaseTransitions"] == 2


def test_a_new_lease_names_itself_and_starts_with_no_transitions():
    election = LeaderElection(namespace="ops", name="mine")
    body = claimed(None, ME, election, NOW)
    assert body["metadata"] == {"name": "mine", "namespace": "ops"}
    assert (body["kind"], body["apiVersion"]) == ("Lease", "coordination.k8s.io/v1")
    assert body["spec"]["leaseTransitions"] == 0 and holder(body) == ME


def test_a_released_lease_has_no_holder_and_keeps_its_version():
    body = released(lease(holder_identity=ME))
    assert holder(body) == "" and "holderIdentity" not in body["spec"]
    assert body["metadata"]["resourceVersion"] == "7"


@pytest.mark.parametrize(
    ("duration", "deadline", "retry"), [(15, 15, 2), (15, 10, 10), (15, 10, 0), (3, 5, 1)]
)
def test_timings_that_could_let_two_replicas_act_are_refused(duration, deadline, retry):
    with pytest.raises(ValueError):
        LeaderElection(lease_duration=duration, renew_deadline=deadline, retry_period=retry)


def test_without_the_lease_every_write_is_refused_before_it_is_sent():
    """No API server listens at port 1: a request that were sent would fail with status 0."""
    configuration = Configuration(host="http://127.0.0.1:1")
    kube = FencedKube(ApiClient(configuration), timeout=1, may_write=lambda: False)
    job = {"kind": "Job", "metadata": {"name": "x-0", "namespace": "ns"}}
    experiment = {"metadata": {"name": "x", "namespace": "ns", "uid": "u"}}
    writes = [
        lambda: kube.apply(job),
        lambda: kube.create(job),
        lambda: kube.delete("Job", "ns", "x-0"),
        lambda: kube.patch_status("ns", "x", {"phase": "Running"}, "7"),
        lambda: kube.post_event(experiment, "Normal", "JobCreated", "created"),
    ]
    try:
        for write in writes:
            with pytest.raises(NotLeading):
                write()
        with pytest.raises(ApiError) as err:  # reads still go out
            kube.get("Job", "ns", "x-0")
        assert err.value.status == 0
    finally:
        kube.close()
