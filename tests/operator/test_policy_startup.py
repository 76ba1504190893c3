"""Pods that cannot be created or cannot start (policies/startup.py), and what decide and the
reconciler make of them: a Blocked condition that clears, or phase Failed."""

from dataclasses import replace
from datetime import timedelta

import pytest

from evokube_operator import api
from evokube_operator.conditions import find
from evokube_operator.plans.decide import (
    JOB_EVENTS_GRACE_SECONDS,
    JOB_EVENTS_REQUEUE_SECONDS,
    READ_JOB_EVENTS,
    READ_QUEUE,
    Observation,
    Read,
    decide,
)
from evokube_operator.reading.observe import JobEvent, PodView
from evokube_operator.reading.spec import Experiment
from evokube_operator.reconcilers.reconcile import Reconciler
from evokube_operator.rules import startup
from evokube_operator.util import MESSAGE_LIMIT
from tests.operator.factories import NOW, body, job, pod
from tests.operator.test_reconcile import KEY, FakeKube

TIMEOUTS = startup.Timeouts(image_pull=600, unschedulable=300)
QUOTA = (
    'Error creating: pods "demo-0-0-x" is forbidden: exceeded quota: q, requested: pods=1, '
    "used: pods=0, limited: pods=0"
)
POD_SECURITY = (
    'Error creating: pods "demo-0-0-x" is forbidden: violates PodSecurity "restricted:latest": '
    'runAsNonRoot != true (pod or container "trainer" must set securityContext.runAsNonRoot=true)'
)
NEW_QUOTA = 'Error creating: pods "demo-0-0-x" is forbidden: status unknown for quota: q'
PRIORITY = (
    'Error creating: pods "demo-0-0-x" is forbidden: no PriorityClass with name nope was found'
)
INVALID = 'Error creating: Pod "demo-0-0-x" is invalid: spec.containers[0].image: Required value'
WEBHOOK_DENIED = 'Error creating: admission webhook "policy.example.com" denied the request: no'
POLICY_DENIED = (
    "Error creating: pods \"demo-0-0-x\" is forbidden: ValidatingAdmissionPolicy 'p' with "
    "binding 'b' denied request: no"
)
WEBHOOK_DOWN = (
    'Error creating: Internal error occurred: failed calling webhook "policy.example.com": '
    "connection refused"
)
NO_ACCOUNT = (
    'Error creating: pods "demo-0-0-x" is forbidden: error looking up service account '
    'ns/demo-trainer: serviceaccount "demo-trainer" not found'
)


def created(message, ago=0.0, reason=startup.FAILED_CREATE):
    return JobEvent(reason, message, NOW - timedelta(seconds=ago))


def waiting(index, reason, message="", started_ago=None):
    started = None if started_ago is None else NOW - timedelta(seconds=started_ago)
    return replace(
        pod(index, "Pending"), waiting_reason=reason, waiting_message=message, started_at=started
    )


def unschedulable(index, ago, message="0/5 nodes are available: 5 node(s) didn't match"):
    return replace(
        pod(index, "Pending"),
        unschedulable_since=NOW - timedelta(seconds=ago),
        unschedulable_message=message,
    )


BLOCKED, FAILED = False, True


