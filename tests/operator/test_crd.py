"""The CRD on the real API server: what it refuses (schema and CEL), defaults, columns, names."""

import copy
import json

import pytest

from tests.operator.conftest import experiment_manifest

pytestmark = pytest.mark.cluster

DELETE = object()
TPU = {"type": "tpu", "tpu": {"type": "tpu-v5-lite-podslice", "topology": "4x4"}}


def mutated(namespace: str, changes: dict) -> dict:
    """The valid base manifest with dotted paths set (or deleted with DELETE)."""
    manifest = experiment_manifest("bad", namespace)
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = manifest
        for part in parents:
            node = node.setdefault(part, {})
        if value is DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = copy.deepcopy(value)
    return manifest


# (case, changes, text the API server's refusal must contain: the field it is about)
INVALID = [
    ("no image", {"spec.image": DELETE}, "spec.image"),
    ("empty image", {"spec.image": ""}, "spec.image"),
    ("unknown algorithm", {"spec.algorithm.name": "ppo"}, "spec.algorithm.name"),
    (
        "environment not backend/name",
        {"spec.environment.name": "Pendulum"},
        "spec.environment.name",
    ),
    ("population of one", {"spec.population.size": 1}, "spec.population.size"),
    ("no stopping criterion", {"spec.stopping": {}}, "spec.stopping"),
    ("unknown accelerator", {"spec.accelerator": {"type": "fpga"}}, "spec.accelerator.type"),
    ("tpu without its block", {"spec.accelerator": {"type": "tpu"}}, "spec.accelerator.tpu"),
    (
        "gpu block on cpu",
        {"spec.accelerator": {"type": "cpu", "gpu": {"count": 1}}},
        "spec.accelerator.gpu",
    ),
    (
        "topology not AxB",
        {"spec.accelerator": {"type": "tpu", "tpu": {"type": "t", "topology": "4by4"}}},
        "spec.accelerator.tpu.topology",
    ),
    (
        "hosts contradict the topology",
        {"spec.accelerator": {**TPU, "hosts": 3}},
        "spec.accelerator.hosts",
    ),
    (
        "chips per host not 1, 4 or 8",
        {
            "spec.accelerator": {
                "type": "tpu",
                "tpu": {"type": "t", "topology": "4x4", "chipsPerHost": 3},
            }
        },
        "spec.accelerator.tpu.chipsPerHost",
    ),
    (
        "no GPUs",
        {"spec.accelerator": {"type": "gpu", "gpu": {"count": 0}}},
        "spec.accelerator.gpu.count",
    ),
    (
        "population does not shard over devices",
        {"spec.accelerator": {"type": "cpu", "hosts": 3}, "spec.population.size": 64},
        "spec.population.size",
    ),
    ("erl-ga without rl", {"spec.algorithm": {"name": "erl-ga"}}, "spec.algorithm.rl"),
    (
        "rl for an ES",
        {"spec.algorithm": {"name": "openes", "rl": {"numAgents": 2}}},
        "spec.algorithm.rl",
    ),
    (
        "more agents than individuals",
        {"spec.algorithm": {"name": "cem-rl", "rl": {"numAgents": 100}}},
        "spec.algorithm.rl.numAgents",
    ),
    ("negative restarts", {"spec.maxRestarts": -1}, "spec.maxRestarts"),
    ("privileged metrics port", {"spec.metricsPort": 80}, "spec.metricsPort"),
    ("coordinator port out of range", {"spec.coordinatorPort": 70000}, "spec.coordinatorPort"),
    ("zero deadline", {"spec.activeDeadlineSeconds": 0}, "spec.activeDeadlineSeconds"),
    ("negative ttl", {"spec.ttlSecondsAfterFinished": -5}, "spec.ttlSecondsAfterFinished"),
    (
        "not a quantity",
        {"spec.resources": {"limits": {"cpu": "lots"}}},
        "spec.resources.limits.cpu",
    ),
    (
        "bad toleration operator",
        {"spec.tolerations": [{"key": "k", "operator": "Maybe"}]},
        "spec.tolerations[0].operator",
    ),
    ("bad pod label key", {"spec.podLabels": {"no spaces/x y": "v"}}, "spec.podLabels"),
    ("bad pod label value", {"spec.podLabels": {"team": "has space"}}, "spec.podLabels.team"),
    ("bad pull policy", {"spec.imagePullPolicy": "Sometimes"}, "spec.imagePullPolicy"),
    ("zero hidden units", {"spec.policy": {"hiddenLayers": [0]}}, "spec.policy.hiddenLayers[0]"),
    ("negative seed", {"spec.seed": -1}, "spec.seed"),
    (
        "claim with a gs:// location",
        {"spec.checkpoint": {"location": "gs://b/x", "volumeClaimName": "c"}},
        "spec.checkpoint.volumeClaimName",
    ),
    ("unknown field", {"spec.populationSize": 64}, "spec.populationSize"),
    ("name too long", {"metadata.name": "x" * 53}, "metadata.name"),
    ("name not a DNS label", {"metadata.name": "1st.run"}, "metadata.name"),
]


