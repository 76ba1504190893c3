"""Kueue objects for tests: flavors for the kwok node pools, queues, priority
classes, and reading the Workloads Kueue makes.

Each function takes an admin kubernetes-client ApiClient (the `api` fixture).
Kueue's objects are read and written in its storage version, v1beta2.
"""

from __future__ import annotations

import copy
import uuid
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.controlplane import HERE
from tests.cluster.kueue import API_VERSION, GROUP, PRIORITY_LABEL, QUEUE_LABEL

VERSION = API_VERSION.rpartition("/")[2]
__all__ = ["PRIORITY_LABEL", "QUEUE_LABEL"]  # re-exported for the tests
NODE_POOLS: dict[str, dict] = yaml.safe_load(Path(HERE / "nodes.yaml").read_text())["pools"]


def _custom(api):
    from kubernetes import client

    return client.CustomObjectsApi(api)


def _create(api, plural: str, body: dict, namespace: str | None = None) -> dict:
    custom = _custom(api)
    if namespace is None:
        return custom.create_cluster_custom_object(GROUP, VERSION, plural, body)
    return custom.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


# -- flavors -------------------------------------------------------------------
def pool_flavor(pool: str) -> dict:
    """A ResourceFlavor for one kwok node pool of nodes.yaml, named after the pool.

    `nodeLabels` are the pool's labels, so Kueue puts them into the admitted pods'
    node selectors; `tolerations` tolerate the pool's taints, so Kueue adds them to
    the pods too and a workload needs no toleration of its own to land there.
    """
    spec = NODE_POOLS[pool]
    tolerations = [
        {"key": t["key"], "operator": "Equal", "value": t["value"], "effect": t["effect"]}
        for t in spec.get("taints") or []
    ]
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": {"name": pool},
        "spec": {"nodeLabels": dict(spec["labels"])},
    }
    if tolerations:
        body["spec"]["tolerations"] = tolerations
    return body


def ensure_flavors(api, pools: tuple[str, ...] | None = None) -> list[str]:
    """Create the pools' flavors (default: every pool of nodes.yaml) where missing;
    returns their names (= the pool names).

    Flavors are shared by every test of a session and left in place: a flavor in
    use by a ClusterQueue cannot be deleted anyway.
    """
    from kubernetes.client.exceptions import ApiException

    pools = tuple(NODE_POOLS) if pools is None else pools
    for pool in pools:
        try:
            _create(api, "resourceflavors", pool_flavor(pool))
        except ApiException as e:
            if e.status != 409:
                raise
    return list(pools)


# -- queues --------------------------------------------------------------------
def cluster_queue(
    name: str,
    quotas: dict[str, dict[str, str | int]],
    *,
    cohort: str | None = None,
    queueing_strategy: str = "BestEffortFIFO",
    preemption: dict | None = None,
    namespace_selector: dict | None = None,
    spec: dict | None = None,
) -> dict:
    """A ClusterQueue with one resource group: `quotas` maps each flavor, in the
    order Kueue should try them, to {resource: nominal quota}; a resource one
    flavor does not name gets quota 0 there. `namespace_selector` defaults to every
    namespace; `spec` is merged in last."""
    covered = sorted({r for resources in quotas.values() for r in resources})
    flavors = [
        {
            "name": flavor,
            "resources": [{"name": r, "nominalQuota": str(resources.get(r, 0))} for r in covered],
        }
        for flavor, resources in quotas.items()
    ]
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "ClusterQueue",
        "metadata": {"name": name},
        "spec": {
            "namespaceSelector": namespace_selector if namespace_selector is not None else {},
            "queueingStrategy": queueing_strategy,
            "resourceGroups": [{"coveredResources": covered, "flavors": flavors}],
        },
    }
    if cohort:
        body["spec"]["cohortName"] = cohort
    if preemption:
        body["spec"]["preemption"] = preemption
    body["spec"].update(copy.deepcopy(spec or {}))
    return body


def create_cluster_queue(api, name: str, quotas: dict[str, dict[str, str | int]], **kw) -> dict:
    """Create `cluster_queue(name, quotas, **kw)`; returns the object as stored."""
    return _create(api, "clusterqueues", cluster_queue(name, quotas, **kw))


