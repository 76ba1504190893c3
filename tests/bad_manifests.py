"""One valid ERLExperiment manifest and the invalid variants of it that must be refused.

Both gates check the same list: the real API server (tests/operator/test_crd.py) and the
trainer's offline validation, `evokube validate` / `evokube run` (tests/runtime/test_manifest.py).
Each case names the field its refusal must be reported on. A case only one gate can check lives
in that gate's test file, saying why.
"""

from __future__ import annotations

import copy
from typing import Any, NamedTuple

from benchmarks.largest_experiment import largest_experiment

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
NODE_TERM = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}
POD_TERM = {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname"}
NODE_AFFINITY = "spec.affinity.nodeAffinity"
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"
DIGEST = "sha256:" + "0123456789abcdef" * 4


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


class GoodManifest(NamedTuple):
    case: str  # the test id
    changes: dict[str, Any]  # applied to BASE by `with_changes`


def ids(cases: list) -> list[str]:
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
    BadManifest(
        "metrics port is the coordinator's",
        {"spec.metricsPort": 8476, "spec.coordinatorPort": 8476},
        "spec.metricsPort",
    ),
    BadManifest(
        "metrics port is the default coordinator's", {"spec.metricsPort": 8476}, "spec.metricsPort"
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
    BadManifest("zero seeds", {"spec.seeds": 0}, "spec.seeds"),
    BadManifest("65 seeds", {"spec.seeds": 65}, "spec.seeds"),
    BadManifest("seeds as a string", {"spec.seeds": "3"}, "spec.seeds"),
    BadManifest(
        "claim with a gs:// location",
        {"spec.checkpoint": {"location": "gs://bucket/x", "volumeClaimName": "c"}},
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
    BadManifest("name with a trailing newline", {"metadata.name": "ok\n"}, "metadata.name"),
]


def _bad(field: str, cases: dict[str, dict[str, Any]]) -> list[BadManifest]:
    """Several refusals of one field: {test id: changes}."""
    return [BadManifest(case, changes, field) for case, changes in cases.items()]


def _tpu(topology: str, chips_per_host: int = 4) -> dict[str, Any]:
    tpu = {"type": "t", "topology": topology, "chipsPerHost": chips_per_host}
    return {"spec.accelerator": {"type": "tpu", "tpu": tpu}}


def _limits(**limits: Any) -> dict[str, Any]:
    return {"spec.resources": {"limits": limits}}


def _annotation(key: str) -> dict[str, Any]:
    return {"spec.podAnnotations": {key: "x"}}


NODE_PREFERENCE = f"{NODE_AFFINITY}.{PREFERRED}[0].preference"


def _node_preference(**term: Any) -> dict[str, Any]:
    return {NODE_AFFINITY: {PREFERRED: [{"weight": 1, "preference": term}]}}


def _ga(pop: int, **ec: Any) -> dict[str, Any]:
    return {"spec.algorithm": {"name": "ga", "ec": ec}, "spec.population.size": pop}


# The attacker's list (issue 12): each was admitted and failed only later, in the operator, the
# Job, the pod or the trainer.
BAD_MANIFESTS += [
    # Gangs: hosts however derived, and no CEL integer overflow on a huge topology.
    *_bad(
        "spec.accelerator.tpu.topology",
        {
            "65536 hosts from a topology": _tpu("256x256", 1),
            "topology dimension that overflows": _tpu("9999999999x9999999999"),
            "topology dimension of 1000": _tpu("1000x2"),
            "topology of four dimensions": _tpu("2x2x2x2"),
            "topology with a trailing newline": _tpu("4x4\n"),
        },
    ),
    BadManifest(
        "tpu type not a label value",
        {"spec.accelerator": {"type": "tpu", "tpu": {"type": "tpu v5", "topology": "2x2"}}},
        "spec.accelerator.tpu.type",
    ),
    BadManifest(
        "gpu product not a label value",
        {"spec.accelerator": {"type": "gpu", "gpu": {"count": 1, "product": "nvidia/h100"}}},
        "spec.accelerator.gpu.product",
    ),
    BadManifest(
        "node selector key with a space", {"spec.nodeSelector": {"a b": "c"}}, "spec.nodeSelector"
    ),
    # Resources.
    *_bad(
        "spec.resources.limits.cpu",
        {
            "negative quantity": _limits(cpu="-1"),
            "negative integer quantity": _limits(cpu=-2),
            "quantity with a trailing newline": _limits(cpu="1\n"),
            "quantity with a fractional exponent": _limits(cpu="1e1.5"),
        },
    ),
    *_bad(
        "spec.resources.limits",
        {
            "unqualified resource name": _limits(gpus="1"),
            "resource name with a space": _limits(**{"example.com/a b": "1"}),
            "tpu in resources": _limits(**{"google.com/tpu": "4"}),
            "kubernetes.io resource name": _limits(**{"kubernetes.io/foo": "1"}),
            "fractional extended resource": _limits(**{"example.com/fpga": "1.5"}),
            "extended resource in kilo": _limits(**{"example.com/fpga": "1k"}),
        },
    ),
    *_bad(
        "spec.resources.requests",
        {
            "gpu in requests": {"spec.resources": {"requests": {"nvidia.com/gpu": 1}}},
            "request above limit": {
                "spec.resources": {"requests": {"cpu": "2"}, "limits": {"cpu": "1500m"}}
            },
            "binary request above decimal limit": {
                "spec.resources": {"requests": {"memory": "1.5Gi"}, "limits": {"memory": "1G"}}
            },
            "extended resource request without a limit": {
                "spec.resources": {"requests": {"example.com/fpga": 1}}
            },
            "extended resource request below its limit": {
                "spec.resources": {
                    "requests": {"example.com/fpga": 1},
                    "limits": {"example.com/fpga": 2},
                }
            },
            "hugepages request below its limit": {
                "spec.resources": {
                    "requests": {"hugepages-2Mi": "2Mi"},
                    "limits": {"hugepages-2Mi": "4Mi"},
                }
            },
            "request above limit by a nano": {
                "spec.resources": {"requests": {"cpu": "1000000001n"}, "limits": {"cpu": 1}}
            },
        },
    ),
    BadManifest("hugepages alone", _limits(**{"hugepages-2Mi": "4Mi"}), "spec.resources"),
    # Affinity: typed, no unknown fields.
    BadManifest(
        "node field selector on a label",
        _node_preference(matchFields=[{"key": "pool", "operator": "In", "values": ["a"]}]),
        f"{NODE_PREFERENCE}.matchFields[0].key",
    ),
    BadManifest(
        "node field selector with two names",
        _node_preference(
            matchFields=[{"key": "metadata.name", "operator": "In", "values": ["a", "b"]}]
        ),
        f"{NODE_PREFERENCE}.matchFields[0].values",
    ),
    BadManifest(
        "node selector key with a space",
        _node_preference(matchExpressions=[{"key": "a b", "operator": "Exists"}]),
        f"{NODE_PREFERENCE}.matchExpressions[0].key",
    ),
    BadManifest(
        "node selector value with a space",
        _node_preference(matchExpressions=[{"key": "a", "operator": "In", "values": ["b c"]}]),
        f"{NODE_PREFERENCE}.matchExpressions[0].values[0]",
    ),
    BadManifest(
        "Gt with a word",
        _node_preference(matchExpressions=[{"key": "n", "operator": "Gt", "values": ["many"]}]),
        f"{NODE_PREFERENCE}.matchExpressions[0].values",
    ),
    # Terms that reach other namespaces: a tenant's anti-affinity would keep others' pods away
    # (the scheduler honours bound pods' terms), its affinity would seek their nodes out.
    *_bad(
        f"spec.affinity.podAntiAffinity.{REQUIRED}[0].namespaceSelector",
        {
            "anti-affinity to every namespace": {
                "spec.affinity.podAntiAffinity": {REQUIRED: [{**POD_TERM, "namespaceSelector": {}}]}
            },
            "anti-affinity to labelled namespaces": {
                "spec.affinity.podAntiAffinity": {
                    REQUIRED: [{**POD_TERM, "namespaceSelector": {"matchLabels": {"team": "b"}}}]
                }
            },
        },
    ),
    BadManifest(
        "anti-affinity to a named namespace",
        {"spec.affinity.podAntiAffinity": {REQUIRED: [{**POD_TERM, "namespaces": ["team-b"]}]}},
        f"spec.affinity.podAntiAffinity.{REQUIRED}[0].namespaces",
    ),
    BadManifest(
        "preferred affinity to another namespace",
        {
            "spec.affinity.podAffinity": {
                PREFERRED: [
                    {"weight": 1, "podAffinityTerm": {**POD_TERM, "namespaces": ["team-b"]}}
                ]
            }
        },
        f"spec.affinity.podAffinity.{PREFERRED}[0].podAffinityTerm.namespaces",
    ),
    BadManifest(
        "preferred anti-affinity to every namespace",
        {
            "spec.affinity.podAntiAffinity": {
                PREFERRED: [{"weight": 1, "podAffinityTerm": {**POD_TERM, "namespaceSelector": {}}}]
            }
        },
        f"spec.affinity.podAntiAffinity.{PREFERRED}[0].podAffinityTerm.namespaceSelector",
    ),
    BadManifest(
        "pod affinity namespace not a DNS label",
        {"spec.affinity.podAffinity": {REQUIRED: [{**POD_TERM, "namespaces": ["Team_A"]}]}},
        f"spec.affinity.podAffinity.{REQUIRED}[0].namespaces[0]",
    ),
    BadManifest(
        "label selector key with a space",
        {
            "spec.affinity.podAffinity": {
                REQUIRED: [{**POD_TERM, "labelSelector": {"matchLabels": {"a b": "c"}}}]
            }
        },
        f"spec.affinity.podAffinity.{REQUIRED}[0].labelSelector.matchLabels",
    ),
    BadManifest(
        "label selector Exists with values",
        {
            "spec.affinity.podAntiAffinity": {
                REQUIRED: [
                    {
                        "labelSelector": {
                            "matchExpressions": [
                                {"key": "a", "operator": "Exists", "values": ["x"]}
                            ]
                        },
                        "topologyKey": "zone",
                    }
                ]
            }
        },
        f"spec.affinity.podAntiAffinity.{REQUIRED}[0].labelSelector.matchExpressions[0].values",
    ),
    BadManifest(
        "misspelled affinity key",
        {"spec.affinity": {"nodeAfinity": {}}},
        "spec.affinity.nodeAfinity",
    ),
    BadManifest(
        "misspelled node selector term key",
        {NODE_AFFINITY: {REQUIRED: {"nodeSelectorTerms": [{"matchExpresions": []}]}}},
        f"{NODE_AFFINITY}.{REQUIRED}.nodeSelectorTerms[0].matchExpresions",
    ),
    BadManifest(
        "affinity weight zero",
        {NODE_AFFINITY: {PREFERRED: [{"weight": 0, "preference": NODE_TERM}]}},
        f"{NODE_AFFINITY}.{PREFERRED}[0].weight",
    ),
    BadManifest(
        "affinity weight above 100",
        {
            "spec.affinity.podAntiAffinity": {
                PREFERRED: [{"weight": 101, "podAffinityTerm": POD_TERM}]
            }
        },
        f"spec.affinity.podAntiAffinity.{PREFERRED}[0].weight",
    ),
    BadManifest(
        "unknown node selector operator",
        {
            NODE_AFFINITY: {
                REQUIRED: {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Is"}]}]
                }
            }
        },
        f"{NODE_AFFINITY}.{REQUIRED}.nodeSelectorTerms[0].matchExpressions[0].operator",
    ),
    BadManifest(
        "In without values",
        {
            NODE_AFFINITY: {
                REQUIRED: {
                    "nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "In"}]}]
                }
            }
        },
        f"{NODE_AFFINITY}.{REQUIRED}.nodeSelectorTerms[0].matchExpressions[0].values",
    ),
    BadManifest(
        "pod affinity without topologyKey",
        {"spec.affinity.podAffinity": {REQUIRED: [{"labelSelector": {"matchLabels": {"a": "b"}}}]}},
        f"spec.affinity.podAffinity.{REQUIRED}[0].topologyKey",
    ),
    # Pod labels and annotations: qualified keys, no reserved ones.
    *_bad(
        "spec.podLabels",
        {
            f"reserved label {key}": {"spec.podLabels": {key: "x"}}
            for key in (
                "job-name",
                "controller-uid",
                "batch.kubernetes.io/job-completion-index",
                "app.kubernetes.io/name",
                "kubernetes.io/metadata.name",
                "node.k8s.io/x",
                "evokube.io/experiment",
                "x.evokube.io/y",
            )
        },
    ),
    BadManifest("label key with a newline", {"spec.podLabels": {"team\n": "a"}}, "spec.podLabels"),
    BadManifest(
        "label value with a newline", {"spec.podLabels": {"team": "a\n"}}, "spec.podLabels.team"
    ),
    *_bad(
        "spec.podAnnotations",
        {
            "bad annotation key": _annotation("no spaces/x y"),
            "apparmor annotation": _annotation(
                "container.apparmor.security.beta.kubernetes.io/trainer"
            ),
            "seccomp annotation": _annotation("seccomp.security.alpha.kubernetes.io/pod"),
            "evokube annotation": _annotation("evokube.io/manifest"),
            "too many annotations": {"spec.podAnnotations": {f"a{i}": "x" for i in range(33)}},
        },
    ),
    BadManifest(
        "annotation value too long",
        {"spec.podAnnotations": {"a": "x" * 2049}},
        "spec.podAnnotations.a",
    ),
    # Priority.
    *_bad(
        "spec.priorityClassName",
        {
            "system-node-critical": {"spec.priorityClassName": "system-node-critical"},
            "system-cluster-critical": {"spec.priorityClassName": "system-cluster-critical"},
        },
    ),
    # Tolerations.
    *_bad(
        "spec.tolerations[0].key",
        {
            "toleration of every taint": {"spec.tolerations": [{"operator": "Exists"}]},
            "empty toleration key": {"spec.tolerations": [{"key": "", "operator": "Exists"}]},
            "taint key with a space": {"spec.tolerations": [{"key": "a b", "operator": "Exists"}]},
            "control-plane taint": {
                "spec.tolerations": [
                    {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}
                ]
            },
            "node condition taint": {
                "spec.tolerations": [
                    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists"}
                ]
            },
        },
    ),
    BadManifest(
        "tolerationSeconds without NoExecute",
        {"spec.tolerations": [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 5}]},
        "spec.tolerations[0].tolerationSeconds",
    ),
    BadManifest(
        "tolerationSeconds above a week",
        {"spec.tolerations": [{"key": "k", "effect": "NoExecute", "tolerationSeconds": 604801}]},
        "spec.tolerations[0].tolerationSeconds",
    ),
    BadManifest(
        "toleration value with Exists",
        {"spec.tolerations": [{"key": "k", "operator": "Exists", "value": "v"}]},
        "spec.tolerations[0].value",
    ),
    # Checkpoint location.
    *_bad(
        "spec.checkpoint.location",
        {
            f"checkpoint location {location!r}": {"spec.checkpoint": {"location": location}}
            for location in (
                "/",
                "relative/ckpt",
                "/data/../etc",
                "/data/./x",
                "/data//x",
                "/data/",
                "/etc/evokube",
                "/etc",
                "/proc/1",
                "/sys",
                "/dev/shm",
                "/usr/local/x",
                "/bin",
                "/sbin/x",
                "/lib64/x",
                "/boot",
                "/run/x",
                "/var/run/secrets",
                "/tmp",
                "/tmp/x",
                "/ckpt\n",
                "/with space",
                "gs://b",
                "gs://bucket//x",
                "s3://b",
                "s3://bucket//x",
                "s3://bucket/x/",
                "s3://Bucket/x",
                "s3://bucket_x/y",
                "s3://" + "a" * 64,
                "S3://bucket/x",
                "/" + "a" * 512,
            )
        },
    ),
    # Integers that overflow later (operator datetimes, trainer int32 counters).
    *[
        BadManifest(f"{field} too large", {field: value}, field)
        for field, value in {
            "spec.activeDeadlineSeconds": 2**63 - 1,
            "spec.ttlSecondsAfterFinished": 315360001,
            "spec.stopping.maxWallClockSeconds": 2**62,
            "spec.stopping.maxGenerations": 2 * 10**9 + 1,
            "spec.checkpoint.intervalGenerations": 2 * 10**9 + 1,
            "spec.evaluation.intervalGenerations": 2 * 10**9 + 1,
            "spec.stopping.maxEnvSteps": 2**53 + 1,  # past what JSON carries exactly
            "spec.algorithm.rl.replayCapacity": 10**9,
            "spec.algorithm.rl.batchSize": 65537,
            "spec.algorithm.rl.warmupSteps": 10**8 + 1,
            "spec.algorithm.rl.updatesPerGeneration": 10**6 + 1,
            "spec.algorithm.rl.numAgents": 1025,
            "spec.algorithm.rl.actorUpdateInterval": 10**6 + 1,
            "spec.environment.episodeLength": 100001,
            "spec.environment.episodesPerEvaluation": 1001,
            "spec.environment.actionRepeat": 1001,
            "spec.evaluation.episodes": 1001,
            "spec.checkpoint.keep": 101,
            "spec.distributed.initializationTimeoutSeconds": 86401,
        }.items()
    ],
    BadManifest(
        "more than 2e9 agent steps per generation into the replay",
        {
            "spec.population.size": 65536,
            "spec.environment.episodesPerEvaluation": 40,
            "spec.environment.episodeLength": 1000,
        },
        "spec.population.size",
    ),
    BadManifest(
        "more than 2e9 replay steps per generation at the env's own 2500-step limit",
        {
            "spec.population.size": 65536,
            "spec.environment.name": "gymnax/Freeway-MinAtar",
            "spec.environment.episodesPerEvaluation": 13,
        },
        "spec.population.size",
    ),
    BadManifest("seed of 2^32", {"spec.seed": 2**32}, "spec.seed"),
    # Algorithm constraints the trainer enforces.
    BadManifest(
        "GA elites equal to the population", _ga(8, numElites=8), "spec.algorithm.ec.numElites"
    ),
    BadManifest(
        "erl-ga elites above the population",
        {
            "spec.algorithm": {"name": "erl-ga", "rl": {"numAgents": 2}, "ec": {"numElites": 9}},
        },
        "spec.algorithm.ec.numElites",
    ),
    BadManifest(
        "tournament larger than the population",
        _ga(8, tournamentSize=9),
        "spec.algorithm.ec.tournamentSize",
    ),
    *_bad(
        "spec.population.size",
        {
            "openes with an odd population": {
                "spec.algorithm": {"name": "openes"},
                "spec.population.size": 7,
            },
            "ars with an odd population": {
                "spec.algorithm": {"name": "ars"},
                "spec.population.size": 7,
            },
            "mirrored sep-cem with an odd population": {
                "spec.algorithm": {"name": "sep-cem", "ec": {"mirrored": True}},
                "spec.population.size": 7,
            },
        },
    ),
    BadManifest(
        "learning rate for CMA-ES",
        {"spec.algorithm": {"name": "cma-es", "ec": {"learningRate": 0.1}}},
        "spec.algorithm.ec.learningRate",
    ),
    BadManifest("mirrored for GA", _ga(8, mirrored=True), "spec.algorithm.ec.mirrored"),
    BadManifest(
        "elite fraction for openes",
        {"spec.algorithm": {"name": "openes", "ec": {"eliteFraction": 0.5}}},
        "spec.algorithm.ec.eliteFraction",
    ),
    # Environments.
    *_bad(
        "spec.environment.name",
        {
            "brax/..": {"spec.environment.name": "brax/.."},
            "env not in gymnax": {"spec.environment.name": "gymnax/NoSuchEnv-v0"},
            "env not in brax": {"spec.environment.name": "brax/pong"},
            "gymnax env left out of the catalog": {
                "spec.environment.name": "gymnax/MNISTBandit-bsuite"
            },
            "brax env left out of the catalog": {"spec.environment.name": "brax/fast"},
            "discrete env for an RL hybrid": {"spec.environment.name": "gymnax/CartPole-v1"},
            "discrete image env for an RL hybrid": {
                "spec.environment.name": "gymnax/Breakout-MinAtar"
            },
        },
    ),
    BadManifest(
        "backend for a gymnax env", {"spec.environment.backend": "mjx"}, "spec.environment.backend"
    ),
    # JSON and ObjectMeta, as the API server decodes and checks them.
    BadManifest("seed beyond int64", {"spec.seed": 2**63}, "spec.seed"),
    BadManifest("quantity beyond int64", _limits(cpu=10**30), "spec.resources.limits.cpu"),
    # 8.0 is an integer to the schema but a double to CEL: the rules on spec cannot evaluate.
    BadManifest("population 8.0", {"spec.population.size": 8.0}, "spec"),
    BadManifest("metadata label value", {"metadata.labels": {"a": "b c"}}, "metadata.labels"),
    BadManifest("metadata label too long", {"metadata.labels": {"a": "x" * 64}}, "metadata.labels"),
    BadManifest(
        "metadata annotation key", {"metadata.annotations": {"a b": "c"}}, "metadata.annotations"
    ),
    BadManifest(
        "null in a list", {"spec.policy": {"hiddenLayers": [None]}}, "spec.policy.hiddenLayers[0]"
    ),
    BadManifest(
        "null required field",
        {"spec.algorithm": {"name": "cem-rl", "rl": {"numAgents": None}}},
        "spec.algorithm.rl.numAgents",
    ),
    # Images.
    *_bad(
        "spec.image",
        {
            f"image {image!r}": {"spec.image": image}
            for image in (
                "   ",
                "trainer:1; rm -rf /",
                "trainer:1 ",
                "trainer:1\n",
                "Trainer:1",
                "trainer:",
                "trainer@sha256:abc",
                "$(id)",
                "a" * 513,
            )
        },
    ),
]


# Edge cases both gates must ADMIT, so that they agree on acceptance as well as refusal.
GOOD_MANIFESTS = [
    GoodManifest(
        "null fields are dropped",
        {
            "spec.podLabels": {"a": None},
            "spec.accelerator": None,
            "spec.stopping": {"maxGenerations": 3, "targetFitness": None},
        },
    ),
    GoodManifest("integral float for an integer", {"spec.seed": 8.0}),
    GoodManifest("64 seeds from the largest seed", {"spec.seed": 2**32 - 1, "spec.seeds": 64}),
    GoodManifest("integral floats for seed and seeds", {"spec.seed": 8.0, "spec.seeds": 2.0}),
    GoodManifest("metadata labels and annotations", {"metadata.labels": {"example.com/a": "b"}}),
    # Cluster-scale budgets (issue 42): past the old 1e9 cap and past 2**31.
    GoodManifest("a 2e9-step budget", {"spec.stopping": {"maxEnvSteps": 2 * 10**9}}),
    GoodManifest("a 1e12-step budget", {"spec.stopping": {"maxEnvSteps": 10**12}}),
    GoodManifest(
        "a million members, 7 episodes of the env's own 2500 steps, no replay: 1.8e10 steps a "
        "generation, summed exactly",
        {
            "spec.algorithm": {"name": "openes"},
            "spec.population.size": 2**20,
            "spec.environment.name": "gymnax/Freeway-MinAtar",
            "spec.environment.episodesPerEvaluation": 7,
        },
    ),
    GoodManifest(
        "largest allowed integers",
        {
            "spec.seed": 2**32 - 1,
            "spec.activeDeadlineSeconds": 315360000,
            "spec.ttlSecondsAfterFinished": 315360000,
            "spec.stopping": {
                "maxGenerations": 2 * 10**9,
                "maxEnvSteps": 2**53,
                "maxWallClockSeconds": 315360000,
            },
            "spec.algorithm.rl": {
                "numAgents": 8,
                "replayCapacity": 10**8,
                "batchSize": 65536,
                "warmupSteps": 10**8,
                "updatesPerGeneration": 10**6,
            },
            "spec.environment.episodeLength": 100000,
            "spec.checkpoint.keep": 100,
            "spec.checkpoint.intervalGenerations": 2 * 10**9,
            "spec.evaluation.intervalGenerations": 2 * 10**9,
            "spec.distributed": {
                "initializationTimeoutSeconds": 86400,
                "heartbeatTimeoutSeconds": 86400,
            },
        },
    ),
    GoodManifest(
        "4096 TPU hosts",
        {"spec.accelerator": _tpu("64x64", 1)["spec.accelerator"], "spec.population.size": 4096},
    ),
    GoodManifest(
        "typed affinity",
        {
            "spec.affinity": {
                "nodeAffinity": {
                    REQUIRED: {
                        "nodeSelectorTerms": [
                            NODE_TERM,
                            {
                                "matchExpressions": [
                                    {"key": "cores", "operator": "Gt", "values": ["4"]}
                                ]
                            },
                            {
                                "matchFields": [
                                    {"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}
                                ]
                            },
                        ]
                    },
                    PREFERRED: [{"weight": 100, "preference": NODE_TERM}],
                },
                "podAffinity": {REQUIRED: [POD_TERM]},
                "podAntiAffinity": {
                    PREFERRED: [
                        {
                            "weight": 1,
                            "podAffinityTerm": {
                                **POD_TERM,
                                "labelSelector": {
                                    "matchExpressions": [{"key": "app", "operator": "Exists"}]
                                },
                                "namespaces": [],  # none listed: the experiment's own
                            },
                        }
                    ]
                },
            }
        },
    ),
    GoodManifest(
        "benign labels and annotations",
        {
            "spec.podLabels": {"team": "a", "example.com/x": ""},
            "spec.podAnnotations": {
                "cluster-autoscaler.kubernetes.io/safe-to-evict": "false",
                "example.com/note": "any text\nwith lines",
            },
        },
    ),
    GoodManifest("gs:// location", {"spec.checkpoint": {"location": "gs://my-bucket/runs/a_1"}}),
    GoodManifest("gs:// bucket root", {"spec.checkpoint": {"location": "gs://my-bucket"}}),
    GoodManifest("s3:// location", {"spec.checkpoint": {"location": "s3://my.bucket-1/runs/a_1"}}),
    GoodManifest("s3:// bucket root", {"spec.checkpoint": {"location": "s3://my-bucket"}}),
    GoodManifest(
        "claim at a path like a system one",
        {"spec.checkpoint": {"location": "/etcetera/ckpt", "volumeClaimName": "c"}},
    ),
    GoodManifest("checkpoint under /var", {"spec.checkpoint": {"location": "/var/ckpt"}}),
    GoodManifest(
        "resources within their limits",
        {
            "spec.resources": {
                "requests": {"cpu": "500m", "memory": "1Gi", "example.com/fpga": 1},
                "limits": {
                    "cpu": 1,
                    "memory": "1Gi",
                    "example.com/fpga": 1,
                    "hugepages-2Mi": "4Mi",
                    "ephemeral-storage": "1.5e9",
                },
            }
        },
    ),
    GoodManifest(
        "requests that round to their limit",
        {
            "spec.resources": {
                "requests": {"cpu": "0.0000000002"},
                "limits": {"cpu": "0.0000000001"},
            }
        },
    ),
    GoodManifest(
        "binary requests capped at their limit",
        {"spec.resources": {"requests": {"memory": "99999Ei"}, "limits": {"memory": "9999Ei"}}},
    ),
    GoodManifest(
        "tolerations",
        {
            "spec.tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 604800,
                },
                {"key": "cloud.google.com/gke-spot", "operator": "Equal", "value": "true"},
                {"key": "dedicated", "value": "ml", "effect": "NoSchedule"},
            ]
        },
    ),
    GoodManifest("priority class", {"spec.priorityClassName": "high-priority"}),
    GoodManifest(
        "image with registry port and digest",
        {"spec.image": f"localhost:5000/evokube/trainer-cpu:0.1.0@{DIGEST}"},
    ),
    GoodManifest("image by digest", {"spec.image": f"ghcr.io/evokube/trainer__cpu@{DIGEST}"}),
    GoodManifest(
        "openes without mirroring, odd population",
        {
            "spec.algorithm": {"name": "openes", "ec": {"mirrored": False}},
            "spec.population.size": 7,
        },
    ),
    GoodManifest("GA keeping all but one", _ga(8, numElites=7, tournamentSize=8)),
    GoodManifest(
        "brax with a backend",
        {"spec.environment": {"name": "brax/inverted_pendulum", "backend": "positional"}},
    ),
    GoodManifest(
        "discrete env for an EC algorithm",
        {"spec.algorithm": {"name": "cma-es"}, "spec.environment.name": "gymnax/CartPole-v1"},
    ),
    GoodManifest(
        "continuous gymnax misc env for an RL hybrid",
        {"spec.environment.name": "gymnax/Reacher-misc"},
    ),
    GoodManifest(
        "image-observation env for an EC algorithm",
        {"spec.algorithm": {"name": "openes"}, "spec.environment.name": "gymnax/Pong-misc"},
    ),
    GoodManifest(
        "brax env with the mjx backend",
        {"spec.environment": {"name": "brax/pusher", "backend": "mjx"}},
    ),
]


