"""The reconcile decision: observation in, plan out, no cluster and no clock."""

from dataclasses import replace
from datetime import timedelta

import pytest

from evokube_operator import api
from evokube_operator.conditions import find
from evokube_operator.plans.decide import (
    BLOCKED_REQUEUE_SECONDS,
    QUEUE_REQUEUE_SECONDS,
    READ_JOB,
    READ_QUEUE,
    STUCK_POD_MARGIN,
    WAIT_FOR_PODS_REQUEUE_SECONDS,
    Observation,
    Read,
    Status,
    decide,
    desired_spec,
)
from evokube_operator.reading.observe import PodView, QueueView
from evokube_operator.reading.ownership import Blocker, location_blocker
from evokube_operator.reading.spec import Experiment, format_time
from evokube_operator.rules.refusal import RETRY_MAX_SECONDS, RETRY_MIN_SECONDS, Refusal
from tests.operator.factories import NOW, TPU, body, gang, job, pod, running_status


def observe(status=None, jobs=(), pods=(), now=NOW, refused=None, fresh=False, **spec):
    exp = Experiment.from_body(body(status=status, **spec))
    return Observation(exp, tuple(jobs), tuple(pods), now, refused, fresh)


def settle(obs, plan):
    """The world after a plan ran: its status written, its Job created, old Jobs gone."""
    written = plan.status.patch_from(Status.from_dict(obs.experiment.status))  # a merge patch
    status = {**obs.experiment.status, **written}
    status = {k: v for k, v in status.items() if v is not None}
    jobs = [j for j in obs.jobs if j.name not in plan.delete_jobs]
    if plan.create_job is not None:
        jobs.append(job(plan.create_job))
    exp = replace(obs.experiment, status=status)
    return replace(obs, experiment=exp, jobs=tuple(jobs))


def reasons(plan):
    """The plan's Event reasons, but the emptyDir warning (tested below, on its own): the
    factories' experiments keep their checkpoints in the default emptyDir."""
    return [e.reason for e in plan.events if e.reason != api.REASON_EMPTYDIR_CHECKPOINTS]


def all_reasons(plan):
    return [e.reason for e in plan.events]


TRANSITIONS = [
    # (case, status, jobs, pods, spec overrides) ->
    #   (phase, restarts, preemptions, create_job, delete_jobs, event reasons)
    ("new experiment", None, [], [], {}, (api.PENDING, 0, 0, 0, (), [])),
    (
        "hosts still pending",
        running_status(phase=api.PENDING),
        [job(0)],
        [pod(0, "Pending")],
        {},
        (api.PENDING, 0, 0, None, (), []),
    ),
    (
        "every host runs",
        running_status(phase=api.PENDING),
        [job(0)],
        gang(1),
        {},
        (api.RUNNING, 0, 0, None, (), [api.REASON_ALL_HOSTS_RUNNING]),
    ),
    (
        "retriable exit code",
        running_status(),
        [job(0)],
        [pod(0, "Failed", exit_code=75, job_uid="job-uid-0")],
        {},
        (api.RESTARTING, 1, 0, 1, ("demo-0",), [api.REASON_RETRIABLE_FAILURE]),
    ),
    (
        "crash (137) is retriable",
        running_status(),
        [job(0)],
        [pod(0, "Failed", exit_code=137, job_uid="job-uid-0")],
        {},
        (api.RESTARTING, 1, 0, 1, ("demo-0",), [api.REASON_RETRIABLE_FAILURE]),
    ),
    (
        "evicted host",
        running_status(),
        [job(0)],
        [pod(0, "Failed", disruption="EvictionByEvictionAPI", job_uid="job-uid-0")],
        {},
        (api.RESTARTING, 0, 1, 1, ("demo-0",), [api.REASON_PREEMPTED]),
    ),
    (
        "evicted host still stopping: the next Job waits",
        running_status(),
        [job(0)],
        [pod(0, disruption="EvictionByEvictionAPI", job_uid="job-uid-0")],
        {},
        (api.RESTARTING, 0, 1, None, ("demo-0",), [api.REASON_PREEMPTED]),
    ),
    (
        "preemptions do not use up restarts",
        running_status(attempt=3, restarts=3),
        [job(3)],
        [pod(0, "Failed", disruption="PreemptionByScheduler", attempt=3, job_uid="job-uid-3")],
        {"maxRestarts": 3},
        (api.RESTARTING, 3, 1, 4, ("demo-3",), [api.REASON_PREEMPTED]),
    ),
    (
        "a restart while other hosts still run: the next Job waits",
        running_status(),
        [job(0)],
        [pod(0, "Failed", exit_code=75, job_uid="job-uid-0"), pod(1, job_uid="job-uid-0")],
        {},
        (api.RESTARTING, 1, 0, None, ("demo-0",), [api.REASON_RETRIABLE_FAILURE]),
    ),
    (
        "a new experiment while a namesake's pods linger",
        None,
        [job(3, owner_uid="another-uid")],
        [pod(0, attempt=3, job_uid="job-uid-3")],
        {},
        (api.PENDING, 0, 0, None, (), []),
    ),
    (
        "permanent exit code",
        running_status(),
        [job(0)],
        [pod(0, "Failed", exit_code=78, job_uid="job-uid-0")],
        {},
        (api.FAILED, 0, 0, None, (), [api.REASON_PERMANENT_FAILURE]),
    ),
    (
        "restarts used up",
        running_status(attempt=2, restarts=2),
        [job(2)],
        [pod(0, "Failed", exit_code=75, attempt=2, job_uid="job-uid-2")],
        {"maxRestarts": 2},
        (api.FAILED, 2, 0, None, (), [api.REASON_MAX_RESTARTS]),
    ),
    (
        "every host exited 0",
        running_status(),
        [job(0)],
        gang(1, "Succeeded", exit_code=0),
        {},
        (api.SUCCEEDED, 0, 0, None, (), [api.REASON_COMPLETED]),
    ),
    (
        "the Job completed",
        running_status(),
        [job(0, complete=True, completion_time="2026-01-02T03:04:00Z")],
        [],
        {},
        (api.SUCCEEDED, 0, 0, None, (), [api.REASON_COMPLETED]),
    ),
    (
        "the Job hit its own deadline",
        running_status(),
        [job(0, failure=("DeadlineExceeded", "too long"))],
        [],
        {"activeDeadlineSeconds": 247},  # 2s left by the operator's clock: the Job's is right
        (api.FAILED, 0, 0, None, (), [api.REASON_DEADLINE]),
    ),
    (
        "suspend a running gang",
        running_status(),
        [job(0)],
        gang(1),
        {"suspend": True},
        (api.SUSPENDED, 0, 1, None, ("demo-0",), [api.REASON_SUSPENDED]),
    ),
    (
        "created suspended",
        None,
        [],
        [],
        {"suspend": True},
        (api.SUSPENDED, 0, 0, None, (), [api.REASON_SUSPENDED]),
    ),
    (
        "resume",
        running_status(phase=api.SUSPENDED, preemptions=1, jobName=None),
        [],
        [],
        {},
        (api.PENDING, 0, 1, 1, (), [api.REASON_RESUMED]),
    ),
    (
        "an old attempt's Job left behind by a crash",
        running_status(attempt=1, restarts=1),
        [job(0), job(1)],
        gang(1, attempt=1),
        {},
        (api.RUNNING, 1, 0, None, ("demo-0",), []),
    ),
    (
        "Kueue holds the Job",
        running_status(phase=api.PENDING),
        [job(0, suspended=True)],
        [],
        {},
        (api.PENDING, 0, 0, None, (), []),
    ),
    (
        "a spec only the API server's rules should stop",
        None,
        [],
        [],
        {"accelerator": {"type": "tpu", "tpu": {"type": "x"}}},
        (api.FAILED, 0, 0, None, (), [api.REASON_INVALID_SPEC]),
    ),
]


