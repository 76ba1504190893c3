"""A real Prometheus scrapes a real `evokube run` and a real operator; the dashboard's every
query returns data, and `promtool check metrics` finds nothing to say about either endpoint.

Everything listens on and is scraped over loopback. The operator drives an
experiment on the test control plane through one gang restart, so its restart
counter exists; the local run trains a tiny CEM-RL (fitness, evaluation, RL
losses, checkpoints).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from tests.cluster.controlplane import free_port, wait_until
from tests.helm.chart import CHART
from tests.observability.prometheus import Prometheus, get, static_scrape_configs
from tests.operator.conftest import (
    K8s,
    OperatorProcess,
    experiment_manifest,
    release_gangs,
    sweep_manifest,
)

pytestmark = pytest.mark.cluster

DASHBOARD = CHART / "dashboards" / "evokube.json"
SCRAPE_INTERVAL_S = 1
# What Grafana would put in for the built-in interval variables at this scrape interval.
GRAFANA_INTERVALS = {"$__rate_interval": "15s", "$__interval": "5s", "$__range": "5m"}


def tools() -> dict[str, str]:
    found = {name: shutil.which(name) for name in ("prometheus", "promtool")}
    missing = [name for name, path in found.items() if not path]
    if missing:
        pytest.fail(f"{', '.join(missing)} not found: `make system-deps` installs Debian's package")
    return found


class LocalRun:
    """`evokube run` of a tiny CEM-RL that keeps training until stopped."""

    def __init__(self, folder: Path, name: str):
        self.name = name
        self.metrics_port = free_port()
        manifest = {
            "apiVersion": "evokube.io/v1alpha1",
            "kind": "ERLExperiment",
            "metadata": {"name": name},
            "spec": {
                "image": "ghcr.io/evokube/trainer-cpu:0.1.0",
                "algorithm": {
                    "name": "cem-rl",
                    "rl": {
                        "numAgents": 2,
                        "batchSize": 32,
                        "warmupSteps": 200,
                        "replayCapacity": 5000,
                        "updatesPerGeneration": 5,
                        "criticHiddenLayers": [16, 16],
                    },
                },
                "environment": {"name": "gymnax/Pendulum-v1", "episodeLength": 50},
                "policy": {"hiddenLayers": [16]},
                "population": {"size": 4},
                "evaluation": {"episodes": 1},
                "stopping": {"maxGenerations": 10_000_000},
                "checkpoint": {"intervalGenerations": 200},
                "metricsPort": self.metrics_port,
            },
        }
        path = folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump(manifest))
        self.log = folder / "evokube-run.log"
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [str(Path(sys.executable).with_name("evokube")), "run", str(path)],
                cwd=folder,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        """Ctrl-C, as a user would: the trainer checkpoints and exits."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel, rows included."""
    dashboard = json.loads(DASHBOARD.read_text())
    panels = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))
    return [(p["title"], t["expr"]) for p in panels for t in p.get("targets", [])]


def regex_value(value: str) -> str:
    """A variable's value as Grafana puts it into a PromQL regex matcher: metacharacters
    escaped, the backslash itself escaped for the PromQL string."""
    return re.sub(r"[\\^$*+?.()|\[\]{}/]", lambda m: "\\\\" + m.group(0), value)


def fill(expr: str, namespace: str, experiment: str) -> str:
    values = {
        **GRAFANA_INTERVALS,
        "$namespace": regex_value(namespace),
        "$experiment": regex_value(experiment),
    }
    for name in sorted(values, key=len, reverse=True):
        expr = expr.replace(name, values[name])
    assert "$" not in expr, f"unknown variable left in {expr}"
    return expr


@pytest.fixture
def local_run(tmp_path):
    run = LocalRun(tmp_path, f"obs-{uuid.uuid4().hex[:6]}")
    yield run
    run.stop()


