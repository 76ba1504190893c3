"""The control-plane tooling itself: cached builds, clean stops, clear failures."""

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cluster.controlplane import (
    HERE,
    Binaries,
    ClusterError,
    ControlPlane,
    _pid_alive,
    fake_nodes,
    read_versions,
)

REPO = HERE.parent.parent


def test_a_warm_build_reuses_the_cache_and_reports_real_versions():
    run = subprocess.run(
        ["bash", str(HERE / "build.sh")], capture_output=True, text=True, check=True
    )
    assert "building" not in run.stderr, run.stderr  # nothing rebuilt
    *control_plane, fake_gcs, kueue, jobset = (Path(p) for p in run.stdout.split())
    for folder, version in (
        (fake_gcs, "FAKE_GCS_SERVER_VERSION"),
        (kueue, "KUEUE_VERSION"),
        (jobset, "JOBSET_VERSION"),
    ):
        assert folder.name.endswith(read_versions()[version])
        assert (folder / ".complete").exists()
    bins = Binaries(*control_plane)
    versions = read_versions()
    for folder, version in zip(
        (bins.etcd, bins.kwok, bins.helm, bins.kubernetes),
        ("ETCD_VERSION", "KWOK_VERSION", "HELM_VERSION", "KUBERNETES_VERSION"),
        strict=True,
    ):
        assert folder.name.endswith(versions[version])  # cache keyed by version
        assert (folder / ".complete").exists()

    def reported(*cmd):
        return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout

    k8s = versions["KUBERNETES_VERSION"]
    for component in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        assert reported(bins.path(component), "--version").strip() == f"Kubernetes {k8s}"
    client = json.loads(reported(bins.path("kubectl"), "version", "--client", "-o", "json"))
    assert client["clientVersion"]["gitVersion"] == k8s
    assert versions["ETCD_VERSION"].lstrip("v") in reported(bins.path("etcd"), "--version")
    assert versions["HELM_VERSION"] in reported(bins.path("helm"), "version")
    assert versions["KWOK_VERSION"] in reported(bins.path("kwok"), "--version")


def test_a_component_that_fails_to_start_is_named_with_its_log(tmp_path):
    real = Binaries.build()
    broken = tmp_path / "broken-etcd"
    broken.mkdir()
    fake = broken / "etcd"
    fake.write_text("#!/bin/sh\necho 'etcd: cannot open data dir' >&2\nexit 3\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    plane = ControlPlane(
        tmp_path / "cluster", Binaries(broken, real.kwok, real.helm, real.kubernetes)
    )
    with pytest.raises(ClusterError) as err:
        plane.start(timeout=20)
    message = str(err.value)
    assert "etcd exited with code 3" in message
    assert str(plane.log("etcd")) in message
    assert "cannot open data dir" in message


def test_up_and_down_by_hand_leave_no_process_behind(tmp_path):
    env = {**os.environ, "EVOKUBE_CLUSTER_DIR": str(tmp_path / "dev")}
    cli = [sys.executable, "-m", "tests.cluster"]
    # What benchmarks/operator_scale.py asks for: a bigger CPU pool, and where it all is.
    up = subprocess.run(
        [*cli, "up", "--json", "--pool-size=cpu=6"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert up.returncode == 0, up.stderr
    where = json.loads(up.stdout)
    plane = ControlPlane(tmp_path / "dev")
    pids = dict(plane.state.pids)
    assert set(pids) == {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kwok",
    }
    assert where == {
        "kubeconfig": str(plane.kubeconfig),
        "kubectl": plane.binaries.path("kubectl"),
        "server": plane.state.server,
        "pids": pids,
    }
    assert plane.is_running()
    nodes = plane.kubectl("get", "nodes", "-o", "name").stdout.split()
    expected = fake_nodes({"cpu": 6})
    assert sorted(nodes) == sorted(f"node/{n['metadata']['name']}" for n in expected)
    pools = [n["metadata"]["labels"]["evokube.io/test-pool"] for n in expected]
    assert pools.count("cpu") == 6
    assert [n for n in expected if "cpu" not in n["metadata"]["name"]] == [
        n for n in fake_nodes() if "cpu" not in n["metadata"]["name"]
    ]
    # `up` again finds it running, and says how to use it.
    again = subprocess.run([*cli, "up"], cwd=REPO, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr
    assert f"export KUBECONFIG={tmp_path / 'dev' / 'kubeconfig'}" in again.stdout
    assert plane.state.pids == ControlPlane(tmp_path / "dev").state.pids  # the same processes

    down = subprocess.run([*cli, "down"], cwd=REPO, env=env, capture_output=True, text=True)
    assert down.returncode == 0, down.stderr
    assert not [name for name, pid in pids.items() if _pid_alive(pid)]
    status = subprocess.run([*cli, "status"], cwd=REPO, env=env, capture_output=True, text=True)
    assert status.returncode == 1 and "not running" in status.stdout


def test_a_copied_pool_is_its_template_under_its_own_node_pool_label():
    """What benchmarks/placement_rate.py asks for: more TPU slices of nodes.yaml's shape."""
    nodes = {n["metadata"]["name"]: n for n in fake_nodes({"tpu-c": 2}, {"tpu-c": "tpu"})}
    copy, template = nodes["tpu-c-1"], nodes["tpu-0"]
    assert "tpu-c-2" not in nodes
    assert copy["metadata"]["labels"] == {
        **template["metadata"]["labels"],
        "kubernetes.io/hostname": "tpu-c-1",
        "evokube.io/test-pool": "tpu-c",
        "cloud.google.com/gke-nodepool": "tpu-c",
    }
    assert (copy["spec"], copy["status"]) == (template["spec"], template["status"])
    with pytest.raises(ClusterError, match="cannot copy pool"):
        fake_nodes(copies={"tpu": "cpu"})
