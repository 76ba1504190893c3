"""`make cluster` as a new user runs it: up, the README's kubectl commands, Prometheus, down.

The same entry point the Makefile calls (`python -m tests.e2e.laptop_cluster`), in a
folder of the test's own. The example is examples/pendulum-cemrl.yaml with fewer
generations and updates (what it trains is unchanged), applied with the printed
KUBECONFIG and kubectl. `down` must leave no process and no folder behind.
"""

import json
import os
import subprocess
import sys
import time
from urllib.parse import quote

import pytest
import yaml

from tests.cluster.controlplane import ClusterState, _pid_alive, wait_until
from tests.e2e.podrunner import local_process
from tests.e2e.stack import REPO
from tests.observability.prometheus import get

pytestmark = pytest.mark.cluster

EXAMPLE = REPO / "examples" / "pendulum-cemrl.yaml"


def entry_point(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tests.e2e.laptop_cluster", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )


def shell_exports(out: str) -> dict[str, str]:
    """The `export NAME=value` lines `up` printed, as a shell would apply them."""
    env = dict(os.environ)
    for line in out.splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            env[name] = value.replace("$PATH", env.get("PATH", ""))
    return env


def short_example() -> str:
    """The example, trained for 3 generations of fewer updates instead of 25."""
    example = yaml.safe_load(EXAMPLE.read_text())
    example["spec"]["stopping"]["maxGenerations"] = 3
    example["spec"]["algorithm"]["rl"]["updatesPerGeneration"] = 50
    example["spec"]["evaluation"]["episodes"] = 2
    return yaml.safe_dump(example)


def test_make_cluster_trains_the_example_to_succeeded_scraped_then_leaves_nothing(tmp_path):
    workdir = tmp_path / "laptop-cluster"
    up = entry_point("up", str(workdir))
    assert up.returncode == 0, up.stdout + up.stderr
    env = shell_exports(up.stdout)
    assert env["KUBECONFIG"] == str(workdir / "cluster" / "kubeconfig"), up.stdout
    prometheus = next(w for w in up.stdout.split() if w.startswith("http://127.0.0.1:"))
    prometheus = prometheus.split("/graph")[0]

    def kubectl(*args: str, input: str | None = None) -> str:
        run = subprocess.run(
            ["kubectl", *args], env=env, input=input, capture_output=True, text=True
        )
        assert run.returncode == 0, f"kubectl {' '.join(args)}: {run.stderr}"
        return run.stdout

    pids: set[int] = set()
    try:
        assert "local-0" in kubectl("get", "nodes")
        kubectl("apply", "-f", "-", input=short_example())
        name = "pendulum-cemrl"

        # Prometheus found the trainer pod through the pod runner's targets and scraped its
        # fitness: looked for while it trains, as a user watching the dashboard would.
        query = f'max_over_time(evokube_population_fitness{{experiment="{name}",stat="best"}}[1h])'
        url = f"{prometheus}/api/v1/query?query={quote(query)}"
        scraped: list = []

        def finished() -> str:
            scraped[:] = scraped or json.loads(get(url))["data"]["result"]
            phase = kubectl("get", "erlx", name, "-o", "jsonpath={.status.phase}")
            if phase == "Failed":
                pytest.fail(kubectl("describe", "erlx", name))
            return phase == "Succeeded"

        wait_until(finished, 480, f"{name} to succeed", interval=1)
        described = kubectl("describe", "erlx", name)
        assert "Completed" in described and "AllHostsRunning" in described, described
        scraped[:] = scraped or json.loads(get(url))["data"]["result"]
        assert scraped and scraped[0]["metric"]["namespace"] == "default", scraped
        up_targets = json.loads(get(f"{prometheus}/api/v1/query?query=up"))["data"]["result"]
        assert {r["metric"]["job"] for r in up_targets} >= {"evokube-operator"}, up_targets

        pods = json.loads(kubectl("get", "pods", "-A", "-o", "json"))["items"]
        pids |= {local_process(p)["pid"] for p in pods if local_process(p)}
    finally:
        state = ClusterState.load(workdir / "cluster")
        pids |= set(state.pids.values()) if state else set()
        down = entry_point("down", str(workdir))
    assert down.returncode == 0, down.stdout + down.stderr
    assert not workdir.exists()
    assert len(pids) >= 8  # etcd, 4 Kubernetes parts, kwok, runner, Prometheus, operator...
    time.sleep(0.5)
    assert not [p for p in pids if _pid_alive(p)], "processes left running"
