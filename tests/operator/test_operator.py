"""The operator end to end: kubectl apply on the real control plane, kwok playing the hosts.

Pods on kwok nodes run until a test ends them with an exit code
(`evokube.test/exit-code`), so every failure the trainer contract knows can
be played: 0, 75, 78, 137, an eviction, a deadline.
"""

import time

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from evokube_operator import api
from tests.operator.conftest import GROUP, PLURAL, VERSION, experiment_manifest

pytestmark = pytest.mark.cluster

TPU = {"type": "tpu", "tpu": {"type": "tpu-v5-lite-podslice", "topology": "4x4"}}
GPU = {"type": "gpu", "hosts": 2, "gpu": {"count": 8, "product": "nvidia-h100-80gb"}}
TWO_CPU_HOSTS = {"type": "cpu", "hosts": 2}


def start(k8s, namespace, name, hosts=2, **spec):
    spec.setdefault("accelerator", TWO_CPU_HOSTS)
    k8s.apply(experiment_manifest(name, namespace, **spec))
    return k8s.wait_running_gang(namespace, name, hosts)


def host_pod(k8s, namespace, name, job, index):
    for pod in k8s.running_pods(namespace, name, job):
        if pod.metadata.annotations["batch.kubernetes.io/job-completion-index"] == str(index):
            return pod
    raise AssertionError(f"no running pod for host {index} of {job}")


def node_pool(k8s, node_name):
    return k8s.core.read_node(node_name).metadata.labels["evokube.io/test-pool"]


def test_apply_creates_owned_objects_and_the_tpu_gang_runs_on_the_tpu_pool(k8s, namespace):
    k8s.apply(
        experiment_manifest(
            "tpu",
            namespace,
            accelerator=TPU,
            podLabels={"team": "rl"},
        )
    )
    status = k8s.wait_running_gang(namespace, "tpu", 4)
    uid = k8s.experiment(namespace, "tpu")["metadata"]["uid"]
    assert status["jobName"] == "tpu-0"
    assert status["coordinatorAddress"] == "tpu-0-0.tpu:8476"
    assert status["hosts"] == 4
    assert status["checkpointLocation"] == "/checkpoints"
    assert status["startTime"] and status["observedGeneration"] == 1
    running = k8s.condition(namespace, "tpu", "Running")
    assert (running["status"], running["reason"]) == ("True", "AllHostsRunning")
    # Only the operator's fields: nothing of Kopf's (handler results, progress) in status.
    assert set(status) <= {
        "phase", "observedGeneration", "hosts", "restarts", "preemptions", "attempt",
        "startTime", "jobName", "jobUID", "coordinatorAddress", "checkpointLocation",
        "conditions",
    }  # fmt: skip
    assert status["attempt"] == 0

    svc = k8s.core.read_namespaced_service("tpu", namespace)
    assert svc.spec.cluster_ip == "None" and svc.spec.publish_not_ready_addresses
    assert svc.spec.selector["evokube.io/experiment"] == "tpu"
    assert {p.name: p.port for p in svc.spec.ports} == {"coordinator": 8476, "metrics": 9100}
    account = k8s.core.read_namespaced_service_account("tpu-trainer", namespace)
    role = k8s.rbac.read_namespaced_role("tpu-trainer", namespace)
    assert [(r.resources, r.resource_names, r.verbs) for r in role.rules] == [
        (["erlexperiments/status"], ["tpu"], ["get", "patch"])
    ]
    binding = k8s.rbac.read_namespaced_role_binding("tpu-trainer", namespace)
    assert [(s.kind, s.name) for s in binding.subjects] == [("ServiceAccount", "tpu-trainer")]
    job = k8s.batch.read_namespaced_job("tpu-0", namespace)
    assert status["jobUID"] == job.metadata.uid
    # The manifest is the attempt's ConfigMap, labelled like its Job; the pods carry no copy.
    config_map = k8s.core.read_namespaced_config_map("tpu-0-manifest", namespace)
    assert config_map.metadata.labels == job.metadata.labels
    assert not job.spec.template.metadata.annotations
    manifest = yaml.safe_load(config_map.data[api.MANIFEST_FILE])
    assert manifest["metadata"]["name"] == "tpu"
    assert manifest["spec"]["accelerator"]["tpu"]["topology"] == "4x4"
    assert (job.spec.completions, job.spec.parallelism) == (4, 4)
    assert job.spec.completion_mode == "Indexed" and job.spec.backoff_limit == 0
    assert [r.action for r in job.spec.pod_failure_policy.rules] == ["FailJob", "FailJob"]
    assert job.spec.template.spec.subdomain == "tpu"
    assert not job.spec.suspend  # no spec.queueName: nothing to wait for
    for owned in (svc, account, role, binding, job, config_map):
        (owner,) = owned.metadata.owner_references
        assert (owner.kind, owner.name, owner.uid, owner.controller) == (
            "ERLExperiment",
            "tpu",
            uid,
            True,
        )

    pods = k8s.running_pods(namespace, "tpu", "tpu-0")
    nodes = {p.spec.node_name for p in pods}
    assert len(nodes) == 4  # one host per TPU VM, placed by kube-scheduler
    # Every host on one of the two 4x4 slices, not half of each (test_placement.py).
    assert {node_pool(k8s, n) for n in nodes} in ({"tpu"}, {"tpu-b"})
    indices = set()
    for pod in pods:
        indices.add(pod.metadata.annotations["batch.kubernetes.io/job-completion-index"])
        (container,) = pod.spec.containers
        env = {e.name: e for e in container.env}
        assert env["JAX_COORDINATOR_ADDRESS"].value == "tpu-0-0.tpu:8476"
        assert env["JAX_NUM_PROCESSES"].value == "4"
        assert "job-completion-index" in env["JAX_PROCESS_ID"].value_from.field_ref.field_path
        assert container.resources.limits["google.com/tpu"] == "4"
        assert pod.spec.node_selector["cloud.google.com/gke-tpu-topology"] == "4x4"
        assert pod.metadata.labels["team"] == "rl"
        assert pod.spec.service_account_name == "tpu-trainer"
    assert indices == {"0", "1", "2", "3"}
    events = k8s.events(namespace, "tpu")
    assert "JobCreated" in events and "AllHostsRunning" in events


