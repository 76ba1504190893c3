"""The sweep reconciler's API calls and its answers to refusals and conflicts, on a fake API."""

from evokube_contract import sweep as contract
from evokube_operator import api
from evokube_operator.metrics import Metrics
from evokube_operator.observe import SweepChildView
from evokube_operator.sweep_reconcile import SweepReconciler
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