@pytest.mark.parametrize(
    ("changes", "field"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID]
)
def test_the_api_server_refuses_invalid_manifests_naming_the_field(
    cluster, crd, namespace, changes, field
):
    run = cluster.kubectl(
        "apply", "-f", "-", input=json.dumps(mutated(namespace, changes)), check=False
    )
    assert run.returncode != 0, f"admitted: {changes}"
    assert field in run.stderr, run.stderr


def test_there_are_at_least_twenty_refusals():
    assert len(INVALID) >= 20


def test_defaults_are_filled_in_by_the_api_server(cluster, crd, api, namespace):
    from kubernetes import client

    cluster.kubectl("apply", "-f", "-", input=json.dumps(experiment_manifest("d", namespace)))
    spec = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "evokube.io", "v1alpha1", namespace, "erlexperiments", "d"
    )["spec"]
    assert spec["maxRestarts"] == 3
    assert spec["suspend"] is False
    assert spec["metricsPort"] == 9100
    assert spec["coordinatorPort"] == 8476
    assert spec["accelerator"] == {"type": "cpu", "devicesPerHost": 1}
    assert spec["checkpoint"]["intervalGenerations"] == 10


def test_immutable_fields_stay_and_the_accelerator_changes_only_while_suspended(
    cluster, crd, namespace
):
    manifest = experiment_manifest("imm", namespace, suspend=True)
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def update(**spec):
        changed = copy.deepcopy(manifest)
        changed["spec"].update(spec)
        return cluster.kubectl("apply", "-f", "-", input=json.dumps(changed), check=False)

    refused = update(algorithm={"name": "cma-es"})
    assert refused.returncode != 0 and "algorithm is immutable" in refused.stderr
    refused = update(population={"size": 128})
    assert refused.returncode != 0 and "population is immutable" in refused.stderr
    assert update(accelerator={"type": "cpu", "devicesPerHost": 2}).returncode == 0  # suspended
    manifest["spec"]["accelerator"] = {"type": "cpu", "devicesPerHost": 2}
    assert update(suspend=False).returncode == 0
    manifest["spec"]["suspend"] = False
    refused = update(accelerator={"type": "cpu", "devicesPerHost": 4})
    assert refused.returncode != 0 and "suspend it first" in refused.stderr


def test_short_name_category_and_printer_columns(cluster, crd, namespace):
    cluster.kubectl("apply", "-f", "-", input=json.dumps(experiment_manifest("cols", namespace)))
    for resource in ("erlx", "evokube", "erlexperiments.evokube.io"):
        out = cluster.kubectl("get", resource, "-n", namespace).stdout
        header = out.splitlines()[0].split()
        assert header[:4] == ["NAME", "PHASE", "ALGORITHM", "ENVIRONMENT"], out
        assert {"HOSTS", "GENERATION", "BEST", "RESTARTS", "AGE"} <= set(header)
        assert "cols" in out
    wide = cluster.kubectl("get", "erlx", "-n", namespace, "-o", "wide").stdout.splitlines()[0]
    assert {"PREEMPTIONS", "JOB", "COORDINATOR"} <= set(wide.split())