@pytest.mark.parametrize(
    ("status", "jobs", "pods", "spec", "expected"),
    [case[1:] for case in TRANSITIONS],
    ids=[case[0] for case in TRANSITIONS],
)
def test_transitions(status, jobs, pods, spec, expected):
    phase, restarts, preemptions, create_job, delete_jobs, events = expected
    plan = decide(observe(status, jobs, pods, **spec))
    assert plan.status.phase == phase
    assert (plan.status.restarts, plan.status.preemptions) == (restarts, preemptions)
    assert plan.create_job == create_job
    assert plan.delete_jobs == delete_jobs
    assert reasons(plan) == events


@pytest.mark.parametrize(
    ("status", "jobs", "pods", "spec"),
    [case[1:5] for case in TRANSITIONS],
    ids=[case[0] for case in TRANSITIONS],
)
def test_a_carried_out_plan_needs_no_second_write(status, jobs, pods, spec):
    """Deciding again on the world the plan left changes nothing: no flapping writes."""
    obs = observe(status, jobs, pods, **spec)
    plan = decide(obs)
    after = settle(obs, plan)
    again = decide(after)
    patch = again.status.patch_from(Status.from_dict(after.experiment.status))
    if plan.create_job is not None:  # the one write a new Job costs: its uid, once seen
        assert patch == {"jobUID": job(plan.create_job).uid}
        after = replace(
            after, experiment=replace(after.experiment, status=after.experiment.status | patch)
        )
        again = decide(after)
        patch = again.status.patch_from(Status.from_dict(after.experiment.status))
    assert patch == {}
    assert again.create_job is None
    assert again.events == ()


def test_starting_records_the_gang_before_its_job_exists():
    plan = decide(observe(accelerator=TPU, activeDeadlineSeconds=600))
    status = plan.status
    assert status.job_name == "demo-0"
    assert status.coordinator_address == "demo-0-0.demo:8476"
    assert status.hosts == 4
    assert status.checkpoint_location == "/checkpoints"
    assert status.start_time == format_time(NOW)
    assert status.observed_generation == 1
    running = find(status.conditions, api.COND_RUNNING)
    assert (running["status"], running["reason"]) == ("False", api.REASON_WAITING_FOR_HOSTS)
    assert plan.job_deadline == 600
    assert plan.requeue_after == 600


def test_a_restart_records_why_and_points_at_the_new_gang():
    plan = decide(
        observe(running_status(), [job(0)], [pod(0, "Failed", exit_code=75, job_uid="job-uid-0")])
    )
    restarting = find(plan.status.conditions, api.COND_RESTARTING)
    assert restarting["status"] == "True"
    assert restarting["reason"] == api.REASON_RETRIABLE_FAILURE
    assert "exited with code 75" in restarting["message"]
    assert plan.status.job_name == "demo-1"
    assert plan.status.coordinator_address == "demo-1-0.demo:8476"
    assert plan.events[0].type == "Warning"


