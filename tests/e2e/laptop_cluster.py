"""`make cluster`: evokube on a Kubernetes cluster on this machine, up until `make cluster-down`.

    python -m tests.e2e.laptop_cluster up       # control plane, pod runner, chart, Prometheus
    python -m tests.e2e.laptop_cluster down     # stops every process, removes the folder
    python -m tests.e2e.laptop_cluster status

The test control plane (tests/cluster) keeps kwok's fake TPU and GPU pools but none of its
CPU nodes: a pod that asks for no accelerator goes to the pod runner's two untainted nodes
(tests/e2e/podrunner.py), which run it as a local process, so `kubectl apply -f
examples/pendulum-cemrl.yaml` really trains. The chart's operator runs there too, installed
by helm as a user installs it. Prometheus scrapes the trainer and operator pods with
docs/observability.md's relabelling; the pod runner lists them for it (file_sd), as Kubernetes
discovery would, which Debian's Prometheus lacks.

The pod runner and Prometheus are components of the control plane (ControlPlane.spawn): each
in a session of its own, its pid in the cluster's state.json, so they outlive the `up` command
and `down`, from any shell, stops them all. The folder is $EVOKUBE_LAPTOP_CLUSTER_DIR (default
~/.cache/evokube/laptop-cluster).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

from tests.cluster.controlplane import ClusterError, ControlPlane
from tests.e2e.podrunner import POOL_LABEL, PodRunner
from tests.e2e.stack import REPO, install_chart
from tests.observability.prometheus import Prometheus

DEFAULT_DIR = Path.home() / ".cache" / "evokube" / "laptop-cluster"
POD_RUNNER, PROMETHEUS = "pod-runner", "prometheus"
# Enough to see a generation's fitness move, cheap on 2 cores.
SCRAPE_INTERVAL_S = 2


def scrape_configs(targets_file: Path) -> list[dict]:
    """docs/observability.md's jobs and relabelling; the pods come from the pod runner's file
    (the `__meta_kubernetes_*` labels of Kubernetes discovery) instead of the API server."""

    def job(name: str, app: str, *more: dict) -> dict:
        return {
            "job_name": name,
            # Read again every scrape too: a pod of a few seconds must not wait for a
            # missed file event and file_sd's default 5 minutes.
            "file_sd_configs": [
                {"files": [str(targets_file)], "refresh_interval": f"{SCRAPE_INTERVAL_S}s"}
            ],
            "relabel_configs": [
                {
                    "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name"],
                    "regex": app,
                    "action": "keep",
                },
                {
                    "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                    "regex": "metrics",
                    "action": "keep",
                },
                *more,
            ],
        }

    pod = {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"}
    return [
        job("evokube-trainers", "evokube-trainer", pod),
        job("evokube-operator", "evokube-operator"),
    ]


class LaptopCluster:
    """The folder's cluster: its control plane, and where everything else keeps its files."""

    def __init__(self, workdir: Path):
        self.workdir = Path(workdir).resolve()
        # No kwok CPU nodes: CPU pods must land on the pod runner's nodes, where they run.
        self.plane = ControlPlane(self.workdir / "cluster", pool_sizes={"cpu": 0})

    @property
    def targets_file(self) -> Path:
        return self.workdir / "runner" / "targets.json"

    @property
    def runner_ready(self) -> Path:
        return self.workdir / "runner" / "ready"

    def is_running(self) -> bool:
        """Every component alive (ControlPlane.is_running), the last one, Prometheus, too."""
        return self.plane.is_running() and PROMETHEUS in self.plane.state.pids

    def up(self, log=print) -> None:
        """Start everything afresh (whatever an earlier `up` left is removed first)."""
        binary = shutil.which("prometheus")
        if binary is None:
            raise ClusterError("prometheus not found: `make system-deps` installs Debian's package")
        self.down()
        started = time.monotonic()
        self.plane.start()
        log(f"control plane up: {self.plane.state.server} ({time.monotonic() - started:.0f}s)")
        self.plane.spawn(
            POD_RUNNER,
            [sys.executable, "-m", "tests.e2e.laptop_cluster", "run-pods", str(self.workdir)],
            env={**os.environ, "PYTHONPATH": _python_path()},
        )
        self.plane.wait_for(POD_RUNNER, self.runner_ready.exists, 120, "running its nodes")
        log(f"pod runner: nodes Ready ({time.monotonic() - started:.0f}s)")
        install_chart(
            self.plane,
            self.workdir,
            {"nodeSelector": {POOL_LABEL: "local"}, "operator": {"replicas": 1}},
        )
        log(f"helm install of helm/evokube: operator up ({time.monotonic() - started:.0f}s)")
        prometheus = Prometheus(
            self.workdir / "prometheus",
            scrape_configs(self.targets_file),
            interval_s=SCRAPE_INTERVAL_S,
        )
        self.plane.spawn(PROMETHEUS, prometheus.command(binary))
        self.plane.wait_for(PROMETHEUS, prometheus.ready, 60, "ready")
        (self.workdir / "prometheus-url").write_text(prometheus.url)
        log(f"Prometheus: {prometheus.url} ({time.monotonic() - started:.0f}s)")

    def down(self) -> None:
        """Stop every process (Prometheus, the pods and their runner, the control plane, newest
        first) and remove the folder."""
        self.plane.stop()
        shutil.rmtree(self.workdir, ignore_errors=True)

    @property
    def prometheus_url(self) -> str:
        return (self.workdir / "prometheus-url").read_text()


