"""The reconciler's order of API calls and its answers to conflicts, on a fake API."""

import copy
from collections.abc import Callable
from datetime import timedelta

import pytest

from evokube_operator import api
from evokube_operator.cluster.kube import ApiError
from evokube_operator.conditions import find
from evokube_operator.plans.decide import BLOCKED_REQUEUE_SECONDS
from evokube_operator.reading.ownership import NameConflict, is_owned_by
from evokube_operator.reconcilers.reconcile import Reconciler
from evokube_operator.rules.refusal import RETRY_MIN_SECONDS, Refusal
from tests.operator.factories import NOW, body, gang, job, pod, running_status

KEY = ("ns", "demo")


class FakeKube:
    """Just enough of the API server: one experiment, objects by (kind, name), a call log.

    create_owned follows kube.Kube's contract (tested on the real API server in
    test_ownership.py and test_refusals.py): create (or, in a dry run, only ask); a taken name
    is ours to update only if we control it; what the API server refuses raises Refusal.
    """

    def __init__(self, experiment: dict, kind: str = api.KIND):
        self.kind = kind  # of the one object (an ERLSweep for the sweep reconciler's tests)
        self.experiment = copy.deepcopy(experiment)
        self.objects: dict[tuple[str, str], dict] = {}
        self.calls: list[tuple[str, str]] = []
        self.refuse: dict[str, tuple[int, str]] = {}  # kind -> (HTTP code, the API's message)
        # A status write's ApiError, if the server would refuse it (too large, say).
        self.refuse_status: Callable[[dict], ApiError | None] = lambda status: None
        self.deleted: list[tuple[str, str | None]] = []  # (name, uid precondition)

    def _bump(self):
        meta = self.experiment["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    def external_status_write(self, **status):
        """Someone else (the trainer) writes status: the resourceVersion moves on."""
        self.experiment["status"].update(status)
        self._bump()

    def get(self, kind, namespace, name):
        self.calls.append(("get", kind))
        if kind == self.kind:
            return copy.deepcopy(self.experiment)
        if (kind, name) not in self.objects:
            raise ApiError(404, f"{kind} {name} not found", "NotFound")
        return copy.deepcopy(self.objects[kind, name])

    def create_owned(self, obj, owner_uid, update=True, dry_run=False):
        kind, name = obj["kind"], obj["metadata"]["name"]
        self.calls.append(("dry-run" if dry_run else "create", kind))
        if kind in self.refuse:
            raise Refusal(kind, name, *self.refuse[kind])
        existing = self.objects.get((kind, name))
        if existing is None:
            if not dry_run:
                self.objects[kind, name] = obj
            return obj, True
        if not is_owned_by(existing, owner_uid):
            raise NameConflict(kind, name)
        if update and not dry_run:
            self.calls.append(("apply", kind))
            self.objects[kind, name] = obj
        return existing, False

    def create_owned_all(self, objs, owner_uid):
        conflicts = []
        for obj in objs:
            try:
                self.create_owned(obj, owner_uid)
            except NameConflict as conflict:
                conflicts.append(conflict)
        return conflicts

    def delete(self, kind, namespace, name, uid=None):
        self.calls.append(("delete", kind))
        self.deleted.append((name, uid))
        return self.objects.pop((kind, name), None) is not None

    def patch_status(self, namespace, name, status, resource_version, kind=api.KIND):
        assert kind == self.kind
        self.calls.append(("patch_status", kind))
        if resource_version != self.experiment["metadata"]["resourceVersion"]:
            raise ApiError(409, "the object has been modified", "Conflict")
        refused = self.refuse_status(status)
        if refused is not None:
            raise refused
        merged = {**self.experiment["status"], **status}
        self.experiment["status"] = {k: v for k, v in merged.items() if v is not None}
        self._bump()
        return copy.deepcopy(self.experiment)

    def post_event(self, involved, type_, reason, message):
        self.calls.append(("event", reason))

    def verbs(self):
        return [verb for verb, _ in self.calls]


def reconciler(kube):
    return Reconciler(kube, clock=lambda: NOW)


def test_a_new_experiment_gets_its_objects_then_status_then_its_job():
    kube = FakeKube(body())
    outcome = reconciler(kube).reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
    assert kube.calls == [
        ("create", "Service"),
        ("create", "ServiceAccount"),
        ("create", "Role"),
        ("create", "RoleBinding"),
        ("patch_status", api.KIND),
        ("event", api.REASON_EMPTYDIR_CHECKPOINTS),  # the factory's experiment: no location
        ("create", "ConfigMap"),  # the attempt's manifest, before its Job
        ("create", "Job"),
        ("event", api.REASON_JOB_CREATED),
    ]
    assert outcome.phase == api.PENDING
    assert kube.experiment["status"]["jobName"] == "demo-0"
    assert ("Job", "demo-0") in kube.objects
    assert ("ConfigMap", "demo-0-manifest") in kube.objects


def test_a_status_the_api_server_refuses_is_a_condition_and_an_event_and_no_job():
    kube = FakeKube(body())
    refusal = ApiError(422, "status.message: Too long: may not be more than 4096 bytes")
    kube.refuse_status = lambda status: None if status.keys() == {"conditions"} else refusal
    with pytest.raises(ApiError):
        reconciler(kube).reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
    incomplete = find(kube.experiment["status"]["conditions"], api.COND_STATUS_INCOMPLETE)
    assert (incomplete["status"], incomplete["reason"]) == ("True", api.REASON_STATUS_REFUSED)
    assert "status.message: Too long" in incomplete["message"]
    assert ("event", api.REASON_STATUS_REFUSED) in kube.calls
    assert ("Job", "demo-0") not in kube.objects  # nothing done that status does not record
    # Taken whole again: the condition goes False, and the Job is created.
    kube.refuse_status = lambda status: None
    reconciler(kube).reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
    incomplete = find(kube.experiment["status"]["conditions"], api.COND_STATUS_INCOMPLETE)
    assert (incomplete["status"], incomplete["reason"]) == ("False", api.REASON_STATUS_WRITTEN)
    assert ("Job", "demo-0") in kube.objects


def test_a_failing_reconcile_is_a_condition_and_one_event_until_one_goes_through():
    kube = FakeKube(body())
    rec = reconciler(kube)
    for _ in range(2):  # retried: the condition stays, the Event is not posted again
        rec.report_failure(KEY, copy.deepcopy(kube.experiment), KeyError("spec.placement"))
    failing = find(kube.experiment["status"]["conditions"], api.COND_RECONCILE_FAILING)
    assert (failing["status"], failing["reason"]) == ("True", api.REASON_RECONCILE_ERROR)
    assert "KeyError: 'spec.placement'" in failing["message"]
    assert kube.calls.count(("event", api.REASON_RECONCILE_ERROR)) == 1
    rec.reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
    failing = find(kube.experiment["status"]["conditions"], api.COND_RECONCILE_FAILING)
    assert (failing["status"], failing["reason"]) == ("False", api.REASON_RECONCILED)
    assert ("Job", "demo-0") in kube.objects


def test_a_gang_that_simply_runs_costs_no_api_call():
    kube = FakeKube(body(status=running_status()))
    outcome = reconciler(kube).reconcile(KEY, copy.deepcopy(kube.experiment), (job(0),), gang(1))
    assert kube.calls == []
    assert outcome.phase == api.RUNNING


def manifest_of_attempt(attempt: int, owner_uid: str) -> dict:
    name = f"demo-{attempt}-manifest"
    owner = {"uid": owner_uid, "controller": True}
    return {"kind": "ConfigMap", "metadata": {"name": name, "ownerReferences": [owner]}}


def test_a_restart_writes_status_before_the_new_job_and_reuses_the_owned_objects():
    kube = FakeKube(body(status=running_status()))
    kube.objects["ConfigMap", "demo-0-manifest"] = manifest_of_attempt(
        0, kube.experiment["metadata"]["uid"]
    )
    rec = reconciler(kube)
    failed = (pod(0, "Failed", exit_code=75, job_uid="job-uid-0"),)
    outcome = rec.reconcile(KEY, copy.deepcopy(kube.experiment), (job(0),), failed)
    calls = kube.calls
    assert calls.index(("patch_status", api.KIND)) < calls.index(("delete", "Job"))
    assert calls.index(("delete", "Job")) < calls.index(("create", "Job"))
    assert outcome.restarts == 1
    assert kube.experiment["status"]["restarts"] == 1
    # Only the very Job it saw it owns, and that attempt's manifest with it.
    assert kube.deleted == [("demo-0", "job-uid-0"), ("demo-0-manifest", None)]
    # A second restart in the same process does not touch the owned objects again.
    kube.calls.clear()
    failed = (pod(0, "Failed", exit_code=75, attempt=1, job_uid="job-uid-1"),)
    rec.reconcile(KEY, copy.deepcopy(kube.experiment), (job(1),), failed)
    assert [kind for verb, kind in kube.calls if verb == "create"] == ["ConfigMap", "Job"]
    assert kube.experiment["status"]["jobName"] == "demo-2"


def test_a_restart_leaves_a_tenants_namesake_of_the_last_manifest():
    kube = FakeKube(body(status=running_status()))
    kube.objects["ConfigMap", "demo-0-manifest"] = manifest_of_attempt(0, "someone-else")
    failed = (pod(0, "Failed", exit_code=75, job_uid="job-uid-0"),)
    reconciler(kube).reconcile(KEY, copy.deepcopy(kube.experiment), (job(0),), failed)
    assert kube.deleted == [("demo-0", "job-uid-0")]
    assert ("ConfigMap", "demo-0-manifest") in kube.objects
    assert ("ConfigMap", "demo-1-manifest") in kube.objects


def test_a_conflict_means_read_again_and_decide_again_keeping_the_trainers_progress():
    kube = FakeKube(body(status=running_status(phase=api.PENDING)))
    cached = copy.deepcopy(kube.experiment)
    kube.external_status_write(progress={"generation": 3})
    outcome = reconciler(kube).reconcile(KEY, cached, (job(0),), gang(1))
    assert kube.verbs() == ["patch_status", "get", "patch_status", "event"]
    assert outcome.phase == api.RUNNING
    assert kube.experiment["status"]["progress"] == {"generation": 3}


def test_a_stale_cache_is_read_again_before_any_job_is_created():
    # The cache still says attempt 0, but attempt 1's Job exists: status moved on.
    kube = FakeKube(body(status=running_status(attempt=1, restarts=1)))
    cached = body(status=running_status())
    reconciler(kube).reconcile(KEY, cached, (job(1),), gang(1, attempt=1))
    assert kube.verbs() == ["get"]  # read, then nothing to do: attempt 1 runs


def test_a_job_deleted_behind_the_operators_back_starts_the_next_attempt_as_a_preemption():
    kube = FakeKube(body(status=running_status()))  # the operator had seen demo-0 (jobUID)
    reconciler(kube).reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
    calls = kube.calls
    assert calls.index(("patch_status", api.KIND)) < calls.index(("create", "Job"))  # guarded
    assert ("Job", "demo-1") in kube.objects
    assert ("Job", "demo-0") not in kube.objects  # never recreated under its old name
    status = kube.experiment["status"]
    assert (status["phase"], status["restarts"], status["preemptions"]) == (api.RESTARTING, 0, 1)
    assert "jobUID" not in status
    restarting = find(status["conditions"], api.COND_RESTARTING)
    assert restarting["reason"] == api.REASON_JOB_DELETED
    assert "Job demo-0" in restarting["message"]
    assert ("event", api.REASON_JOB_DELETED) in kube.calls


def test_a_job_missing_only_from_the_watch_is_no_reason_for_a_new_attempt():
    kube = FakeKube(body(status=running_status()))
    kube.objects["Job", "demo-0"] = {
        "kind": "Job",
        "metadata": {"name": "demo-0", "uid": "job-uid-0"},
    }
    outcome = reconciler(kube).reconcile(KEY, copy.deepcopy(kube.experiment), (), gang(1))
    assert kube.calls == [("get", "Job")]
    assert outcome.phase == api.RUNNING


def test_a_job_not_seen_yet_is_created_again_under_the_same_name():
    status = running_status(phase=api.PENDING)
    del status["jobUID"]  # created, then gone before the operator ever saw it
    kube = FakeKube(body(status=status))
    reconciler(kube).reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
    assert ("Job", "demo-0") in kube.objects
    assert ("ConfigMap", "demo-0-manifest") in kube.objects
    assert kube.experiment["status"]["preemptions"] == 0


def test_creating_a_job_without_a_status_write_first_reads_the_experiment_again():
    kube = FakeKube(body())
    rec = reconciler(kube)
    rec.reconcile(KEY, copy.deepcopy(kube.experiment), (), ())  # Pending, demo-0 created
    del kube.objects["Job", "demo-0"]  # gone before the watch ever showed it
    kube.calls.clear()
    reconciler(kube).reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
    assert kube.verbs()[0] == "get"
    assert ("Job", "demo-0") in kube.objects
    assert ("ConfigMap", "demo-0-manifest") in kube.objects


def test_the_reconciler_prefers_its_own_newer_write_to_the_cache():
    kube = FakeKube(body(status=running_status(phase=api.PENDING)))
    rec = reconciler(kube)
    cached = copy.deepcopy(kube.experiment)
    rec.reconcile(KEY, cached, (job(0),), gang(1))  # writes Running
    kube.calls.clear()
    rec.reconcile(KEY, cached, (job(0),), gang(1))  # the cache has not caught up
    assert kube.calls == []


INVALID_JOB = (422, 'Job.batch "demo-0" is invalid: spec.template.spec.affinity: Invalid value')
INVALID_SERVICE = (422, 'Service "demo" is invalid: spec.ports[1]: Duplicate value')
DENIED = (403, "jobs.batch \"demo-0\" is forbidden: ValidatingAdmissionPolicy 'p' denied request")
NO_JOBS = (
    403,
    'jobs.batch "demo-0" is forbidden: exceeded quota: q, requested: count/jobs.batch=1',
)
NO_SERVICES = (403, 'services "demo" is forbidden: exceeded quota: q, requested: services=1')


@pytest.mark.parametrize(
    ("kind", "refusal"),
    [("Job", INVALID_JOB), ("Service", INVALID_SERVICE), ("Job", DENIED)],
    ids=["invalid job", "invalid service", "denied job"],
)
def test_an_object_refused_for_good_fails_the_experiment_within_one_reconcile(kind, refusal):
    kube = FakeKube(body())
    kube.refuse[kind] = refusal
    outcome = reconciler(kube).reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
    assert outcome.phase == api.FAILED
    status = kube.experiment["status"]
    failed = find(status["conditions"], api.COND_FAILED)
    assert failed["reason"] == api.REASON_CREATION_REFUSED
    name = "demo-0" if kind == "Job" else "demo"
    assert failed["message"] == f"the API server refused {kind} {name}: {refusal[1]}"
    assert ("event", api.REASON_CREATION_REFUSED) in kube.calls
    assert ("Job", "demo-0") not in kube.objects


@pytest.mark.parametrize(("kind", "refusal"), [("Job", NO_JOBS), ("Service", NO_SERVICES)])
def test_a_quota_blocks_within_one_reconcile_and_is_tried_again_without_a_storm(kind, refusal):
    kube = FakeKube(body())
    kube.refuse[kind] = refusal
    clock = [NOW]
    rec = Reconciler(kube, clock=lambda: clock[0])
    outcome = rec.reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
    assert (outcome.phase, outcome.requeue_after) == (api.PENDING, RETRY_MIN_SECONDS)
    blocked = blocked_condition(kube)
    assert (blocked["status"], blocked["reason"]) == ("True", api.REASON_CREATION_FAILING)
    assert refusal[1] in blocked["message"]
    assert "jobName" not in kube.experiment["status"]
    assert [c for c in kube.calls if c[0] == "event"][-1] == ("event", api.REASON_CREATION_FAILING)
    # Still refused: one try (a dry run of the Job), nothing written, nobody told twice.
    for seconds in (5, 10, 20):
        clock[0] = NOW + timedelta(seconds=seconds)
        kube.calls.clear()
        outcome = rec.reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
        assert [c for c in kube.calls if c[1] == kind] == [
            ("dry-run" if kind == "Job" else "create", kind)
        ]
        assert not [c for c in kube.calls if c[0] in ("patch_status", "event")]
        assert outcome.requeue_after == seconds  # as long as it has been Blocked
    # The quota raised: the Job is created and Blocked turns False.
    del kube.refuse[kind]
    rec.reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
    assert ("Job", "demo-0") in kube.objects
    assert ("ConfigMap", "demo-0-manifest") in kube.objects
    blocked = blocked_condition(kube)
    assert (blocked["status"], blocked["reason"]) == ("False", api.REASON_UNBLOCKED)
    assert kube.experiment["status"]["jobName"] == "demo-0"


def test_a_refused_static_object_does_not_stop_a_running_gang():
    kube = FakeKube(body(status=running_status(), generation=2))  # an edited spec
    kube.refuse["Service"] = INVALID_SERVICE
    outcome = reconciler(kube).reconcile(KEY, copy.deepcopy(kube.experiment), (job(0),), gang(1))
    assert outcome.phase == api.RUNNING
    assert kube.experiment["status"]["observedGeneration"] == 2


def test_an_expired_experiment_is_deleted():
    status = running_status(phase=api.SUCCEEDED, completionTime="2026-01-01T00:00:00Z")
    kube = FakeKube(body(status=status, ttlSecondsAfterFinished=60))
    outcome = reconciler(kube).reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
    assert kube.calls == [("event", api.REASON_EXPIRED), ("delete", api.KIND)]
    assert outcome.phase == api.SUCCEEDED


def test_a_vanished_experiment_is_forgotten():
    kube = FakeKube(body())
    assert reconciler(kube).reconcile(KEY, None, (), ()).phase is None
    assert kube.calls == []


def test_transient_errors_propagate_for_the_controller_to_retry():
    kube = FakeKube(body())

    def unavailable(obj):
        raise ApiError(503, "etcd is sad")

    kube.create_owned_all = lambda objs, owner_uid: unavailable(objs)
    with pytest.raises(ApiError):
        reconciler(kube).reconcile(KEY, copy.deepcopy(kube.experiment), (), ())


def foreign(kind: str, name: str, **extra) -> dict:
    """An object someone else made under a name the experiment needs."""
    return {"kind": kind, "metadata": {"name": name, "namespace": "ns", **extra}}


def blocked_condition(kube):
    return find(kube.experiment["status"].get("conditions") or [], api.COND_BLOCKED)


@pytest.mark.parametrize(
    ("kind", "name", "owners"),
    [
        ("ServiceAccount", "demo-trainer", []),
        ("Service", "demo", []),
        # A deleted namesake's leftovers are not this experiment's either.
        ("RoleBinding", "demo-trainer", [{"uid": "other-uid", "controller": True}]),
    ],
)
def test_a_foreign_object_under_an_owned_name_blocks_the_start_and_stays_untouched(
    kind, name, owners
):
    kube = FakeKube(body())
    kube.objects[kind, name] = taken = foreign(kind, name, ownerReferences=owners)
    rec = reconciler(kube)
    outcome = rec.reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
    assert kube.objects[kind, name] is taken
    assert ("apply", kind) not in kube.calls
    assert ("create", "Job") not in kube.calls
    assert ("event", api.REASON_NAME_CONFLICT) in kube.calls
    blocked = blocked_condition(kube)
    assert (blocked["status"], blocked["reason"]) == ("True", api.REASON_NAME_CONFLICT)
    assert f"{kind}/{name}" in blocked["message"]
    assert "jobName" not in kube.experiment["status"]
    assert outcome.phase == api.PENDING
    assert outcome.requeue_after == BLOCKED_REQUEUE_SECONDS
    # Looking again while nothing changed writes nothing and tells nobody twice.
    kube.calls.clear()
    rec.reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
    assert ("patch_status", api.KIND) not in kube.calls
    assert not [c for c in kube.calls if c[0] == "event"]
    # Once the object is gone, the experiment starts and Blocked clears.
    del kube.objects[kind, name]
    rec.reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
    assert ("Job", "demo-0") in kube.objects
    assert ("ConfigMap", "demo-0-manifest") in kube.objects
    blocked = blocked_condition(kube)
    assert (blocked["status"], blocked["reason"]) == ("False", api.REASON_UNBLOCKED)
    assert kube.experiment["status"]["jobName"] == "demo-0"


@pytest.mark.parametrize("kind", ["ServiceAccount", "Role"])
def test_nothing_is_bound_to_a_foreign_account_or_role(kind):
    kube = FakeKube(body())
    kube.objects[kind, "demo-trainer"] = foreign(kind, "demo-trainer")
    reconciler(kube).reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
    assert ("create", "RoleBinding") not in kube.calls
    assert ("RoleBinding", "demo-trainer") not in kube.objects


def test_a_foreign_job_under_the_attempts_name_is_never_adopted():
    kube = FakeKube(body())
    kube.objects["Job", "demo-0"] = taken = foreign("Job", "demo-0")
    rec = reconciler(kube)
    outcome = rec.reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
    assert outcome.requeue_after == BLOCKED_REQUEUE_SECONDS  # found at creation: said at once
    status = kube.experiment["status"]
    assert "jobName" not in status and "coordinatorAddress" not in status
    assert blocked_condition(kube)["reason"] == api.REASON_NAME_CONFLICT
    assert "Job/demo-0" in blocked_condition(kube)["message"]
    # Looking again: the Job is tried in a dry run before any write, so nothing flaps.
    kube.calls.clear()
    outcome = rec.reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
    assert ("patch_status", api.KIND) not in kube.calls
    assert ("create", "Job") not in kube.calls and ("dry-run", "Job") in kube.calls
    assert outcome.requeue_after == BLOCKED_REQUEUE_SECONDS
    assert kube.objects["Job", "demo-0"] is taken
    assert kube.deleted == []


CLAIM = {"location": "/ckpt", "volumeClaimName": "ckpt"}


@pytest.mark.parametrize(
    ("labels", "said"),
    [
        (None, "does not exist"),
        ({}, "lacks the label"),
        ({api.LABEL_CHECKPOINT_CLAIM: "false"}, "lacks the label"),
    ],
)
def test_a_checkpoint_claim_must_opt_in(labels, said):
    kube = FakeKube(body(checkpoint=CLAIM))
    if labels is not None:
        kube.objects["PersistentVolumeClaim", "ckpt"] = foreign(
            "PersistentVolumeClaim", "ckpt", labels=labels
        )
    rec = reconciler(kube)
    rec.reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
    blocked = blocked_condition(kube)
    assert blocked["reason"] == api.REASON_CLAIM_NOT_ALLOWED
    assert said in blocked["message"] and api.LABEL_CHECKPOINT_CLAIM in blocked["message"]
    assert "PersistentVolumeClaim ckpt" in blocked["message"]
    assert not [c for c in kube.calls if c[0] == "create"]  # not even the owned objects
    kube.objects["PersistentVolumeClaim", "ckpt"] = foreign(
        "PersistentVolumeClaim", "ckpt", labels={api.LABEL_CHECKPOINT_CLAIM: "true"}
    )
    rec.reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
    assert ("Job", "demo-0") in kube.objects
    assert ("ConfigMap", "demo-0-manifest") in kube.objects
    assert blocked_condition(kube)["status"] == "False"


class WorkloadKube(FakeKube):
    """FakeKube that lists Kueue Workloads (or answers 404: no such kind, Kueue absent)."""

    def __init__(self, experiment, workloads=None):
        super().__init__(experiment)
        self.workloads = workloads
        self.selectors: list[str] = []

    def list(self, kind, namespace, labelSelector):
        assert kind == "Workload"
        self.selectors.append(labelSelector)
        if self.workloads is None:
            raise ApiError(404, "the server could not find the requested resource", "NotFound")
        return self.workloads


PENDING_WORKLOAD = {
    "status": {
        "conditions": [
            {
                "type": "QuotaReserved",
                "status": "False",
                "reason": "Pending",
                "message": "couldn't assign flavors to pod set main: insufficient unused quota",
            }
        ]
    }
}


@pytest.mark.parametrize(
    ("workloads", "reason", "said"),
    [
        ([PENDING_WORKLOAD], "Pending", "insufficient unused quota"),
        (None, api.REASON_NO_WORKLOAD, "is Kueue installed with its batch/job integration"),
    ],
)
def test_a_queued_job_shows_what_kueue_says_read_at_most_once_per_interval(workloads, reason, said):
    experiment = body(status=running_status(phase=api.PENDING), queueName="tpu-q")
    kube = WorkloadKube(experiment, workloads)
    clock = [NOW]
    reconciler = Reconciler(kube, clock=lambda: clock[0])
    held = (job(0, suspended=True),)
    outcome = reconciler.reconcile(KEY, experiment, held, ())
    assert kube.selectors == ["kueue.x-k8s.io/job-uid=job-uid-0"]
    assert outcome.phase == api.QUEUED and outcome.requeue_after == 15.0
    queued = find(kube.experiment["status"]["conditions"], api.COND_QUEUED)
    assert queued["reason"] == reason and said in queued["message"]
    reconciler.reconcile(KEY, kube.experiment, held, ())
    assert len(kube.selectors) == 1
    clock[0] = NOW + timedelta(seconds=15)
    reconciler.reconcile(KEY, kube.experiment, held, ())
    assert len(kube.selectors) == 2
    assert ("create", "Job") not in kube.calls  # never a second Job, never an unsuspend