def test_a_gpu_gang_lands_on_the_gpu_pool_under_the_restricted_pod_security_standard(
    k8s, namespace
):
    k8s.core.patch_namespace(
        namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    )
    start(k8s, namespace, "gpu", hosts=2, accelerator=GPU)
    pods = k8s.running_pods(namespace, "gpu", "gpu-0")
    assert {node_pool(k8s, p.spec.node_name) for p in pods} == {"gpu"}
    assert len({p.spec.node_name for p in pods}) == 2
    for pod in pods:
        assert pod.spec.containers[0].resources.limits["nvidia.com/gpu"] == "8"
        assert pod.spec.security_context.run_as_non_root is True


def test_retriable_exits_restart_the_gang_until_max_restarts_is_used_up(k8s, namespace):
    status = start(k8s, namespace, "r", maxRestarts=1)
    first = {p.metadata.uid for p in k8s.pods(namespace, "r", "r-0")}
    k8s.exit_pod(namespace, host_pod(k8s, namespace, "r", "r-0", 1).metadata.name, 75)

    k8s.wait(lambda: k8s.status(namespace, "r").get("jobName") == "r-1", "the restart to attempt 1")
    status = k8s.wait_running_gang(namespace, "r", 2)
    assert (status["restarts"], status.get("preemptions", 0)) == (1, 0)
    assert status["coordinatorAddress"] == "r-1-0.r:8476"
    assert not first & {p.metadata.uid for p in k8s.pods(namespace, "r", "r-1")}
    k8s.wait(lambda: [j.metadata.name for j in k8s.jobs(namespace, "r")] == ["r-1"], "r-0 gone")
    restarting = k8s.condition(namespace, "r", "Restarting")
    assert (restarting["status"], restarting["reason"]) == ("False", "Recovered")
    k8s.wait_event(namespace, "r", "RetriableFailure")

    k8s.exit_pod(namespace, host_pod(k8s, namespace, "r", "r-1", 0).metadata.name, 137)
    status = k8s.wait_phase(namespace, "r", "Failed")
    failed = k8s.condition(namespace, "r", "Failed")
    assert failed["reason"] == "MaxRestartsExceeded"
    assert "code 137" in failed["message"]
    assert status["restarts"] == 1 and status["completionTime"]
    assert [j.metadata.name for j in k8s.jobs(namespace, "r")] == ["r-1"]


