"""The test control plane is a real Kubernetes: versions, RBAC, scheduling, Jobs, GC."""

import os
import signal

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.cluster.controlplane import read_versions, wait_until

pytestmark = pytest.mark.cluster

TPU_SELECTOR = {
    "cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice",
    "cloud.google.com/gke-tpu-topology": "4x4",
}
TPU_TOLERATION = client.V1Toleration(key="google.com/tpu", operator="Exists", effect="NoSchedule")


def pod_spec(**overrides) -> client.V1PodSpec:
    container = client.V1Container(
        name="main",
        image="registry.invalid/trainer:test",
        resources=client.V1ResourceRequirements(limits=overrides.pop("limits", None)),
    )
    return client.V1PodSpec(containers=[container], restart_policy="Never", **overrides)


def create_pod(api, namespace, name, **spec) -> client.V1Pod:
    core = client.CoreV1Api(api)
    pod = client.V1Pod(metadata=client.V1ObjectMeta(name=name), spec=pod_spec(**spec))
    return core.create_namespaced_pod(namespace, pod)


def create_cpu_job(batch, namespace, name) -> client.V1Job:
    """A one-pod Job on the CPU pool that never retries."""
    template = client.V1PodTemplateSpec(
        spec=pod_spec(node_selector={"evokube.io/test-pool": "cpu"})
    )
    job = client.V1Job(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1JobSpec(template=template, backoff_limit=0),
    )
    return batch.create_namespaced_job(namespace, job)


def pod_phase(api, namespace, name) -> str:
    return client.CoreV1Api(api).read_namespaced_pod(name, namespace).status.phase


def test_server_reports_the_pinned_release(api):
    version = client.VersionApi(api).get_code()
    assert version.git_version == read_versions()["KUBERNETES_VERSION"]


def test_unprivileged_service_account_is_forbidden_from_secrets(cluster, api, namespace):
    core = client.CoreV1Api(api)
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="nobody"))
    )
    token = core.create_namespaced_service_account_token(
        "nobody", namespace, client.AuthenticationV1TokenRequest(spec={"audiences": []})
    ).status.token

    with cluster.api_client(token) as sa_api:
        # The token authenticates (the API knows who we are) ...
        review = client.AuthenticationV1Api(sa_api).create_self_subject_review(
            client.V1SelfSubjectReview()
        )
        assert review.status.user_info.username == f"system:serviceaccount:{namespace}:nobody"
        # ... and RBAC refuses what nobody granted.
        with pytest.raises(ApiException) as forbidden:
            client.CoreV1Api(sa_api).list_namespaced_secret(namespace)
    assert forbidden.value.status == 403
    # The admin identity can, so the refusal is RBAC and not a broken server.
    core.list_namespaced_secret(namespace)


def test_tpu_pod_is_scheduled_onto_the_tpu_pool_and_runs(api, namespace):
    create_pod(
        api,
        namespace,
        "tpu-worker",
        node_selector=TPU_SELECTOR,
        tolerations=[TPU_TOLERATION],
        limits={"google.com/tpu": "4"},
    )
    wait_until(
        lambda: pod_phase(api, namespace, "tpu-worker") == "Running", 60, "the TPU pod to run"
    )
    pod = client.CoreV1Api(api).read_namespaced_pod("tpu-worker", namespace)
    node = client.CoreV1Api(api).read_node(pod.spec.node_name)
    assert node.metadata.labels["evokube.io/test-pool"] in ("tpu", "tpu-b")  # two 4x4 slices
    assert node.status.allocatable["google.com/tpu"] == "4"


def test_taints_and_extended_resources_are_enforced_by_the_scheduler(api, namespace):
    # No toleration: the tainted TPU nodes must refuse it.
    create_pod(
        api, namespace, "untolerated", node_selector=TPU_SELECTOR, limits={"google.com/tpu": "4"}
    )
    # More chips than any host has: nothing fits.
    create_pod(
        api,
        namespace,
        "too-many-chips",
        node_selector=TPU_SELECTOR,
        tolerations=[TPU_TOLERATION],
        limits={"google.com/tpu": "8"},
    )
    core = client.CoreV1Api(api)

    def unschedulable(name):
        conditions = core.read_namespaced_pod(name, namespace).status.conditions or []
        return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conditions)

    for name in ("untolerated", "too-many-chips"):
        wait_until(lambda n=name: unschedulable(n), 60, f"{name} to be marked Unschedulable")
        assert core.read_namespaced_pod(name, namespace).spec.node_name is None