def create_local_queue(api, namespace: str, name: str, cluster_queue_name: str) -> dict:
    """A LocalQueue `name` in `namespace` feeding `cluster_queue_name`.

    Avoid the name "default": Kueue (LocalQueueDefaulting) sends every Job of a
    namespace that has a LocalQueue "default" there, labelled or not.
    """
    body = {
        "apiVersion": API_VERSION,
        "kind": "LocalQueue",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"clusterQueue": cluster_queue_name},
    }
    return _create(api, "localqueues", body, namespace)


def create_workload_priority_class(
    api, name: str, value: int, description: str | None = None
) -> dict:
    """A WorkloadPriorityClass; a Job selects it with the label PRIORITY_LABEL."""
    body: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": name},
        "value": value,
    }
    if description:
        body["description"] = description
    return _create(api, "workloadpriorityclasses", body)


def delete_cluster_object(api, plural: str, name: str) -> None:
    """Delete a cluster-scoped Kueue object, if it is there; does not wait (Kueue
    keeps a ClusterQueue in use until its workloads are gone)."""
    from kubernetes.client.exceptions import ApiException

    try:
        _custom(api).delete_cluster_custom_object(GROUP, VERSION, plural, name)
    except ApiException as e:
        if e.status != 404:
            raise


# -- reading -------------------------------------------------------------------
def get(api, plural: str, name: str, namespace: str | None = None) -> dict:
    custom = _custom(api)
    if namespace is None:
        return custom.get_cluster_custom_object(GROUP, VERSION, plural, name)
    return custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)


def workloads(api, namespace: str) -> list[dict]:
    items = _custom(api).list_namespaced_custom_object(GROUP, VERSION, namespace, "workloads")
    return items["items"]


def workload_of(api, namespace: str, owner_uid: str) -> dict | None:
    """The Workload Kueue made for the object with this uid (a Job, say), if any."""
    for wl in workloads(api, namespace):
        if any(ref["uid"] == owner_uid for ref in wl["metadata"].get("ownerReferences") or []):
            return wl
    return None


def condition(obj: dict | None, type_: str) -> dict | None:
    """The status condition `type_` of an object, or None."""
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c
    return None


def is_true(obj: dict | None, type_: str) -> bool:
    c = condition(obj, type_)
    return c is not None and c["status"] == "True"


class KueueObjects:
    """Makes Kueue objects for one test and deletes the cluster-scoped ones after it.

    Namespaced ones (LocalQueues) go with the test's namespace.
    """

    def __init__(self, api, namespace: str):
        self.api = api
        self.namespace = namespace
        self._made: list[tuple[str, str]] = []

    def flavors(self, pools: tuple[str, ...] | None = None) -> list[str]:
        return ensure_flavors(self.api, pools)

    def cluster_queue(self, quotas: dict[str, dict[str, str | int]], **kw) -> str:
        """A new ClusterQueue (see `cluster_queue`); the flavors named in `quotas`
        that are node pools are created first. Returns its name."""
        self.flavors(tuple(f for f in quotas if f in NODE_POOLS))
        name = kw.pop("name", None) or unique("cq")
        create_cluster_queue(self.api, name, quotas, **kw)
        self._made.append(("clusterqueues", name))
        return name

    def local_queue(self, cluster_queue_name: str, name: str | None = None) -> str:
        name = name or unique("lq")
        create_local_queue(self.api, self.namespace, name, cluster_queue_name)
        return name

    def queue(self, quotas: dict[str, dict[str, str | int]], **kw) -> str:
        """A ClusterQueue with these quotas and a LocalQueue for it in the test's
        namespace; returns the LocalQueue's name (the Job label's value)."""
        return self.local_queue(self.cluster_queue(quotas, **kw))

    def priority_class(self, value: int, name: str | None = None, description=None) -> str:
        name = name or unique("wpc")
        create_workload_priority_class(self.api, name, value, description)
        self._made.append(("workloadpriorityclasses", name))
        return name

    def cleanup(self) -> None:
        for plural, name in reversed(self._made):
            delete_cluster_object(self.api, plural, name)
        self._made.clear()
