"""Kubernetes-style status conditions (metav1.Condition), set without needless churn.

`set_condition` follows meta.SetStatusCondition: lastTransitionTime moves only
when status flips; reason, message and observedGeneration are updated in
place; and setting a condition to what it already is returns the very same
tuple, so the reconciler sees that nothing changed and writes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from evokube_operator import api
from evokube_operator.util import clip

Conditions = tuple[Mapping[str, Any], ...]


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str


def find(conditions: Iterable[Mapping[str, Any]], kind: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions if c.get("type") == kind), None)


def is_true(conditions: Iterable[Mapping[str, Any]], kind: str) -> bool:
    found = find(conditions, kind)
    return found is not None and found.get("status") == "True"


# The CRD's maxLength of status.conditions[].message: a longer one would fail the status write.
MESSAGE_MAX = 2048


def set_condition(conditions: Conditions, new: Condition, generation: int, now: str) -> Conditions:
    status = "True" if new.status else "False"
    message = clip(new.message, MESSAGE_MAX)
    wanted = {
        "type": new.type,
        "status": status,
        "reason": new.reason,
        "message": message,
        "observedGeneration": generation,
    }
    old = find(conditions, new.type)
    if old is not None:
        if all(old.get(k) == v for k, v in wanted.items()):
            return conditions
        moved = old.get("status") != status or not old.get("lastTransitionTime")
        wanted["lastTransitionTime"] = now if moved else old["lastTransitionTime"]
        return tuple(wanted if c is old else c for c in conditions)
    wanted["lastTransitionTime"] = now
    return (*conditions, wanted)


def set_all(
    conditions: Conditions, updates: Iterable[Condition], generation: int, now: str
) -> Conditions:
    for update in updates:
        conditions = set_condition(conditions, update, generation, now)
    return conditions


def clear(conditions: Conditions, kind: str, reason: str, message: str, generation: int, now: str):
    """Set a condition False, but only if it exists (no False noise before it ever was True)."""
    if find(conditions, kind) is None:
        return conditions
    return set_condition(conditions, Condition(kind, False, reason, message), generation, now)


# Conditions a reconcile writes beside its plan, when it cannot carry the plan out: True until
# the next reconcile that writes its whole status.
BESIDE_PLAN: Final = (api.COND_STATUS_INCOMPLETE, api.COND_RECONCILE_FAILING)
_WRITTEN_AGAIN: Final = {
    api.COND_STATUS_INCOMPLETE: api.REASON_STATUS_WRITTEN,
    api.COND_RECONCILE_FAILING: api.REASON_RECONCILED,
}


def failing(err: Exception) -> Condition:
    """The ReconcileFailing condition of `err`, which no API error explains."""
    text = f"{type(err).__name__}: {err}"
    message = (
        f"the operator cannot reconcile this object ({text[:512]}); it retries with backoff, "
        "and its log has the traceback"
    )
    return Condition(api.COND_RECONCILE_FAILING, True, api.REASON_RECONCILE_ERROR, message)


def clear_beside_plan(conditions: Conditions, generation: int, now: str) -> Conditions:
    for kind, reason in _WRITTEN_AGAIN.items():
        conditions = clear(conditions, kind, reason, "", generation, now)
    return conditions
