"""The operator under the real Kueue: queued experiments, admission, preemption, waitForPodsReady.

Each trainer pod asks for 1 CPU (`spec.resources`); a 2-host gang needs 2 CPUs of the
ClusterQueue's "cpu" flavor. Pods are kwok's: the tests end them with exit codes
(tests/cluster/kwok-stages.yaml); real trainers that checkpoint on SIGTERM and resume
are the e2e scenario's part (tests/e2e).
"""

from __future__ import annotations

import pytest

from tests.cluster.kueue import KueueSettings, WaitForPodsReady
from tests.kueue.helpers import NODE_POOLS, QUEUE_LABEL
from tests.operator.conftest import experiment_manifest

pytestmark = pytest.mark.cluster

TWO_CPU_HOSTS = {"type": "cpu", "hosts": 2}
ONE_CPU_EACH = {"requests": {"cpu": "1"}}


def queued(name: str, namespace: str, queue: str, **spec) -> dict:
    return experiment_manifest(
        name, namespace, accelerator=TWO_CPU_HOSTS, resources=ONE_CPU_EACH, queueName=queue, **spec
    )


def finish(k8s, namespace: str, name: str, job: str) -> None:
    for pod in k8s.running_pods(namespace, name, job):
        k8s.exit_pod(namespace, pod.metadata.name, 0)
    k8s.wait_phase(namespace, name, "Succeeded")


def queue_column(k8s, namespace: str, name: str) -> str:
    """The QUEUE column of `kubectl get erlx` (the last one: every column before has a value)."""
    header, row = k8s.cluster.kubectl("get", "erlx", name, "-n", namespace).stdout.splitlines()
    return row[header.index("QUEUE") :].strip()


def test_two_gangs_fit_the_quota_the_third_is_queued_with_kueues_reason_then_runs(
    kueue, kueue_objects, k8s, namespace
):
    queue = kueue_objects.queue({"cpu": {"cpu": 4}})
    for name in ("a", "b"):
        k8s.apply(queued(name, namespace, queue))
        k8s.wait_running_gang(namespace, name, 2)
    k8s.apply(queued("c", namespace, queue))
    status = k8s.wait_phase(namespace, "c", "Queued")
    condition = k8s.condition(namespace, "c", "Queued")
    assert condition["status"] == "True", condition
    k8s.wait(
        lambda: "insufficient unused quota" in k8s.condition(namespace, "c", "Queued")["message"],
        "Kueue's reason in the Queued condition",
    )
    assert "insufficient unused quota" in queue_column(k8s, namespace, "c")
    (job,) = k8s.jobs(namespace, "c")
    assert job.spec.suspend and job.metadata.labels[QUEUE_LABEL] == queue
    assert k8s.pods(namespace, "c") == []
    assert status["jobName"] == "c-0"

    finish(k8s, namespace, "a", "a-0")
    status = k8s.wait_running_gang(namespace, "c", 2, timeout=60)
    assert (status["jobName"], status.get("restarts", 0), status.get("preemptions", 0)) == (
        "c-0",
        0,
        0,
    )
    admitted = k8s.condition(namespace, "c", "Queued")
    assert (admitted["status"], admitted["reason"]) == ("False", "Admitted")
    # Kueue's flavor put its node labels into the pods' selector; the operator left them.
    (job,) = k8s.jobs(namespace, "c")
    selector = job.spec.template.spec.node_selector or {}
    assert NODE_POOLS["cpu"]["labels"].items() <= selector.items(), selector
    assert not job.spec.suspend
    k8s.wait_event(namespace, "c", "Admitted")


def test_a_higher_priority_experiment_preempts_a_running_one_which_resumes_on_its_job(
    kueue, kueue_objects, k8s, namespace
):
    low = kueue_objects.priority_class(10)
    high = kueue_objects.priority_class(1000)
    queue = kueue_objects.queue(
        {"cpu": {"cpu": 2}}, preemption={"withinClusterQueue": "LowerPriority"}
    )
    k8s.apply(queued("low", namespace, queue, workloadPriorityClassName=low))
    k8s.wait_running_gang(namespace, "low", 2)
    k8s.apply(queued("high", namespace, queue, workloadPriorityClassName=high))

    status = k8s.wait(
        lambda: (s := k8s.status(namespace, "low")).get("preemptions") == 1 and s,
        "Kueue to evict the low-priority gang",
        timeout=60,
    )
    assert status["phase"] == "Queued" and status.get("restarts", 0) == 0, status
    assert (status["jobName"], status["attempt"]) == ("low-0", 0)
    k8s.wait_event(namespace, "low", "Evicted")
    (job,) = k8s.jobs(namespace, "low")
    assert job.spec.suspend  # Kueue's doing; the operator never unsuspends it
    k8s.wait_running_gang(namespace, "high", 2, timeout=60)

    finish(k8s, namespace, "high", "high-0")
    status = k8s.wait_running_gang(namespace, "low", 2, timeout=60)
    assert (status["jobName"], status["attempt"], status.get("restarts", 0)) == ("low-0", 0, 0)
    assert status["preemptions"] == 1
    assert [j.metadata.name for j in k8s.jobs(namespace, "low")] == ["low-0"]
    finish(k8s, namespace, "low", "low-0")


@pytest.mark.parametrize(
    "kueue_settings",
    [KueueSettings(wait_for_pods_ready=WaitForPodsReady(timeout="30s", block_admission=True))],
)
def test_wait_for_pods_ready_admits_a_whole_multi_host_gang(kueue, kueue_objects, k8s, namespace):
    """All-or-nothing: the 2-host gang is admitted as one Workload, and its pods become Ready
    together; a second gang waits (blockAdmission) until the first is ready."""
    queue = kueue_objects.queue({"cpu": {"cpu": 4}})
    k8s.apply(queued("first", namespace, queue))
    k8s.apply(queued("second", namespace, queue))
    for name in ("first", "second"):
        status = k8s.wait_running_gang(namespace, name, 2, timeout=60)
        assert status.get("preemptions", 0) == 0 and status.get("restarts", 0) == 0
    for name in ("first", "second"):
        finish(k8s, namespace, name, f"{name}-0")


@pytest.mark.parametrize(
    "kueue_settings",
    [KueueSettings(wait_for_pods_ready=WaitForPodsReady(timeout="5s", block_admission=True))],
)
def test_a_gang_whose_pods_never_get_ready_is_evicted_and_counted_as_preempted(
    kueue, kueue_objects, k8s, namespace
):
    queue = kueue_objects.queue({"cpu": {"cpu": 4}})
    k8s.apply(queued("stuck", namespace, queue, image="registry.local/evokube/unpullable:1"))
    status = k8s.wait(
        lambda: (s := k8s.status(namespace, "stuck")).get("preemptions", 0) >= 1 and s,
        "Kueue to evict the gang whose pods never became ready",
        timeout=90,
    )
    assert status.get("restarts", 0) == 0 and status["jobName"] == "stuck-0", status
    k8s.wait_event(namespace, "stuck", "Evicted")


def test_without_kueue_a_queue_name_says_what_to_check(k8s, namespace):
    """No Workload ever appears (no Kueue in this test, or a LocalQueue that does not exist):
    the experiment says so instead of waiting in silence."""
    k8s.apply(queued("lonely", namespace, "no-such-queue"))
    k8s.wait_phase(namespace, "lonely", "Queued")
    condition = k8s.condition(namespace, "lonely", "Queued")
    assert condition["status"] == "True"
    assert condition["reason"] in ("NoWorkload", "Pending", "Inadmissible"), condition