@pytest.fixture
def operator_with_a_restart(cluster, api, crd, namespace, tmp_path):
    """An operator (watching one namespace) whose experiment went through one gang restart."""
    args = ("--namespace", namespace, f"--leader-election-namespace={namespace}")
    operator = OperatorProcess(cluster.kubeconfig, tmp_path, args)
    operator.start()
    k8s = K8s(cluster, api, operator)
    try:
        name = "observed"
        k8s.apply(
            experiment_manifest(
                name, namespace, accelerator={"type": "cpu", "hosts": 2}, maxRestarts=3
            )
        )
        k8s.wait_running_gang(namespace, name, 2)
        pod = k8s.running_pods(namespace, name, f"{name}-0")[0]
        k8s.exit_pod(namespace, pod.metadata.name, 75)
        k8s.wait(lambda: k8s.status(namespace, name).get("jobName") == f"{name}-1", "a restart")
        k8s.wait_running_gang(namespace, name, 2)
        # A sweep of one child, played to the end: its gauges (children, best fitness).
        k8s.apply(sweep_manifest("swept", namespace, [{"path": "spec.seed", "values": [0]}]))
        k8s.wait_phase(namespace, "swept-0", "Running")
        k8s.succeed(namespace, "swept-0", [{"seed": 0, "bestFitness": -5.0, "fitness": -6.0}])
        k8s.wait_phase(namespace, "swept-0", "Succeeded")
        yield operator
    finally:
        release_gangs(k8s, namespace)
        operator.stop()


def test_prometheus_scrapes_both_and_every_dashboard_query_returns_data(
    local_run, operator_with_a_restart, tmp_path
):
    binaries = tools()
    operator = operator_with_a_restart
    prometheus = Prometheus(
        tmp_path,
        static_scrape_configs(
            {
                "evokube-trainer": f"127.0.0.1:{local_run.metrics_port}",
                "evokube-operator": f"127.0.0.1:{operator.port}",
            }
        ),
        interval_s=SCRAPE_INTERVAL_S,
    )
    prometheus.start(binaries["prometheus"])
    try:
        # Scraped: both targets up.
        def both_up():
            assert local_run.alive(), local_run.log.read_text()[-3000:]
            return {r["metric"]["job"] for r in prometheus.query("up == 1")} == {
                "evokube-trainer",
                "evokube-operator",
            }

        wait_until(both_up, 120, "both targets to be up")

        # The dashboard's variables offer this run.
        experiment = local_run.name
        wait_until(
            lambda: (
                experiment
                in prometheus.api("label/experiment/values", **{"match[]": "evokube_run_info"})
            ),
            60,
            "the experiment variable to offer the run",
        )
        namespaces = prometheus.api("label/namespace/values", **{"match[]": "evokube_run_info"})
        assert "default" in namespaces  # `evokube run` reports namespace "default"

        # The run's first generation is scraped (its compile takes minutes on a loaded machine;
        # the panels' own waits below are for the scrapes after it).
        wait_until(
            lambda: prometheus.query(f'evokube_population_fitness{{experiment="{experiment}"}}'),
            300,
            "the run's first generation to be scraped",
        )

        # Every panel's query, variables filled in, returns data.
        empty = []
        for title, expr in dashboard_queries():
            query = fill(expr, "default", experiment)
            try:
                wait_until(lambda q=query: prometheus.query(q), 60, f"data for {title!r}")
            except TimeoutError:
                empty.append(f"{title}: {query}")
        assert not empty, "queries without data:\n" + "\n".join(empty)

        # promtool finds nothing to complain about on either endpoint.
        for url in (local_run.url, operator.url + "/metrics"):
            check = subprocess.run(
                [binaries["promtool"], "check", "metrics"],
                input=get(url),
                capture_output=True,
                text=True,
            )
            assert check.returncode == 0 and not (check.stdout + check.stderr).strip(), (
                f"promtool check metrics on {url}:\n{check.stdout}{check.stderr}"
            )
    finally:
        prometheus.stop()


def test_the_dashboard_covers_each_topic_with_variables_for_namespace_and_experiment():
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert "label_values(evokube_run_info, namespace)" in variables["namespace"]["definition"]
    assert '$namespace"' in variables["experiment"]["definition"]
    titles = " | ".join(title.lower() for title, _ in dashboard_queries())
    for topic in (
        "fitness over generations",
        "evaluation return",
        "steps per second",
        "generation duration",
        "rl losses",
        "restarts",
        "phase",
        "checkpoint age",
        "pods per experiment",
        "sweep children by phase",
        "sweep best configuration",
    ):
        assert topic in titles, f"no panel about {topic}"
    queries = dashboard_queries()
    fitness = [q for t, q in queries if "fitness" in t.lower()]
    assert {s for q in fitness for s in re.findall(r'stat="(\w+)"', q)} == {"best", "mean", "min"}
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    # Every trainer panel follows the variables; the operator's are cluster-wide.
    for title, expr in queries:
        if "evokube_operator_" not in expr:
            assert '$namespace"' in expr and '$experiment"' in expr, title
