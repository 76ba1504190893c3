"""The JobSet of a multislice gang (spec.accelerator.tpu.slices > 1), a pure function like
builders.py, whose pod template and Indexed Job it reuses.

One replicated Job, SLICE_JOB, of `slices` Indexed Jobs of `hosts` pods: JobSet's controller
(kubernetes-sigs/jobset v0.11.1) creates `<jobset>-slice-<s>` and labels each Job's pods with
its index `s` (jobset.sigs.k8s.io/job-index), the trainer's MEGASCALE_SLICE_ID. Pods keep the
single-slice host names, under the experiment's own headless Service (network.subdomain), as
`<jobset>-slice-<s>-<host>.<service>`. Decisions (docs/multislice.md):

- restarts stay the operator's: failurePolicy.maxRestarts 0, so a slice's failed Job fails the
  set, and the operator reads why (exit 78, a disruption, a crash) and starts the next attempt,
  a new JobSet, counted or not against spec.maxRestarts exactly as a single slice's Job;
- each slice has a node pool to itself by JobSet's exclusive-topology annotation, whose webhook
  pins a Job's pods to one value of the topology key and keeps other Jobs off it;
- Kueue admits the set as one workload: the queue labels go on the JobSet, created suspended,
  never on its Jobs.
"""

from __future__ import annotations

from typing import Any, Final

from evokube_operator import api
from evokube_operator.desired import builders
from evokube_operator.reading import placement
from evokube_operator.reading.spec import Experiment, ExperimentSpec

GROUP: Final = "jobset.x-k8s.io"
VERSION: Final = "v1alpha2"
PLURAL: Final = "jobsets"
KIND: Final = "JobSet"


def jobset(
    exp: Experiment,
    spec: ExperimentSpec,
    attempt: int,
    active_deadline_seconds: int | None = None,
    trainer_token: str = api.TOKEN_HOST_0,
) -> dict[str, Any]:
    """The JobSet of one gang attempt over `spec.accelerator.slices` slices."""
    template = builders.pod_template(exp, spec, attempt, trainer_token)
    # No labels of ours on the slices' Jobs: the operator watches the JobSet as the gang's Job.
    job_meta: dict[str, Any] = {}
    if spec.exclusive_topology_key:
        job_meta["annotations"] = {
            placement.EXCLUSIVE_TOPOLOGY_ANNOTATION: spec.exclusive_topology_key
        }
    body: dict[str, Any] = {
        "replicatedJobs": [
            {
                "name": builders.SLICE_JOB,
                "replicas": spec.accelerator.slices,
                "template": {
                    "metadata": job_meta,
                    "spec": builders.indexed_job_spec(spec, template, active_deadline_seconds),
                },
            }
        ],
        # The operator's Service, which also selects these pods: JobSet creates none of its own.
        "network": {
            "enableDNSHostnames": True,
            "subdomain": builders.service_name(exp.name),
            "publishNotReadyAddresses": True,
        },
        "failurePolicy": {"maxRestarts": 0},
    }
    if spec.queue_name:  # Kueue admits (unsuspends) the whole set when every slice fits
        body["suspend"] = True
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": builders.gang_metadata(exp, spec, attempt),
        "spec": body,
    }