def test_failure_records_reason_message_and_completion_time():
    plan = decide(
        observe(running_status(), [job(0)], [pod(0, "Failed", exit_code=78, job_uid="job-uid-0")])
    )
    failed = find(plan.status.conditions, api.COND_FAILED)
    assert failed["reason"] == api.REASON_PERMANENT_FAILURE
    assert failed["message"] == "host 0 (pod demo-0-0-abcde) exited with code 78"
    assert plan.status.completion_time == format_time(NOW)
    assert find(plan.status.conditions, api.COND_RUNNING)["status"] == "False"
    # The Job controller stops the other hosts; the pods stay for their logs.
    assert plan.delete_jobs == ()


def test_the_operator_enforces_the_deadline_and_stops_the_gang():
    status = running_status(startTime=format_time(NOW - timedelta(seconds=61)))
    plan = decide(observe(status, [job(0)], gang(1), activeDeadlineSeconds=60))
    assert plan.status.phase == api.FAILED
    assert find(plan.status.conditions, api.COND_FAILED)["reason"] == api.REASON_DEADLINE
    assert plan.delete_jobs == ("demo-0",)


def test_a_job_deadline_from_an_older_shorter_spec_only_restarts_the_gang():
    status = running_status(startTime=format_time(NOW - timedelta(seconds=100)))
    failed = job(0, failure=("DeadlineExceeded", "Job was active longer than specified deadline"))
    plan = decide(observe(status, [failed], [], activeDeadlineSeconds=3600))
    assert plan.status.phase == api.RESTARTING
    assert (plan.status.restarts, plan.status.preemptions) == (0, 1)
    assert plan.create_job == 1


def test_a_running_experiment_is_looked_at_again_when_its_deadline_comes():
    status = running_status(startTime=format_time(NOW - timedelta(seconds=20)))
    plan = decide(observe(status, [job(0)], gang(1), activeDeadlineSeconds=60))
    assert plan.requeue_after == 40


def test_resume_restarts_the_deadline_clock():
    status = running_status(phase=api.SUSPENDED, preemptions=1, jobName=None)
    plan = decide(observe(status, activeDeadlineSeconds=60))
    assert plan.status.start_time == format_time(NOW)
    assert find(plan.status.conditions, api.COND_SUSPENDED)["reason"] == api.REASON_RESUMED


def test_success_takes_the_jobs_completion_time():
    plan = decide(
        observe(running_status(), [job(0, complete=True, completion_time="2026-01-02T03:04:00Z")])
    )
    assert plan.status.completion_time == "2026-01-02T03:04:00Z"


@pytest.mark.parametrize(
    ("finished_ago", "ttl", "delete", "requeue"),
    [(10, None, False, None), (10, 60, False, 50), (60, 60, True, None), (5, 0, True, None)],
)
def test_ttl_after_finished(finished_ago, ttl, delete, requeue):
    status = running_status(
        phase=api.SUCCEEDED, completionTime=format_time(NOW - timedelta(seconds=finished_ago))
    )
    spec = {} if ttl is None else {"ttlSecondsAfterFinished": ttl}
    plan = decide(observe(status, [job(0, complete=True)], **spec))
    assert plan.delete_experiment is delete
    assert plan.requeue_after == requeue
    assert plan.status.patch_from(Status.from_dict(status)) == {}


def test_a_status_older_than_the_jobs_is_read_again_before_acting():
    obs = observe(running_status(attempt=0), [job(0), job(1)], gang(1, attempt=1))
    assert decide(obs).stale
    fresh = decide(replace(obs, fresh=True))
    assert not fresh.stale  # a fresh read is the truth, even when someone rewrote it


def test_jobs_of_a_deleted_namesake_are_ignored():
    stranger = job(5, owner_uid="another-uid")
    plan = decide(observe(None, [stranger], []))
    assert not plan.stale
    assert plan.create_job == 0
    assert plan.delete_jobs == ()


# -- the API server refuses an object the experiment needs -------------------------------------
QUOTA = 'jobs.batch "demo-0" is forbidden: exceeded quota: q, requested: count/jobs.batch=1'
POLICY = (
    "jobs.batch \"demo-0\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' "
    "denied request: no jobs here"
)
PORTS = 'Service "demo" is invalid: spec.ports[1]: Duplicate value: {"port":9100}'


@pytest.mark.parametrize(
    ("refusal", "said"),
    [
        (Refusal("Job", "demo-0", 422, "spec.template: bad"), "Job demo-0: spec.template: bad"),
        (Refusal("Service", "demo", 422, PORTS), f"Service demo: {PORTS}"),
        (Refusal("Job", "demo-0", 403, POLICY), "denied request: no jobs here"),
        (Refusal("Role", "demo-trainer", 400, "bad request"), "Role demo-trainer: bad request"),
        (Refusal("Job", "demo-0", 413, "too large"), "Job demo-0: too large"),
    ],
    ids=["invalid job", "invalid service", "admission policy", "bad request", "too large"],
)
def test_an_object_refused_for_good_fails_the_experiment_naming_it_and_the_api_servers_words(
    refusal, said
):
    for status in (None, running_status(phase=api.PENDING)):
        plan = decide(observe(status, refused=refusal))
        assert plan.status.phase == api.FAILED
        assert plan.create_job is None
        failed = find(plan.status.conditions, api.COND_FAILED)
        assert (failed["status"], failed["reason"]) == ("True", api.REASON_CREATION_REFUSED)
        assert said in failed["message"]
        assert ("Warning", api.REASON_CREATION_REFUSED) in [(e.type, e.reason) for e in plan.events]


