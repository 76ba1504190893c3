"""The few Kubernetes API calls the reconciler makes, on plain dicts.

A thin layer over the official client's ApiClient (its configuration, TLS
and token refresh), so that every call is one obvious HTTP request, objects
stay plain JSON-like dicts from the pure builders, and each request is
counted for the operator's metrics.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException

from evokube_contract import sweep
from evokube_operator import api
from evokube_operator.desired import gangs
from evokube_operator.reading.ownership import NameConflict, is_owned_by
from evokube_operator.rules.refusal import REFUSAL_CODES, Refusal

FIELD_MANAGER = "evokube-operator"
# kind -> (API prefix, plural) for every kind the operator touches.
KINDS: dict[str, tuple[str, str]] = {
    "Service": ("/api/v1", "services"),
    "ServiceAccount": ("/api/v1", "serviceaccounts"),
    "ConfigMap": ("/api/v1", "configmaps"),
    "Event": ("/api/v1", "events"),
    "PersistentVolumeClaim": ("/api/v1", "persistentvolumeclaims"),
    "Namespace": ("/api/v1", "namespaces"),  # cluster-scoped: read by name alone
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
    "Role": ("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    api.KIND: (f"/apis/{api.GROUP}/{api.VERSION}", api.PLURAL),
    "Workload": (f"/apis/{api.KUEUE_GROUP}/{api.KUEUE_VERSION}", "workloads"),  # read only
    **{b.kind: (f"/apis/{b.api_version}", b.plural) for b in gangs.BACKENDS.values()},
    sweep.SWEEP_KIND: (f"/apis/{api.GROUP}/{api.VERSION}", sweep.SWEEP_PLURAL),
}


class ApiError(Exception):
    """A request the API server answered with an error status (0: no answer at all)."""

    def __init__(self, status: int, message: str, reason: str = ""):
        super().__init__(f"{status} {reason}: {message}".strip())
        self.status = status
        self.reason = reason
        self.message = message


def refused_write(err: ApiError) -> bool:
    """The API server will refuse this write again as it is (too large, invalid), rather
    than a conflict, a missing object or a passing failure: retrying it changes nothing."""
    # etcd's limit on one write, as the API server passes it on: "rpc error: code =
    # ResourceExhausted desc = trying to send message larger than max (N vs. 2097152)", or
    # "etcdserver: request is too large".
    too_large = err.status == 500 and re.search(
        r"ResourceExhausted|larger than max|too large", err.message
    )
    return err.status in (400, 413, 422) or bool(too_large)


# kube-apiserver's limit on a request body: past it, it closes the connection unanswered.
MAX_REQUEST_BYTES = 3 << 20


RequestCounter = Callable[[str, str, int], None]  # (verb, kind, status)
PARALLEL_WRITES = 16  # the write pool's threads (create_owned_all)
NAME_RACES = 3  # create/read rounds when an object comes and goes under us


class Kube:
    """Synchronous calls; the controller runs reconciles in worker threads.

    `create_owned_all` sends independent writes at once from a small pool of its own, so
    that launching an experiment costs one round trip for its owned objects, not one each.
    """

    def __init__(
        self,
        client: ApiClient,
        count: RequestCounter | None = None,
        timeout=30.0,
        parallel_writes: int = PARALLEL_WRITES,
    ):
        self.client = client
        self._count = count or (lambda verb, kind, code: None)
        self._timeout = timeout
        self._pool = ThreadPoolExecutor(parallel_writes, thread_name_prefix="evokube-write")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.client.close()

    @classmethod
    def from_configuration(cls, configuration: Configuration, **kwargs: Any) -> Kube:
        """Keeps enough connections open for the write pool and the reconcile workers."""
        wanted = 2 * kwargs.get("parallel_writes", PARALLEL_WRITES)
        configuration.connection_pool_maxsize = max(configuration.connection_pool_maxsize, wanted)
        return cls(ApiClient(configuration), **kwargs)

    # -- transport --------------------------------------------------------------------
    def _path(self, kind: str, namespace: str, name: str | None = None, sub: str = "") -> str:
        prefix, plural = KINDS[kind]
        path = (
            f"{prefix}/{plural}"
            if kind == "Namespace"
            else f"{prefix}/namespaces/{quote(namespace)}/{plural}"
        )
        if name is not None:
            path += f"/{quote(name)}"
        return path + (f"/{sub}" if sub else "")

    def request(
        self,
        verb: str,
        kind: str,
        path: str,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> dict[str, Any]:
        url = self.client.configuration.host + path
        if query:
            url += "?" + urlencode(query)
        headers = {"Accept": "application/json", "Content-Type": content_type}
        self.client.update_params_for_auth(headers, [], ["BearerToken"], path, verb, body)
        if self.client.user_agent:
            headers.setdefault("User-Agent", self.client.user_agent)
        try:
            response = self.client.call_api(
                verb, url, header_params=headers, body=body, _request_timeout=self._timeout
            )
            data = response.read()
            status = response.status
        except ApiException as err:  # raised for transport trouble (status 0)
            self._count(verb, kind, err.status or 0)
            raise ApiError(err.status or 0, str(err.reason or err)) from err
        except Exception as err:  # urllib3 connection errors and the like
            self._count(verb, kind, 0)
            raise ApiError(0, f"{type(err).__name__}: {err}") from err
        self._count(verb, kind, status)
        payload: dict[str, Any] = {}
        if data:
            try:
                payload = json.loads(data)
            except ValueError:
                payload = {"message": data.decode(errors="replace")[:500]}
        if not 200 <= status < 300:
            raise ApiError(status, payload.get("message", ""), payload.get("reason", ""))
        return payload

    def serves(self, kind: str) -> bool:
        """Whether the API server serves `kind` (discovery: its group version lists it)."""
        prefix, plural = KINDS[kind]
        try:
            found = self.request("GET", kind, prefix)
        except ApiError as err:
            if err.status == 404:
                return False
            raise
        return any(r.get("name") == plural for r in found.get("resources") or [])

    # -- objects ------------------------------------------------------------------------
    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any]:
        return self.request("GET", kind, self._path(kind, namespace, name))

    def list(self, kind: str, namespace: str, **selectors: str) -> list[dict[str, Any]]:
        """Up to 100 objects of `kind` in `namespace`, filtered by fieldSelector and
        labelSelector (keyword arguments of those names)."""
        query = {**selectors, "limit": "100"}
        found = self.request("GET", kind, self._path(kind, namespace), query=query)
        return found.get("items") or []

    def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply of the fields the operator owns (a metadata.resourceVersion in
        `obj` makes it conditional: 409 if the object changed since)."""
        meta = obj["metadata"]
        return self.request(
            "PATCH",
            obj["kind"],
            self._path(obj["kind"], meta["namespace"], meta["name"]),
            body=obj,
            query={"fieldManager": FIELD_MANAGER, "force": "true"},
            content_type="application/apply-patch+yaml",
        )

    def create(self, obj: Mapping[str, Any], dry_run: bool = False) -> dict[str, Any]:
        """POST `obj`; with `dry_run`, the API server admits it (quota, policies, webhooks)
        without storing it."""
        meta = obj["metadata"]
        query = {"fieldManager": FIELD_MANAGER, **({"dryRun": "All"} if dry_run else {})}
        return self.request(
            "POST", obj["kind"], self._path(obj["kind"], meta["namespace"]), body=obj, query=query
        )

    def create_owned(
        self, obj: Mapping[str, Any], owner_uid: str, update: bool = True, dry_run: bool = False
    ) -> tuple[dict[str, Any], bool]:
        """Create `obj`, or take up the existing one only if `owner_uid` is its controller.

        (object, created). An object under the name that `owner_uid` does not control
        raises NameConflict and is left untouched. One it does control is server-side
        applied with `update` (guarded by the resourceVersion read, so an object swapped
        in between is not written), else returned as it is (a Job's template is immutable).
        A refusal of the creation or the apply (rules/refusal.py) raises Refusal, naming
        the object. `dry_run` only asks whether the creation would pass (nothing is written;
        an object it would take up is returned as it is). Any kind of KINDS; the read happens
        only when the name is taken.
        """
        try:
            return self._create_owned(obj, owner_uid, update and not dry_run, dry_run)
        except ApiError as err:
            if err.status not in REFUSAL_CODES:
                raise
            kind, name = obj["kind"], obj["metadata"]["name"]
            raise Refusal(kind, name, err.status, err.message or str(err)) from err

    def _create_owned(
        self, obj: Mapping[str, Any], owner_uid: str, update: bool, dry_run: bool
    ) -> tuple[dict[str, Any], bool]:
        kind, meta = obj["kind"], obj["metadata"]
        for _ in range(NAME_RACES):
            try:
                return self.create(obj, dry_run), True
            except ApiError as err:
                if err.status != 409:
                    raise
            try:
                existing = self.get(kind, meta["namespace"], meta["name"])
            except ApiError as err:
                if err.status == 404:  # deleted in between: create again
                    continue
                raise
            if not is_owned_by(existing, owner_uid):
                raise NameConflict(kind, meta["name"])
            if not update:
                return existing, False
            version = existing["metadata"]["resourceVersion"]
            return self.apply({**obj, "metadata": {**meta, "resourceVersion": version}}), False
        raise ApiError(409, f"{kind} {meta['name']} keeps appearing and vanishing", "Conflict")

    def create_owned_all(
        self, objs: Sequence[Mapping[str, Any]], owner_uid: str
    ) -> list[NameConflict]:
        """`create_owned` each object, all at once; the name conflicts found, if any.

        A refusal (Refusal) or any other error is raised."""
        futures = [self._pool.submit(self.create_owned, obj, owner_uid) for obj in objs]
        conflicts: list[NameConflict] = []
        for future in futures:
            try:
                future.result()
            except NameConflict as conflict:
                conflicts.append(conflict)
        return conflicts

    def delete(self, kind: str, namespace: str, name: str, uid: str | None = None) -> bool:
        """Delete in the background (the garbage collector takes dependents); False if gone."""
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": "Background",
        }
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self.request("DELETE", kind, self._path(kind, namespace, name), body=body)
            return True
        except ApiError as err:
            if err.status in (404, 409):  # gone, or a namesake with another uid
                return False
            raise

    # -- the experiment (or sweep) --------------------------------------------------------
    def patch_status(
        self,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        resource_version: str,
        kind: str = api.KIND,
    ) -> dict[str, Any]:
        """Merge-patch the status subresource, only if the object is still at resource_version.

        The merge patch carries only the operator's fields, so status.progress
        (the trainer's) is never touched; the resourceVersion makes a decision
        taken on a stale read fail with 409 instead of being written.
        """
        body = {"metadata": {"resourceVersion": resource_version}, "status": dict(status)}
        size = len(json.dumps(body, separators=(",", ":")))
        if size > MAX_REQUEST_BYTES:  # the server would drop the connection, not answer
            raise ApiError(
                413,
                f"the status is {size:,} bytes, over the API server's {MAX_REQUEST_BYTES:,} "
                "a request",
                "RequestEntityTooLarge",
            )
        return self.request(
            "PATCH",
            kind,
            self._path(kind, namespace, name, "status"),
            body=body,
            content_type="application/merge-patch+json",
        )

    def post_event(
        self, involved: Mapping[str, Any], type_: str, reason: str, message: str
    ) -> None:
        """A core/v1 Event about `involved` (an object body), as kubectl describe shows it."""
        meta = involved["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "name": f"{meta['name']}.{uuid.uuid4().hex[:16]}",
                "namespace": meta["namespace"],
            },
            "involvedObject": {
                "apiVersion": involved.get("apiVersion", api.API_VERSION),
                "kind": involved.get("kind", api.KIND),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid", ""),
                "resourceVersion": meta.get("resourceVersion", ""),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER,
            "reportingInstance": FIELD_MANAGER,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        self.request("POST", "Event", self._path("Event", meta["namespace"]), body=event)
