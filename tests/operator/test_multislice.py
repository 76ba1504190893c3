"""A multislice experiment and the operator, on the real control plane (no JobSet controller).

Without the JobSet CRD the experiment is Blocked, naming why; once the CRD (from the Go module
cache, the version the JobSet tests build) is installed, the operator creates the JobSet that
jobset.jobset() builds, status shows the slices, and the JobSet's own status (written here, as
JobSet's controller would) decides the phase, as a Job's does.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from evokube_operator import api
from evokube_operator.cluster.kube import Kube
from evokube_operator.desired import builders, jobset
from evokube_operator.handlers import SERVED_CHECK_SECONDS
from evokube_operator.plans.decide import BLOCKED_REQUEUE_SECONDS
from evokube_operator.reading.spec import Experiment, parse_spec
from tests.helm.chart import trainer_token_mode
from tests.operator.conftest import experiment_manifest

pytestmark = pytest.mark.cluster

JOBSET_VERSION = "v0.11.1"
JOBSET_CRD_NAME = f"{jobset.PLURAL}.{jobset.GROUP}"
TPU = {
    "type": "tpu",
    "tpu": {"type": "tpu-v5-lite-podslice", "topology": "4x4", "slices": 2},
}


def jobset_crd() -> Path:
    """JobSet's CRD as the Go module cache holds it (`go mod download` of the JobSet tests)."""
    cache = subprocess.run(
        ["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True
    ).stdout.strip()
    module = Path(cache) / f"sigs.k8s.io/jobset@{JOBSET_VERSION}"
    return module / "config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml"


def served(k8s) -> bool:
    """The operator's own discovery call (kube.Kube.serves)."""
    return Kube(k8s.api_client, parallel_writes=1).serves(jobset.KIND)


def restart_operator(k8s) -> None:
    """The operator's watches are those the cluster served when it started (handlers.py);
    it stops itself when that changes, so a fixture that changes it starts a new one."""
    k8s.operator.stop()
    k8s.operator.start()


@pytest.fixture
def no_jobset_crd(k8s):
    """The JobSet CRD absent for the test's start, and an operator started without it; the
    session's state put back after it."""
    had = served(k8s)
    k8s.cluster.kubectl("delete", "crd", JOBSET_CRD_NAME, "--ignore-not-found", "--wait")
    k8s.wait(lambda: not served(k8s), "jobset.x-k8s.io no longer served")
    restart_operator(k8s)
    yield
    installed = served(k8s)
    if had and not installed:
        install_jobset_crd(k8s)
    if not had and installed:
        k8s.cluster.kubectl("delete", "crd", JOBSET_CRD_NAME, "--wait")
        k8s.wait(lambda: not served(k8s), "jobset.x-k8s.io no longer served")
    # The later tests' operator watches what is served again (JobSet gone or back).
    restart_operator(k8s)


def install_jobset_crd(k8s) -> None:
    k8s.cluster.kubectl("apply", "--server-side", "-f", str(jobset_crd()))
    k8s.wait(lambda: served(k8s), "jobset.x-k8s.io served", timeout=60)


def get_jobset(k8s, namespace: str, name: str) -> dict | None:
    try:
        return k8s.custom.get_namespaced_custom_object(
            jobset.GROUP, jobset.VERSION, namespace, jobset.PLURAL, name
        )
    except ApiException as err:
        if err.status == 404:
            return None
        raise


def test_a_multislice_experiment_waits_for_jobset_then_runs_as_one(k8s, namespace, no_jobset_crd):
    manifest = experiment_manifest("ms", namespace, accelerator=TPU, population={"size": 32})
    k8s.apply(manifest)
    blocked = k8s.wait(
        lambda: (
            (c := k8s.condition(namespace, "ms", api.COND_BLOCKED)) and c["status"] == "True" and c
        ),
        "Blocked",
    )
    assert blocked["reason"] == api.REASON_JOBSET_NOT_SERVED
    assert "spec.accelerator.tpu.slices is 2" in blocked["message"]
    assert "JobSet" in blocked["message"]
    assert k8s.status(namespace, "ms")["phase"] == api.PENDING
    k8s.wait_event(namespace, "ms", api.REASON_JOBSET_NOT_SERVED)
    assert not k8s.jobs(namespace, "ms")  # never a Job in its place

    # Installed while the operator runs: it notices within SERVED_CHECK_SECONDS and starts
    # its watches again in the same process (Kopf's own rescan misses a CRD that discovery
    # lists late), then creates the JobSet: nobody restarts anything.
    pid = k8s.operator.proc.pid
    install_jobset_crd(k8s)
    created = k8s.wait(
        lambda: get_jobset(k8s, namespace, "ms-0"),
        "JobSet ms-0",
        timeout=SERVED_CHECK_SECONDS + BLOCKED_REQUEUE_SECONDS + 30,
    )
    assert k8s.operator.alive() and k8s.operator.proc.pid == pid  # the same process
    assert "JobSet is now served: starting the watches again" in k8s.operator.log_path.read_text()
    body = k8s.experiment(namespace, "ms")
    exp = Experiment.from_body(body)
    expected = jobset.jobset(exp, parse_spec(exp.spec), 0)
    assert created["metadata"]["ownerReferences"] == expected["metadata"]["ownerReferences"]
    [rjob] = created["spec"]["replicatedJobs"]
    [want] = expected["spec"]["replicatedJobs"]
    assert (rjob["name"], rjob["replicas"]) == ("slice", 2)
    assert rjob["template"]["metadata"] == want["template"]["metadata"]
    pod = rjob["template"]["spec"]["template"]["spec"]
    assert pod["containers"][0]["env"] == builders.trainer_env(exp, parse_spec(exp.spec), 0)
    assert created["spec"]["failurePolicy"]["maxRestarts"] == 0
    status = k8s.status(namespace, "ms")
    assert (status["hosts"], status["slices"], status["jobName"]) == (8, 2, "ms-0")
    assert status["coordinatorAddress"] == builders.coordinator_address("ms", 0, 8476, 2)
    assert k8s.condition(namespace, "ms", api.COND_BLOCKED)["status"] == "False"
    assert not k8s.jobs(namespace, "ms")

    # JobSet's controller would write this once every slice's Job completed.
    done = {
        "type": "Completed",
        "status": "True",
        "reason": "AllJobsCompleted",
        "message": "jobset completed successfully",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    k8s.custom.patch_namespaced_custom_object_status(
        jobset.GROUP,
        jobset.VERSION,
        namespace,
        jobset.PLURAL,
        "ms-0",
        {"status": {"conditions": [done], "restarts": 0}},
    )
    k8s.wait_phase(namespace, "ms", api.SUCCEEDED)


@pytest.mark.parametrize(("slice_id", "holds_token"), [(0, True), (1, False)])
def test_only_host_0_of_slice_0_gets_the_trainer_token(
    k8s, cluster, namespace, slice_id, holds_token
):
    """The chart's MutatingAdmissionPolicy, on a pod as JobSet's controller labels it (host 0
    of each slice has completion index 0); where no such policy is served, the ValidatingAdmission
    Policy names host 0 of Job <jobName>-slice-0 instead (helm/evokube/templates/admission.yaml)."""
    if trainer_token_mode(cluster) != api.TOKEN_HOST_0:
        pytest.skip("this Kubernetes serves no MutatingAdmissionPolicy (before 1.36)")
    exp = Experiment.from_body(
        experiment_manifest("ms", namespace, accelerator=TPU, population={"size": 32})
        | {"metadata": {"name": "ms", "namespace": namespace, "uid": "u"}}
    )
    template = jobset.jobset(exp, parse_spec(exp.spec), 0)["spec"]["replicatedJobs"][0]
    pod_template = template["template"]["spec"]["template"]
    metadata = pod_template["metadata"]
    metadata["labels"] |= {
        api.JOB_INDEX_LABEL: str(slice_id),
        api.COMPLETION_INDEX_ANNOTATION: "0",  # also a label of an Indexed Job's pods
    }
    metadata.setdefault("annotations", {})[api.COMPLETION_INDEX_ANNOTATION] = "0"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**metadata, "name": f"ms-0-slice-{slice_id}-0-abcde", "namespace": namespace},
        # The experiment's own account is the operator's to create; the policy looks at labels.
        "spec": {**pod_template["spec"], "serviceAccountName": "default"},
    }
    created = json.loads(
        k8s.cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(pod)).stdout
    )
    names = {v["name"] for v in created["spec"]["volumes"]}
    k8s.core.delete_namespaced_pod(pod["metadata"]["name"], namespace, grace_period_seconds=0)
    assert ("evokube-api-access" in names) is holds_token