@pytest.mark.parametrize(
    "message",
    [
        QUOTA,
        'jobs.batch is forbidden: User "system:serviceaccount:evokube-system:evokube-operator" '
        'cannot create resource "jobs" in API group "batch" in the namespace "ns"',
        'Internal error occurred: failed calling webhook "w.example.com": connection refused',
    ],
    ids=["quota", "rbac", "webhook down"],
)
def test_a_refusal_that_may_pass_blocks_and_is_tried_again_less_and_less_often(message):
    refused = Refusal("Job", "demo-0", 403, message)
    plan = decide(observe(refused=refused))
    assert plan.status.phase == api.PENDING
    assert plan.create_job is None and plan.status.job_name is None
    blocked = find(plan.status.conditions, api.COND_BLOCKED)
    assert (blocked["status"], blocked["reason"]) == ("True", api.REASON_CREATION_FAILING)
    assert blocked["message"] == f"the API server refused Job demo-0: {message}"
    assert [
        (e.type, e.reason) for e in plan.events if e.reason != api.REASON_EMPTYDIR_CHECKPOINTS
    ] == [("Warning", api.REASON_CREATION_FAILING)]
    assert plan.requeue_after == RETRY_MIN_SECONDS
    # Refused again later: nothing written, nobody told twice, and a longer wait each time.
    waits = []
    obs = settle(observe(refused=refused), plan)
    for minutes in (1, 2, 4, 60):
        again = decide(replace(obs, now=NOW + timedelta(minutes=minutes)))
        assert again.status.patch_from(Status.from_dict(obs.experiment.status)) == {}
        assert again.events == ()
        waits.append(again.requeue_after)
    assert waits == [60, 120, 240, RETRY_MAX_SECONDS]
    # The quota raised: the Job is created, and Blocked turns False.
    free = decide(replace(obs, refused=None, now=NOW + timedelta(minutes=5)))
    assert free.create_job == 0 and free.status.job_name == "demo-0"
    unblocked = find(free.status.conditions, api.COND_BLOCKED)
    assert (unblocked["status"], unblocked["reason"]) == ("False", api.REASON_UNBLOCKED)


def test_a_refusal_while_restarting_keeps_the_restart_and_its_count():
    failed = [pod(0, "Failed", exit_code=75, job_uid="job-uid-0")]
    restart = decide(observe(running_status(), [job(0)], failed))
    assert (restart.status.phase, restart.status.restarts, restart.create_job) == (
        api.RESTARTING,
        1,
        1,
    )
    written = settle(observe(running_status(), [job(0)], failed), restart)
    refused = Refusal("Job", "demo-1", 403, QUOTA)
    plan = decide(replace(written, jobs=(), refused=refused))  # its Job was not created
    assert (plan.status.phase, plan.status.restarts, plan.create_job) == (api.RESTARTING, 1, None)
    assert find(plan.status.conditions, api.COND_BLOCKED)["reason"] == api.REASON_CREATION_FAILING


def test_a_deadline_sooner_than_the_retry_comes_first():
    status = {"startTime": format_time(NOW - timedelta(seconds=98))}
    plan = decide(
        observe(status, refused=Refusal("Job", "demo-0", 403, QUOTA), activeDeadlineSeconds=100)
    )
    assert plan.requeue_after == 2


# -- Kueue: a queued Job, its admission, its eviction --------------------------------------------
WAITING = QueueView(True, "Pending", "couldn't assign flavors to pod set main: insufficient quota")


def queued_status(**kw):
    """Attempt 0's Job was created with spec.queueName: Queued True, not admitted yet."""
    plan = decide(observe(None, queueName="tpu-q"))
    assert find(plan.status.conditions, api.COND_QUEUED)["status"] == "True"
    return {**json_status(plan), **kw}


def json_status(plan):
    return {k: v for k, v in plan.status.patch_from(Status()).items() if v is not None}


def test_a_suspended_job_asks_what_kueue_says_then_shows_it_as_queued():
    status = queued_status()
    asked = decide(observe(status, [job(0, suspended=True)], queueName="tpu-q"))
    assert asked.read == Read(READ_QUEUE, "demo-0", "job-uid-0") and asked.create_job is None
    obs = replace(observe(status, [job(0, suspended=True)], queueName="tpu-q"), queue=WAITING)
    plan = decide(obs)
    assert plan.status.phase == api.QUEUED
    queued = find(plan.status.conditions, api.COND_QUEUED)
    assert (queued["status"], queued["reason"]) == ("True", "Pending")
    assert "insufficient quota" in queued["message"]
    assert find(plan.status.conditions, api.COND_RUNNING)["reason"] == api.REASON_JOB_SUSPENDED
    assert reasons(plan) == [api.REASON_QUEUED]
    assert plan.requeue_after == QUEUE_REQUEUE_SECONDS  # Workloads are not watched
    assert (plan.status.preemptions, plan.status.restarts, plan.delete_jobs) == (0, 0, ())


@pytest.mark.parametrize(
    ("kind", "integration"), [("Job", "batch/job"), ("JobSet", "jobset.x-k8s.io/jobset")]
)
def test_no_workload_names_the_local_queue_and_kueue_integration_to_check(kind, integration):
    held = replace(job(0, suspended=True), kind=kind)
    obs = observe(queued_status(), [held], queueName="tpu-q")
    plan = decide(replace(obs, queue=QueueView(False)))
    queued = find(plan.status.conditions, api.COND_QUEUED)
    assert queued["reason"] == api.REASON_NO_WORKLOAD
    assert "LocalQueue tpu-q" in queued["message"] and f"{kind} demo-0 waits" in queued["message"]
    assert f"Kueue installed with its {integration} integration" in queued["message"]


