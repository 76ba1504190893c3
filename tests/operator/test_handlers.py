"""Which experiment events reach the reconciler: not the trainer's progress and result
patches, nor metadata the operator never reads."""

import copy

from evokube_operator.handlers import wants_reconcile
from tests.operator.factories import body, running_status

KEY = ("ns", "demo")


def test_progress_and_result_patches_and_resource_version_bumps_wake_no_reconcile():
    seen: dict = {}
    exp = body(status=running_status())
    exp["metadata"]["managedFields"] = [{"manager": "evokube-operator"}]
    assert wants_reconcile(seen, KEY, None, exp)  # the first listing
    assert not wants_reconcile(seen, KEY, "MODIFIED", copy.deepcopy(exp))

    progressed = copy.deepcopy(exp)
    progressed["status"]["progress"] = {"generation": 7, "bestFitness": -150.0}
    progressed["metadata"]["resourceVersion"] = "99"
    progressed["metadata"]["managedFields"].append({"manager": "evokube-trainer"})
    assert not wants_reconcile(seen, KEY, "MODIFIED", progressed)
    progressed["status"]["result"] = {"bestReturn": -150.0, "generation": 7, "policyURI": "/p"}
    assert not wants_reconcile(seen, KEY, "MODIFIED", progressed)

    unread = copy.deepcopy(progressed)
    unread["metadata"]["labels"] = {"team": "rl"}
    unread["metadata"]["annotations"] = {"note": "x" * 4096}
    assert not wants_reconcile(seen, KEY, "MODIFIED", unread)

    for change in (
        lambda e: e["status"].update(phase="Restarting"),  # the operator's own write, or not
        lambda e: e["spec"].update(suspend=True),
        lambda e: e["metadata"].update(deletionTimestamp="2026-01-02T03:04:05Z"),
        lambda e: e["metadata"].update(generation=2),
    ):
        changed = copy.deepcopy(progressed)
        change(changed)
        assert wants_reconcile(seen, KEY, "MODIFIED", changed)
        assert not wants_reconcile(seen, KEY, "MODIFIED", changed)
    assert wants_reconcile(seen, KEY, "DELETED", changed)
    assert KEY not in seen
    assert wants_reconcile(seen, ("ns", "other"), None, changed)  # each experiment on its own