def test_the_permanent_exit_code_fails_the_experiment_at_once(k8s, namespace):
    start(k8s, namespace, "p")
    k8s.exit_pod(namespace, host_pod(k8s, namespace, "p", "p-0", 1).metadata.name, 78)
    status = k8s.wait_phase(namespace, "p", "Failed")
    failed = k8s.condition(namespace, "p", "Failed")
    assert failed["reason"] == "PermanentFailure"
    assert "host 1" in failed["message"] and "code 78" in failed["message"]
    assert status.get("restarts", 0) == 0 and status["completionTime"]
    k8s.wait_event(namespace, "p", "PermanentFailure")
    assert [j.metadata.name for j in k8s.jobs(namespace, "p")] == ["p-0"]


def test_an_evicted_host_restarts_the_gang_without_using_up_restarts(k8s, namespace):
    start(k8s, namespace, "e", maxRestarts=0)
    pod = host_pod(k8s, namespace, "e", "e-0", 0)
    k8s.core.create_namespaced_pod_eviction(
        pod.metadata.name,
        namespace,
        client.V1Eviction(
            metadata=client.V1ObjectMeta(name=pod.metadata.name, namespace=namespace)
        ),
    )
    k8s.wait(lambda: k8s.status(namespace, "e").get("jobName") == "e-1", "a gang restart")
    status = k8s.wait_running_gang(namespace, "e", 2)
    assert (status.get("restarts", 0), status["preemptions"]) == (0, 1)
    k8s.wait_event(namespace, "e", "Preempted")


def test_all_hosts_exiting_0_succeed_and_the_ttl_then_deletes_everything(k8s, namespace):
    start(k8s, namespace, "s", ttlSecondsAfterFinished=2)
    for pod in k8s.running_pods(namespace, "s", "s-0"):
        k8s.exit_pod(namespace, pod.metadata.name, 0)
    status = k8s.wait_phase(namespace, "s", "Succeeded")
    assert status["completionTime"]
    assert k8s.condition(namespace, "s", "Succeeded")["reason"] == "Completed"
    k8s.wait(
        lambda: (
            not k8s.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)["items"]
        ),
        "the TTL to delete the experiment",
    )
    assert_everything_owned_is_gone(k8s, namespace, "s")


def assert_everything_owned_is_gone(k8s, namespace, name):
    def leftovers():
        found = [j.metadata.name for j in k8s.jobs(namespace, name)]
        found += [p.metadata.name for p in k8s.pods(namespace, name)]
        selector = f"evokube.io/experiment={name}"
        for lister in (
            k8s.core.list_namespaced_service,
            k8s.core.list_namespaced_service_account,
            k8s.core.list_namespaced_config_map,
            k8s.rbac.list_namespaced_role,
            k8s.rbac.list_namespaced_role_binding,
        ):
            found += [o.metadata.name for o in lister(namespace, label_selector=selector).items]
        return found

    k8s.wait(lambda: not leftovers(), f"the garbage collector to delete what {name} owned")


def test_deleting_an_experiment_deletes_everything_it_owned(k8s, cluster, namespace):
    start(k8s, namespace, "d")
    cluster.kubectl("delete", "erlx", "d", "-n", namespace, "--wait=true", "--timeout=30s")
    assert_everything_owned_is_gone(k8s, namespace, "d")


def test_suspend_removes_the_gang_and_resume_brings_it_back(k8s, namespace):
    start(k8s, namespace, "z")
    k8s.patch_spec(namespace, "z", {"suspend": True})
    status = k8s.wait_phase(namespace, "z", "Suspended")
    k8s.wait(lambda: not k8s.jobs(namespace, "z") and not k8s.pods(namespace, "z"), "no gang")
    assert "jobName" not in status and status["preemptions"] == 1
    assert k8s.condition(namespace, "z", "Suspended")["status"] == "True"

    k8s.patch_spec(namespace, "z", {"suspend": False})
    status = k8s.wait_running_gang(namespace, "z", 2)
    assert status["jobName"] == "z-1"
    assert k8s.condition(namespace, "z", "Suspended")["reason"] == "Resumed"