def test_admission_clears_queued_and_the_gang_runs():
    status = {**queued_status(), "phase": api.QUEUED}
    plan = decide(observe(status, [job(0)], gang(1), queueName="tpu-q"))
    assert plan.status.phase == api.RUNNING
    queued = find(plan.status.conditions, api.COND_QUEUED)
    assert (queued["status"], queued["reason"]) == ("False", api.REASON_ADMITTED)
    assert api.REASON_ADMITTED in reasons(plan)


def admitted_and_running():
    status = {**queued_status(), "phase": api.QUEUED}
    plan = decide(observe(status, [job(0)], gang(2), queueName="tpu-q", accelerator=TWO_CPU))
    assert plan.status.phase == api.RUNNING
    return json_status(plan)


TWO_CPU = {"type": "cpu", "hosts": 2}


def test_an_eviction_is_a_preemption_on_the_same_job_and_attempt():
    """Kueue suspends the admitted Job: its pods get SIGTERM, checkpoint and exit 75; none of
    that is a failure, and the operator neither restarts the gang nor unsuspends the Job."""
    status = admitted_and_running()
    stopping = (
        pod(0, "Failed", exit_code=75, deletion_timestamp=NOW),
        pod(1, deletion_timestamp=NOW),
    )
    evicted = QueueView(True, "Pending", "waiting for quota", "Preempted: to admit demo-high")
    obs = observe(
        status, [job(0, suspended=True)], stopping, queueName="tpu-q", accelerator=TWO_CPU
    )
    plan = decide(replace(obs, queue=evicted))
    assert plan.status.phase == api.QUEUED
    assert (plan.status.preemptions, plan.status.restarts, plan.status.attempt) == (1, 0, 0)
    assert plan.status.job_name == "demo-0"
    assert plan.create_job is None and plan.delete_jobs == ()
    assert reasons(plan) == [api.REASON_EVICTED, api.REASON_QUEUED]
    assert "Preempted: to admit demo-high" in plan.events[0].message

    # Decided again while still queued: counted once.
    again = decide(replace(settle(obs, plan), queue=evicted))
    assert (again.status.preemptions, again.status.phase, reasons(again)) == (1, api.QUEUED, [])

    # Re-admitted: the evicted gang's pods (created before the resume) are not failures.
    resumed = replace(job(0), resumed_at=NOW)
    old = tuple(replace(p, created_at=NOW - timedelta(minutes=5)) for p in stopping)
    # The Job controller creates the new pods, then writes the admission's time (whole seconds):
    # a new pod may look a second older than the admission; it is not being deleted.
    ages = (-1, 1)
    new = tuple(
        replace(p, created_at=NOW + timedelta(seconds=s))
        for p, s in zip(gang(2), ages, strict=True)
    )
    back = decide(replace(settle(obs, plan), jobs=(resumed,), pods=old + new))
    assert back.status.phase == api.RUNNING
    assert (back.status.preemptions, back.status.restarts, back.create_job) == (1, 0, None)


def test_a_job_suspended_while_running_without_a_queue_is_an_eviction_too():
    obs = observe(running_status(), [job(0, suspended=True)])
    plan = decide(replace(obs, queue=QueueView(False)))
    assert (plan.status.phase, plan.status.preemptions) == (api.QUEUED, 1)
    assert "someone else than the operator" in plan.events[-1].message


def test_a_restart_moves_the_attempt_even_when_kueue_preemptions_did_not():
    status = {**running_status(restarts=0, preemptions=2, jobName="demo-0"), "attempt": 0}
    assert Status.from_dict(status).attempt == 0  # written: kept
    assert Status.from_dict({"restarts": 1, "preemptions": 2}).attempt == 3  # older statuses
    failed = pod(0, "Failed", exit_code=75)
    plan = decide(observe(status, [job(0)], [failed]))
    assert (plan.status.attempt, plan.status.restarts, plan.create_job) == (1, 1, 1)


def test_trainer_progress_is_never_part_of_the_operators_patch():
    status = running_status(phase=api.PENDING, progress={"generation": 7, "bestFitness": 1.5})
    plan = decide(observe(status, [job(0)], gang(1)))
    patch = plan.status.patch_from(Status.from_dict(status))
    assert patch["phase"] == api.RUNNING
    assert "progress" not in patch


def test_a_spec_change_is_acknowledged_in_observed_generation():
    exp = Experiment.from_body(body(status=running_status(), generation=2))
    plan = decide(Observation(exp, (job(0),), gang(1), NOW))
    patch = plan.status.patch_from(Status.from_dict(exp.status))
    assert patch["observedGeneration"] == 2
    assert all(c["observedGeneration"] == 2 for c in patch["conditions"])


def test_an_experiment_being_deleted_is_left_alone():
    exp = replace(Experiment.from_body(body()), deleting=True)
    plan = decide(Observation(exp, (), (), NOW))
    assert plan.create_job is None and plan.status == Status()


# -- a new gang waits for the pods of earlier ones -------------------------------------------
def restart_with(*pods, **spec):
    """Attempt 0 failed on host 0 (exit 75); `pods` are what else the index holds."""
    failed = pod(0, "Failed", exit_code=75, job_uid="job-uid-0")
    return observe(running_status(), [job(0)], [failed, *pods], **spec)


