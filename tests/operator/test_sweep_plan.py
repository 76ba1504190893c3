"""An ERLSweep's plan: observation in, plan out, no cluster and no clock."""

import json
import tracemalloc
from dataclasses import replace
from datetime import timedelta

import evokube_sweeps as sweeps
from evokube_contract import sweep as contract
from evokube_operator import api
from evokube_operator.conditions import find
from evokube_operator.plans.sweep_plan import (
    STATUS_SECONDS,
    STATUS_VALUE_CHARS,
    SweepObservation,
    plan_sweep,
)
from evokube_operator.reading.observe import SweepChildView, sweep_body
from evokube_operator.reading.ownership import NameConflict
from evokube_operator.rules.refusal import Refusal
from tests.operator.factories import NOW, spec

SWEEP_UID = "sweep-uid"


def a_sweep(max_parallel=2, status=None, generation=1, **spec_overrides):
    """A 3 x 2 grid (six children) over the factories' valid experiment."""
    body = {
        "metadata": {"name": "grid", "namespace": "ns", "uid": SWEEP_UID, "generation": generation},
        "spec": {
            "template": {"spec": spec()},
            "parameters": [
                {"path": "spec.population.size", "values": [16, 32, 64]},
                {"path": "spec.seed", "values": [0, 1]},
            ],
            "maxParallel": max_parallel,
            **spec_overrides,
        },
        "status": status or {},
    }
    return sweep_body(body)


def child(index, phase=None, owner=SWEEP_UID, seeds=()):
    assignment = sweeps.expand(a_sweep()["spec"])[index]
    body = {
        "metadata": {
            "name": sweeps.child_name("grid", index),
            "uid": f"child-{index}",
            "labels": {contract.SWEEP_LABEL: "grid", contract.SWEEP_INDEX_LABEL: str(index)},
            "annotations": {
                contract.SWEEP_ASSIGNMENT_ANNOTATION: json.dumps(assignment, separators=(",", ":"))
            },
            "ownerReferences": [{"uid": owner, "controller": True}],
        },
        "status": {
            **({"phase": phase} if phase else {}),
            "progress": {"seeds": [{"seed": i, "bestFitness": f, "fitness": f} for i, f in seeds]},
        },
    }
    return SweepChildView.from_body(body)


def observe(sweep=None, children=(), **fields):
    return SweepObservation(sweep or a_sweep(), tuple(children), NOW, **fields)


def names(manifests):
    return [m["metadata"]["name"] for m in manifests]


def test_the_first_children_wait_for_a_dry_run_of_every_child():
    plan = plan_sweep(observe())
    assert names(plan.admit) == [f"grid-{i}" for i in range(6)] and not plan.create
    assert plan.patch == {}
    for manifest in plan.admit:
        (owner,) = manifest["metadata"]["ownerReferences"]
        assert owner["uid"] == SWEEP_UID and owner["controller"] and owner["blockOwnerDeletion"]
        assert owner["kind"] == contract.SWEEP_KIND


def test_once_admitted_at_most_max_parallel_children_are_created_in_order():
    plan = plan_sweep(observe(admitted=True))
    assert names(plan.create) == ["grid-0", "grid-1"]
    assert plan.status["phase"] == api.RUNNING and plan.status["children"] == 6


def test_max_parallel_is_never_exceeded_as_children_finish():
    """Walk the whole sweep: each step creates what the plan says, then finishes one child."""
    present: dict[int, str | None] = {}
    most = 0
    for _ in range(20):
        kids = [child(i, phase) for i, phase in present.items()]
        plan = plan_sweep(observe(children=kids, admitted=True))
        for manifest in plan.create:
            present[int(manifest["metadata"]["labels"][contract.SWEEP_INDEX_LABEL])] = None
        unfinished = [i for i, p in present.items() if p not in api.FINISHED_PHASES]
        most = max(most, len(unfinished))
        assert len(unfinished) <= 2
        if not unfinished:
            break
        present[unfinished[0]] = api.SUCCEEDED
    assert most == 2 and len(present) == 6 and plan.status["phase"] == api.SUCCEEDED


def test_children_that_exist_are_adopted_and_none_is_created_twice():
    """After an operator restart the watch shows grid-0 and grid-1 running: nothing new."""
    running = [child(0, api.RUNNING), child(1, api.PENDING)]
    plan = plan_sweep(observe(children=running))
    assert not plan.create and not plan.admit  # no dry run once a child exists
    assert plan.status["counts"] == {api.RUNNING: 1, api.PENDING: 1}
    plan = plan_sweep(observe(children=[child(0, api.SUCCEEDED), child(1, api.PENDING)]))
    assert names(plan.create) == ["grid-2"]


