"""The API server refuses what the operator creates for an experiment, on the real control plane.

A ResourceQuota (403, may pass), a ValidatingAdmissionPolicy (403 Forbidden, or 422 with its
reason Invalid: refused for good), each ends at once in a phase, a condition and a Warning Event
that name the object and quote the API server (docs/operator.md, "When the API server refuses
an object"); a quota lifted lets the experiment go on by itself.
"""

from __future__ import annotations

import contextlib

import pytest
import yaml
from kubernetes import client

from evokube_operator.cluster.kube import Kube
from evokube_operator.desired import builders
from evokube_operator.reading.spec import Experiment, parse_spec
from evokube_operator.rules.refusal import Refusal
from tests.operator.conftest import (
    apply_quotas,
    experiment_manifest,
    quota_of_none,
    suspended_experiment,
)

pytestmark = pytest.mark.cluster


def no_jobs_quota(k8s, namespace: str) -> None:
    """count/jobs.batch: 0 in `namespace`, counted by the quota controller."""
    apply_quotas(k8s, namespace, [quota_of_none("no-jobs", "count/jobs.batch")])


@contextlib.contextmanager
def refusing_policy(k8s, namespace: str, group: str, resource: str, reason: str | None = None):
    """A ValidatingAdmissionPolicy that refuses every new `resource` in `namespace` (403, or the
    HTTP code of `reason`: Invalid is 422), for as long as the block runs."""
    name = f"refuse-{resource}-{namespace}"[:63]
    validation = {"expression": "false", "message": f"no {resource} in {namespace}"}
    if reason:
        validation["reason"] = reason
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [group],
                        "apiVersions": ["*"],
                        "operations": ["CREATE"],
                        "resources": [resource],
                    }
                ]
            },
            "validations": [validation],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
            },
        },
    }
    k8s.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([policy, binding]))
    try:
        # The API server picks a new policy up within a second or so: wait until it refuses.
        probe = {"metadata": {"generateName": "probe-"}}
        if resource == "services":
            probe["spec"] = {"ports": [{"port": 80}]}
            create = k8s.core.create_namespaced_service
        else:
            probe["spec"] = {
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "c", "image": "busybox"}],
                    }
                }
            }
            create = k8s.batch.create_namespaced_job

        def refused() -> bool:
            try:
                create(namespace, probe, dry_run="All")
            except client.ApiException as err:
                return err.status in (403, 422)
            return False

        k8s.wait(refused, f"the policy {name} to refuse {resource}")
        yield name
    finally:
        k8s.cluster.kubectl("delete", "validatingadmissionpolicybinding", name, check=False)
        k8s.cluster.kubectl("delete", "validatingadmissionpolicy", name, check=False)


def condition(k8s, namespace, name, kind):
    found = k8s.condition(namespace, name, kind)
    return (found["status"], found["reason"], found["message"]) if found else None


def test_a_job_quota_blocks_with_the_cause_then_the_experiment_runs_once_it_is_lifted(
    k8s, namespace
):
    no_jobs_quota(k8s, namespace)
    k8s.apply(experiment_manifest("quota", namespace))

    def blocked():
        found = condition(k8s, namespace, "quota", "Blocked")
        return found if found and found[:2] == ("True", "CreationFailing") else None

    _, _, message = k8s.wait(blocked, "quota to be Blocked (CreationFailing)")
    assert message.startswith("the API server refused Job quota-0: "), message
    assert "exceeded quota: no-jobs" in message and "count/jobs.batch" in message
    assert k8s.status(namespace, "quota")["phase"] == "Pending"
    k8s.wait_event(namespace, "quota", "CreationFailing")
    assert not k8s.jobs(namespace, "quota")

    k8s.core.delete_namespaced_resource_quota("no-jobs", namespace)
    k8s.wait_running_gang(namespace, "quota", 1, timeout=90)
    status, reason, _ = condition(k8s, namespace, "quota", "Blocked")
    assert (status, reason) == ("False", "Unblocked")
    k8s.wait_event(namespace, "quota", "Unblocked")
    # Told once, however many times it was tried again.
    assert k8s.events(namespace, "quota").count("CreationFailing") == 1


@pytest.mark.parametrize(
    ("group", "resource", "reason", "refused"),
    [
        ("batch", "jobs", None, "Job policy-0"),  # 403 Forbidden
        ("", "services", "Invalid", "Service policy"),  # 422 Unprocessable Entity
    ],
    ids=["job-403", "service-422"],
)
def test_an_admission_policy_refusal_fails_the_experiment_naming_the_object(
    k8s, namespace, group, resource, reason, refused
):
    with refusing_policy(k8s, namespace, group, resource, reason) as policy:
        k8s.apply(experiment_manifest("policy", namespace))
        k8s.wait_phase(namespace, "policy", "Failed")
    status, found, message = condition(k8s, namespace, "policy", "Failed")
    assert (status, found) == ("True", "CreationRefused")
    assert message.startswith(f"the API server refused {refused}: "), message
    assert f"ValidatingAdmissionPolicy '{policy}'" in message
    assert f"no {resource} in {namespace}" in message
    k8s.wait_event(namespace, "policy", "CreationRefused")
    assert not k8s.jobs(namespace, "policy")


def test_equal_ports_are_refused_at_admission_naming_the_field(k8s, namespace):
    manifest = experiment_manifest("ports", namespace, metricsPort=8476)  # the coordinator's
    run = k8s.apply(manifest, check=False)
    assert run.returncode != 0 and "spec.metricsPort" in run.stderr, run.stderr
    assert "must differ from coordinatorPort" in run.stderr


def test_a_dry_run_writes_nothing_and_a_refusal_names_the_object(k8s, namespace):
    """kube.Kube.create_owned(dry_run=True), as the operator tries a Blocked Job again."""
    exp = Experiment.from_body(suspended_experiment(k8s, namespace, "dry"))  # no Job of its own
    job = builders.job(exp, parse_spec(exp.spec), 0)
    kube = Kube(k8s.cluster.api_client())
    try:
        _, created = kube.create_owned(job, exp.uid, update=False, dry_run=True)
        assert created and not k8s.jobs(namespace, "dry")
        no_jobs_quota(k8s, namespace)
        with pytest.raises(Refusal) as refused:
            kube.create_owned(job, exp.uid, update=False, dry_run=True)
        assert (refused.value.kind, refused.value.name, refused.value.code) == ("Job", "dry-0", 403)
        assert not refused.value.final
        assert "exceeded quota: no-jobs" in refused.value.message
    finally:
        kube.close()
