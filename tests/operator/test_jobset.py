"""The JobSet of a multislice experiment (jobset.py): its shape, and the per-pod environment
that jax.distributed and libtpu read, resolved for every pod as the kubelet would."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

import evokube_contract as contract
from evokube_operator import api
from evokube_operator.desired import builders, jobset
from evokube_operator.reading import placement
from evokube_operator.reading.observe import JobView, PodView, gang_pods
from evokube_operator.reading.spec import Experiment, parse_spec
from evokube_operator.rules import success
from evokube_trainer.runtime import manifest
from tests.operator.factories import TPU, experiment

SLICES, HOSTS = 2, 4  # 2 x v5e-16
MULTISLICE = {**TPU, "tpu": {**TPU["tpu"], "slices": SLICES}}


def _build(**overrides):
    exp = experiment(name="demo", accelerator=MULTISLICE, population={"size": 32}, **overrides)
    spec = parse_spec(exp.spec)
    return exp, spec, jobset.jobset(exp, spec, attempt=3)


def _pod_env(js: dict, slice_id: int, host: int) -> dict[str, str]:
    """The container's environment as the kubelet resolves it in pod `host` of slice `slice_id`
    (JobSet's labels and the Job's completion index by the downward API, then `$(VAR)`)."""
    fields = {
        f"metadata.labels['{contract.JOB_INDEX_LABEL}']": str(slice_id),
        f"metadata.annotations['{contract.COMPLETION_INDEX_ANNOTATION}']": str(host),
    }
    template = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    env: dict[str, str] = {}
    for var in template["spec"]["containers"][0]["env"]:
        if "valueFrom" in var:
            env[var["name"]] = fields[var["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[var["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], var["value"])
    return env


def test_one_replicated_job_of_one_indexed_job_per_slice():
    exp, _, js = _build()
    assert (js["apiVersion"], js["kind"]) == ("jobset.x-k8s.io/v1alpha2", "JobSet")
    assert js["metadata"]["name"] == builders.job_name("demo", 3)
    assert js["metadata"]["ownerReferences"] == [builders.owner_reference(exp)]
    [rjob] = js["spec"]["replicatedJobs"]
    assert (rjob["name"], rjob["replicas"]) == ("slice", SLICES)
    job_spec = rjob["template"]["spec"]
    assert job_spec["completionMode"] == "Indexed"
    assert job_spec["completions"] == job_spec["parallelism"] == HOSTS
    assert job_spec["backoffLimit"] == 0
    # The operator restarts the gang itself: a failed slice fails the set.
    assert js["spec"]["failurePolicy"] == {"maxRestarts": 0}
    # Host names under the experiment's own headless Service.
    assert js["spec"]["network"]["subdomain"] == builders.service_name("demo")
    assert js["spec"]["network"]["enableDNSHostnames"] is True
    assert "suspend" not in js["spec"]


def test_the_pod_template_is_the_single_slice_one_but_for_the_environment_and_placement():
    exp, _, js = _build()
    single = parse_spec({**exp.spec, "accelerator": TPU})
    one_slice = builders.job(exp, single, 3)["spec"]["template"]
    many = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    for part in (one_slice, many):
        part["spec"]["containers"][0].pop("env")
        part["spec"].pop("affinity", None)
    assert many == one_slice


def test_each_slice_is_exclusive_by_jobsets_annotation_not_pod_terms():
    js = _build()[2]
    template = js["spec"]["replicatedJobs"][0]["template"]
    assert template["metadata"]["annotations"] == {
        placement.EXCLUSIVE_TOPOLOGY_ANNOTATION: placement.DEFAULT_TOPOLOGY_KEY
    }
    assert "affinity" not in template["spec"]["template"]["spec"]
    _, _, opted_out = _build(placement={"exclusive": False})
    assert "annotations" not in opted_out["spec"]["replicatedJobs"][0]["template"]["metadata"]


@pytest.mark.parametrize("slice_id", range(SLICES))
@pytest.mark.parametrize("host", range(HOSTS))
def test_every_pod_gets_jax_and_megascale_wiring(slice_id, host):
    _, spec, js = _build()
    env = _pod_env(js, slice_id, host)
    service = builders.service_name("demo")
    coordinator = f"demo-3-slice-0-0.{service}"
    assert env[contract.ENV_COORDINATOR] == f"{coordinator}:{spec.coordinator_port}"
    assert env[contract.ENV_NUM_PROCESSES] == str(SLICES * HOSTS)
    assert env[contract.ENV_MEGASCALE_COORDINATOR] == coordinator
    assert env[contract.ENV_MEGASCALE_NUM_SLICES] == str(SLICES)
    assert env[contract.ENV_MEGASCALE_SLICE_ID] == str(slice_id)
    assert env[contract.ENV_MEGASCALE_PORT] == str(contract.MEGASCALE_PORT)
    # libtpu's view of its own slice: the hosts of this slice's Job, in index order.
    assert env[contract.ENV_TPU_WORKER_ID] == str(host)
    assert env[contract.ENV_TPU_WORKER_HOSTNAMES].split(",") == [
        f"demo-3-slice-{slice_id}-{i}.{service}" for i in range(HOSTS)
    ]
    # jax.distributed's process id: every pod of every slice has its own.
    process = contract.global_process_id(
        int(env[contract.ENV_PROCESS_ID]), slice_id, SLICES * HOSTS, SLICES
    )
    assert process == slice_id * HOSTS + host


def test_a_queued_set_is_one_suspended_workload_with_the_queue_on_the_jobset_only():
    _, _, js = _build(queueName="tpu-queue", workloadPriorityClassName="high")
    assert js["spec"]["suspend"] is True
    assert js["metadata"]["labels"][api.KUEUE_QUEUE_LABEL] == "tpu-queue"
    assert js["metadata"]["labels"][api.KUEUE_PRIORITY_LABEL] == "high"
    job_template = js["spec"]["replicatedJobs"][0]["template"]
    assert "labels" not in job_template["metadata"]
    assert "suspend" not in job_template["spec"]


def test_one_slice_keeps_the_single_slice_environment():
    exp = experiment(name="demo", accelerator=TPU, population={"size": 16})
    env = {v["name"]: v for v in builders.trainer_env(exp, parse_spec(exp.spec), 3)}
    assert not any(name.startswith("MEGASCALE_") for name in env)
    assert env[contract.ENV_TPU_WORKER_HOSTNAMES]["value"].startswith("demo-3-0.")
    assert env[contract.ENV_COORDINATOR]["value"].startswith("demo-3-0.")


def test_the_jobset_is_pure():
    assert _build()[2] == _build()[2]


def test_the_gke_example_is_two_v5e_16_slices_of_four_hosts():
    path = Path(__file__).parents[2] / "examples/gke/multislice/tpu-v5e-16x2.yaml"
    document = yaml.safe_load(path.read_text())
    assert manifest.check(document)[1] == []  # `evokube validate`
    exp = Experiment.from_body(
        {**document, "metadata": {**document["metadata"], "namespace": "ml"}}
    )
    spec = parse_spec(exp.spec)
    built = jobset.jobset(exp, spec, 0)
    [rjob] = built["spec"]["replicatedJobs"]
    assert (rjob["replicas"], rjob["template"]["spec"]["completions"]) == (2, 4)
    pod = rjob["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {
        api.TPU_ACCELERATOR_SELECTOR: "tpu-v5-lite-podslice",
        api.TPU_TOPOLOGY_SELECTOR: "4x4",
    }
    assert pod["containers"][0]["resources"]["limits"] == {api.TPU_RESOURCE: 4}


def _jobset_pod(slice_id: int, host: int, phase: str = "Running") -> PodView:
    """A pod as JobSet's controller and the Job controller label it."""
    return PodView.from_body(
        {
            "metadata": {
                "name": f"demo-3-slice-{slice_id}-{host}-abcde",
                "labels": {
                    api.JOBSET_NAME_LABEL: "demo-3",
                    api.JOBSET_UID_LABEL: "set-uid",
                    api.JOB_NAME_LABEL: f"demo-3-slice-{slice_id}",
                    api.JOB_UID_LABEL: f"job-uid-{slice_id}",
                    api.JOB_INDEX_LABEL: str(slice_id),
                    api.LABEL_ATTEMPT: "3",
                },
                "annotations": {api.COMPLETION_INDEX_ANNOTATION: str(host)},
            },
            "status": {"phase": phase},
        }
    )


