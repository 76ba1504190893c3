"""The real JobSet controller places multislice TPU work on the kwok node pools, and the
real Kueue admits a queued JobSet as one workload (without the operator, then with it: the
multislice example of docs/kueue.md).

The test cluster has two 4x4 v5e slices (tests/cluster/nodes.yaml: pools tpu and tpu-b,
4 hosts of 4 chips each). A JobSet of 2 replicated Jobs x 2 pods of 4 chips fits either
way: both Jobs in one pool, or split across both. Only JobSet's exclusive topology makes
each Job one pool of its own.
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from tests.cluster.controlplane import NODE_POOL_LABEL, read_versions, wait_until
from tests.cluster.jobset import (
    API_VERSION,
    EXCLUSIVE_TOPOLOGY,
    GROUP,
    JOBSET_NAME_LABEL,
    jobset_folder,
    jobset_manifest,
    pod_spec,
)
from tests.cluster.kueue import KueueSettings
from tests.kueue.helpers import QUEUE_LABEL, is_true, workload_of, workloads

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kueue"
TPU_HOST = {"google.com/tpu": "4", "cpu": "1", "memory": "1Gi"}
SLICES, HOSTS = 2, 2


def create_jobset(api, namespace: str, manifest: dict) -> dict:
    group, version = API_VERSION.split("/")
    return client.CustomObjectsApi(api).create_namespaced_custom_object(
        group, version, namespace, "jobsets", manifest
    )


def multislice(name: str, **kw) -> dict:
    """SLICES replicated Jobs ("slice") of HOSTS pods of one TPU host each."""
    return jobset_manifest(
        name, {"slice": pod_spec(TPU_HOST)}, parallelism=HOSTS, replicas=SLICES, **kw
    )


def running(api, namespace: str, name: str, count: int) -> list | None:
    """The JobSet's pods once `count` of them are Running, else None."""
    pods = (
        client.CoreV1Api(api)
        .list_namespaced_pod(namespace, label_selector=f"{JOBSET_NAME_LABEL}={name}")
        .items
    )
    up = [p for p in pods if p.status.phase == "Running"]
    return up if len(up) == count else None


def pools_by_job(api, pods) -> dict[str, set[str]]:
    """Child Job name -> the node pools its pods run in."""
    core = client.CoreV1Api(api)
    pools = defaultdict(set)
    for pod in pods:
        node = core.read_node(pod.spec.node_name)
        pools[pod.metadata.labels["job-name"]].add(node.metadata.labels[NODE_POOL_LABEL])
    return dict(pools)


def test_the_cached_build_has_the_manager_and_its_manifests():
    folder = jobset_folder()  # a warm build: nothing to do
    assert folder.name == f"jobset-{read_versions()['JOBSET_VERSION']}"
    assert (folder / ".complete").exists()
    assert os.access(folder / "jobset", os.X_OK)
    assert (folder / "config" / "crd" / "bases" / f"{GROUP}_jobsets.yaml").exists()
    assert (folder / "config" / "webhook" / "manifests.yaml").exists()


@pytest.mark.cluster
def test_exclusive_topology_gives_each_slice_a_node_pool_of_its_own(jobset, api, namespace):
    """2 slices x 2 hosts: two Jobs on two distinct pools, no Job split across pools; a
    third slice finds no pool free of another Job and stays Pending."""
    exclusive = {EXCLUSIVE_TOPOLOGY: NODE_POOL_LABEL}
    create_jobset(api, namespace, multislice("ms", annotations=exclusive))
    pods = wait_until(
        lambda: running(api, namespace, "ms", SLICES * HOSTS), 90, "4 pods of the JobSet Running"
    )
    # JobSet's pod webhooks did it (the kustomization's patch keeps them to its own pods).
    admission = client.AdmissionregistrationV1Api(api)
    hooks = admission.read_mutating_webhook_configuration(
        jobset.webhook_names["MutatingWebhookConfiguration"]
    ).webhooks
    (pod_hook,) = [h for h in hooks if h.rules[0].resources == ["pods"]]
    assert pod_hook.object_selector.match_expressions[0].key == JOBSET_NAME_LABEL
    assert all(p.spec.affinity or p.spec.node_selector for p in pods)
    pools = pools_by_job(api, pods)
    assert sorted(pools) == ["ms-slice-0", "ms-slice-1"]
    assert all(len(p) == 1 for p in pools.values()), pools  # never split
    assert pools["ms-slice-0"] != pools["ms-slice-1"], pools  # one pool each

    # Each pool still has 2 free hosts, but each holds another Job: exclusive, so no room.
    extra = jobset_manifest("extra", {"slice": pod_spec(TPU_HOST)}, 1, annotations=exclusive)
    create_jobset(api, namespace, extra)
    core = client.CoreV1Api(api)

    def unschedulable():
        pods = core.list_namespaced_pod(namespace, label_selector=f"{JOBSET_NAME_LABEL}=extra")
        return [
            p
            for p in pods.items
            for c in p.status.conditions or []
            if c.type == "PodScheduled" and c.reason == "Unschedulable"
        ]

    (pod,) = wait_until(unschedulable, 60, "the third slice's pod reported Unschedulable")
    assert pod.spec.node_name is None