def test_created_suspended_then_resumed_without_a_preemption(k8s, namespace):
    k8s.apply(experiment_manifest("q", namespace, accelerator=TWO_CPU_HOSTS, suspend=True))
    k8s.wait_phase(namespace, "q", "Suspended")
    assert k8s.jobs(namespace, "q") == []
    k8s.patch_spec(namespace, "q", {"suspend": False})
    status = k8s.wait_running_gang(namespace, "q", 2)
    assert status["jobName"] == "q-0" and status.get("preemptions", 0) == 0


def test_active_deadline_fails_the_experiment_and_stops_its_hosts(k8s, namespace):
    start(k8s, namespace, "t", activeDeadlineSeconds=3)
    k8s.wait_phase(namespace, "t", "Failed", timeout=20)
    assert k8s.condition(namespace, "t", "Failed")["reason"] == "DeadlineExceeded"
    k8s.wait(lambda: not k8s.running_pods(namespace, "t", "t-0"), "the hosts to stop")


def test_a_killed_operator_adopts_what_exists_and_converges_after_restart(k8s, operator, namespace):
    start(k8s, namespace, "k")
    job_uid = k8s.batch.read_namespaced_job("k-0", namespace).metadata.uid

    operator.kill()
    operator.start()
    k8s.wait(lambda: operator.metric("evokube_operator_experiments", phase="Running") >= 1, "adopt")
    assert k8s.batch.read_namespaced_job("k-0", namespace).metadata.uid == job_uid
    assert (
        operator.metric("evokube_operator_api_requests_total", verb="POST", kind="Job", code="201")
        == 0
    )

    operator.kill()  # and a host fails while no operator runs
    k8s.exit_pod(namespace, host_pod(k8s, namespace, "k", "k-0", 1).metadata.name, 75)
    k8s.wait(
        lambda: any(p.status.phase == "Failed" for p in k8s.pods(namespace, "k", "k-0")),
        "the host to fail",
    )
    operator.start()
    status = k8s.wait(
        lambda: (s := k8s.status(namespace, "k")).get("jobName") == "k-1" and s, "the restart"
    )
    status = k8s.wait_running_gang(namespace, "k", 2)
    assert status["restarts"] == 1
    k8s.wait(lambda: [j.metadata.name for j in k8s.jobs(namespace, "k")] == ["k-1"], "one Job")
    for lister in (
        k8s.core.list_namespaced_service,
        k8s.core.list_namespaced_service_account,
        k8s.rbac.list_namespaced_role,
        k8s.rbac.list_namespaced_role_binding,
    ):
        assert len(lister(namespace, label_selector="evokube.io/experiment=k").items) == 1


def test_the_trainer_token_patches_its_own_status_and_nothing_else(k8s, cluster, namespace):
    start(k8s, namespace, "mine", hosts=1, accelerator={"type": "cpu"})
    start(k8s, namespace, "theirs", hosts=1, accelerator={"type": "cpu"})
    request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[]))
    token = k8s.core.create_namespaced_service_account_token(
        "mine-trainer", namespace, request
    ).status.token
    trainer = cluster.api_client(token)
    try:
        custom = client.CustomObjectsApi(trainer)
        progress = {"status": {"progress": {"generation": 5, "bestFitness": 1.5}}}
        custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, "mine", progress
        )
        own = custom.get_namespaced_custom_object_status(GROUP, VERSION, namespace, PLURAL, "mine")
        assert own["status"]["progress"]["generation"] == 5
        forbidden = [
            lambda: custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, "theirs", progress
            ),
            lambda: custom.patch_namespaced_custom_object(
                GROUP, VERSION, namespace, PLURAL, "mine", {"spec": {"maxRestarts": 9}}
            ),
            lambda: custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL),
        ]
        for attempt in forbidden:
            with pytest.raises(ApiException) as err:
                attempt()
            assert err.value.status == 403
    finally:
        trainer.close()
    # The operator's next status write (a restart) leaves the trainer's progress alone.
    k8s.exit_pod(namespace, host_pod(k8s, namespace, "mine", "mine-0", 0).metadata.name, 75)
    k8s.wait(lambda: k8s.status(namespace, "mine").get("restarts") == 1, "a restart")
    assert k8s.status(namespace, "mine")["progress"] == {"generation": 5, "bestFitness": 1.5}