@pytest.mark.parametrize(
    ("events", "pods", "verdict", "reason"),
    [
        ([], [pod(0), pod(1)], None, None),
        ([], [pod(0, "Pending")], None, None),  # pulling, created, scheduled: nothing wrong yet
        ([created(QUOTA)], [], BLOCKED, api.REASON_POD_CREATION_FAILING),
        ([created(NO_ACCOUNT)], [], BLOCKED, api.REASON_POD_CREATION_FAILING),
        ([created(NEW_QUOTA)], [], BLOCKED, api.REASON_POD_CREATION_FAILING),
        ([created(WEBHOOK_DOWN)], [], BLOCKED, api.REASON_POD_CREATION_FAILING),
        ([created("Error creating: etcdserver: request timed out")], [], BLOCKED,
         api.REASON_POD_CREATION_FAILING),
        ([created(POD_SECURITY)], [], FAILED, api.REASON_POD_CREATION_REFUSED),
        ([created(PRIORITY)], [], FAILED, api.REASON_POD_CREATION_REFUSED),
        ([created(INVALID)], [], FAILED, api.REASON_POD_CREATION_REFUSED),
        ([created(WEBHOOK_DENIED)], [], FAILED, api.REASON_POD_CREATION_REFUSED),
        ([created(POLICY_DENIED)], [], FAILED, api.REASON_POD_CREATION_REFUSED),
        # the newest FailedCreate decides: the quota was the old story
        ([created(QUOTA, ago=30), created(POD_SECURITY)], [], FAILED,
         api.REASON_POD_CREATION_REFUSED),
        ([created(POD_SECURITY, ago=30), created(QUOTA)], [], BLOCKED,
         api.REASON_POD_CREATION_FAILING),
        ([created("Created pod: demo-0-0-x", reason="SuccessfulCreate")], [], None, None),
        ([], [waiting(0, "InvalidImageName", "Failed to apply default image tag")], FAILED,
         api.REASON_INVALID_IMAGE),
        ([], [waiting(0, "ImagePullBackOff", started_ago=60)], BLOCKED,
         api.REASON_IMAGE_PULL_BACKOFF),
        ([], [waiting(0, "ErrImagePull", started_ago=601)], FAILED, api.REASON_IMAGE_PULL_BACKOFF),
        ([], [waiting(0, "ErrImageNeverPull", started_ago=601)], FAILED,
         api.REASON_IMAGE_PULL_BACKOFF),
        ([], [waiting(0, "ImagePullBackOff")], BLOCKED, api.REASON_IMAGE_PULL_BACKOFF),  # no start
        ([], [waiting(0, "CreateContainerConfigError", 'secret "s" not found')], BLOCKED,
         api.REASON_CONTAINER_CONFIG_ERROR),
        ([], [waiting(0, "ContainerCreating")], None, None),
        ([], [unschedulable(0, ago=299)], None, None),
        ([], [unschedulable(0, ago=300)], BLOCKED, api.REASON_UNSCHEDULABLE),
        ([], [unschedulable(0, ago=86400)], BLOCKED, api.REASON_UNSCHEDULABLE),  # never Failed
        # a final cause anywhere wins over a blocking one
        ([created(QUOTA)], [waiting(1, "InvalidImageName")], FAILED, api.REASON_INVALID_IMAGE),
        ([], [unschedulable(0, ago=900), waiting(1, "InvalidImageName")], FAILED,
         api.REASON_INVALID_IMAGE),
        # a pod on its way out says nothing about the gang
        ([], [replace(waiting(0, "InvalidImageName"), deleting=True)], None, None),
    ],
)  # fmt: skip
def test_diagnose(events, pods, verdict, reason):
    problem = startup.diagnose(events, pods, NOW, TIMEOUTS).problem
    assert (problem.final if problem else None, problem.reason if problem else None) == (
        verdict,
        reason,
    )


def test_the_message_names_the_host_and_quotes_the_cause_clipped():
    problem = startup.diagnose([], [unschedulable(1, 900, "x" * 2000)], NOW, TIMEOUTS).problem
    assert problem.message.startswith("host 1 (pod demo-0-1-abcde) cannot be scheduled: xxx")
    assert len(problem.message) == MESSAGE_LIMIT and problem.message.endswith("...")
    problem = startup.diagnose([created(PRIORITY)], [], NOW, TIMEOUTS).problem
    assert problem.message == f"the trainer pods cannot be created: {PRIORITY}"


@pytest.mark.parametrize(
    ("pods", "recheck"),
    [
        ([pod(0)], None),
        ([waiting(0, "ImagePullBackOff", started_ago=100)], 500),
        ([unschedulable(0, ago=100)], 200),
        ([unschedulable(0, ago=100), waiting(1, "ErrImagePull", started_ago=500)], 100),
        ([unschedulable(0, ago=400)], None),  # run out: Blocked, nothing more to wait for
    ],
)
def test_diagnose_says_when_a_timeout_runs_out(pods, recheck):
    assert startup.diagnose([], pods, NOW, TIMEOUTS).recheck_after == recheck


def test_missing_pods_does_not_count_pods_on_their_way_out():
    assert startup.missing_pods([pod(0)], 2)
    assert not startup.missing_pods([pod(0), pod(1)], 2)
    assert startup.missing_pods([pod(0), replace(pod(1), deleting=True)], 2)


def test_a_pod_body_keeps_why_it_has_not_started():
    view = PodView.from_body(
        {
            "metadata": {"name": "demo-0-0-x", "labels": {}, "annotations": {}},
            "status": {
                "phase": "Pending",
                "startTime": "2026-01-02T03:00:00Z",
                "conditions": [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": "Unschedulable",
                        "message": "0/3 nodes are available",
                        "lastTransitionTime": "2026-01-02T03:00:01Z",
                    }
                ],
                "containerStatuses": [
                    {"name": "sidecar", "state": {"waiting": {"reason": "ErrImagePull"}}},
                    {
                        "name": api.CONTAINER,
                        "state": {
                            "waiting": {"reason": "ImagePullBackOff", "message": "Back-off "}
                        },
                    },
                ],
            },
        }
    )
    assert (view.waiting_reason, view.waiting_message) == ("ImagePullBackOff", "Back-off")
    assert view.started_at == NOW.replace(hour=3, minute=0, second=0)
    assert view.unschedulable_since == NOW.replace(hour=3, minute=0, second=1)
    assert view.unschedulable_message == "0/3 nodes are available"
    scheduled = PodView.from_body({"status": {"conditions": [{"type": "PodScheduled",
                                                              "status": "True"}]}})  # fmt: skip
    assert scheduled.unschedulable_since is None and scheduled.waiting_reason is None


