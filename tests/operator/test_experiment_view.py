"""What the operator keeps of an experiment between reconciles (issue 22, operator memory):
a trimmed view, a fraction of the object's memory, forgotten with the experiment."""

import copy
import json
import tracemalloc

from benchmarks.largest_experiment import largest_experiment
from evokube_operator import api
from evokube_operator.reading.observe import ExperimentView
from evokube_operator.reading.spec import Experiment
from evokube_operator.reconcilers.controller import Indices
from evokube_operator.reconcilers.reconcile import _written
from tests.operator.factories import body, gang, job, running_status
from tests.operator.test_reconcile import KEY, FakeKube, reconciler


def watched(exp: dict) -> dict:
    """`exp` as a watch delivers it: metadata the operator never reads, the trainer's status."""
    exp = copy.deepcopy(exp)
    exp["metadata"] |= {
        "labels": {"team": "rl"},
        "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "x" * 200_000},
        "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}],
        "creationTimestamp": "2026-01-02T03:04:05Z",
    }
    exp["status"] = exp.get("status", {}) | {
        "progress": {"generation": 7, "hyperparameters": {"actorLearningRate": 0.001}},
        "result": {"bestReturn": -150.0, "generation": 7, "policyURI": "/p"},
    }
    return exp


def test_the_view_keeps_only_what_a_reconcile_reads():
    original = watched(body(status=running_status()))
    original["metadata"]["deletionTimestamp"] = "2026-01-03T00:00:00Z"
    kept = ExperimentView.from_body(original).body()
    assert set(kept["metadata"]) == {
        "name",
        "namespace",
        "uid",
        "generation",
        "resourceVersion",
        "deletionTimestamp",
    }
    assert kept["spec"] == original["spec"]
    trainers = ("progress", "result")
    assert kept["status"] == {k: v for k, v in original["status"].items() if k not in trainers}
    # A reconcile sees the same experiment either way.
    assert Experiment.from_body(kept) == Experiment.from_body(
        {**original, "status": kept["status"]}
    )


def test_each_body_is_a_fresh_copy_worker_threads_may_change():
    view = ExperimentView.from_body(body(status=running_status()))
    indices = Indices({KEY: [view]}, {}, {})
    first, _, _ = indices.snapshot(KEY)
    first["spec"]["suspend"] = True
    second, _, _ = indices.snapshot(KEY)
    assert second["spec"]["suspend"] is False and second == view.body()


def test_a_view_of_the_largest_admitted_experiment_is_a_fraction_of_its_body():
    big = watched(largest_experiment("big", "ns", "trainer:1"))
    big["metadata"] |= {"uid": "u", "generation": 1, "resourceVersion": "1"}
    text = json.dumps(big)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        bodies = [json.loads(text) for _ in range(5)]
        per_body = (tracemalloc.get_traced_memory()[0] - before) / 5
        before = tracemalloc.get_traced_memory()[0]
        views = [ExperimentView.from_body(b) for b in bodies]
        per_view = (tracemalloc.get_traced_memory()[0] - before) / 5
    finally:
        tracemalloc.stop()
    spec_json = len(json.dumps(big["spec"], separators=(",", ":")))
    assert per_view < 1.05 * spec_json  # the spec's compact JSON, and little else
    assert per_view < 0.5 * per_body, (per_view, per_body)
    assert len(views) == 5


def test_the_reconciler_keeps_a_view_of_its_writes_and_forgets_a_deleted_experiment():
    kube = FakeKube(watched(body()))
    rec = reconciler(kube)
    rec.reconcile(KEY, copy.deepcopy(kube.experiment), (job(0),), gang(1))  # writes Running
    written = rec._memory[KEY].last_written
    assert isinstance(written, ExperimentView)
    assert written.body()["status"]["phase"] == api.RUNNING
    assert "annotations" not in written.body()["metadata"]
    # Without the spec, which the cache holds for the same generation: a stale cache's copy
    # reads as our write's status with that spec.
    assert written.body()["spec"] == {}
    stale = copy.deepcopy(kube.experiment) | {"status": {}}
    stale["metadata"]["resourceVersion"] = "1"
    freshest = rec._freshest(KEY, stale)
    assert freshest["spec"] == kube.experiment["spec"]
    assert freshest["status"]["phase"] == api.RUNNING

    # Once the watch has delivered that write, the reconciler keeps no copy of its own.
    rec.reconcile(KEY, copy.deepcopy(kube.experiment), (job(0),), gang(1))
    assert rec._memory[KEY].last_written is None

    assert rec.reconcile(KEY, None, (), ()).phase is None  # the watch saw it deleted
    assert KEY not in rec._memory


def test_a_write_of_another_generation_than_the_caches_keeps_its_spec():
    """The spec was edited after the cached copy (a fresh read decided): the cache's spec is
    not the write's, so the write's view keeps its own."""
    edited = body(status=running_status(), generation=2, suspend=True)
    kept = _written(edited, cached_generation=1)
    assert kept.body()["spec"] == edited["spec"]
    assert _written(edited, cached_generation=2).body()["spec"] == {}
