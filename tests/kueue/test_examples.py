"""docs/kueue.md's steps, as written: examples/kueue/ applied to the test cluster with real Kueue.

The flavors name GKE's TPU and GPU node labels, which the kwok pools of tests/cluster/nodes.yaml
carry, so the 4-host v5e experiment is admitted onto a simulated 4x4 slice.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.cluster

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "kueue"


def test_the_gke_queue_example_admits_the_tpu_experiment(kueue, k8s, cluster, namespace):
    queues = EXAMPLES / "queues.yaml"
    experiment = yaml.safe_load((EXAMPLES / "tpu-experiment.yaml").read_text())
    name = experiment["metadata"]["name"]
    cluster.kubectl("apply", "-n", namespace, "-f", str(queues))
    try:
        cluster.kubectl("apply", "-n", namespace, "-f", str(EXAMPLES / "tpu-experiment.yaml"))
        status = k8s.wait_running_gang(namespace, name, 4, timeout=90)
        assert status["attempt"] == 0 and status.get("preemptions", 0) == 0
        assert k8s.condition(namespace, name, "Queued")["reason"] == "Admitted"
        (job,) = k8s.jobs(namespace, name)
        assert job.metadata.labels["kueue.x-k8s.io/queue-name"] == "research"
        assert job.metadata.labels["kueue.x-k8s.io/priority-class"] == "evokube-sweep"
        selector = job.spec.template.spec.node_selector
        assert selector["cloud.google.com/gke-tpu-accelerator"] == "tpu-v5-lite-podslice"
        assert selector["cloud.google.com/gke-tpu-topology"] == "4x4"
    finally:
        cluster.kubectl("delete", "erlx", name, "-n", namespace, "--ignore-not-found")
        k8s.wait(lambda: not k8s.pods(namespace, name), "the gang to be gone", timeout=60)
        cluster.kubectl(
            "delete", "-n", namespace, "-f", str(queues), "--ignore-not-found", "--timeout=60s"
        )