def test_a_job_event_body_from_either_events_api():
    core = {"reason": "FailedCreate", "message": "m", "lastTimestamp": "2026-01-02T03:04:05Z"}
    series = {
        "reason": "FailedCreate",
        "note": "n",
        "eventTime": "2026-01-02T03:00:00.000000Z",
        "series": {"count": 3, "lastObservedTime": "2026-01-02T03:04:05.000000Z"},
    }
    assert JobEvent.from_body(core) == JobEvent("FailedCreate", "m", NOW)
    assert JobEvent.from_body(series) == JobEvent("FailedCreate", "n", NOW)


# -- through decide ---------------------------------------------------------------------------
PENDING = {
    "phase": api.PENDING,
    "observedGeneration": 1,
    "hosts": 2,
    "startTime": "2026-01-02T03:00:00Z",
    "jobName": "demo-0",
    "jobUID": "job-uid-0",
}
TWO_HOSTS = {"type": "cpu", "hosts": 2}


def observe(pods=(), events=None, status=None, created_ago=60.0, **spec):
    spec.setdefault("accelerator", TWO_HOSTS)
    exp = Experiment.from_body(body(status=status or PENDING, **spec))
    the_job = replace(job(), created_at=NOW - timedelta(seconds=created_ago))
    return replace(
        Observation(exp, (the_job,), tuple(pods), NOW), job_events=events
    )  # fmt: skip


def blocked(plan):
    return find(plan.status.conditions, api.COND_BLOCKED)


def test_a_gang_lacking_pods_asks_for_its_jobs_events_and_comes_back():
    plan = decide(observe([pod(0, "Pending")]))
    assert plan.read == Read(READ_JOB_EVENTS, "demo-0", "job-uid-0")
    assert plan.requeue_after == JOB_EVENTS_REQUEUE_SECONDS
    given = decide(observe([pod(0, "Pending")], events=()))
    assert given.read is None and blocked(given) is None


def test_a_young_job_or_a_full_gang_costs_no_event_read():
    young = decide(observe([], created_ago=1.0))
    assert young.read is None
    assert young.requeue_after == pytest.approx(JOB_EVENTS_GRACE_SECONDS - 1.0)
    full = decide(observe([pod(0, "Pending"), pod(1, "Pending")]))
    assert full.read is None and full.requeue_after is None
    running = decide(observe([pod(0), pod(1)]))
    assert running.read is None and running.status.phase == api.RUNNING


def test_a_refused_pod_fails_the_experiment_and_stops_its_job():
    plan = decide(observe([], events=(created(POD_SECURITY),)))
    assert plan.status.phase == api.FAILED
    failed = find(plan.status.conditions, api.COND_FAILED)
    assert failed["reason"] == api.REASON_POD_CREATION_REFUSED
    assert "violates PodSecurity" in failed["message"]
    assert plan.delete_jobs == ("demo-0",)
    assert [(e.type, e.reason) for e in plan.events] == [
        ("Warning", api.REASON_POD_CREATION_REFUSED)
    ]


def test_quota_blocks_with_one_warning_then_clears_once_the_pods_exist():
    plan = decide(observe([pod(0, "Pending")], events=(created(QUOTA),)))
    assert plan.status.phase == api.PENDING
    condition = blocked(plan)
    assert (condition["status"], condition["reason"]) == ("True", api.REASON_POD_CREATION_FAILING)
    assert "exceeded quota" in condition["message"]
    assert ("Warning", api.REASON_POD_CREATION_FAILING) in [(e.type, e.reason) for e in plan.events]
    status = {**PENDING, "conditions": [dict(c) for c in plan.status.conditions]}
    again = decide(observe([pod(0, "Pending")], events=(created(QUOTA),), status=status))
    assert again.status == plan.status and again.events == ()  # no write, no second Event
    freed = decide(observe([pod(0, "Pending"), pod(1, "Pending")], status=status))
    condition = blocked(freed)
    assert (condition["status"], condition["reason"]) == ("False", api.REASON_UNBLOCKED)
    assert [e.reason for e in freed.events] == [api.REASON_UNBLOCKED]
    running = decide(observe([pod(0), pod(1)], status=status))
    assert running.status.phase == api.RUNNING and blocked(running)["status"] == "False"


