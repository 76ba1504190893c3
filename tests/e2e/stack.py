"""The whole system on one machine: control plane, pod runner, the Helm chart's operator.

`Stack.up()` starts a test control plane of its own (kwok keeps its fake
pools), starts a `PodRunner` for the pool `local`, and `helm install`s
helm/evokube with the operator's pod placed on that pool, so the chart's own
Deployment runs the operator under the chart's ServiceAccount. Experiments
placed on the same pool (tests/e2e/experiment.yaml) run real trainer processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from evokube_operator import api as operator_api
from tests.cluster.controlplane import NODE_POOL_LABEL, ControlPlane, wait_until
from tests.cluster.jobset import JobSet
from tests.e2e.podrunner import PodRunner, local_process

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "evokube"
EXPERIMENT = Path(__file__).with_name("experiment.yaml")
RELEASE, RELEASE_NAMESPACE = "evokube", "evokube-system"
OPERATOR_SELECTOR = f"app.kubernetes.io/name=evokube-operator,app.kubernetes.io/instance={RELEASE}"
CHECKPOINT_CLAIM = "checkpoints"  # experiment.yaml's checkpoint.volumeClaimName
GROUP, VERSION, PLURAL = "evokube.io", "v1alpha1", "erlexperiments"
COMPLETION_INDEX = operator_api.COMPLETION_INDEX_ANNOTATION
# The TPU slices `add_tpu_slices` gives the runner: v5e hosts of 4 chips in a 2x4 topology,
# which no kwok pool has, so that a multislice experiment's pods run here only.
TPU_TYPE, TPU_TOPOLOGY, TPU_CHIPS = "tpu-v5-lite-podslice", "2x4", 4

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class Stack:
    def __init__(self, workdir: Path, jobset: bool = False):
        self.workdir = Path(workdir).resolve()
        self.with_jobset = jobset
        self.cluster = ControlPlane(self.workdir / "cluster")
        self.runner: PodRunner | None = None
        self.jobset: JobSet | None = None  # JobSet's controller, with `jobset`
        self.tpu_pools: tuple[str, ...] = ()  # added by `add_tpu_slices`
        self.api = None
        self.claims: dict[str, Path] = {}  # namespace -> the folder behind its checkpoint claim

    # -- lifecycle -------------------------------------------------------------------------
    def up(self, log=lambda what: None) -> None:
        """Control plane, pod runner, chart; returns once the operator answers /readyz."""
        from kubernetes import client

        self.cluster.start()
        log(f"control plane up: {self.cluster.state.server}")
        self.api = self.cluster.api_client()
        self.core = client.CoreV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.runner = PodRunner(self.cluster, self.workdir / "runner")
        self.runner.start()
        log(f"pod runner: nodes {', '.join(self.runner.node_names)} Ready")
        if self.with_jobset:
            # Before the operator: its watch of JobSets may miss a CRD installed later.
            self.jobset = JobSet(self.cluster)
            self.jobset.start()
            log(f"JobSet controller pid {self.jobset.process.pid}")
        self.helm_install()
        pod = self.operator_pod()
        log(
            f"helm install {RELEASE}: operator pod {pod['metadata']['name']} on "
            f"{pod['spec']['nodeName']}, pid {local_process(pod)['pid']}, "
            f"ServiceAccount {pod['spec']['serviceAccountName']}"
        )

    def add_tpu_slices(self, pools: tuple[str, ...], hosts: int) -> None:
        """TPU node pools of `hosts` nodes each, run by the pod runner: a multislice
        experiment (TPU_TYPE, TPU_TOPOLOGY) trains on them, on a stack with JobSet."""
        if self.jobset is None:
            raise RuntimeError("multislice experiments need Stack(jobset=True)")
        self.tpu_pools += pools
        for pool in pools:
            self.runner.add_pool(
                pool,
                hosts,
                labels={
                    operator_api.TPU_ACCELERATOR_SELECTOR: TPU_TYPE,
                    operator_api.TPU_TOPOLOGY_SELECTOR: TPU_TOPOLOGY,
                    NODE_POOL_LABEL: pool,
                },
                capacity={operator_api.TPU_RESOURCE: str(TPU_CHIPS)},
            )

    def down(self) -> None:
        if self.jobset is not None:
            self.jobset.stop()
        if self.runner is not None:
            self.runner.stop()
        if self.api is not None:
            self.api.close()
        self.cluster.stop()

    def helm(self, *args: str) -> str:
        return helm(self.cluster, self.workdir / "helm", *args)

    def helm_install(self) -> None:
        """The chart as a user installs it, plus the pod runner's pool for the operator pod."""
        # One replica: the scenarios watch and kill "the" operator pod (leader election still
        # runs; a restarted container waits out its predecessor's Lease).
        install_chart(
            self.cluster,
            self.workdir,
            {
                "nodeSelector": self.runner.node_selector,
                "tolerations": self.runner.tolerations,
                "operator": {"replicas": 1},
            },
        )
        wait_until(lambda: self.operator_get("/readyz")[0] == 200, 60, "the operator's /readyz")

    # -- namespaces and experiments --------------------------------------------------------
    def namespace(self, name: str) -> str:
        """A fresh namespace with the checkpoint claim experiment.yaml names."""
        self.cluster.kubectl("create", "namespace", name)
        self.cluster.wait_for_default_account(name)
        self.claims[name] = self.runner.provision_claim(name, CHECKPOINT_CLAIM)
        return name

    def apply(self, namespace: str, document: dict[str, Any] | None = None) -> None:
        """`kubectl apply` experiment.yaml (or a changed copy of it) into `namespace`."""
        if document is None:
            self.cluster.kubectl("apply", "-n", namespace, "-f", str(EXPERIMENT))
        else:
            self.cluster.kubectl(
                "apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(document)
            )

    def experiment(self, namespace: str, name: str) -> dict[str, Any]:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)

    def status(self, namespace: str, name: str) -> dict[str, Any]:
        return self.experiment(namespace, name).get("status") or {}

    def get_row(self, namespace: str, name: str, *flags: str) -> tuple[str, str]:
        """`kubectl get erlx NAME [flags]`: (header, row) with the CRD's printer columns."""
        out = self.cluster.kubectl("get", "erlx", name, "-n", namespace, *flags).stdout
        header, row = out.splitlines()
        return header, row

    # -- pods ------------------------------------------------------------------------------
    def pods(self, namespace: str, selector: str) -> list[dict[str, Any]]:
        response = self.core.list_namespaced_pod(
            namespace, label_selector=selector, _preload_content=False
        )
        return json.loads(response.data)["items"]

    def trainer_pods(self, namespace: str, job: str) -> dict[int, dict[str, Any]]:
        """The pods of one gang attempt by host index."""
        pods = self.pods(namespace, f"batch.kubernetes.io/job-name={job}")
        return {int(p["metadata"]["annotations"][COMPLETION_INDEX]): p for p in pods}

    def slice_pods(self, namespace: str, jobset: str) -> dict[tuple[int, int], dict[str, Any]]:
        """The pods of one multislice gang attempt (a JobSet) by (slice, host)."""
        pods = self.pods(namespace, f"{operator_api.JOBSET_NAME_LABEL}={jobset}")
        return {
            (
                int(p["metadata"]["labels"][operator_api.JOB_INDEX_LABEL]),
                int(p["metadata"]["annotations"][COMPLETION_INDEX]),
            ): p
            for p in pods
        }

    def operator_pod(self) -> dict[str, Any]:
        (pod,) = self.pods(RELEASE_NAMESPACE, OPERATOR_SELECTOR)
        return pod

    # -- metrics ---------------------------------------------------------------------------
    def operator_get(self, path: str) -> tuple[int, str]:
        try:
            port = local_process(self.operator_pod())["ports"]["metrics"]
            return _get(port, path)
        except (ValueError, TypeError, KeyError, OSError):
            return 0, ""

    def operator_samples(self) -> Samples:
        return scrape_text(self.operator_get("/metrics")[1])

    def operator_metric(self, name: str, **labels: str) -> float:
        return self.operator_samples().get((name, tuple(sorted(labels.items()))), 0.0)

    def scrape(self, pod: dict[str, Any]) -> Samples:
        """A pod's /metrics, through the port the runner recorded for its `metrics` port."""
        process = local_process(pod)
        if process is None:
            return {}
        try:
            return scrape_text(_get(process["ports"]["metrics"], "/metrics")[1])
        except OSError:
            return {}


def helm(cluster: ControlPlane, home: Path, *args: str) -> str:
    """Our pinned helm against `cluster`, its cache and config under `home`."""
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    run = subprocess.run(
        [cluster.binaries.path("helm"), f"--kubeconfig={cluster.kubeconfig}", *args],
        capture_output=True,
        text=True,
        env=env,
    )
    if run.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)} failed: {run.stderr.strip()}")
    return run.stdout


def install_chart(cluster: ControlPlane, workdir: Path, values: dict[str, Any]) -> None:
    """`helm install` helm/evokube as a user does, with `values` (workdir/values.yaml); returns
    once the operator's Deployment is ready."""
    path = workdir / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    helm(
        cluster,
        workdir / "helm",
        "install",
        RELEASE,
        str(CHART),
        "-n",
        RELEASE_NAMESPACE,
        "--create-namespace",
        "-f",
        str(path),
        "--wait",
        "--timeout=180s",
    )


def _get(port: int, path: str) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
        return response.status, response.read().decode()


def scrape_text(text: str) -> Samples:
    """{(sample name, sorted labels): value} of a Prometheus exposition."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
