"""The sweep reconciler's API calls and its answers to refusals and conflicts, on a fake API."""

from evokube_contract import sweep as contract
from evokube_operator import api
from evokube_operator.cluster.kube import ApiError
from evokube_operator.cluster.metrics import Metrics
from evokube_operator.conditions import find
from evokube_operator.reading.observe import SweepChildView
from evokube_operator.reconcilers.sweep_reconcile import SweepReconciler
from tests.operator.factories import NOW
from tests.operator.test_reconcile import FakeKube
from tests.operator.test_sweep_plan import a_sweep

KEY = ("ns", "grid")


def setup(**sweep):
    body = a_sweep(**sweep)
    body["metadata"]["resourceVersion"] = "7"
    kube = FakeKube(body, kind=contract.SWEEP_KIND)
    return kube, SweepReconciler(kube, Metrics(), clock=lambda: NOW)


def test_every_child_is_dry_run_then_max_parallel_created_each_with_an_event():
    kube, reconciler = setup()
    outcome = reconciler.reconcile(KEY, kube.experiment, ())
    assert kube.verbs() == ["dry-run"] * 6 + ["create", "event", "create", "event", "patch_status"]
    assert outcome.phase == api.RUNNING
    assert sorted(name for _, name in kube.objects) == ["grid-0", "grid-1"]
    assert ("event", api.REASON_CHILD_CREATED) in kube.calls
    # The watch shows them: nothing is created twice, and no dry run again.
    kube.calls.clear()
    seen = tuple(SweepChildView.from_body(o) for o in kube.objects.values())
    reconciler.reconcile(KEY, kube.experiment, seen)
    assert "create" not in kube.verbs() and "dry-run" not in kube.verbs()


def test_a_refused_child_creates_nothing_and_writes_invalid():
    kube, reconciler = setup()
    kube.refuse[api.KIND] = (422, "spec.population.size: Invalid value: 0")
    outcome = reconciler.reconcile(KEY, kube.experiment, ())
    assert outcome.phase == api.INVALID
    assert kube.verbs() == ["dry-run", "patch_status", "event"] and not kube.objects
    assert "grid-0" in kube.experiment["status"]["conditions"][0]["message"]


def test_a_status_conflict_reads_the_sweep_again_and_writes():
    kube, reconciler = setup()
    stale = {**kube.experiment, "metadata": {**kube.experiment["metadata"]}}
    kube.external_status_write()  # the resourceVersion moves on
    reconciler.reconcile(KEY, stale, ())
    verbs = kube.verbs()
    first = verbs.index("patch_status")
    # Read again, planned again (the two children adopted, not created twice), written.
    assert verbs[first:] == ["patch_status", "get", "create", "create", "patch_status"]
    assert len(kube.objects) == 2 and verbs.count("event") == 2
    assert kube.experiment["status"]["phase"] == api.RUNNING


def test_a_status_too_large_to_write_is_written_without_assignments_with_a_condition():
    kube, reconciler = setup()
    reconciler.reconcile(KEY, kube.experiment, ())
    for child in kube.objects.values():
        child["status"] = {"phase": api.RUNNING}  # counts move: written at once
    seen = tuple(SweepChildView.from_body(o) for o in kube.objects.values())
    too_large = ApiError(
        500,
        "rpc error: code = ResourceExhausted desc = trying to send message larger than max "
        "(2436558 vs. 2097152)",  # what the test control plane answers (test_sweeps.py)
    )
    kube.refuse_status = lambda status: (
        too_large if any("assignment" in c for c in status.get("configurations") or ()) else None
    )
    kube.calls.clear()
    outcome = reconciler.reconcile(KEY, kube.experiment, seen)
    assert outcome.phase == api.RUNNING
    status = kube.experiment["status"]
    # What finished stays recorded (by name and phase), so nothing is created twice.
    assert [c["name"] for c in status["configurations"]] == ["grid-0", "grid-1"]
    assert not any("assignment" in c for c in status["configurations"])
    incomplete = find(status["conditions"], api.COND_STATUS_INCOMPLETE)
    assert (incomplete["status"], incomplete["reason"]) == ("True", api.REASON_STATUS_REFUSED)
    assert "larger than max (2436558 vs. 2097152)" in incomplete["message"]
    assert ("event", api.REASON_STATUS_REFUSED) in kube.calls
    # Refused again: no second Event. Accepted again: the whole status, the condition False.
    kube.calls.clear()
    reconciler.reconcile(KEY, kube.experiment, seen)
    assert ("event", api.REASON_STATUS_REFUSED) not in kube.calls
    kube.refuse_status = lambda status: None
    reconciler.reconcile(KEY, kube.experiment, seen)
    status = kube.experiment["status"]
    assert all("assignment" in c for c in status["configurations"])
    assert find(status["conditions"], api.COND_STATUS_INCOMPLETE)["status"] == "False"


def test_a_status_write_refused_for_another_cause_is_raised_for_a_retry():
    kube, reconciler = setup()
    kube.refuse_status = lambda status: ApiError(503, "the server is shutting down")
    try:
        reconciler.reconcile(KEY, kube.experiment, ())
    except ApiError as err:
        assert err.status == 503
    else:
        raise AssertionError("a passing failure is retried, not written around")


def test_a_failing_sweep_reconcile_is_a_condition_until_one_goes_through():
    kube, reconciler = setup()
    reconciler.report_failure(KEY, kube.experiment, ValueError("a value no one foresaw"))
    failing = find(kube.experiment["status"]["conditions"], api.COND_RECONCILE_FAILING)
    assert (failing["status"], failing["reason"]) == ("True", api.REASON_RECONCILE_ERROR)
    assert "ValueError: a value no one foresaw" in failing["message"]
    assert ("event", api.REASON_RECONCILE_ERROR) in kube.calls
    reconciler.reconcile(KEY, kube.experiment, ())
    failing = find(kube.experiment["status"]["conditions"], api.COND_RECONCILE_FAILING)
    assert failing["status"] == "False"
