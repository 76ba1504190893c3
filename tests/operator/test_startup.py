"""Pods that cannot be created or cannot start, on the real control plane.

The API server's admission (PodSecurity, Priority, ResourceQuota) refuses the
pods and the Job controller says so in FailedCreate events; kwok plays a
kubelet that cannot pull "unpullable" images nor parse over-long image names
(tests/cluster/kwok-stages.yaml); the real scheduler finds no node for a
nodeSelector nobody has. Each ends in Failed or Blocked, with the cause.
"""

import pytest

from tests.operator.conftest import (
    apply_quotas,
    experiment_manifest,
    quota_of_none,
    stand_in,
)

pytestmark = pytest.mark.cluster

TPU = {"type": "tpu", "tpu": {"type": "tpu-v5-lite-podslice", "topology": "4x4"}}
IMAGE_PULL_TIMEOUT = 8
UNSCHEDULABLE_TIMEOUT = 2


@pytest.fixture
def impatient(cluster, api, operator, operator_kubeconfig, namespace):
    """The session's operator pauses; one with short start-up timeouts takes its place."""
    with stand_in(
        cluster,
        api,
        operator,
        operator_kubeconfig,
        namespace,
        "startup",
        f"--image-pull-timeout-seconds={IMAGE_PULL_TIMEOUT}",
        f"--unschedulable-timeout-seconds={UNSCHEDULABLE_TIMEOUT}",
    ) as k8s:
        yield k8s


def condition(k8s, namespace, name, kind):
    found = k8s.condition(namespace, name, kind)
    return (found["status"], found["reason"], found["message"]) if found else None


def wait_blocked(k8s, namespace, name, reason, timeout=30):
    def blocked():
        found = condition(k8s, namespace, name, "Blocked")
        return found if found and found[:2] == ("True", reason) else None

    return k8s.wait(blocked, f"{namespace}/{name} to be Blocked ({reason})", timeout)


def assert_failed_and_stopped(k8s, namespace, name, reason, timeout=30):
    """Phase Failed for `reason`, a Warning Event of it, and no Job left: returns the message."""
    k8s.wait_phase(namespace, name, "Failed", timeout)
    status, found, message = condition(k8s, namespace, name, "Failed")
    assert (status, found) == ("True", reason)
    k8s.wait_event(namespace, name, reason)
    k8s.wait(lambda: not k8s.jobs(namespace, name), f"the Jobs of {name} to be deleted")
    return message


def test_pods_that_violate_pod_security_fail_the_experiment(k8s, namespace):
    # TPU pods keep the image's user, root: "baseline", not "restricted" (builders.py).
    k8s.core.patch_namespace(
        namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    )
    k8s.apply(experiment_manifest("tpu", namespace, accelerator=TPU))
    message = assert_failed_and_stopped(k8s, namespace, "tpu", "PodCreationRefused")
    assert "the trainer pods cannot be created" in message
    assert 'violates PodSecurity "restricted:latest"' in message
    assert not k8s.pods(namespace, "tpu")


def test_a_missing_priority_class_fails_the_experiment(k8s, namespace):
    k8s.apply(experiment_manifest("prio", namespace, priorityClassName="no-such-class"))
    message = assert_failed_and_stopped(k8s, namespace, "prio", "PodCreationRefused")
    assert "no PriorityClass with name no-such-class was found" in message


def test_a_pod_quota_blocks_the_experiment_until_it_is_lifted(k8s, namespace):
    apply_quotas(k8s, namespace, [quota_of_none("no-pods", "pods")])
    k8s.apply(experiment_manifest("quota", namespace))
    _, _, message = wait_blocked(k8s, namespace, "quota", "PodCreationFailing")
    assert "exceeded quota: no-pods" in message
    assert k8s.status(namespace, "quota")["phase"] == "Pending"
    k8s.wait_event(namespace, "quota", "PodCreationFailing")

    k8s.core.delete_namespaced_resource_quota("no-pods", namespace)
    k8s.wait_running_gang(namespace, "quota", 1, timeout=90)
    status, reason, _ = condition(k8s, namespace, "quota", "Blocked")
    assert (status, reason) == ("False", "Unblocked")
    k8s.wait_event(namespace, "quota", "Unblocked")


def test_an_invalid_image_name_fails_the_experiment(k8s, namespace):
    # A valid reference by the CRD's pattern, but a name over 255 characters: the kubelet
    # cannot parse it (InvalidImageName).
    image = "ghcr.io/evokube/" + "a" * 250 + ":0.1.0"
    k8s.apply(experiment_manifest("image", namespace, image=image))
    message = assert_failed_and_stopped(k8s, namespace, "image", "InvalidImage")
    assert message.startswith("host 0 (pod image-0-0-")
    assert "must not be more than 255 characters" in message


def test_an_image_that_never_pulls_blocks_then_fails_after_the_timeout(impatient, namespace):
    k8s = impatient
    k8s.apply(experiment_manifest("pull", namespace, image="ghcr.io/evokube/unpullable:0.1.0"))
    _, _, message = wait_blocked(k8s, namespace, "pull", "ImagePullBackOff")
    assert 'Back-off pulling image "ghcr.io/evokube/unpullable:0.1.0"' in message
    assert k8s.status(namespace, "pull")["phase"] == "Pending"
    message = assert_failed_and_stopped(
        k8s, namespace, "pull", "ImagePullBackOff", timeout=IMAGE_PULL_TIMEOUT + 20
    )
    assert f"no image after {IMAGE_PULL_TIMEOUT}s" in message


def test_an_unschedulable_gang_is_blocked_after_the_timeout_then_runs_once_it_fits(
    impatient, namespace
):
    k8s = impatient
    label = "evokube.test/startup-pool"
    k8s.apply(experiment_manifest("nowhere", namespace, nodeSelector={label: namespace}))
    _, _, message = wait_blocked(k8s, namespace, "nowhere", "Unschedulable")
    assert message.startswith("host 0 (pod nowhere-0-0-")
    assert "didn't match Pod's node affinity/selector" in message
    assert k8s.status(namespace, "nowhere")["phase"] == "Pending"
    k8s.wait_event(namespace, "nowhere", "Unschedulable")

    node = k8s.core.list_node(label_selector="cloud.google.com/gke-nodepool=cpu").items[0]
    name = node.metadata.name
    k8s.core.patch_node(name, {"metadata": {"labels": {label: namespace}}})
    try:
        k8s.wait_running_gang(namespace, "nowhere", 1, timeout=60)
        status, reason, _ = condition(k8s, namespace, "nowhere", "Blocked")
        assert (status, reason) == ("False", "Unblocked")
    finally:
        k8s.core.patch_node(name, {"metadata": {"labels": {label: None}}})
