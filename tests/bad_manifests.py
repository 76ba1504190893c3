"""One valid ERLExperiment manifest and the invalid variants of it that must be refused.

Both gates check the same list: the real API server (tests/operator/test_crd.py) and the
trainer's offline validation, `evokube validate` / `evokube run` (tests/runtime/test_manifest.py).
Each case names the field its refusal must be reported on. A case only one gate can check lives
in that gate's test file, saying why.
"""

from __future__ import annotations

import copy
from typing import Any, NamedTuple

BASE: dict[str, Any] = {
    "apiVersion": "evokube.io/v1alpha1",
    "kind": "ERLExperiment",
    "metadata": {"name": "ok"},
    "spec": {
        "image": "trainer:1",
        "algorithm": {"name": "cem-rl", "rl": {"numAgents": 2}},
        "environment": {"name": "gymnax/Pendulum-v1"},
        "population": {"size": 8},
        "stopping": {"maxGenerations": 3},
    },
}

DELETE = object()  # a change that removes the field
TPU = {"type": "tpu", "tpu": {"type": "tpu-v5-lite-podslice", "topology": "4x4"}}


def with_changes(changes: dict[str, Any], base: dict[str, Any] = BASE) -> dict[str, Any]:
    """A copy of `base` with dotted paths ("spec.population.size") set, or removed with DELETE."""
    doc = copy.deepcopy(base)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = doc
        for part in parents:
            node = node.setdefault(part, {})
        if value is DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = copy.deepcopy(value)
    return doc


class BadManifest(NamedTuple):
    case: str  # the test id
    changes: dict[str, Any]  # applied to BASE by `with_changes`
    field: str  # the field path the refusal must name


def ids(cases: list[BadManifest]) -> list[str]:
    return [c.case for c in cases]


