"""docs/quickstart.md on the test control plane: its manifests admitted by the API server, its
experiments scheduled onto the nodes GKE makes of its node pools (kwok nodes of the same
labels, taints and chips), and the dashboard it opens rendered by the chart with its values."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.helm.chart import CHART, MONITORING_APIS, documents, render
from tests.quickstart.walkthrough import (
    EXAMPLES,
    QUICKSTART,
    commands,
    experiments,
    node_pools,
)

pytestmark = pytest.mark.cluster


def test_the_api_server_admits_every_manifest(cluster, crd, namespace):
    for path in experiments():
        run = cluster.kubectl(
            "apply", "--dry-run=server", "--validate=strict", "-n", namespace, "-f", str(path)
        )
        assert "created (server dry run)" in run.stdout, run.stdout


@pytest.fixture
def gke_nodes(cluster):
    """The nodes of the quickstart's node pools, run by kwok while the test runs."""
    nodes = [node for pool in node_pools() for node in pool.nodes()]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(nodes))
    names = [n["metadata"]["name"] for n in nodes]
    try:
        cluster.kubectl("wait", "--for=condition=Ready", "--timeout=60s", "node", *names)
        yield names
    finally:
        cluster.kubectl("delete", "node", *names, "--ignore-not-found")


def test_each_experiment_runs_on_the_node_pool_made_for_it(gke_nodes, k8s, cluster, namespace):
    # gke_nodes first: its nodes go only after k8s has released the gangs on them.
    placed = {}
    for path, document in experiments().items():
        cluster.kubectl("apply", "-n", namespace, "-f", str(path))
        name = document["metadata"]["name"]
        k8s.wait_running_gang(namespace, name, 1, timeout=60)
        (pod,) = k8s.pods(namespace, name)
        placed[path.name] = pod.spec.node_name
    assert placed == {"gpu-l4.yaml": "gpu-l4-0", "tpu-v5e-8.yaml": "tpu-v5e-8-0"}
    assert set(placed.values()) <= set(gke_nodes)


def test_the_dashboard_the_quickstart_opens_is_the_one_the_chart_ships(cluster):
    values = yaml.safe_load((EXAMPLES / "evokube-values.yaml").read_text())
    (install,) = [
        w for w in commands(EXAMPLES / "install.sh") if w[:3] == ["helm", "install", "evokube"]
    ]
    release, namespace = install[2], install[install.index("-n") + 1]
    objects = documents(render(cluster, release, namespace, values, api_versions=MONITORING_APIS))
    # grafana.sh's first command shows the ConfigMap: its namespace and name.
    shown = commands(EXAMPLES / "grafana.sh")[0]
    assert shown[:2] == ["kubectl", "-n"] and shown[3:5] == ["get", "configmap"]
    (config_map,) = [
        o
        for o in objects
        if o["kind"] == "ConfigMap"
        and (o["metadata"]["namespace"], o["metadata"]["name"]) == (shown[2], shown[5])
    ]
    dashboard = (CHART / "dashboards" / "evokube.json").read_text()
    assert config_map["data"] == {"evokube.json": dashboard}
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    # The quickstart names the file and the dashboard's title as Grafana lists it.
    text = QUICKSTART.read_text()
    assert "`helm/evokube/dashboards/evokube.json`" in text
    assert f"**{json.loads(dashboard)['title']}**" in text
    monitors = [o for o in objects if o["kind"] in ("ServiceMonitor", "PodMonitor")]
    assert len(monitors) == 2
    for monitor in monitors:
        wanted = values["serviceMonitor" if monitor["kind"] == "ServiceMonitor" else "podMonitor"]
        assert wanted["labels"].items() <= monitor["metadata"]["labels"].items()