def test_an_image_that_never_pulls_blocks_then_fails_after_the_timeout():
    young = [waiting(0, "ImagePullBackOff", "Back-off pulling image", 100), pod(1, "Pending")]
    plan = decide(observe(young))
    assert blocked(plan)["reason"] == api.REASON_IMAGE_PULL_BACKOFF
    assert plan.requeue_after == 500  # when the timeout runs out
    old = [waiting(0, "ImagePullBackOff", "Back-off pulling image", 700), pod(1, "Pending")]
    plan = decide(observe(old))
    assert plan.status.phase == api.FAILED
    assert find(plan.status.conditions, api.COND_FAILED)["reason"] == api.REASON_IMAGE_PULL_BACKOFF
    short = decide(observe(young), startup.Timeouts(image_pull=50))
    assert short.status.phase == api.FAILED


def test_an_unschedulable_gang_is_blocked_after_the_timeout_never_failed():
    pods = [unschedulable(0, ago=100), unschedulable(1, ago=100)]
    plan = decide(observe(pods))
    assert blocked(plan) is None and plan.requeue_after == 200
    # Meanwhile `kubectl describe` says what it waits for: the scheduler's word.
    running = find(plan.status.conditions, api.COND_RUNNING)
    assert (running["status"], running["reason"]) == ("False", api.REASON_WAITING_FOR_HOSTS)
    assert running["message"].endswith(
        "is not scheduled yet: 0/5 nodes are available: 5 node(s) didn't match"
    ), running
    plan = decide(observe(pods), startup.Timeouts(unschedulable=60))
    assert plan.status.phase == api.PENDING
    condition = blocked(plan)
    assert (condition["status"], condition["reason"]) == ("True", api.REASON_UNSCHEDULABLE)
    assert "didn't match" in condition["message"]


def test_a_suspended_job_is_waiting_for_admission_not_blocked():
    exp = observe([unschedulable(0, ago=900)], events=(created(QUOTA),))
    held = replace(exp, jobs=(replace(exp.jobs[0], suspended=True),))
    plan = decide(held)
    assert blocked(plan) is None and plan.read == Read(READ_QUEUE, "demo-0", "job-uid-0")


# -- through the reconciler -------------------------------------------------------------------
class EventsKube(FakeKube):
    """FakeKube (test_reconcile.py) that also lists Events, and counts the lists."""

    def __init__(self, experiment, events=()):
        super().__init__(experiment)
        self.events = list(events)
        self.selectors: list[str] = []

    def list(self, kind, namespace, fieldSelector):
        assert kind == "Event"
        self.selectors.append(fieldSelector)
        return self.events


class Clock:
    def __init__(self):
        self.now = NOW

    def __call__(self):
        return self.now


def test_the_reconciler_reads_a_jobs_events_at_most_once_per_interval():
    experiment = body(status=PENDING, accelerator=TWO_HOSTS)
    kube = EventsKube(experiment, [{"reason": "FailedCreate", "message": QUOTA}])
    clock = Clock()
    reconciler = Reconciler(kube, clock=clock)
    the_job = replace(job(), created_at=NOW - timedelta(seconds=60))
    outcome = reconciler.reconcile(KEY, experiment, (the_job,), ())
    assert kube.selectors == [
        "involvedObject.kind=Job,involvedObject.name=demo-0,involvedObject.uid=job-uid-0,"
        "reason=FailedCreate"
    ]
    assert outcome.phase == api.PENDING and outcome.requeue_after == JOB_EVENTS_REQUEUE_SECONDS
    written = kube.experiment
    assert find(written["status"]["conditions"], api.COND_BLOCKED)["reason"] == (
        api.REASON_POD_CREATION_FAILING
    )
    clock.now = NOW + timedelta(seconds=5)  # a pod event, say: the events read is reused
    reconciler.reconcile(KEY, kube.experiment, (the_job,), (pod(0, "Pending"),))
    assert len(kube.selectors) == 1
    clock.now = NOW + timedelta(seconds=JOB_EVENTS_REQUEUE_SECONDS)
    reconciler.reconcile(KEY, kube.experiment, (the_job,), (pod(0, "Pending"),))
    assert len(kube.selectors) == 2
    clock.now += timedelta(seconds=60)  # the whole gang exists: no read at all
    both = (pod(0, "Pending"), pod(1, "Pending"))
    reconciler.reconcile(KEY, kube.experiment, (the_job,), both)
    assert len(kube.selectors) == 2
    assert find(kube.experiment["status"]["conditions"], api.COND_BLOCKED)["status"] == "False"