def test_a_restart_waits_for_the_old_gangs_pods_to_stop():
    obs = restart_with(pod(1, job_uid="job-uid-0"), pod(2, "Pending", job_uid="job-uid-0"))
    plan = decide(obs)
    assert plan.create_job is None and plan.job_deadline is None
    assert plan.delete_jobs == ("demo-0",)
    assert plan.requeue_after == WAIT_FOR_PODS_REQUEUE_SECONDS
    # The new attempt is recorded all the same: the status write comes first.
    assert (plan.status.phase, plan.status.restarts) == (api.RESTARTING, 1)
    assert plan.status.job_name == "demo-1"
    running = find(plan.status.conditions, api.COND_RUNNING)
    assert (running["status"], running["reason"]) == ("False", api.REASON_WAITING_FOR_PREVIOUS_PODS)
    assert running["message"] == "Job demo-1 waits for the pods of an earlier gang to stop"
    assert find(plan.status.conditions, api.COND_RESTARTING)["status"] == "True"
    assert reasons(plan) == [api.REASON_RETRIABLE_FAILURE]


def test_a_waiting_restart_comes_back_by_the_deadline_if_that_is_sooner():
    status = running_status(startTime=format_time(NOW - timedelta(seconds=55)))
    failed = pod(0, "Failed", exit_code=75, job_uid="job-uid-0")
    obs = observe(status, [job(0)], [failed, pod(1, job_uid="job-uid-0")], activeDeadlineSeconds=60)
    plan = decide(obs)
    assert plan.create_job is None
    assert plan.requeue_after == 5


@pytest.mark.parametrize(
    "left",
    [(), (pod(1, "Succeeded", exit_code=0, job_uid="job-uid-0"),), (pod(1, "Failed"),)],
    ids=["all gone", "a Succeeded pod left", "a Failed pod left"],
)
def test_the_next_job_is_created_once_the_old_pods_have_stopped(left):
    obs = restart_with(pod(1, job_uid="job-uid-0"))
    waiting = settle(obs, decide(obs))
    assert decide(waiting).create_job is None  # deciding again: still waiting, no new write
    stopped = replace(waiting, pods=left)
    plan = decide(stopped)
    assert plan.create_job == 1
    assert plan.delete_jobs == ()
    assert plan.events == ()  # the restart was told when it was decided
    assert plan.status.restarts == 1  # not counted twice
    patch = plan.status.patch_from(Status.from_dict(stopped.experiment.status))
    running = find(patch["conditions"], api.COND_RUNNING)
    assert running["reason"] == api.REASON_WAITING_FOR_HOSTS  # a write: never a stale create


def test_the_pods_of_a_job_being_deleted_hold_its_successor_back():
    status = running_status(phase=api.PENDING)
    deleting = replace(job(0), deleting=True)
    plan = decide(replace(observe(status, [deleting], gang(1)), job_gone="job-uid-0"))
    assert plan.create_job is None
    assert plan.delete_jobs == ()
    reason = find(plan.status.conditions, api.COND_RUNNING)["reason"]
    assert reason == api.REASON_WAITING_FOR_PREVIOUS_PODS


@pytest.mark.parametrize(
    ("past_deadline", "blocks"),
    [
        (None, True),  # not deleted (yet)
        (timedelta(seconds=-30), True),  # still in its grace period
        (timedelta(seconds=10), True),  # a little late: a busy kubelet
        (STUCK_POD_MARGIN, True),
        (STUCK_POD_MARGIN + timedelta(seconds=1), False),  # its node is presumably gone
    ],
)
def test_a_pod_stuck_terminating_stops_blocking_after_a_margin(past_deadline, blocks):
    when = None if past_deadline is None else NOW - past_deadline
    plan = decide(restart_with(pod(1, job_uid="job-uid-0", deletion_timestamp=when)))
    assert (plan.create_job is None) is blocks


def test_a_pods_deletion_timestamp_is_read_from_its_metadata():
    meta = {"name": "demo-0-0-x", "deletionTimestamp": "2026-01-02T03:04:05Z"}
    view = PodView.from_body({"metadata": meta, "status": {"phase": "Running"}})
    assert view.deleting and view.deletion_timestamp == NOW
    view = PodView.from_body({"metadata": {"name": "demo-0-0-x"}})
    assert not view.deleting and view.deletion_timestamp is None


NAME_CONFLICT = Blocker(api.REASON_NAME_CONFLICT, "ServiceAccount/demo-trainer already exists")
CLAIM_NOT_ALLOWED = Blocker(api.REASON_CLAIM_NOT_ALLOWED, "PersistentVolumeClaim ckpt lacks")


@pytest.mark.parametrize(
    ("case", "status", "jobs", "pods", "blocker", "phase"),
    [
        ("a new experiment", None, [], [], NAME_CONFLICT, api.PENDING),
        ("a new experiment", None, [], [], CLAIM_NOT_ALLOWED, api.PENDING),
        (
            "a restart",
            running_status(),
            [job(0)],
            [pod(0, "Failed", exit_code=75, job_uid="job-uid-0")],
            NAME_CONFLICT,
            api.RESTARTING,
        ),
    ],
)
def test_a_blocked_start_creates_no_job_names_none_and_looks_again(
    case, status, jobs, pods, blocker, phase
):
    plan = decide(replace(observe(status, jobs, pods), blocked=blocker))
    assert plan.create_job is None
    assert plan.status.phase == phase
    assert (plan.status.job_name, plan.status.job_uid, plan.status.coordinator_address) == (
        None,
        None,
        None,
    )
    blocked = find(plan.status.conditions, api.COND_BLOCKED)
    assert (blocked["status"], blocked["reason"], blocked["message"]) == (
        "True",
        blocker.reason,
        blocker.message,
    )
    assert ("Warning", blocker.reason) in [(e.type, e.reason) for e in plan.events]
    assert plan.requeue_after == BLOCKED_REQUEUE_SECONDS
    # Still blocked on the next look: nothing to write, nobody told twice.
    again = decide(replace(settle(observe(status, jobs, pods), plan), blocked=blocker))
    assert again.status.patch_from(plan.status) == {}
    assert again.events == ()
    # Unblocked: the Job is created and Blocked turns False.
    free = decide(replace(settle(observe(status, jobs, pods), plan), blocked=None))
    assert free.create_job == plan.status.attempt
    unblocked = find(free.status.conditions, api.COND_BLOCKED)
    assert (unblocked["status"], unblocked["reason"]) == ("False", api.REASON_UNBLOCKED)
    assert api.REASON_UNBLOCKED in reasons(free)