# Refused by the API server and by the trainer's validation alike (the CRD's schema and CEL).
BAD_MANIFESTS = [
    BadManifest("no image", {"spec.image": DELETE}, "spec.image"),
    BadManifest("empty image", {"spec.image": ""}, "spec.image"),
    BadManifest("unknown algorithm", {"spec.algorithm.name": "ppo"}, "spec.algorithm.name"),
    BadManifest(
        "environment not backend/name",
        {"spec.environment.name": "Pendulum-v1"},
        "spec.environment.name",
    ),
    BadManifest("population of one", {"spec.population.size": 1}, "spec.population.size"),
    BadManifest("negative population", {"spec.population.size": -4}, "spec.population.size"),
    BadManifest(
        "population not a number", {"spec.population.size": "eight"}, "spec.population.size"
    ),
    BadManifest("no stopping criterion", {"spec.stopping": {}}, "spec.stopping"),
    BadManifest(
        "zero generations",
        {"spec.stopping.maxGenerations": 0},
        "spec.stopping.maxGenerations",
    ),
    BadManifest(
        "unknown accelerator", {"spec.accelerator": {"type": "fpga"}}, "spec.accelerator.type"
    ),
    BadManifest(
        "tpu without its block", {"spec.accelerator": {"type": "tpu"}}, "spec.accelerator.tpu"
    ),
    BadManifest(
        "gpu without its block", {"spec.accelerator": {"type": "gpu"}}, "spec.accelerator.gpu"
    ),
    BadManifest(
        "gpu block on cpu",
        {"spec.accelerator": {"type": "cpu", "gpu": {"count": 1}}},
        "spec.accelerator.gpu",
    ),
    BadManifest(
        "topology not AxB",
        {"spec.accelerator": {"type": "tpu", "tpu": {"type": "t", "topology": "4by4"}}},
        "spec.accelerator.tpu.topology",
    ),
    BadManifest(
        "hosts contradict the topology",
        {"spec.accelerator": {**TPU, "hosts": 3}},
        "spec.accelerator.hosts",
    ),
    BadManifest(
        "chips per host not 1, 4 or 8",
        {
            "spec.accelerator": {
                "type": "tpu",
                "tpu": {"type": "t", "topology": "4x4", "chipsPerHost": 3},
            }
        },
        "spec.accelerator.tpu.chipsPerHost",
    ),
    BadManifest(
        "no GPUs",
        {"spec.accelerator": {"type": "gpu", "gpu": {"count": 0}}},
        "spec.accelerator.gpu.count",
    ),
    BadManifest(
        "population does not shard over devices",
        {"spec.accelerator": {"type": "cpu", "hosts": 3}, "spec.population.size": 64},
        "spec.population.size",
    ),
    BadManifest("erl-ga without rl", {"spec.algorithm": {"name": "erl-ga"}}, "spec.algorithm.rl"),
    BadManifest("cem-rl without rl", {"spec.algorithm": {"name": "cem-rl"}}, "spec.algorithm.rl"),
    BadManifest(
        "rl for an ES",
        {"spec.algorithm": {"name": "openes", "rl": {"numAgents": 2}}},
        "spec.algorithm.rl",
    ),
    BadManifest(
        "more agents than individuals",
        {"spec.algorithm": {"name": "cem-rl", "rl": {"numAgents": 9}}, "spec.population.size": 8},
        "spec.algorithm.rl.numAgents",
    ),
    BadManifest(
        "discount above one",
        {"spec.algorithm.rl": {"numAgents": 2, "gamma": 1.5}},
        "spec.algorithm.rl.gamma",
    ),
    BadManifest("negative restarts", {"spec.maxRestarts": -1}, "spec.maxRestarts"),
    BadManifest("privileged metrics port", {"spec.metricsPort": 80}, "spec.metricsPort"),
    BadManifest(
        "coordinator port out of range", {"spec.coordinatorPort": 70000}, "spec.coordinatorPort"
    ),
    BadManifest("zero deadline", {"spec.activeDeadlineSeconds": 0}, "spec.activeDeadlineSeconds"),
    BadManifest(
        "negative ttl", {"spec.ttlSecondsAfterFinished": -5}, "spec.ttlSecondsAfterFinished"
    ),
    BadManifest(
        "not a quantity",
        {"spec.resources": {"limits": {"cpu": "lots"}}},
        "spec.resources.limits.cpu",
    ),
    BadManifest(
        "bad toleration operator",
        {"spec.tolerations": [{"key": "k", "operator": "Maybe"}]},
        "spec.tolerations[0].operator",
    ),
    BadManifest("bad pod label key", {"spec.podLabels": {"no spaces/x y": "v"}}, "spec.podLabels"),
    BadManifest(
        "bad pod label value", {"spec.podLabels": {"team": "has space"}}, "spec.podLabels.team"
    ),
    BadManifest("bad pull policy", {"spec.imagePullPolicy": "Sometimes"}, "spec.imagePullPolicy"),
    BadManifest(
        "zero hidden units", {"spec.policy": {"hiddenLayers": [0]}}, "spec.policy.hiddenLayers[0]"
    ),
    BadManifest("negative seed", {"spec.seed": -1}, "spec.seed"),
    BadManifest(
        "claim with a gs:// location",
        {"spec.checkpoint": {"location": "gs://b/x", "volumeClaimName": "c"}},
        "spec.checkpoint.volumeClaimName",
    ),
    BadManifest(
        "zero checkpoint interval",
        {"spec.checkpoint": {"intervalGenerations": 0}},
        "spec.checkpoint.intervalGenerations",
    ),
    BadManifest("unknown field", {"spec.populationSize": 64}, "spec.populationSize"),
    BadManifest("name too long", {"metadata.name": "x" * 53}, "metadata.name"),
    BadManifest("name not a DNS label", {"metadata.name": "1st.run"}, "metadata.name"),
    BadManifest("name with capitals", {"metadata.name": "Bad_Name"}, "metadata.name"),
]
