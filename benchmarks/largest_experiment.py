"""An ERLExperiment near the largest the CRD admits, that can still run on the test cluster.

Every bounded list, map and string of the pod settings (affinity, env, envFrom, volumes,
volumeMounts, tolerations, nodeSelector, podLabels, podAnnotations, imagePullSecrets) is at
its maxItems, maxProperties and maxLength, each value distinct (nothing shared in memory).
What it leaves smaller, so that the gang is admitted and scheduled on kwok's nodes: resources
names only cpu and memory (ephemeral-storage, hugepages and extended resources would need nodes
that have them), and no serviceAccountName, priorityClassName or queueName (each needs an
object of the cluster). Its pods need the node labels `NODE_LABELS` and the namespace the
listing annotations of `namespace_annotations()`; `tests/crd_size.py` says how close to the
CRD's bound it comes.
"""

from __future__ import annotations

from typing import Any

from evokube_contract import API_VERSION, KIND

DNS_SUBDOMAIN = 253
LABEL_KEY = 317  # a 253-character prefix, '/', a 63-character name
LABEL_VALUE = 63


def _dns(tag: str, length: int = DNS_SUBDOMAIN) -> str:
    """A DNS subdomain of `length` characters ending in `tag`: labels of at most 63."""
    body = ".".join(["a" * 63, "b" * 63, "c" * 63, "d" * 63])[: length - len(tag)]
    return (body.rstrip(".-") + tag)[:length] if body.endswith((".", "-")) else body + tag


def label_key(tag: str) -> str:
    return f"{_dns('p' + tag)}/{'n' * (LABEL_VALUE - len(tag) - 1)}k{tag}"


def label_value(tag: str) -> str:
    return f"v{'x' * (LABEL_VALUE - len(tag) - 1)}{tag}"


# Node labels every node of the cluster must carry: the experiment's nodeSelector, and the
# topology key of its required pod affinity (every node one topology domain).
NODE_LABELS = {label_key(f"node{i:02d}"): label_value(f"node{i:02d}") for i in range(16)}
TOPOLOGY_KEY = next(iter(NODE_LABELS))
CONFIGMAPS = [_dns(f"cm{i:02d}") for i in range(8 + 8 * 2)]  # envFrom, then projected sources
SECRETS = [_dns(f"secret{i:02d}") for i in range(8)]  # imagePullSecrets


def namespace_annotations() -> dict[str, str]:
    """What the namespace must list for the experiment's ConfigMaps and Secrets to be used."""
    return {
        "evokube.io/trainer-configmaps": ",".join(CONFIGMAPS),
        "evokube.io/trainer-secrets": ",".join(SECRETS),
    }


def _requirement(tag: str, values: int) -> dict[str, Any]:
    """A node or pod selector requirement that no node and no pod matches (NotIn)."""
    return {
        "key": label_key(tag),
        "operator": "NotIn",
        "values": [label_value(f"{tag}v{i:02d}") for i in range(values)],
    }


def _node_term(tag: str) -> dict[str, Any]:
    return {
        "matchExpressions": [_requirement(f"{tag}e{i}", 8) for i in range(4)],
        "matchFields": [
            {"key": "metadata.name", "operator": "NotIn", "values": [_dns(f"{tag}f{i}")]}
            for i in range(2)
        ],
    }


def _pod_term(tag: str, pod_labels: dict[str, str]) -> dict[str, Any]:
    """Matches the gang's own pods (8 of its labels), in one domain covering every node."""
    return {
        "labelSelector": {
            "matchLabels": dict(list(pod_labels.items())[:8]),
            "matchExpressions": [_requirement(f"{tag}e{i}", 4) for i in range(4)],
        },
        "topologyKey": TOPOLOGY_KEY,
        "matchLabelKeys": [label_key(f"{tag}m{i}") for i in range(2)],
        "mismatchLabelKeys": [label_key(f"{tag}x{i}") for i in range(2)],
    }


def _pod_affinity(tag: str, pod_labels: dict[str, str]) -> dict[str, Any]:
    return {
        "requiredDuringSchedulingIgnoredDuringExecution": [
            _pod_term(f"{tag}r{i}", pod_labels) for i in range(2)
        ],
        "preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "podAffinityTerm": _pod_term(f"{tag}p{i}", pod_labels)}
            for i in range(2)
        ],
    }


def _key_to_paths(tag: str) -> list[dict[str, Any]]:
    return [
        {"key": f"{tag}k{i}".ljust(DNS_SUBDOMAIN, "k"), "path": f"{tag}p{i}".ljust(128, "p")}
        for i in range(8)
    ]


def _volume(i: int) -> dict[str, Any]:
    sources = [
        {
            "configMap": {
                "name": CONFIGMAPS[8 + 2 * i + j],
                "items": _key_to_paths(f"v{i}s{j}"),
                "optional": True,
            }
        }
        for j in range(2)
    ]
    return {"name": f"vol{i}".ljust(63, "v"), "projected": {"defaultMode": 420, "sources": sources}}


def _mount_path(i: int) -> str:
    segments = [f"data{i}", *(f"{'s' * 100}{j}" for j in range(4))]
    path = "/" + "/".join(segments)
    return path + "/" + "e" * (512 - len(path) - 1)


def largest_experiment(name: str, namespace: str, image: str, hosts: int = 4) -> dict[str, Any]:
    pod_labels = {label_key(f"pl{i:02d}"): label_value(f"pl{i:02d}") for i in range(16)}
    spec: dict[str, Any] = {
        "image": image,
        "algorithm": {"name": "openes"},
        "environment": {"name": "gymnax/Pendulum-v1"},
        "population": {"size": 64},
        "stopping": {"maxGenerations": 10},
        "accelerator": {"type": "cpu", "hosts": hosts},
        "resources": {
            "requests": {"cpu": "100m", "memory": "64Mi"},
            "limits": {"cpu": "1", "memory": "1Gi"},
        },
        "nodeSelector": NODE_LABELS,
        "tolerations": [
            {
                "key": label_key(f"t{i:02d}"),
                "operator": "Equal",
                "value": label_value(f"t{i:02d}"),
                "effect": "NoExecute",
                "tolerationSeconds": 604800,
            }
            for i in range(16)
        ],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [_node_term(f"nr{i}") for i in range(4)]
                },
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 100, "preference": _node_term(f"np{i}")} for i in range(4)
                ],
            },
            "podAffinity": _pod_affinity("pa", pod_labels),
            "podAntiAffinity": {
                # Anti-affinity to the gang's own pods would keep them apart: preferred only.
                "preferredDuringSchedulingIgnoredDuringExecution": _pod_affinity("pn", pod_labels)[
                    "preferredDuringSchedulingIgnoredDuringExecution"
                ]
            },
        },
        "podLabels": pod_labels,
        "podAnnotations": {label_key(f"pa{i:02d}"): f"{i:04d}".ljust(1024, "a") for i in range(16)},
        "imagePullSecrets": [{"name": s} for s in SECRETS],
        "env": [
            {"name": f"VAR_{i:02d}".ljust(128, "X"), "value": f"{i:04d}".ljust(1024, "=")}
            for i in range(32)
        ],
        "envFrom": [
            {"prefix": f"P{i}_".ljust(64, "P"), "configMapRef": {"name": c, "optional": True}}
            for i, c in enumerate(CONFIGMAPS[:8])
        ],
        "volumes": [_volume(i) for i in range(8)],
        "volumeMounts": [
            {"name": f"vol{i}".ljust(63, "v"), "mountPath": _mount_path(i), "readOnly": True}
            for i in range(8)
        ],
    }
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }
