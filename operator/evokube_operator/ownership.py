"""Whose is an object: the operator touches only what it created for this very experiment.

Every name the operator uses is deterministic (`<name>`, `<name>-trainer`,
`<name>-<attempt>`), so any user of the namespace can take one first. An
object is the experiment's only when its controller ownerReference carries the
experiment's uid; anything else under one of its names is a name conflict: the
experiment waits, Blocked, and the foreign object stays untouched. The same goes
for a checkpoint claim that was not opted in with LABEL_CHECKPOINT_CLAIM.

Pure functions of object bodies; kube.py and reconcile.py act on their answers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from evokube_operator import api


@dataclass(frozen=True)
class Blocker:
    """Why the experiment's next Job cannot be created until a person acts (condition Blocked)."""

    reason: str  # api.REASON_NAME_CONFLICT | api.REASON_CLAIM_NOT_ALLOWED
    message: str


class NameConflict(Exception):
    """An object the experiment needs exists under its name and is not the experiment's."""

    def __init__(self, kind: str, name: str):
        super().__init__(f"{kind} {name}")
        self.kind = kind
        self.name = name


# Kinds that grant something to other objects named in them (a RoleBinding: its Role and its
# ServiceAccount, by name only).
GRANTING_KINDS = frozenset({"RoleBinding"})


def creation_waves(objects: Iterable[Mapping[str, Any]]) -> list[list[Mapping[str, Any]]]:
    """The owned objects in the order to create them: a RoleBinding only after everything
    else is known to be the experiment's, so that a foreign ServiceAccount (or Role) under
    its name is never bound (nor is our ServiceAccount bound to a foreign Role)."""
    objects = list(objects)
    waves = [
        [o for o in objects if o["kind"] not in GRANTING_KINDS],
        [o for o in objects if o["kind"] in GRANTING_KINDS],
    ]
    return [wave for wave in waves if wave]


def controller_uid(body: Mapping[str, Any]) -> str | None:
    """The uid of the object's controller (the owner reference with controller: true)."""
    for owner in (body.get("metadata") or {}).get("ownerReferences") or []:
        if owner.get("controller"):
            return owner.get("uid")
    return None


def is_owned_by(body: Mapping[str, Any], owner_uid: str) -> bool:
    return bool(owner_uid) and controller_uid(body) == owner_uid


def name_conflict(conflicts: Iterable[NameConflict]) -> Blocker | None:
    """One Blocker naming every conflicting object, as kind/name."""
    names = sorted(f"{c.kind}/{c.name}" for c in conflicts)
    if not names:
        return None
    return Blocker(
        api.REASON_NAME_CONFLICT,
        f"{', '.join(names)} already exists and is not owned by this experiment: "
        "rename or remove it, or rename the experiment",
    )


def claim_blocker(claim: str, pvc: Mapping[str, Any] | None) -> Blocker | None:
    """None when the claim may be mounted: it exists and carries the opt-in label."""
    opt_in = f'{api.LABEL_CHECKPOINT_CLAIM}: "true"'
    if pvc is None:
        message = f"PersistentVolumeClaim {claim} does not exist (it also needs the label {opt_in})"
        return Blocker(api.REASON_CLAIM_NOT_ALLOWED, message)
    labels = (pvc.get("metadata") or {}).get("labels") or {}
    if labels.get(api.LABEL_CHECKPOINT_CLAIM) != "true":
        message = (
            f"PersistentVolumeClaim {claim} lacks the label {opt_in}, which whoever may edit "
            "claims sets to let experiments mount it for checkpoints"
        )
        return Blocker(api.REASON_CLAIM_NOT_ALLOWED, message)
    return None