ODD = [
    # (name, spec, phase it settles in): admitted by the API server, each odd in its own way
    # (what the CRD refuses is in tests/bad_manifests.py)
    ("unschedulable", {"resources": {"requests": {"cpu": "100000"}}}, "Pending"),
    ("nowhere", {"nodeSelector": {"pool": "none"}}, "Pending"),
    ("no-such-priority", {"priorityClassName": "does-not-exist"}, "Failed"),
    ("x" * 52, {}, "Running"),
    ("blink", {"activeDeadlineSeconds": 1}, "Failed"),
    ("too-many-gpus", {"accelerator": {"type": "gpu", "gpu": {"count": 16}}}, "Pending"),
    ("parked", {"suspend": True, "ttlSecondsAfterFinished": 0}, "Suspended"),
]


def test_odd_but_admitted_manifests_never_crash_the_operator(k8s, operator, namespace):
    for name, spec, _ in ODD:
        k8s.apply(experiment_manifest(name, namespace, **spec))
    for name, _, phase in ODD:
        k8s.wait_phase(namespace, name, phase, timeout=30)
    failed = k8s.condition(namespace, "no-such-priority", "Failed")
    assert failed["reason"] == "PodCreationRefused" and "does-not-exist" in failed["message"]
    assert operator.alive()
    assert operator.get("/healthz")[0] == 200
    start(k8s, namespace, "still-fine")  # and it still does its job


def test_metrics_probes_and_no_api_calls_for_a_gang_that_just_runs(k8s, operator, namespace):
    start(k8s, namespace, "m")
    assert operator.get("/healthz")[0] == 200
    assert operator.get("/readyz")[0] == 200
    assert operator.metric("evokube_operator_experiments", phase="Running") >= 1
    reconciles = operator.metric("evokube_operator_reconciles_total", result="success")
    # The leader renews its Lease on its own clock: those requests are not the gang's.
    requests = operator.metric_sum("evokube_operator_api_requests_total", but='kind="Lease"')
    for pod in k8s.running_pods(namespace, "m", "m-0"):  # pod events, nothing to do
        k8s.core.patch_namespaced_pod(
            pod.metadata.name, namespace, {"metadata": {"labels": {"x": "y"}}}
        )
    k8s.wait(
        lambda: (
            operator.metric("evokube_operator_reconciles_total", result="success") >= reconciles + 2
        ),
        "reconciles of the pod events",
    )
    assert (
        operator.metric_sum("evokube_operator_api_requests_total", but='kind="Lease"') == requests
    )
    _, text = operator.get("/metrics")
    for name in (
        "evokube_operator_reconcile_duration_seconds_bucket",
        "evokube_operator_reconcile_errors_total",
        "evokube_operator_gang_restarts_total",
    ):
        assert name in text


def test_the_trainers_progress_patches_wake_no_reconcile(k8s, operator, namespace):
    """Process 0 of every gang patches status.progress every few seconds; none of it is an
    input of the operator's decisions (operator/evokube_operator/handlers.py).

    The counter is the whole operator's, and other tests' experiments may reconcile at any
    time (a requeue, a namespace going): a window with a reconcile is tried again, up to three
    times. Were patches waking reconciles, every window would hold some."""
    start(k8s, namespace, "quiet", hosts=1, accelerator={"type": "cpu"})
    seen = [-1.0]

    def settled() -> bool:  # no reconcile for 2 s
        count = operator.metric_sum("evokube_operator_reconciles_total")
        quiet, seen[0] = count == seen[0], count
        time.sleep(2)
        return quiet

    woken = []
    for attempt in range(3):
        k8s.wait(settled, "the operator to settle")
        before = operator.metric_sum("evokube_operator_reconciles_total")
        for step in range(1, 4):
            k8s.custom.patch_namespaced_custom_object_status(
                GROUP,
                VERSION,
                namespace,
                PLURAL,
                "quiet",
                {"status": {"progress": {"generation": 3 * attempt + step}}},
            )
        time.sleep(3)
        woken.append(operator.metric_sum("evokube_operator_reconciles_total") - before)
        if woken[-1] == 0:
            break
    assert woken[-1] == 0, f"reconciles during each window of 3 progress patches: {woken}"
    generation = 3 * len(woken)
    assert k8s.status(namespace, "quiet")["progress"]["generation"] == generation
