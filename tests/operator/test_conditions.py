"""Conditions move like metav1.Condition: the transition time only when status flips."""

from pathlib import Path

import yaml

from evokube_operator.conditions import (
    MESSAGE_MAX,
    Condition,
    clear,
    find,
    is_true,
    set_condition,
)

CRD = Path(__file__).resolve().parents[2] / "crds" / "erlexperiments.evokube.io.yaml"

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"


def test_a_new_condition_is_added_with_its_transition_time():
    out = set_condition((), Condition("Running", True, "AllHostsRunning", "ok"), 3, T0)
    assert out == (
        {
            "type": "Running",
            "status": "True",
            "reason": "AllHostsRunning",
            "message": "ok",
            "observedGeneration": 3,
            "lastTransitionTime": T0,
        },
    )
    assert is_true(out, "Running")


def test_setting_the_same_condition_again_changes_nothing():
    first = set_condition((), Condition("Running", True, "R", "m"), 1, T0)
    assert set_condition(first, Condition("Running", True, "R", "m"), 1, T1) is first


def test_a_new_message_keeps_the_transition_time_a_flip_moves_it():
    first = set_condition((), Condition("Running", False, "Waiting", "a"), 1, T0)
    reworded = set_condition(first, Condition("Running", False, "Waiting", "b"), 2, T1)
    assert find(reworded, "Running")["lastTransitionTime"] == T0
    assert find(reworded, "Running")["observedGeneration"] == 2
    flipped = set_condition(reworded, Condition("Running", True, "Up", "c"), 2, T1)
    assert find(flipped, "Running")["lastTransitionTime"] == T1


def test_other_conditions_keep_their_place():
    out = set_condition((), Condition("A", True, "r", "m"), 1, T0)
    out = set_condition(out, Condition("B", True, "r", "m"), 1, T0)
    out = set_condition(out, Condition("A", False, "r", "m"), 1, T1)
    assert [c["type"] for c in out] == ["A", "B"]


def test_clear_only_touches_conditions_that_exist():
    assert clear((), "Restarting", "Recovered", "m", 1, T0) == ()
    out = set_condition((), Condition("Restarting", True, "RetriableFailure", "m"), 1, T0)
    cleared = clear(out, "Restarting", "Recovered", "back", 1, T1)
    assert find(cleared, "Restarting")["status"] == "False"


def test_a_message_is_clipped_to_what_the_crd_admits():
    (version,) = yaml.safe_load(CRD.read_text())["spec"]["versions"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["conditions"]["items"]["properties"]["message"]["maxLength"] == MESSAGE_MAX
    out = set_condition((), Condition("Failed", True, "Refused", "x" * 10_000), 1, T0)
    assert len(out[0]["message"]) == MESSAGE_MAX and out[0]["message"].endswith("...")