def test_the_jobset_and_its_pods_read_as_one_gang():
    pod = _jobset_pod(1, 2)
    assert (pod.job_name, pod.job_uid, pod.slice, pod.index) == ("demo-3", "set-uid", 1, 2)
    assert pod.host_key == (1, 2) and pod.host.startswith("slice 1 host 2 ")
    body = {
        "kind": jobset.KIND,
        "metadata": {"name": "demo-3", "uid": "set-uid", "labels": {api.LABEL_ATTEMPT: "3"}},
        "status": {"conditions": [{"type": "Completed", "status": "True"}]},
    }
    view = JobView.from_body(body)
    assert (view.kind, view.complete, view.attempt) == (jobset.KIND, True, 3)
    assert gang_pods(view, [pod]) == [pod]


def test_hosts_of_different_slices_with_one_index_are_different_hosts():
    one_slice = [_jobset_pod(0, host) for host in range(HOSTS)]
    both = one_slice + [_jobset_pod(1, host) for host in range(HOSTS)]
    assert not success.all_running(one_slice, SLICES * HOSTS)
    assert success.all_running(both, SLICES * HOSTS)
    done = [_jobset_pod(s, h, "Succeeded") for s in range(SLICES) for h in range(HOSTS)]
    view = JobView("demo-3", "set-uid", 3, kind=jobset.KIND)
    assert not success.succeeded(view, done[:HOSTS], SLICES * HOSTS)
    assert success.succeeded(view, done, SLICES * HOSTS)