@pytest.mark.cluster
@pytest.mark.parametrize(
    "kueue_settings", [KueueSettings(frameworks=("batch/job", f"{GROUP}/jobset"))]
)
def test_kueue_admits_a_queued_jobset_as_one_workload(kueue_jobsets, kueue_objects, api, namespace):
    """Kueue's JobSet integration: one Workload for the whole set, one pod set per
    replicated Job counting all its pods, admitted on the TPU flavor; then every pod runs."""
    queue = kueue_objects.queue({"tpu": {"google.com/tpu": 16, "cpu": 16, "memory": "64Gi"}})
    made = create_jobset(api, namespace, multislice("queued", labels={QUEUE_LABEL: queue}))
    uid = made["metadata"]["uid"]

    def admitted():
        wl = workload_of(api, namespace, uid)
        return wl if is_true(wl, "Admitted") else None

    wl = wait_until(admitted, 60, "the JobSet's Workload Admitted")
    assert [w["metadata"]["name"] for w in workloads(api, namespace)] == [wl["metadata"]["name"]]
    owner = wl["metadata"]["ownerReferences"][0]
    assert (owner["apiVersion"], owner["kind"], owner["name"]) == (API_VERSION, "JobSet", "queued")
    assert [(ps["name"], ps["count"]) for ps in wl["spec"]["podSets"]] == [
        ("slice", SLICES * HOSTS)
    ]
    (assignment,) = wl["status"]["admission"]["podSetAssignments"]
    assert assignment["flavors"]["google.com/tpu"] == "tpu"
    assert assignment["resourceUsage"]["google.com/tpu"] == str(4 * SLICES * HOSTS)

    pods = wait_until(
        lambda: running(api, namespace, "queued", SLICES * HOSTS), 90, "the queued JobSet's pods"
    )
    assert set().union(*pools_by_job(api, pods).values()) == {"tpu-v5e-4x4"}


@pytest.mark.cluster
@pytest.mark.parametrize(
    "kueue_settings", [KueueSettings(frameworks=("batch/job", f"{GROUP}/jobset"))]
)
def test_the_multislice_queue_example_is_admitted_as_one_workload(
    kueue_jobsets, k8s, cluster, api, namespace
):
    """docs/kueue.md, "Multislice", as written: examples/kueue/ applied with the operator. The
    two-slice experiment's JobSet is one Workload holding both slices' 32 chips, admitted whole;
    then every host of both slices runs, each slice on a pool of its own."""
    queues = EXAMPLES / "queues.yaml"
    example = EXAMPLES / "tpu-multislice-experiment.yaml"
    name = yaml.safe_load(example.read_text())["metadata"]["name"]
    cluster.kubectl("apply", "-n", namespace, "-f", str(queues))
    try:
        cluster.kubectl("apply", "-n", namespace, "-f", str(example))
        pods = k8s.wait(
            lambda: (
                (up := [p for p in k8s.pods(namespace, name) if p.status.phase == "Running"])
                and len(up) == 8
                and up
            ),
            "8 hosts of both slices running",
            timeout=120,
        )
        status = k8s.wait_phase(namespace, name, "Running", timeout=60)
        assert (status["slices"], status["hosts"]) == (2, 8)
        assert k8s.condition(namespace, name, "Queued")["reason"] == "Admitted"
        (workload,) = workloads(api, namespace)
        owner = workload["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"]) == ("JobSet", status["jobName"])
        assert [(s["name"], s["count"]) for s in workload["spec"]["podSets"]] == [("slice", 8)]
        (assignment,) = workload["status"]["admission"]["podSetAssignments"]
        assert assignment["flavors"]["google.com/tpu"] == "tpu-v5e-4x4"
        assert assignment["resourceUsage"]["google.com/tpu"] == "32"
        # The queue is the JobSet's: Kueue would see each Job as a workload of its own otherwise.
        group, version = API_VERSION.split("/")
        made = client.CustomObjectsApi(api).get_namespaced_custom_object(
            group, version, namespace, "jobsets", status["jobName"]
        )
        assert made["metadata"]["labels"][QUEUE_LABEL] == "research"
        assert not [j for j in k8s.jobs(namespace, name) if QUEUE_LABEL in j.metadata.labels]
        pools = pools_by_job(api, pods)
        assert all(len(p) == 1 for p in pools.values()) and len(set().union(*pools.values())) == 2
    finally:
        cluster.kubectl("delete", "erlx", name, "-n", namespace, "--ignore-not-found")
        k8s.wait(lambda: not k8s.pods(namespace, name), "the gang to be gone", timeout=60)
        cluster.kubectl(
            "delete", "-n", namespace, "-f", str(queues), "--ignore-not-found", "--timeout=60s"
        )