def _python_path() -> str:
    """This checkout first, then what the caller had (absolute: the runner runs elsewhere)."""
    entries = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([str(REPO), *(str(Path(p).resolve()) for p in entries)])


def run_pods(cluster: LaptopCluster) -> None:
    """The pod runner as a process of its own: until SIGTERM, then it ends its pods' processes."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    runner = PodRunner(
        cluster.plane, cluster.workdir / "runner", taint=False, targets_file=cluster.targets_file
    )
    runner.start()
    cluster.runner_ready.write_text(str(os.getpid()))
    while not stop.wait(1):
        pass
    runner.stop()


def usage(cluster: LaptopCluster) -> str:
    """What to paste into a shell, and where things are."""
    kubectl = Path(cluster.plane.binaries.path("kubectl"))
    helm = Path(cluster.plane.binaries.path("helm"))
    version = kubectl.parent.name.removeprefix("kubernetes-")
    logs = cluster.plane.workdir / "logs"
    return "\n".join(
        [
            "evokube runs on a cluster on this machine. In your shell:",
            f"  export KUBECONFIG={cluster.plane.kubeconfig}",
            f"  export PATH={kubectl.parent}:{helm.parent}:$PATH   # kubectl {version}, helm",
            "  kubectl apply -f examples/pendulum-cemrl.yaml",
            "  kubectl get erlx -w",
            "  kubectl describe erlx pendulum-cemrl",
            f"Prometheus: {cluster.prometheus_url}/graph?g0.expr=evokube_population_fitness",
            f"logs: {logs} (operator and trainers: {cluster.workdir / 'runner' / 'pods'})",
            "stop it and remove its files: make cluster-down",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.e2e.laptop_cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=["up", "down", "status", "run-pods"])
    parser.add_argument(
        "dir",
        nargs="?",
        type=Path,
        default=Path(os.environ.get("EVOKUBE_LAPTOP_CLUSTER_DIR", DEFAULT_DIR)),
    )
    args = parser.parse_args(argv)
    cluster = LaptopCluster(args.dir)
    if args.command == "run-pods":
        run_pods(cluster)
        return 0
    if args.command == "down":
        cluster.down()
        print(f"stopped the cluster and removed {cluster.workdir}")
        return 0
    running = cluster.is_running()
    if args.command == "status":
        print(f"cluster in {cluster.workdir}: {'running' if running else 'not running'}")
        return 0 if running else 1
    if running:
        print(f"already up in {cluster.workdir}")
    else:
        try:
            cluster.up(log=lambda line: print(line, flush=True))
        except (ClusterError, RuntimeError, TimeoutError) as err:
            cluster.down()
            print(f"error: {err}", file=sys.stderr)
            return 1
    print(usage(cluster))
    return 0


if __name__ == "__main__":
    sys.exit(main())