def test_a_namesake_not_owned_blocks_with_a_condition_naming_it():
    plan = plan_sweep(observe(children=[child(0, owner="someone-else")], admitted=True))
    assert not plan.create
    blocked = find(plan.status["conditions"], api.COND_BLOCKED)
    assert blocked["status"] == "True" and blocked["reason"] == api.REASON_NAME_CONFLICT
    assert "ERLExperiment/grid-0" in blocked["message"]
    assert [e.reason for e in plan.events] == [api.REASON_NAME_CONFLICT]
    # One found by creating (no label, so not in the watch) blocks the same way.
    plan = plan_sweep(observe(admitted=True, conflicts=(NameConflict(api.KIND, "grid-1"),)))
    assert not plan.create and plan.requeue_after is not None
    assert "ERLExperiment/grid-1" in find(plan.status["conditions"], api.COND_BLOCKED)["message"]


def test_a_refused_child_makes_the_sweep_invalid_naming_it_and_nothing_is_created():
    message = 'ERLExperiment.evokube.io "grid-3" is invalid: spec.population.size: Invalid value'
    refused = Refusal(api.KIND, "grid-3", 422, message)
    plan = plan_sweep(observe(refused=refused))
    assert not plan.create and not plan.admit
    assert plan.patch["phase"] == api.INVALID
    invalid = find(plan.patch["conditions"], api.COND_INVALID)
    assert invalid["reason"] == api.REASON_CREATION_REFUSED
    assert "grid-3" in invalid["message"] and "spec.population.size" in invalid["message"]
    assert [e.type for e in plan.events] == ["Warning"]
    # Written once: the next plan of the same generation changes nothing.
    settled = a_sweep(status=plan.status)
    assert plan_sweep(observe(settled)) == replace(plan, patch={}, events=())


def test_an_expansion_error_is_invalid_naming_the_field():
    bad = a_sweep(parameters=[{"path": "spec.nonsense", "values": [1]}])
    plan = plan_sweep(observe(bad))
    assert plan.patch["phase"] == api.INVALID
    invalid = find(plan.patch["conditions"], api.COND_INVALID)
    assert invalid["reason"] == api.REASON_INVALID_SPEC
    assert "spec.parameters[0].path" in invalid["message"]


def test_a_path_crossing_a_non_object_of_the_template_is_invalid_naming_the_parameter():
    bad = a_sweep(template={"spec": {**spec(), "population": [64]}})
    plan = plan_sweep(observe(bad))
    assert plan.patch["phase"] == api.INVALID
    invalid = find(plan.patch["conditions"], api.COND_INVALID)
    assert invalid["reason"] == api.REASON_INVALID_SPEC
    assert "spec.parameters[0].path: spec.population.size crosses" in invalid["message"]
    assert [e.type for e in plan.events] == ["Warning"]


def test_the_finished_sweep_reports_counts_configurations_and_the_best():
    kids = [
        child(i, api.SUCCEEDED if i != 4 else api.FAILED, seeds=[(0, -100.0 * (i + 1))])
        for i in range(6)
    ]
    plan = plan_sweep(observe(children=kids))
    status = plan.patch
    assert status["phase"] == api.SUCCEEDED
    assert status["counts"] == {api.SUCCEEDED: 5, api.FAILED: 1}
    assert [c["name"] for c in status["configurations"]] == [f"grid-{i}" for i in range(6)]
    assert status["bestConfiguration"]["name"] == "grid-0"
    assert status["configurations"][0]["assignment"] == {
        "spec.population.size": 16,
        "spec.seed": 0,
    }
    done = find(status["conditions"], api.COND_SUCCEEDED)
    assert done["reason"] == api.REASON_COMPLETED and "5 succeeded, 1 failed" in done["message"]
    assert [e.reason for e in plan.events] == [api.REASON_COMPLETED]


def test_a_sweep_whose_children_all_failed_fails():
    plan = plan_sweep(observe(children=[child(i, api.FAILED) for i in range(6)]))
    assert plan.patch["phase"] == api.FAILED
    assert find(plan.patch["conditions"], api.COND_FAILED)["reason"] == (
        api.REASON_ALL_CHILDREN_FAILED
    )


def test_a_finished_child_deleted_later_is_not_created_again_and_stays_in_the_summary():
    kids = [child(0, api.SUCCEEDED, seeds=[(0, -5.0)]), child(1, api.RUNNING)]
    first = plan_sweep(observe(a_sweep(max_parallel=1), children=kids))
    gone = a_sweep(max_parallel=1, status=first.status)  # grid-0 deleted by its TTL
    plan = plan_sweep(observe(gone, children=[child(1, api.RUNNING)]))
    assert not plan.create
    assert plan.status["configurations"][0]["name"] == "grid-0"
    assert plan.status["bestConfiguration"]["name"] == "grid-0"