# Pod settings (issue 13): what the trainer pods may be given, and nothing that shadows the
# operator's own settings or reaches beyond the safe list of volume kinds.
def _volume(**source: Any) -> dict[str, Any]:
    return {"spec.volumes": [{"name": "v", **source}]}


def _mount(path: str, **changes: Any) -> dict[str, Any]:
    return {
        "spec.volumes": [{"name": "v", "emptyDir": {}}],
        "spec.volumeMounts": [{"name": "v", "mountPath": path}],
        **changes,
    }


BAD_MANIFESTS += [
    BadManifest(
        "account not a name", {"spec.serviceAccountName": "A B"}, "spec.serviceAccountName"
    ),
    *_bad(
        "spec.terminationGracePeriodSeconds",
        {
            "grace period of 0": {"spec.terminationGracePeriodSeconds": 0},
            "grace period above an hour": {"spec.terminationGracePeriodSeconds": 3601},
        },
    ),
    BadManifest(
        "pull secret not a name",
        {"spec.imagePullSecrets": [{"name": "a/b"}]},
        "spec.imagePullSecrets[0].name",
    ),
    *_bad(
        "spec.env[0].name",
        {
            f"env {name}": {"spec.env": [{"name": name, "value": "x"}]}
            for name in ("EVOKUBE_CHECKPOINT_DIR", "EVOKUBE_ANYTHING", "JAX_PROCESS_ID", "HOME")
        }
        | {
            "env name with =": {"spec.env": [{"name": "A=B", "value": "x"}]},
            "env name with a digit first": {"spec.env": [{"name": "1A", "value": "x"}]},
        },
    ),
    BadManifest(
        "XLA_FLAGS on cpu",
        {"spec.env": [{"name": "XLA_FLAGS", "value": "--xla_dump_to=/tmp"}]},
        "spec.env",
    ),
    BadManifest(
        "env twice",
        {"spec.env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]},
        "spec.env",
    ),
    BadManifest("33 env", {"spec.env": [{"name": f"A{i}"} for i in range(33)]}, "spec.env"),
    BadManifest(
        "env value too long",
        {"spec.env": [{"name": "A", "value": "x" * 2049}]},
        "spec.env[0].value",
    ),
    BadManifest(
        "env value and valueFrom",
        {
            "spec.env": [
                {
                    "name": "A",
                    "value": "x",
                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                }
            ]
        },
        "spec.env[0].valueFrom",
    ),
    BadManifest(
        "env valueFrom of two sources",
        {
            "spec.env": [
                {
                    "name": "A",
                    "valueFrom": {
                        "fieldRef": {"fieldPath": "metadata.name"},
                        "secretKeyRef": {"name": "s", "key": "k"},
                    },
                }
            ]
        },
        "spec.env[0].valueFrom",
    ),
    BadManifest(
        "env fieldRef to the spec",
        {"spec.env": [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.containers"}}}]},
        "spec.env[0].valueFrom.fieldRef.fieldPath",
    ),
    BadManifest(
        "env resourceFieldRef to a gpu",
        {
            "spec.env": [
                {
                    "name": "A",
                    "valueFrom": {"resourceFieldRef": {"resource": "limits.nvidia.com/gpu"}},
                }
            ]
        },
        "spec.env[0].valueFrom.resourceFieldRef.resource",
    ),
    BadManifest(
        "envFrom of both kinds",
        {"spec.envFrom": [{"secretRef": {"name": "s"}, "configMapRef": {"name": "c"}}]},
        "spec.envFrom[0]",
    ),
    BadManifest(
        "envFrom prefix with a space",
        {"spec.envFrom": [{"prefix": "A B", "secretRef": {"name": "s"}}]},
        "spec.envFrom[0].prefix",
    ),
    # Beside a kind of the list, so that only the unknown field is wrong: the API server's strict
    # decoding stops there, before any rule.
    BadManifest(
        "hostPath volume", _volume(emptyDir={}, hostPath={"path": "/"}), "spec.volumes[0].hostPath"
    ),
    BadManifest("volume of no kind", _volume(), "spec.volumes[0]"),
    BadManifest(
        "volume of two kinds", _volume(emptyDir={}, configMap={"name": "c"}), "spec.volumes[0]"
    ),
    BadManifest(
        "Memory emptyDir without a size",
        _volume(emptyDir={"medium": "Memory"}),
        "spec.volumes[0].emptyDir.sizeLimit",
    ),
    BadManifest(
        "emptyDir on hugepages",
        _volume(emptyDir={"medium": "HugePages"}),
        "spec.volumes[0].emptyDir.medium",
    ),
    BadManifest(
        "projected service account token",
        _volume(
            projected={"sources": [{"secret": {"name": "s"}, "serviceAccountToken": {"path": "t"}}]}
        ),
        "spec.volumes[0].projected.sources[0].serviceAccountToken",
    ),
    BadManifest(
        "secret item path with ..",
        _volume(secret={"secretName": "s", "items": [{"key": "k", "path": "a/../../b"}]}),
        "spec.volumes[0].secret.items[0].path",
    ),
    *_bad(
        "spec.volumes[0].name",
        {
            f"volume named {name}": {"spec.volumes": [{"name": name, "emptyDir": {}}]}
            for name in ("scratch", "manifest", "checkpoints", "evokube-api-access")
        },
    ),
    BadManifest(
        "two volumes of one name",
        {"spec.volumes": [{"name": "v", "emptyDir": {}}, {"name": "v", "emptyDir": {}}]},
        "spec.volumes",
    ),
    BadManifest(
        "mount of no volume",
        {"spec.volumeMounts": [{"name": "v", "mountPath": "/data"}]},
        "spec.volumeMounts",
    ),
    *_bad(
        "spec.volumeMounts[0].mountPath",
        {
            f"mount at {path}": _mount(path)
            for path in (
                "/",
                "/etc",
                "/etc/evokube",
                "/tmp",
                "/tmp/x",
                "/var",
                "/var/run/secrets/kubernetes.io/serviceaccount",
                "/run/secrets",
                "/dev",
                "/dev/nvidia0",
                "/proc/self",
                "/usr/lib",
                "/lib64",
                "relative",
                "/data/../etc",
            )
        },
    ),
    *_bad(
        "spec.volumeMounts",
        {
            "mount at the checkpoint location": _mount("/checkpoints"),
            "mount under the checkpoint location": _mount(
                "/ckpt/x", **{"spec.checkpoint": {"location": "/ckpt"}}
            ),
            "mount above the checkpoint location": _mount(
                "/data", **{"spec.checkpoint": {"location": "/data/ckpt"}}
            ),
            "two mounts at one path": {
                "spec.volumes": [{"name": "v", "emptyDir": {}}, {"name": "w", "emptyDir": {}}],
                "spec.volumeMounts": [
                    {"name": "v", "mountPath": "/data"},
                    {"name": "w", "mountPath": "/data"},
                ],
            },
        },
    ),
]

GOOD_MANIFESTS += [
    GoodManifest(
        "pod settings",
        {
            "spec.serviceAccountName": "wandb-trainer",
            "spec.terminationGracePeriodSeconds": 3600,
            "spec.imagePullSecrets": [{"name": "registry"}],
            "spec.accelerator": {"type": "gpu", "gpu": {"count": 1}},
            "spec.env": [
                {"name": "XLA_FLAGS", "value": "--xla_gpu_enable_latency_hiding_scheduler=true"},
                {"name": "NCCL_DEBUG", "value": "INFO"},
                {"name": "EVOKUBE_LOG_LEVEL", "value": "DEBUG"},
                {"name": "LIBTPU_INIT_ARGS", "value": ""},
                {
                    "name": "WANDB_API_KEY",
                    "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "key"}},
                },
                {
                    "name": "RUN",
                    "valueFrom": {"configMapKeyRef": {"name": "c", "key": "run", "optional": True}},
                },
                {
                    "name": "POD",
                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['team']"}},
                },
                {
                    "name": "NODE",
                    "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}},
                },
                {
                    "name": "MEM",
                    "valueFrom": {
                        "resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}
                    },
                },
            ],
            "spec.envFrom": [
                {"prefix": "WANDB_", "secretRef": {"name": "wandb"}},
                {"configMapRef": {"name": "c", "optional": True}},
            ],
            "spec.volumes": [
                {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
                {"name": "data", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}},
                {
                    "name": "conf",
                    "configMap": {
                        "name": "c",
                        "items": [{"key": "k", "path": "a/b.yaml", "mode": 0o444}],
                    },
                },
                {"name": "key", "secret": {"secretName": "gcs-key", "defaultMode": 0o400}},
                {
                    "name": "bucket",
                    "csi": {
                        "driver": "gcsfuse.csi.storage.gke.io",
                        "volumeAttributes": {"bucketName": "b"},
                    },
                },
                {
                    "name": "both",
                    "projected": {
                        "sources": [{"configMap": {"name": "c"}}, {"secret": {"name": "s"}}]
                    },
                },
            ],
            "spec.volumeMounts": [
                {"name": "shm", "mountPath": "/dev/shm"},
                {"name": "data", "mountPath": "/data", "readOnly": True},
                {"name": "conf", "mountPath": "/etc/trainer"},
                {"name": "key", "mountPath": "/var/secrets/gcs"},
                {"name": "bucket", "mountPath": "/checkpoints-old"},
                {"name": "both", "mountPath": "/config"},
            ],
        },
    ),
]

# Kueue: the queue and its priority are fields of their own; the labels are the operator's.
BAD_MANIFESTS += [
    *_bad(
        "spec.queueName",
        {
            "queue name with capitals": {"spec.queueName": "TPU-queue"},
            "queue name with a slash": {"spec.queueName": "team/q"},
            "queue name longer than a label value": {"spec.queueName": "q" * 64},
            "queue name empty": {"spec.queueName": ""},
        },
    ),
    *_bad(
        "spec.workloadPriorityClassName",
        {
            "workload priority without a queue": {"spec.workloadPriorityClassName": "high"},
            "workload priority with a dot and no queue": {"spec.workloadPriorityClassName": "a.b"},
            "workload priority of 64 characters": {
                "spec.queueName": "q",
                "spec.workloadPriorityClassName": "p" * 64,
            },
        },
    ),
    *_bad(
        "spec.podLabels",
        {
            "kueue queue label in podLabels": {
                "spec.podLabels": {"kueue.x-k8s.io/queue-name": "q"}
            },
            "kueue priority label in podLabels": {
                "spec.podLabels": {"kueue.x-k8s.io/priority-class": "high"}
            },
        },
    ),
]
GOOD_MANIFESTS += [
    GoodManifest("a queue", {"spec.queueName": "tpu-v5e"}),
    GoodManifest(
        "a queue and a workload priority",
        {"spec.queueName": "team-a", "spec.workloadPriorityClassName": "high-priority"},
    ),
]

# Exclusive placement: the topology key is one of the allow-listed node labels (one naming
# every node, kubernetes.io/os, would keep the namespace's other gangs off the whole cluster);
# naming one asks for exclusivity. On tpu the slice's host variables are the operator's.
TPU_GANG = {"spec.accelerator": TPU, "spec.population.size": 16}  # 16 chips, 4 hosts
BAD_MANIFESTS += [
    *_bad(
        "spec.placement.topologyKey",
        {
            "topology key naming every node": {
                "spec.placement": {"exclusive": True, "topologyKey": "kubernetes.io/os"}
            },
            "topology key naming a zone": {
                "spec.placement": {"topologyKey": "topology.kubernetes.io/zone"}
            },
            "topology key not listed": {"spec.placement": {"topologyKey": "example.com/rack"}},
            "topology key of another case": {
                "spec.placement": {"topologyKey": "Cloud.google.com/gke-nodepool"}
            },
            "topology key empty": {"spec.placement": {"topologyKey": ""}},
            "topology key of a gang that is not exclusive": {
                "spec.placement": {"exclusive": False, "topologyKey": "kubernetes.io/hostname"}
            },
        },
    ),
    BadManifest(
        "exclusive not a boolean",
        {"spec.placement": {"exclusive": "yes"}},
        "spec.placement.exclusive",
    ),
    BadManifest(
        "misspelled placement key", {"spec.placement": {"topology": "a"}}, "spec.placement.topology"
    ),
    *_bad(
        "spec.env",
        {
            "TPU_WORKER_ID in env on tpu": {
                **TPU_GANG,
                "spec.env": [{"name": "TPU_WORKER_ID", "value": "0"}],
            },
            "TPU_WORKER_HOSTNAMES in env on tpu": {
                **TPU_GANG,
                "spec.env": [{"name": "TPU_WORKER_HOSTNAMES", "value": "a,b,c,d"}],
            },
        },
    ),
]
GOOD_MANIFESTS += [
    GoodManifest("a tpu slice, exclusive by default", TPU_GANG),
    GoodManifest("a tpu slice opting out", {**TPU_GANG, "spec.placement": {"exclusive": False}}),
    GoodManifest(
        "a tpu slice on another topology key",
        {**TPU_GANG, "spec.placement": {"topologyKey": "cloud.google.com/gce-topology-subblock"}},
    ),
    GoodManifest(
        "an exclusive gpu gang by its topology key",
        {
            "spec.accelerator": {"type": "gpu", "hosts": 2, "gpu": {"count": 2}},
            "spec.placement": {"topologyKey": "nvidia.com/gpu.clique"},
        },
    ),
    GoodManifest("an exclusive cpu gang", {"spec.placement": {"exclusive": True}}),
    GoodManifest(
        "an exclusive gang on one node",
        {"spec.placement": {"exclusive": True, "topologyKey": "kubernetes.io/hostname"}},
    ),
    GoodManifest(
        "TPU_WORKER_ID in env on gpu",
        {
            "spec.accelerator": {"type": "gpu", "gpu": {"count": 1}},
            "spec.env": [{"name": "TPU_WORKER_ID", "value": "0"}],
        },
    ),
]


def _cma(pop: int, **ec: Any) -> dict[str, Any]:
    return {"spec.algorithm": {"name": "cma-es", "ec": ec}, "spec.population.size": pop}


# IPOP restarts (issue 16): refused where the first run would be too small or mu is fixed.
BAD_MANIFESTS += [
    BadManifest(
        "IPOP whose first run has one member",
        _cma(8, maxRestarts=3),
        "spec.population.size",
    ),
    BadManifest(
        "IPOP with an elite fraction",
        _cma(16, maxRestarts=1, eliteFraction=0.25),
        "spec.algorithm.ec.eliteFraction",
    ),
    BadManifest(
        "restarts for an algorithm without them",
        {"spec.algorithm": {"name": "openes", "ec": {"maxRestarts": 1}}},
        "spec.algorithm.ec.maxRestarts",
    ),
    BadManifest(
        "a population factor of 3",
        _cma(16, maxRestarts=1, restartPopulationFactor=3),
        "spec.algorithm.ec.restartPopulationFactor",
    ),
]
GOOD_MANIFESTS += [
    GoodManifest("IPOP from 2 to 8 members", _cma(8, maxRestarts=2)),
    GoodManifest(
        "restarts at the full population", _cma(8, maxRestarts=3, restartPopulationFactor=1)
    ),
    GoodManifest(
        "cem-rl with OpenES",
        {
            "spec.algorithm": {
                "name": "cem-rl",
                "rl": {"numAgents": 2},
                "ec": {"distribution": "openes", "learningRate": 0.05},
            }
        },
    ),
    GoodManifest("erl-es", {"spec.algorithm": {"name": "erl-es", "rl": {"numAgents": 1}}}),
    GoodManifest(
        "erl-eda",
        {
            "spec.algorithm": {
                "name": "erl-eda",
                "rl": {"numAgents": 1},
                "ec": {"eliteFraction": 0.5},
            }
        },
    ),
]

# PBT (spec.algorithm.pbt): refusals name the field, for the API server and `evokube validate`.
_PBT = {"name": "pbt", "rl": {}}
BAD_MANIFESTS += [
    BadManifest("pbt without rl", {"spec.algorithm": {"name": "pbt"}}, "spec.algorithm.rl"),
    BadManifest(
        "pbt with numAgents",
        {"spec.algorithm": {**_PBT, "rl": {"numAgents": 2}}},
        "spec.algorithm.rl.numAgents",
    ),
    BadManifest(
        "a pbt section for cem-rl",
        {"spec.algorithm": {"name": "cem-rl", "rl": {"numAgents": 2}, "pbt": {"interval": 2}}},
        "spec.algorithm.pbt",
    ),
    BadManifest(
        "pbt exploration noise for sac",
        {
            "spec.algorithm": {
                "name": "pbt",
                "rl": {"learner": "sac"},
                "pbt": {"hyperparameters": {"explorationNoise": {"min": 0.1, "max": 0.2}}},
            }
        },
        "spec.algorithm.pbt.hyperparameters.explorationNoise",
    ),
    BadManifest(
        "pbt range upside down",
        {
            "spec.algorithm": {
                **_PBT,
                "pbt": {"hyperparameters": {"actorLearningRate": {"min": 0.01, "max": 0.001}}},
            }
        },
        "spec.algorithm.pbt.hyperparameters.actorLearningRate.max",
    ),
    BadManifest(
        "pbt exploits more than half",
        {"spec.algorithm": {**_PBT, "pbt": {"exploitFraction": 0.75}}},
        "spec.algorithm.pbt.exploitFraction",
    ),
    BadManifest(
        "pbt with an ec field",
        {"spec.algorithm": {**_PBT, "ec": {"noiseStd": 0.1}}},
        "spec.algorithm.ec.noiseStd",
    ),
]
GOOD_MANIFESTS += [
    GoodManifest("pbt with defaults", {"spec.algorithm": _PBT}),
    GoodManifest(
        "pbt with sac and ranges",
        {
            "spec.algorithm": {
                "name": "pbt",
                "rl": {"learner": "sac"},
                "pbt": {
                    "interval": 3,
                    "perturbFactors": [0.8, 1.2],
                    "hyperparameters": {
                        "criticLearningRate": {"min": 0.0001, "max": 0.001},
                        "targetEntropyScale": {"min": 0.5, "max": 2.0},
                    },
                },
            }
        },
    ),
]


# Sizes (issue 22, operator memory): every list, map and string has a bound (docs/security.md,
# "Sizes"), so no experiment is large; the largest that still runs is admitted.
def _attack_term(t: int) -> dict[str, Any]:
    """One of the issue's 15 nodeSelectorTerms: 16 expressions of 64 values (about 70 KB)."""
    values = [f"v{t:02d}{e:02d}{v:02d}".ljust(63, "x") for e in range(16) for v in range(64)]
    return {
        "matchExpressions": [
            {"key": f"k{e}", "operator": "In", "values": values[e * 64 : (e + 1) * 64]}
            for e in range(16)
        ]
    }


BAD_MANIFESTS += [
    BadManifest(
        "the issue's 1 MB node affinity",
        {
            f"{NODE_AFFINITY}.{REQUIRED}": {
                "nodeSelectorTerms": [_attack_term(t) for t in range(15)]
            }
        },
        f"{NODE_AFFINITY}.{REQUIRED}.nodeSelectorTerms",
    ),
    BadManifest(
        "more than 32 environment variables",
        {"spec.env": [{"name": f"V{i}", "value": "x"} for i in range(33)]},
        "spec.env",
    ),
    BadManifest(
        "a CSI attribute key over 128 characters",
        {
            "spec.volumes": [
                {"name": "v", "csi": {"driver": "d", "volumeAttributes": {"k" * 129: "x"}}}
            ]
        },
        "spec.volumes[0].csi.volumeAttributes",
    ),
]
GOOD_MANIFESTS += [
    GoodManifest(
        "the largest experiment that runs",
        {"spec": largest_experiment("ok", "default", BASE["spec"]["image"])["spec"]},
    ),
]


# Multislice (issue 25): spec.accelerator.tpu.slices, 2 x v5e-16 (32 chips, 8 hosts) below.
def _slices(slices: Any, topology: str = "4x4", chips_per_host: int = 4) -> dict[str, Any]:
    tpu = {"type": "t", "topology": topology, "chipsPerHost": chips_per_host, "slices": slices}
    return {"spec.accelerator": {"type": "tpu", "tpu": tpu}, "spec.population.size": 32}


MULTISLICE = _slices(2)
BAD_MANIFESTS += [
    *_bad(
        "spec.accelerator.tpu.slices",
        {
            "no slices": _slices(0),
            "65 slices": {**_slices(65), "spec.population.size": 65 * 16},
            "slices not a number": _slices("two"),
            # 17 slices of 256 single-chip hosts: 4352 hosts.
            "slices x hosts over 4096": {
                **_slices(17, "16x16", 1),
                "spec.population.size": 17 * 256,
            },
        },
    ),
    BadManifest(
        "population does not shard over every slice's chips",
        {**MULTISLICE, "spec.population.size": 16},
        "spec.population.size",
    ),
    BadManifest(
        "a slice's topology does not divide into hosts",
        {**_slices(2, "2x3"), "spec.population.size": 48},
        "spec.accelerator.tpu.topology",
    ),
    BadManifest(
        "slices on gpu (multi-node gpu is accelerator.hosts)",
        {
            "spec.accelerator": {
                "type": "gpu",
                "gpu": {"count": 1},
                "tpu": {"type": "t", "topology": "2x2", "slices": 2},
            }
        },
        "spec.accelerator.tpu",
    ),
    BadManifest(
        "slices on cpu",
        {
            "spec.accelerator": {
                "type": "cpu",
                "tpu": {"type": "t", "topology": "2x2", "slices": 2},
            }
        },
        "spec.accelerator.tpu",
    ),
    BadManifest(
        "a multislice name too long for its host names",
        {**MULTISLICE, "metadata.name": "m" * 44},
        "metadata.name",
    ),
    *_bad(
        "spec.env",
        {
            f"{name} in env on tpu": {**MULTISLICE, "spec.env": [{"name": name, "value": "1"}]}
            for name in (
                "MEGASCALE_COORDINATOR_ADDRESS",
                "MEGASCALE_NUM_SLICES",
                "MEGASCALE_SLICE_ID",
                "MEGASCALE_PORT",
            )
        },
    ),
]
GOOD_MANIFESTS += [
    GoodManifest("2 slices of v5e-16", MULTISLICE),
    GoodManifest("a multislice name of 43 characters", {**MULTISLICE, "metadata.name": "m" * 43}),
    GoodManifest("a long name on one slice", {**_slices(1), "metadata.name": "m" * 52}),
    GoodManifest(
        "64 slices of 64 hosts", {**_slices(64, "16x16"), "spec.population.size": 64 * 256}
    ),
]
