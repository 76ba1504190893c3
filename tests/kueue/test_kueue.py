"""The real Kueue admits plain batch/v1 Jobs on the test cluster (no evokube operator).

Quota arithmetic of the first test: the ClusterQueue has 4 CPUs of flavor "cpu";
job A asks for 3, so job B's 2 do not fit until A is gone.
"""

from __future__ import annotations

import os

import pytest
from kubernetes.client import CustomObjectsApi

from tests.cluster.controlplane import read_versions, wait_until
from tests.cluster.kueue import (
    MUTATING,
    VALIDATING,
    KueueSettings,
    WaitForPodsReady,
    kueue_folder,
)
from tests.kueue.helpers import NODE_POOLS, QUEUE_LABEL, condition, is_true, workload_of

CPU_POOL_LABELS = NODE_POOLS["cpu"]["labels"]


def job_manifest(
    name: str, queue: str | None, cpu: str, image: str = "registry.local/evokube/sleep:1"
) -> dict:
    """A one-pod Job; queued (label and suspend: true) when `queue` is given."""
    labels = {QUEUE_LABEL: queue} if queue else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "suspend": bool(queue),
            "parallelism": 1,
            "completions": 1,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "main",
                            "image": image,
                            "resources": {"requests": {"cpu": cpu, "memory": "256Mi"}},
                        }
                    ],
                }
            },
        },
    }


def test_the_cached_build_has_the_manager_and_its_manifests():
    folder = kueue_folder()  # a warm build: nothing to do
    assert folder.name == f"kueue-{read_versions()['KUEUE_VERSION']}"
    assert (folder / ".complete").exists()
    assert os.access(folder / "kueue", os.X_OK)
    bases = {p.name for p in (folder / "config" / "crd" / "bases").glob("*.yaml")}
    assert "kueue.x-k8s.io_workloads.yaml" in bases
    assert (folder / "config" / "webhook" / "manifests.yaml").exists()


@pytest.fixture
def batch(api):
    from kubernetes import client

    return client.BatchV1Api(api)


@pytest.fixture
def core(api):
    from kubernetes import client

    return client.CoreV1Api(api)


def create_job(batch, namespace: str, manifest: dict):
    return batch.create_namespaced_job(namespace, manifest)


def wait_workload(api, namespace, job, what: str, predicate, timeout: float = 60) -> dict:
    """Wait until the Workload of `job` satisfies `predicate`; return it."""

    def check():
        wl = workload_of(api, namespace, job.metadata.uid)
        return wl if wl is not None and predicate(wl) else None

    return wait_until(check, timeout, f"the Workload of job {job.metadata.name} {what}")


def suspended(batch, namespace: str, name: str) -> bool:
    return bool(batch.read_namespaced_job(name, namespace).spec.suspend)


def running_pods(core, namespace: str, job_name: str) -> list:
    pods = core.list_namespaced_pod(namespace, label_selector=f"job-name={job_name}").items
    return [p for p in pods if p.status.phase == "Running"]


@pytest.mark.cluster
def test_job_admitted_then_second_waits_for_quota(
    kueue, kueue_objects, api, batch, core, namespace
):
    queue = kueue_objects.queue({"cpu": {"cpu": 4, "memory": "8Gi"}})

    a = create_job(batch, namespace, job_manifest("job-a", queue, cpu="3"))
    wl_a = wait_workload(api, namespace, a, "admitted", lambda w: is_true(w, "Admitted"))
    assert is_true(wl_a, "QuotaReserved")
    assert wl_a["spec"]["queueName"] == queue
    flavors = wl_a["status"]["admission"]["podSetAssignments"][0]["flavors"]
    assert flavors == {"cpu": "cpu", "memory": "cpu"}

    # Kueue unsuspends the Job and injects the flavor's node labels.
    wait_until(lambda: not suspended(batch, namespace, "job-a"), 30, "job-a unsuspended")
    template = batch.read_namespaced_job("job-a", namespace).spec.template.spec
    assert CPU_POOL_LABELS.items() <= (template.node_selector or {}).items()
    pods = wait_until(lambda: running_pods(core, namespace, "job-a"), 60, "job-a's pod Running")
    assert pods[0].spec.node_name.startswith("cpu-")

    b = create_job(batch, namespace, job_manifest("job-b", queue, cpu="2"))
    wl_b = wait_workload(
        api,
        namespace,
        b,
        "pending for quota",
        lambda w: (condition(w, "QuotaReserved") or {}).get("status") == "False",
    )
    pending = condition(wl_b, "QuotaReserved")
    assert pending["reason"] == "Pending"
    assert "insufficient unused quota for cpu" in pending["message"]
    assert not is_true(wl_b, "Admitted")
    assert suspended(batch, namespace, "job-b")

    batch.delete_namespaced_job("job-a", namespace, propagation_policy="Background")
    wait_workload(api, namespace, b, "admitted", lambda w: is_true(w, "Admitted"))
    wait_until(lambda: not suspended(batch, namespace, "job-b"), 30, "job-b unsuspended")
    wait_until(lambda: running_pods(core, namespace, "job-b"), 60, "job-b's pod Running")