def test_the_operator_records_the_uid_of_the_job_it_sees():
    status = running_status(phase=api.PENDING)
    del status["jobUID"]
    plan = decide(observe(status, [job(0)], [pod(0, "Pending")]))
    assert plan.status.patch_from(Status.from_dict(status))["jobUID"] == "job-uid-0"


@pytest.mark.parametrize(
    ("jobs", "expected"),
    [
        ([], "gone"),  # the watch no longer shows it
        ([replace(job(0), deleting=True)], "being deleted"),
    ],
)
def test_a_job_deleted_by_someone_else_is_a_preemption_under_a_new_name(jobs, expected):
    unconfirmed = decide(observe(running_status(restarts=0), jobs))
    assert unconfirmed.read == Read(READ_JOB, "demo-0", "job-uid-0")  # not on the watch's word
    assert unconfirmed.status == Status.from_dict(running_status(restarts=0))
    assert (unconfirmed.create_job, unconfirmed.delete_jobs, unconfirmed.events) == (None, (), ())
    plan = decide(replace(observe(running_status(restarts=0), jobs), job_gone="job-uid-0"))
    assert (plan.status.restarts, plan.status.preemptions) == (0, 1)
    assert plan.status.job_name == "demo-1" and plan.status.job_uid is None
    restarting = find(plan.status.conditions, api.COND_RESTARTING)
    assert (restarting["status"], restarting["reason"]) == ("True", api.REASON_JOB_DELETED)
    assert "Job demo-0" in restarting["message"]
    assert api.REASON_JOB_DELETED in reasons(plan)
    assert plan.create_job == 1


def test_a_suspension_forgets_the_jobs_uid():
    plan = decide(observe(running_status(), [job(0)], gang(1), suspend=True))
    assert plan.status.job_uid is None


def test_a_suspended_experiment_is_no_longer_blocked():
    blocked = decide(replace(observe(), blocked=NAME_CONFLICT))
    status = blocked.status.patch_from(Status())
    plan = decide(observe(status, suspend=True))
    condition = find(plan.status.conditions, api.COND_BLOCKED)
    assert (condition["status"], condition["reason"]) == ("False", api.REASON_SUSPENDED)


# -- where checkpoints go ------------------------------------------------------------------
DEFAULT = "gs://team-bucket/evokube"


def test_without_a_location_the_operators_default_names_the_experiments_own_folder():
    obs = observe()
    plan = decide(obs, default_checkpoints=DEFAULT)
    assert plan.status.checkpoint_location == f"{DEFAULT}/ns/demo"
    assert desired_spec(obs.experiment, DEFAULT).checkpoint_location == f"{DEFAULT}/ns/demo"
    assert find(plan.status.conditions, api.COND_CHECKPOINTS_EPHEMERAL) is None
    assert api.REASON_EMPTYDIR_CHECKPOINTS not in all_reasons(plan)


def test_the_experiments_own_location_wins_over_the_default():
    plan = decide(observe(checkpoint={"location": "s3://mine/x"}), default_checkpoints=DEFAULT)
    assert plan.status.checkpoint_location == "s3://mine/x"


def test_a_changed_default_never_moves_a_started_experiment():
    first = decide(observe(), default_checkpoints=DEFAULT)
    obs = settle(observe(), first)
    restart = decide(obs, default_checkpoints="s3://elsewhere")
    assert restart.status.checkpoint_location == f"{DEFAULT}/ns/demo"
    spec = desired_spec(obs.experiment, "s3://elsewhere")  # what the restarted Job is built from
    assert spec.checkpoint_location == f"{DEFAULT}/ns/demo"


def test_checkpoints_in_an_emptydir_are_a_warning_once_not_a_refusal():
    plan = decide(observe())
    warning = find(plan.status.conditions, api.COND_CHECKPOINTS_EPHEMERAL)
    assert (warning["status"], warning["reason"]) == ("True", api.REASON_EMPTYDIR_CHECKPOINTS)
    assert "will not survive a gang restart" in warning["message"]
    assert [e.type for e in plan.events if e.reason == api.REASON_EMPTYDIR_CHECKPOINTS] == [
        "Warning"
    ]
    assert plan.create_job == 0
    again = decide(settle(observe(), plan))
    assert api.REASON_EMPTYDIR_CHECKPOINTS not in all_reasons(again)


