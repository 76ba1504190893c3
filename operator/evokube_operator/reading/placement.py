"""Where a gang's pods may run: one slice per gang, one gang per slice; and the TPU host
environment libtpu needs. Pure functions, like builders.py, which calls them.

Exclusive placement
-------------------
A multi-host TPU slice is one GKE node pool whose hosts share the chips' interconnect
(ICI). kube-scheduler knows nothing of slices: it places each pod of a gang on any node
with free chips of the right type and topology, so with two slices of the same shape one
gang can get half of each (the halves then cannot form one TPU mesh), and two gangs can
share a slice. The operator prevents both with two required scheduling terms on every
pod of an exclusive gang, keyed on the node label that names a slice (the topology key,
`cloud.google.com/gke-nodepool` unless spec.placement.topologyKey, one of the CRD's
allow-listed keys, says otherwise):

- pod affinity to the pods of its own gang: once one pod of the gang is bound, the rest
  may only go where the label has the same value. The first pod has no peer yet, and the
  scheduler lets a pod whose own labels match its affinity term be the first of a group;
- pod anti-affinity to the pods of any other gang of the same namespace: a slice that runs
  a pod of another of the namespace's gangs is no candidate.

Neither term reaches into another namespace. The scheduler also honours the anti-affinity
of pods already bound against each pod it places, so a term selecting every namespace
would let one tenant's gang (one CPU pod, say, keyed on a label every node shares) keep
every other tenant's gangs off the cluster. Between namespaces a slice is held by what
the gang's pods request (a TPU host's every chip), and two tenants' gangs that start at
once can each take part of one free slice: admitting whole gangs across tenants is
Kueue's part (spec.queueName; docs/security.md, "Scheduling").

These are the terms of JobSet's `alpha.jobset.sigs.k8s.io/exclusive-topology` annotation
(kubernetes-sigs/jobset, pkg/webhooks/pod_mutating_webhook.go, which gives them to the pod
of index 0 and pins the others to its slice by a node selector, a webhook's job; here every
pod gets them), less JobSet's `namespaceSelector: {}`. The gang is named by the pod label
GANG_LABEL, the SHA-1 of `<namespace>/<job>`, as JobSet's `jobset.sigs.k8s.io/job-key`: a
Job's name is unique only within its namespace, its uid is not known before the pods exist,
and a label value holds at most 63 characters. Every trainer pod carries the label, so an
exclusive gang also keeps the namespace's non-exclusive evokube gangs out of its slice;
pods of other software are not affected.

The TPU host environment
------------------------
libtpu forms the slice's mesh from TPU_WORKER_ID (this host's rank) and
TPU_WORKER_HOSTNAMES (every host's address, in rank order); JAX's GKE cluster detection
reads the same two. GKE injects them with a mutating webhook only for an Indexed Job
with a subdomain, parallelism above 1 and google.com/tpu requests, and other controllers
(LeaderWorkerSet, ai-on-gke's KubeRay TPU webhook) set them themselves. The operator sets
them for every TPU gang of more than one host, from what it alone knows for sure:
the completion index and the stable host names `<job>-<index>.<service>` of the
headless Service, the same names JAX_COORDINATOR_ADDRESS uses.

Multislice
----------
Slices of a multislice gang (spec.accelerator.tpu.slices > 1) are the Jobs of one JobSet
(jobset.py), `<jobset>-slice-<s>`; libtpu joins them over the data-center network (DCN)
from MEGASCALE_COORDINATOR_ADDRESS (host 0 of slice 0), MEGASCALE_PORT,
MEGASCALE_NUM_SLICES and MEGASCALE_SLICE_ID, which the downward API reads from the pod's
JobSet label `jobset.sigs.k8s.io/job-index`. The pod template is one for all slices, so a
slice's TPU_WORKER_HOSTNAMES names its own Job through `$(MEGASCALE_SLICE_ID)`, which the
kubelet expands from the variable set before it. Each slice is kept to one node pool by
JobSet's own exclusive-topology annotation (its webhook's terms, described above), not by
the terms below.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any, Final

# libtpu's (and JAX's GkeTpuCluster's) view of the slice's hosts.
from evokube_contract import (
    ENV_MEGASCALE_COORDINATOR,
    ENV_MEGASCALE_NUM_SLICES,
    ENV_MEGASCALE_PORT,
    ENV_MEGASCALE_SLICE_ID,
    ENV_TPU_WORKER_HOSTNAMES,
    ENV_TPU_WORKER_ID,
    JOB_INDEX_LABEL,
    MEGASCALE_PORT,
)
from evokube_operator.util import plain

# The pod label naming a gang (one Job): sha1("<namespace>/<job>") in hex, 40 characters.
GANG_LABEL: Final = "evokube.io/gang"
# A slice is a GKE node pool: one multi-host TPU slice per node pool.
DEFAULT_TOPOLOGY_KEY: Final = "cloud.google.com/gke-nodepool"

# JobSet's annotation on a replicated Job: each of its Jobs has one value of this node label.
EXCLUSIVE_TOPOLOGY_ANNOTATION: Final = "alpha.jobset.sigs.k8s.io/exclusive-topology"
# The pod's slice, as an env value the kubelet expands (megascale_env defines the variable).
SLICE_ID_REF: Final = f"$({ENV_MEGASCALE_SLICE_ID})"

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


def gang_key(namespace: str, job: str) -> str:
    """The value of GANG_LABEL on every pod of the Job `namespace/job`."""
    return hashlib.sha1(f"{namespace}/{job}".encode(), usedforsecurity=False).hexdigest()


def exclusive_topology_key(
    placement: Mapping[str, Any], accelerator_type: str, hosts: int
) -> str | None:
    """The node label a gang must have to itself, or None when it is not exclusive.

    spec.placement.exclusive decides; unset, a gang is exclusive when it names a
    topologyKey or is a TPU gang of more than one host (a single host is a slice of its
    own, and GPU and CPU node pools are not slices: there exclusivity is an opt-in).
    """
    key = placement.get("topologyKey") or None
    exclusive = placement.get("exclusive")
    if exclusive is None:
        exclusive = key is not None or (accelerator_type == "tpu" and hosts > 1)
    return (key or DEFAULT_TOPOLOGY_KEY) if exclusive else None


def exclusive_terms(gang: str, topology_key: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod affinity term, pod anti-affinity term) that give the gang one domain to itself."""
    together = {
        "labelSelector": {
            "matchExpressions": [{"key": GANG_LABEL, "operator": "In", "values": [gang]}]
        },
        "topologyKey": topology_key,
    }
    alone = {
        "labelSelector": {
            "matchExpressions": [
                {"key": GANG_LABEL, "operator": "Exists"},
                {"key": GANG_LABEL, "operator": "NotIn", "values": [gang]},
            ]
        },
        "topologyKey": topology_key,
    }
    return together, alone


