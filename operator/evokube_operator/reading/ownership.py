"""Whose is an object: the operator touches only what it created for this very experiment.

Every name the operator uses is deterministic (`<name>`, `<name>-trainer`,
`<name>-<attempt>`), so any user of the namespace can take one first. An
object is the experiment's only when its controller ownerReference carries the
experiment's uid; anything else under one of its names is a name conflict: the
experiment waits, Blocked, and the foreign object stays untouched. The same goes
for what the pods would use of the namespace and was not opted in: a claim
without LABEL_CHECKPOINT_CLAIM, a ServiceAccount without LABEL_TRAINER_ACCOUNT,
a Secret or ConfigMap the namespace's annotation does not list; and for the
folders of the operator's default checkpoint location, which belong to the
namespace they are named after.

Pure functions of object bodies; kube.py and reconcile.py act on their answers.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from evokube_operator import api
from evokube_operator.reading.spec import Reference


@dataclass(frozen=True)
class Blocker:
    """Why the experiment's next Job cannot be created until a person acts (condition Blocked)."""

    reason: str  # api.REASON_NAME_CONFLICT | api.REASON_*_NOT_ALLOWED
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


@dataclass(frozen=True)
class OptIn:
    """The label by which an object of a kind lets experiments use it, set to "true" by
    whoever may edit such objects (an experiment author need not be one of them)."""

    label: str
    reason: str  # of the Blocked condition while it is missing
    use: str  # what the label lets experiments do, for the message


# Objects of the namespace the pods use only once they opted in with a label.
LABEL_OPT_INS: dict[str, OptIn] = {
    "PersistentVolumeClaim": OptIn(
        api.LABEL_CHECKPOINT_CLAIM, api.REASON_CLAIM_NOT_ALLOWED, "mount it"
    ),
    "ServiceAccount": OptIn(
        api.LABEL_TRAINER_ACCOUNT, api.REASON_ACCOUNT_NOT_ALLOWED, "run their pods as it"
    ),
}
# Objects of the namespace the pods use only once the namespace lists them in an annotation
# (the operator may not read Secrets, so the opt-in cannot be on the object itself).
LISTING_ANNOTATIONS: dict[str, str] = {
    "Secret": api.ANNOTATION_TRAINER_SECRETS,
    "ConfigMap": api.ANNOTATION_TRAINER_CONFIGMAPS,
}


def opt_in_blocker(ref: Reference, body: Mapping[str, Any] | None) -> Blocker | None:
    """None when the object `ref` names may be used: it exists and carries its opt-in label."""
    opt_in = LABEL_OPT_INS[ref.kind]
    wanted = f'{opt_in.label}: "true"'
    if body is None:
        message = f"{ref.kind} {ref.name} does not exist (it also needs the label {wanted})"
        return Blocker(opt_in.reason, f"{ref.field}: {message}")
    labels = (body.get("metadata") or {}).get("labels") or {}
    if labels.get(opt_in.label) == "true":
        return None
    message = (
        f"{ref.field}: {ref.kind} {ref.name} lacks the label {wanted}, which whoever may "
        f"edit it sets to let experiments {opt_in.use}"
    )
    return Blocker(opt_in.reason, message)


def listed_names(namespace: Mapping[str, Any] | None, kind: str) -> frozenset[str]:
    """The names of `kind` the namespace's annotation lets experiments use."""
    annotations = ((namespace or {}).get("metadata") or {}).get("annotations") or {}
    listed = annotations.get(LISTING_ANNOTATIONS[kind]) or ""
    return frozenset(name.strip() for name in listed.split(",") if name.strip())


def listing_blocker(
    refs: Iterable[Reference], namespace: Mapping[str, Any] | None
) -> Blocker | None:
    """None when the namespace lists every Secret and ConfigMap in `refs`; else one Blocker
    naming each field, object and annotation."""
    unlisted = [
        f"{ref.field}: {ref.kind} {ref.name} is not listed in the namespace's annotation "
        f"{LISTING_ANNOTATIONS[ref.kind]}"
        for ref in refs
        if ref.kind in LISTING_ANNOTATIONS and ref.name not in listed_names(namespace, ref.kind)
    ]
    if not unlisted:
        return None
    message = "; ".join(unlisted) + " (whoever may edit the namespace lists the names there)"
    return Blocker(api.REASON_REFERENCE_NOT_ALLOWED, message)


# A path segment as the CRD admits it in spec.checkpoint.location, but `.` and `..`: nothing a
# store or a client library could decode (%2F) or resolve (Orbax normalises paths) into another.
_PLAIN_SEGMENT = re.compile(r"[-A-Za-z0-9_.+@=,]+")
_BUCKET_URL = re.compile(r"(?i:gs|s3)://([^/]*)(.*)", re.DOTALL)


def _bucket_path(location: str) -> tuple[str, list[str]] | None:
    """(bucket, path segments) of a gs:// or s3:// URL, None for a path. The scheme is dropped
    (Cloud Storage also answers the S3 protocol), the bucket lower-cased (bucket names are) and
    empty segments dropped (`//`, a trailing `/`), so one folder has one spelling."""
    found = _BUCKET_URL.fullmatch(location)
    if found is None:
        return None
    return found[1].lower(), [s for s in found[2].split("/") if s]


def location_blocker(location: str, default: str | None, namespace: str) -> Blocker | None:
    """None unless the checkpoint location `location` reaches into the operator's default
    location `default` (where each namespace's experiments get <default>/<namespace>/<name>)
    other than below <default>/<namespace>: at or above the default itself, or in another
    namespace's folder. Path segments are compared without regard to case, but the
    namespace's own, which must be exact; a `.`, `..` or any character the CRD would refuse
    in the default's bucket is refused too."""
    root, place = _bucket_path(default or ""), _bucket_path(location)
    if root is None or place is None or place[0] != root[0]:
        return None
    root_path, path = root[1], place[1]
    depth = len(root_path)
    if all(_PLAIN_SEGMENT.fullmatch(s) and s not in (".", "..") for s in path):
        shared = min(depth, len(path))
        if [s.lower() for s in path[:shared]] != [s.lower() for s in root_path[:shared]]:
            return None  # beside the default location: the bucket's IAM is the only judge
        if path[depth : depth + 1] == [namespace]:
            return None  # in the namespace's own folder
    message = (
        f"spec.checkpoint.location: {location} reaches into the operator's default checkpoint "
        f"location {default} outside this namespace's folder {default}/{namespace}, where "
        "other namespaces' experiments keep their checkpoints: name a location under "
        f"{default}/{namespace}/ or outside {default}"
    )
    return Blocker(api.REASON_LOCATION_NOT_ALLOWED, message)
