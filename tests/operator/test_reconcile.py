"""The reconciler's order of API calls and its answers to conflicts, on a fake API."""

import copy

import pytest

from evokube_operator import api
from evokube_operator.kube import ApiError
from evokube_operator.reconcile import Reconciler
from tests.operator.factories import NOW, body, gang, job, pod, running_status

KEY = ("ns", "demo")


class FakeKube:
    """Just enough of the API server: one experiment, objects by (kind, name), a call log."""

    def __init__(self, experiment: dict):
        self.experiment = copy.deepcopy(experiment)
        self.objects: dict[tuple[str, str], dict] = {}
        self.calls: list[tuple[str, str]] = []
        self.refuse_jobs: str | None = None

    def _bump(self):
        meta = self.experiment["metadata"]
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)

    def external_status_write(self, **status):
        """Someone else (the trainer) writes status: the resourceVersion moves on."""
        self.experiment["status"].update(status)
        self._bump()

    def get(self, kind, namespace, name):
        self.calls.append(("get", kind))
        return copy.deepcopy(self.experiment)

    def apply(self, obj):
        self.calls.append(("apply", obj["kind"]))
        self.objects[obj["kind"], obj["metadata"]["name"]] = obj
        return obj

    def apply_all(self, objs):
        return [self.apply(obj) for obj in objs]

    def create(self, obj):
        self.calls.append(("create", obj["kind"]))
        if self.refuse_jobs:
            raise ApiError(422, self.refuse_jobs, "Invalid")
        key = (obj["kind"], obj["metadata"]["name"])
        if key in self.objects:
            return None
        self.objects[key] = obj
        return obj

    def delete(self, kind, namespace, name, uid=None):
        self.calls.append(("delete", kind))
        return self.objects.pop((kind, name), None) is not None

    def patch_status(self, namespace, name, status, resource_version):
        self.calls.append(("patch_status", api.KIND))
        if resource_version != self.experiment["metadata"]["resourceVersion"]:
            raise ApiError(409, "the object has been modified", "Conflict")
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
        ("apply", "ConfigMap"),
        ("apply", "Service"),
        ("apply", "ServiceAccount"),
        ("apply", "Role"),
        ("apply", "RoleBinding"),
        ("patch_status", api.KIND),
        ("create", "Job"),
        ("event", api.REASON_JOB_CREATED),
    ]
    assert outcome.phase == api.PENDING
    assert kube.experiment["status"]["jobName"] == "demo-0"
    assert ("Job", "demo-0") in kube.objects


def test_a_gang_that_simply_runs_costs_no_api_call():
    kube = FakeKube(body(status=running_status()))
    outcome = reconciler(kube).reconcile(KEY, copy.deepcopy(kube.experiment), (job(0),), gang(1))
    assert kube.calls == []
    assert outcome.phase == api.RUNNING


def test_a_restart_writes_status_before_the_new_job_and_reuses_the_owned_objects():
    kube = FakeKube(body(status=running_status()))
    rec = reconciler(kube)
    failed = (pod(0, "Failed", exit_code=75, job_uid="job-uid-0"),)
    outcome = rec.reconcile(KEY, copy.deepcopy(kube.experiment), (job(0),), failed)
    verbs = kube.verbs()
    assert verbs.index("patch_status") < verbs.index("delete") < verbs.index("create")
    assert outcome.restarts == 1
    assert kube.experiment["status"]["restarts"] == 1
    # A second restart in the same process does not apply the owned objects again.
    kube.calls.clear()
    failed = (pod(0, "Failed", exit_code=75, attempt=1, job_uid="job-uid-1"),)
    rec.reconcile(KEY, copy.deepcopy(kube.experiment), (job(1),), failed)
    assert "apply" not in kube.verbs()
    assert kube.experiment["status"]["jobName"] == "demo-2"


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


def test_a_job_deleted_behind_the_operators_back_is_recreated_not_counted():
    kube = FakeKube(body(status=running_status()))
    reconciler(kube).reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
    verbs = kube.verbs()
    assert verbs.index("patch_status") < verbs.index("create")  # back to Pending, guarded
    assert ("Job", "demo-0") in kube.objects
    assert kube.experiment["status"]["phase"] == api.PENDING
    assert kube.experiment["status"]["restarts"] == 0


def test_creating_a_job_without_a_status_write_first_reads_the_experiment_again():
    kube = FakeKube(body())
    rec = reconciler(kube)
    rec.reconcile(KEY, copy.deepcopy(kube.experiment), (), ())  # Pending, demo-0 created
    del kube.objects["Job", "demo-0"]  # gone before the watch ever showed it
    kube.calls.clear()
    reconciler(kube).reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
    assert kube.verbs()[0] == "get"
    assert ("Job", "demo-0") in kube.objects


def test_the_reconciler_prefers_its_own_newer_write_to_the_cache():
    kube = FakeKube(body(status=running_status(phase=api.PENDING)))
    rec = reconciler(kube)
    cached = copy.deepcopy(kube.experiment)
    rec.reconcile(KEY, cached, (job(0),), gang(1))  # writes Running
    kube.calls.clear()
    rec.reconcile(KEY, cached, (job(0),), gang(1))  # the cache has not caught up
    assert kube.calls == []


def test_a_refused_job_fails_the_experiment_on_the_next_pass():
    kube = FakeKube(body(affinity={"nodeAffinity": "yes"}))
    kube.refuse_jobs = "spec.template.spec.affinity.nodeAffinity: Invalid value"
    rec = reconciler(kube)
    outcome = rec.reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
    assert outcome.requeue_after == 0
    outcome = rec.reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
    assert outcome.phase == api.FAILED
    failed = next(c for c in kube.experiment["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == api.REASON_INVALID_SPEC
    assert "affinity.nodeAffinity" in failed["message"]


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

    kube.apply = unavailable
    with pytest.raises(ApiError):
        reconciler(kube).reconcile(KEY, copy.deepcopy(kube.experiment), (), ())