def test_gpu_pod_lands_on_the_gpu_pool(api, namespace):
    create_pod(
        api,
        namespace,
        "gpu-worker",
        node_selector={"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
        tolerations=[client.V1Toleration(key="nvidia.com/gpu", operator="Exists")],
        limits={"nvidia.com/gpu": "8"},
    )
    wait_until(
        lambda: pod_phase(api, namespace, "gpu-worker") == "Running", 60, "the GPU pod to run"
    )
    pod = client.CoreV1Api(api).read_namespaced_pod("gpu-worker", namespace)
    assert pod.spec.node_name.startswith("gpu-")


def test_indexed_job_pods_get_stable_hostnames_under_the_headless_service(api, namespace):
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    core.create_namespaced_service(
        namespace,
        client.V1Service(
            metadata=client.V1ObjectMeta(name="hosts"),
            spec=client.V1ServiceSpec(
                cluster_ip="None", selector={"app": "gang"}, ports=[client.V1ServicePort(port=1234)]
            ),
        ),
    )
    spec = pod_spec(subdomain="hosts", node_selector={"evokube.io/test-pool": "cpu"})
    batch.create_namespaced_job(
        namespace,
        client.V1Job(
            metadata=client.V1ObjectMeta(name="gang"),
            spec=client.V1JobSpec(
                completions=4,
                parallelism=4,
                completion_mode="Indexed",
                backoff_limit=0,
                template=client.V1PodTemplateSpec(
                    metadata=client.V1ObjectMeta(labels={"app": "gang"}), spec=spec
                ),
            ),
        ),
    )

    def running_pods():
        pods = core.list_namespaced_pod(namespace, label_selector="job-name=gang").items
        return pods if len(pods) == 4 and all(p.status.phase == "Running" for p in pods) else None

    pods = wait_until(running_pods, 60, "4 running Job pods")
    assert sorted(p.spec.hostname for p in pods) == [f"gang-{i}" for i in range(4)]
    assert {p.spec.subdomain for p in pods} == {"hosts"}
    for pod in pods:
        index = pod.metadata.annotations["batch.kubernetes.io/job-completion-index"]
        assert pod.spec.hostname == f"gang-{index}"


@pytest.mark.parametrize(("code", "phase"), [(42, "Failed"), (0, "Succeeded")])
def test_a_pod_can_be_driven_to_exit_with_a_chosen_code(api, namespace, code, phase):
    core = client.CoreV1Api(api)
    create_pod(api, namespace, "worker", node_selector={"evokube.io/test-pool": "cpu"})
    wait_until(lambda: pod_phase(api, namespace, "worker") == "Running", 60, "the pod to run")
    core.patch_namespaced_pod(
        "worker", namespace, {"metadata": {"annotations": {"evokube.test/exit-code": str(code)}}}
    )
    wait_until(lambda: pod_phase(api, namespace, "worker") == phase, 60, f"phase {phase}")
    state = core.read_namespaced_pod("worker", namespace).status.container_statuses[0].state
    assert state.terminated.exit_code == code


def test_deleting_an_owner_garbage_collects_its_dependents(api, namespace):
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    owner = core.create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="owner"))
    )
    ref = client.V1OwnerReference(
        api_version="v1", kind="ConfigMap", name="owner", uid=owner.metadata.uid
    )
    core.create_namespaced_config_map(
        namespace,
        client.V1ConfigMap(metadata=client.V1ObjectMeta(name="dependent", owner_references=[ref])),
    )
    create_cpu_job(batch, namespace, "job")
    wait_until(
        lambda: core.list_namespaced_pod(namespace, label_selector="job-name=job").items,
        60,
        "the Job's pod",
    )

    core.delete_namespaced_config_map("owner", namespace)
    batch.delete_namespaced_job("job", namespace, propagation_policy="Background")

    def gone():
        names = {c.metadata.name for c in core.list_namespaced_config_map(namespace).items}
        pods = core.list_namespaced_pod(namespace, label_selector="job-name=job").items
        return "dependent" not in names and not pods

    wait_until(gone, 60, "the garbage collector to delete the dependents")


def test_a_running_job_pod_that_is_deleted_goes_away(api, namespace):
    """No kubelet runs here; kwok must stop the pod so the Job controller releases it."""
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    create_cpu_job(batch, namespace, "job")

    def running_pod():
        pods = core.list_namespaced_pod(namespace, label_selector="job-name=job").items
        return pods[0].metadata.name if pods and pods[0].status.phase == "Running" else None

    name = wait_until(running_pod, 60, "the Job's pod to run")
    core.delete_namespaced_pod(name, namespace)

    def gone():
        return name not in {p.metadata.name for p in core.list_namespaced_pod(namespace).items}

    wait_until(gone, 60, "the deleted pod to disappear")


def test_a_controller_manager_that_died_mid_session_is_reported_and_restarted(cluster, api):
    """One broken component must not fail every later test of the session: a namespace
    whose default ServiceAccount never comes warns with the component's log, restarts it
    once, and gets its account."""
    os.killpg(cluster.state.pids["kube-controller-manager"], signal.SIGKILL)
    name = "kcm-died"
    client.CoreV1Api(api).create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name))
    )
    try:
        with pytest.warns(UserWarning, match="kube-controller-manager not running") as caught:
            cluster.wait_for_default_account(name, timeout=5)
        assert str(cluster.log("kube-controller-manager")) in str(caught[0].message)
        assert cluster.is_running()
    finally:
        client.CoreV1Api(api).delete_namespace(name)