@pytest.mark.cluster
def test_tpu_job_lands_on_the_tpu_slice_with_the_flavors_toleration(
    kueue, kueue_objects, api, batch, core, namespace
):
    """4 hosts x 4 chips: the flavor brings the slice's node selector and tolerates
    its taint, so a Job that says neither runs on the slice."""
    queue = kueue_objects.queue({"tpu": {"google.com/tpu": 16, "cpu": 16, "memory": "64Gi"}})
    manifest = job_manifest("slice", queue, cpu="1")
    manifest["spec"]["parallelism"] = manifest["spec"]["completions"] = 4
    main = manifest["spec"]["template"]["spec"]["containers"][0]
    main["resources"]["requests"]["google.com/tpu"] = "4"
    main["resources"]["limits"] = {"google.com/tpu": "4"}
    job = create_job(batch, namespace, manifest)
    wl = wait_workload(api, namespace, job, "admitted", lambda w: is_true(w, "Admitted"))
    assert wl["status"]["admission"]["podSetAssignments"][0]["flavors"]["google.com/tpu"] == "tpu"
    pods = wait_until(
        lambda: (lambda ps: ps if len(ps) == 4 else None)(running_pods(core, namespace, "slice")),
        60,
        "4 pods of the slice Job Running",
    )
    tpu_nodes = {f"tpu-{i}" for i in range(NODE_POOLS["tpu"]["count"])}
    assert {p.spec.node_name for p in pods} == tpu_nodes
    assert any(t.key == "google.com/tpu" for t in pods[0].spec.tolerations)


@pytest.mark.cluster
def test_conversion_webhook_answers_for_v1beta1(kueue, kueue_objects, api):
    """v1beta2's cohortName is v1beta1's cohort: only Kueue's conversion webhook,
    reached over its URL, renames it."""
    name = kueue_objects.cluster_queue({"cpu": {"cpu": 1}}, cohort="team-a")
    old = CustomObjectsApi(api).get_cluster_custom_object(
        "kueue.x-k8s.io", "v1beta1", "clusterqueues", name
    )
    assert old["apiVersion"] == "kueue.x-k8s.io/v1beta1"
    assert old["spec"]["cohort"] == "team-a"
    assert "cohortName" not in old["spec"]


@pytest.mark.cluster
def test_job_without_queue_label_is_left_alone(kueue, api, batch, core, namespace):
    """manageJobsWithoutQueueName is false: Kueue's webhooks see the Job but keep out."""
    job = create_job(batch, namespace, job_manifest("plain", None, cpu="1"))
    assert not job.spec.suspend
    wait_until(lambda: running_pods(core, namespace, "plain"), 60, "the plain Job's pod Running")
    assert workload_of(api, namespace, job.metadata.uid) is None


@pytest.mark.cluster
def test_stopped_kueue_leaves_no_webhooks(kueue_runner, kueue, cluster, batch, namespace):
    """After stop, Job creation no longer goes through Kueue (a later test restarts it)."""
    kueue_runner.stop()
    for kind, name in (
        ("mutatingwebhookconfiguration", MUTATING),
        ("validatingwebhookconfiguration", VALIDATING),
    ):
        assert cluster.kubectl("get", kind, name, check=False).returncode != 0
    # Labelled for a queue and not suspended: Kueue's webhook would have suspended it.
    job = job_manifest("after-stop", "no-such-queue", cpu="1")
    job["spec"]["suspend"] = False
    assert create_job(batch, namespace, job).spec.suspend is False


@pytest.mark.cluster
@pytest.mark.parametrize(
    "kueue_settings",
    [KueueSettings(wait_for_pods_ready=WaitForPodsReady(timeout="5s", block_admission=True))],
)
def test_wait_for_pods_ready_evicts_a_job_whose_pods_never_start(
    kueue, kueue_objects, api, batch, namespace
):
    """With waitForPodsReady, a workload whose pods are not ready in time is evicted
    and its Job suspended again (kwok keeps an "unpullable" image in ImagePullBackOff)."""
    assert kueue.configuration()["waitForPodsReady"]["timeout"] == "5s"
    queue = kueue_objects.queue({"cpu": {"cpu": 4, "memory": "8Gi"}})
    job = create_job(
        batch, namespace, job_manifest("stuck", queue, cpu="1", image="registry.local/unpullable:1")
    )
    wait_workload(api, namespace, job, "admitted", lambda w: is_true(w, "Admitted"))
    evicted = wait_workload(
        api, namespace, job, "evicted", lambda w: is_true(w, "Evicted"), timeout=60
    )
    assert condition(evicted, "Evicted")["reason"] == "PodsReadyTimeout"
    assert not is_true(evicted, "PodsReady")
    wait_until(lambda: suspended(batch, namespace, "stuck"), 30, "the evicted Job suspended")