def test_figures_are_written_at_most_every_status_seconds_phases_at_once():
    kids = [child(0, api.RUNNING, seeds=[(0, -50.0)]), child(1, api.RUNNING)]
    first = plan_sweep(observe(children=kids))
    settled = a_sweep(status=first.status)
    better = [child(0, api.RUNNING, seeds=[(0, -10.0)]), child(1, api.RUNNING)]
    held = plan_sweep(observe(settled, better, written_at=NOW - timedelta(seconds=2)))
    assert held.patch == {} and held.requeue_after == STATUS_SECONDS - 2
    later = plan_sweep(observe(settled, better, written_at=NOW - timedelta(seconds=11)))
    assert later.patch.keys() == {"configurations", "bestConfiguration"}
    finished = [child(0, api.SUCCEEDED, seeds=[(0, -10.0)]), child(1, api.RUNNING)]
    now = plan_sweep(observe(settled, finished, written_at=NOW - timedelta(seconds=2)))
    assert now.patch["counts"] == {api.RUNNING: 1, api.SUCCEEDED: 1}


def test_a_phase_that_left_the_counts_is_deleted_from_them():
    pending = plan_sweep(observe(children=[child(0, api.PENDING)]))
    settled = a_sweep(status=pending.status)
    plan = plan_sweep(observe(settled, [child(0, api.RUNNING)]))
    assert plan.patch["counts"] == {api.PENDING: None, api.RUNNING: 1}


def test_a_sweep_being_deleted_is_left_to_the_garbage_collector():
    deleting = a_sweep()
    deleting["metadata"]["deletionTimestamp"] = "2026-01-02T03:04:05Z"
    plan = plan_sweep(observe(deleting, admitted=True))
    assert not plan.create and plan.patch == {}


def largest_sweep(owner=SWEEP_UID):
    """256 children whose assignments are as large as the CRDs allow: 8 parameters of two
    values each, every value 32 variables of 1,024 characters (the experiment CRD's caps)."""
    parameters = [
        {
            "path": "spec.env",
            "values": [
                [{"name": f"V{i}", "value": letter * 1024} for i in range(32)] for letter in "ab"
            ],
        }
    ]
    parameters += [
        {"path": path, "values": [{f"k{i}": letter * 1000 for i in range(8)} for letter in "cd"]}
        for path in ("spec.nodeSelector", "spec.podLabels", "spec.podAnnotations")
    ]
    parameters += [
        {"path": path, "values": [1, 2]}
        for path in ("spec.seed", "spec.maxRestarts", "spec.metricsPort", "spec.coordinatorPort")
    ]
    sweep = a_sweep(max_parallel=256, parameters=parameters)
    kids = []
    for index, assignment in enumerate(sweeps.expand(sweep["spec"])):
        body = {
            "metadata": {
                "name": sweeps.child_name("grid", index),
                "labels": {contract.SWEEP_LABEL: "grid", contract.SWEEP_INDEX_LABEL: str(index)},
                "annotations": {contract.SWEEP_ASSIGNMENT_ANNOTATION: json.dumps(assignment)},
                "ownerReferences": [{"uid": owner, "controller": True}],
            },
            "status": {"phase": api.RUNNING},
        }
        kids.append(SweepChildView.from_body(body))
    return sweep, kids


def test_the_status_of_the_largest_sweep_is_bounded_by_construction():
    sweep, kids = largest_sweep()
    assert len(kids) == contract.MAX_CHILDREN
    whole = sum(len(k.assignment) for k in kids)
    plan = plan_sweep(observe(sweep, kids))
    size = len(json.dumps(plan.status, separators=(",", ":")))
    # Assignments of 15 MB in all; a status well under etcd's 1.5 MiB a write.
    assert whole > 14e6 and size < 600_000, (whole, size)
    first = plan.status["configurations"][0]["assignment"]
    assert first["spec.seed"] == 1  # short values are kept as they are
    cut = first["spec.env"]
    assert isinstance(cut, str) and len(cut) <= STATUS_VALUE_CHARS, cut
    assert cut.startswith('[{"name":"V0","value":"aaa') and cut.endswith(" chars]"), cut


def test_planning_and_admitting_a_sweep_holds_one_child_manifest_at_a_time():
    """256 children of a template of 1,000 tolerations: the plan holds assignments, and each
    manifest (a copy of the template) is built as the reconciler sends it."""
    tolerations = [{"key": f"k{i}", "operator": "Exists"} for i in range(1000)]
    sweep = a_sweep(
        template={"spec": {**spec(), "tolerations": tolerations}},
        parameters=[
            {"path": "spec.seed", "values": list(range(16))},
            {"path": "spec.population.size", "values": [2 * i + 2 for i in range(16)]},
        ],
    )

    def peak(work) -> int:
        tracemalloc.start()
        try:
            work()
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    one = peak(lambda: sweeps.child_manifest(sweep, 0, {}))

    def plan_and_admit():
        plan = plan_sweep(observe(sweep))
        assert len(plan.admit) == contract.MAX_CHILDREN
        for manifest in plan.admit:  # as the reconciler's dry run sends them, one by one
            assert len(manifest["spec"]["tolerations"]) == 1000

    assert peak(plan_and_admit) < 4 * one, (one, contract.MAX_CHILDREN)
