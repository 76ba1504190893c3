"""The real JobSet controller (sigs.k8s.io/jobset) on a test control plane.

build.sh builds JobSet's manager (main.go at the module root) from the Go module
proxy and keeps, beside it, the module's CRD and webhook manifests. `JobSet`
runs it as webhook_manager.py runs any such manager: the CRD, the webhooks on
loopback with a CA of this run, internal certificate management off. All four
webhooks are registered: the JobSet defaulting and validation, and the pod
webhooks that make exclusive placement work (the mutating one pins a follower
pod to its leader's topology domain, the validating one holds followers back
until the leader is scheduled). Both pod webhooks select only pods with the
`jobset.sigs.k8s.io/jobset-name` label, so no other test's pods pass them.

Unlike Kueue, JobSet takes its metrics certificate directory from its
configuration: it serves the same certificate, nothing under /etc.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from tests.cluster.webhook_manager import WebhookManager, component_folder

GROUP = "jobset.x-k8s.io"
API_VERSION = f"{GROUP}/v1alpha2"
# The annotation that gives each replicated Job a topology domain (a node pool) of its own.
EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"


def jobset_folder() -> Path:
    """Build JobSet (a no-op when cached) and return its cache folder."""
    return component_folder("jobset")


@dataclass
class JobSet(WebhookManager):
    """One JobSet manager process on a started control plane."""

    component: ClassVar[str] = "jobset"
    webhook_names: ClassVar[dict[str, str]] = {
        "MutatingWebhookConfiguration": "jobset-mutating-webhook-configuration",
        "ValidatingWebhookConfiguration": "jobset-validating-webhook-configuration",
    }

    def configuration(self) -> dict[str, Any]:
        """JobSet's Configuration (config.jobset.x-k8s.io/v1alpha1) for this run."""
        return {
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {
                "bindAddress": f"127.0.0.1:{self.metrics_port}",
                "certDir": str(self.serving_certs),
            },
            "webhook": {
                "host": "127.0.0.1",
                "port": self.webhook_port,
                "certDir": str(self.serving_certs),
            },
            "clientConnection": {"qps": 50, "burst": 100},
        }

    def webhooks_answer(self) -> bool:
        """A dry-run JobSet comes back defaulted by JobSet's mutating webhook (the pod
        restart policy, which the CRD's schema does not default)."""
        probe = jobset_manifest("jobset-probe", {"r": pod_spec({})}, parallelism=1)
        probe["metadata"]["namespace"] = "default"
        got = self.dry_run(probe)
        if got is None:
            return False
        pod = got["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        return pod.get("restartPolicy") == "OnFailure"


def pod_spec(requests: dict[str, str], image: str = "registry.local/evokube/sleep:1") -> dict:
    """One container asking for `requests` (its limits equal them, as extended
    resources such as google.com/tpu require), tolerating every NoSchedule taint
    of the kwok pools."""
    return {
        "containers": [
            {
                "name": "main",
                "image": image,
                "resources": {"requests": dict(requests), "limits": dict(requests)},
            }
        ],
        "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}],
    }


def jobset_manifest(
    name: str,
    replicated: dict[str, dict],
    parallelism: int,
    replicas: int = 1,
    annotations: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
) -> dict:
    """A JobSet whose replicated Jobs (name -> pod spec), `replicas` each, are Indexed
    Jobs of `parallelism` pods that all run at once."""
    return {
        "apiVersion": API_VERSION,
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "annotations": dict(annotations or {}),
            "labels": dict(labels or {}),
        },
        "spec": {
            "replicatedJobs": [
                {
                    "name": job,
                    "replicas": replicas,
                    "template": {
                        "spec": {
                            "parallelism": parallelism,
                            "completions": parallelism,
                            "completionMode": "Indexed",
                            "backoffLimit": 0,
                            "template": {"spec": spec},
                        }
                    },
                }
                for job, spec in replicated.items()
            ]
        },
    }