def pod_affinity(
    user: Mapping[str, Any] | None, gang: str, topology_key: str | None
) -> dict[str, Any] | None:
    """The pod's affinity: the user's (spec.affinity) with the exclusive terms added.

    Every term of the user's is kept; ours are appended to the required pod affinity
    and anti-affinity lists, so both must hold. None when there is nothing to set.
    """
    out = plain(user) if user else {}
    if topology_key is None:
        return out or None
    together, alone = exclusive_terms(gang, topology_key)
    for kind, term in (("podAffinity", together), ("podAntiAffinity", alone)):
        section = out.setdefault(kind, {})
        section[REQUIRED] = [*section.get(REQUIRED, []), term]
    return out


def worker_hostnames(job: str, service: str, hosts: int) -> str:
    """Every host's stable name under the headless Service, in completion-index order."""
    return ",".join(f"{job}-{index}.{service}" for index in range(hosts))


def tpu_worker_env(job: str, service: str, hosts: int, index_field: str) -> list[dict[str, Any]]:
    """TPU_WORKER_ID (the completion index, read from `index_field`) and TPU_WORKER_HOSTNAMES."""
    return [
        {"name": ENV_TPU_WORKER_ID, "valueFrom": {"fieldRef": {"fieldPath": index_field}}},
        {"name": ENV_TPU_WORKER_HOSTNAMES, "value": worker_hostnames(job, service, hosts)},
    ]


def megascale_env(coordinator_host: str, slices: int) -> list[dict[str, Any]]:
    """libtpu's multislice variables; the slice id from the pod's JobSet job-index label."""
    slice_field = f"metadata.labels['{JOB_INDEX_LABEL}']"
    return [
        {"name": ENV_MEGASCALE_COORDINATOR, "value": coordinator_host},
        {"name": ENV_MEGASCALE_NUM_SLICES, "value": str(slices)},
        {"name": ENV_MEGASCALE_SLICE_ID, "valueFrom": {"fieldRef": {"fieldPath": slice_field}}},
        {"name": ENV_MEGASCALE_PORT, "value": str(MEGASCALE_PORT)},
    ]