@pytest.mark.parametrize(
    "checkpoint",
    [
        {"location": "gs://b-1/x"},
        {"location": "s3://b-1/x"},
        {"location": "/c", "volumeClaimName": "c"},
    ],
)
def test_checkpoints_that_outlive_the_pods_raise_no_warning(checkpoint):
    plan = decide(observe(checkpoint=checkpoint))
    assert find(plan.status.conditions, api.COND_CHECKPOINTS_EPHEMERAL) is None
    assert api.REASON_EMPTYDIR_CHECKPOINTS not in all_reasons(plan)


def test_a_claim_without_a_location_keeps_the_default_path_not_the_default_bucket():
    obs = observe(checkpoint={"volumeClaimName": "c"})
    plan = decide(obs, default_checkpoints=DEFAULT)
    assert plan.status.checkpoint_location == api.DEFAULT_CHECKPOINT_DIR
    assert desired_spec(obs.experiment, DEFAULT).checkpoint_claim == "c"


# -- a namespace's folder of the default location is no other namespace's ------------------------
@pytest.mark.parametrize(
    ("location", "default"),
    [
        (f"{DEFAULT}/other/demo", DEFAULT),  # another namespace's experiment
        (f"{DEFAULT}/other", DEFAULT),  # another namespace's folder
        (f"{DEFAULT}/nsx/demo", DEFAULT),  # a namespace whose name starts like this one's
        (DEFAULT, DEFAULT),  # the default itself: the trainer's folders would land among them
        ("gs://team-bucket", DEFAULT),  # above it
        ("s3://team-bucket/evokube/other/x", DEFAULT),  # Cloud Storage answers S3 too
        ("GS://Team-Bucket/Evokube/other/x", DEFAULT),  # cases
        (f"{DEFAULT}/NS/x", DEFAULT),  # the namespace's own name, in another case
        ("gs://team-bucket//evokube/other/x", DEFAULT),  # an empty segment
        (f"{DEFAULT}/ns/../other/x", DEFAULT),  # Orbax normalises paths
        (f"{DEFAULT}/ns/./x", DEFAULT),
        (f"{DEFAULT}/ns/%2E%2E/other", DEFAULT),  # an escape
        ("gs://team-bucket/evokube%2Fother/x", DEFAULT),
        ("gs://team-bucket/a b", DEFAULT),
        (f"{DEFAULT}/other/x", f"{DEFAULT}/"),  # the operator's default, spelled otherwise
        ("gs://team-bucket/other/x", "gs://team-bucket"),  # a default that is a whole bucket
    ],
)
def test_locations_reaching_into_other_namespaces_folders_are_refused(location, default):
    blocker = location_blocker(location, default, "ns")
    assert blocker is not None
    assert blocker.reason == api.REASON_LOCATION_NOT_ALLOWED
    assert blocker.message.startswith(f"spec.checkpoint.location: {location} reaches into")


@pytest.mark.parametrize(
    ("location", "default"),
    [
        (f"{DEFAULT}/ns/demo", DEFAULT),  # its own default folder
        (f"{DEFAULT}/ns", DEFAULT),  # the namespace's folder
        (f"{DEFAULT}/ns/another-experiment/x", DEFAULT),  # the namespace's other experiments
        ("s3://team-bucket/evokube/ns/x", DEFAULT),
        ("gs://team-bucket/EVOKUBE/ns/x", DEFAULT),
        ("gs://team-bucket/elsewhere/x", DEFAULT),  # beside the default: IAM decides
        ("gs://team-bucket/evokube-old/other", DEFAULT),
        ("gs://other-bucket/evokube/other/x", DEFAULT),
        ("gs://other-bucket/a%2Fb", DEFAULT),
        ("/checkpoints/other", DEFAULT),  # a path: a volume of the pod's own
        (f"{DEFAULT}/other/demo", None),  # no default location
    ],
)
def test_locations_of_the_namespace_or_beside_the_default_are_allowed(location, default):
    assert location_blocker(location, default, "ns") is None


def test_a_location_in_another_namespaces_folder_blocks_and_is_never_recorded():
    theirs = f"{DEFAULT}/other/demo"
    obs = observe(checkpoint={"location": theirs})
    plan = decide(obs, default_checkpoints=DEFAULT)
    assert plan.create_job is None
    blocked = find(plan.status.conditions, api.COND_BLOCKED)
    assert (blocked["status"], blocked["reason"]) == ("True", api.REASON_LOCATION_NOT_ALLOWED)
    assert blocked["message"].startswith(f"spec.checkpoint.location: {theirs}")
    assert ("Warning", api.REASON_LOCATION_NOT_ALLOWED) in [(e.type, e.reason) for e in plan.events]
    # Not in status, which would make it the experiment's location once the spec drops it.
    assert plan.status.checkpoint_location is None
    fixed = decide(observe(settle(obs, plan).experiment.status), default_checkpoints=DEFAULT)
    assert fixed.create_job == 0
    assert fixed.status.checkpoint_location == f"{DEFAULT}/ns/demo"
    unblocked = find(fixed.status.conditions, api.COND_BLOCKED)
    assert (unblocked["status"], unblocked["reason"]) == ("False", api.REASON_UNBLOCKED)


def test_a_location_recorded_before_the_rule_blocks_the_next_attempt():
    status = running_status(checkpointLocation=f"{DEFAULT}/other/demo")
    failed = pod(0, "Failed", exit_code=75, job_uid="job-uid-0")
    plan = decide(observe(status, [job(0)], [failed]), default_checkpoints=DEFAULT)
    assert plan.create_job is None
    blocked = find(plan.status.conditions, api.COND_BLOCKED)
    assert blocked["reason"] == api.REASON_LOCATION_NOT_ALLOWED
