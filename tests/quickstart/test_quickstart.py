"""docs/quickstart.md without a cluster: each block is a file of the repository, the scripts
parse, the manifests are valid, and the node pools fit the manifests."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from evokube_trainer.laptop import cli
from evokube_trainer.runtime import exitcodes
from tests.quickstart.walkthrough import (
    EXAMPLES,
    QUICKSTART,
    REPO,
    blocks,
    commands,
    experiments,
    fenced_blocks,
    fits,
    flags,
    node_pools,
    shown,
    trainer_job,
)

SCRIPTS = sorted(EXAMPLES.glob("*.sh"))
KPS_CHART = "prometheus-community/kube-prometheus-stack"


def test_every_block_is_a_file_of_the_repository_as_it_is():
    found = blocks()
    assert len(found) == fenced_blocks(), "a block without its <!-- file: PATH --> line"
    for block in found:
        path = REPO / block.path
        assert path.is_file(), block.path
        assert block.text == shown(path), f"docs/quickstart.md differs from {block.path}"


def test_the_quickstart_shows_every_file_of_examples_gke():
    assert {b.path for b in blocks()} == {
        str(p.relative_to(REPO)) for p in EXAMPLES.iterdir() if p.is_file()
    }


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_parse_and_their_header_is_what_the_quickstart_says(script):
    subprocess.run(["bash", "-n", str(script)], check=True)
    header = script.read_text().split("\n\n", 1)[0].splitlines()
    if script.name == "env.sh":  # sourced: no shebang, no options of its own
        assert header[0] == "# shellcheck shell=bash"
        return
    assert header[0] == "#!/usr/bin/env bash"
    assert "set -euo pipefail" in header
    code = [line for line in header if not line.startswith("#")]
    assert set(code) <= {
        "set -euo pipefail",
        'cd "$(dirname "$0")/../.."',
        "source examples/gke/env.sh",
    }, code


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck is not installed")
def test_shellcheck_finds_nothing():
    run = subprocess.run(
        ["shellcheck", "--external-sources", *map(str, SCRIPTS)],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout


def test_the_manifests_pass_evokube_validate(capsys):
    paths = [str(p) for p in experiments()]
    assert len(paths) == 2
    assert cli.main(["validate", *paths]) == exitcodes.SUCCESS
    assert capsys.readouterr().out.count(": valid") == 2


def test_each_manifest_fits_exactly_one_node_pool_and_each_pool_serves_one():
    pools = node_pools()
    assert {p.name for p in pools} == {"tpu-v5e-8", "gpu-l4"}
    served = set()
    for path, document in experiments().items():
        job = trainer_job(document)
        reasons = {p.name: [fits(job, node) for node in p.nodes()] for p in pools}
        homes = [p for p in pools if not any(reasons[p.name])]
        assert len(homes) == 1, f"{path.name}: {reasons}"
        (home,) = homes
        # One pod per host, and the pool has that many nodes.
        assert job["spec"]["parallelism"] == len(home.nodes())
        served.add(home.name)
    assert served == {p.name for p in pools}


def test_the_tpu_pool_is_the_v5e_8_slice_the_manifest_names():
    (pool,) = [p for p in node_pools() if p.machine.tpu]
    (tpu,) = [d for d in experiments().values() if d["spec"]["accelerator"]["type"] == "tpu"]
    want = tpu["spec"]["accelerator"]["tpu"]
    assert pool.flags["machine-type"] == "ct5lp-hightpu-8t"
    assert (pool.machine.tpu, pool.machine.topology, pool.machine.count) == (
        want["type"],
        want["topology"],
        want["chipsPerHost"],
    )
    # A single-host slice takes its topology from the machine type; if given, it must agree.
    assert pool.flags.get("tpu-topology", want["topology"]) == want["topology"]


def test_the_gpu_pool_attaches_the_gpus_its_machine_type_carries():
    (pool,) = [p for p in node_pools() if p.machine.gpu]
    (gpu,) = [d for d in experiments().values() if d["spec"]["accelerator"]["type"] == "gpu"]
    want = gpu["spec"]["accelerator"]["gpu"]
    assert pool.accelerator["type"] == pool.machine.gpu == want["product"]
    assert int(pool.accelerator["count"]) == pool.machine.count == want["count"]


def test_every_pool_and_cluster_command_names_the_same_project_cluster_and_zone():
    for script in SCRIPTS:
        for words in commands(script):
            if words[:2] == ["gcloud", "container"]:
                given = flags(words)
                assert given["project"] == "$PROJECT" and given["location"] == "$ZONE", words
                assert "$CLUSTER" in words or given.get("cluster") == "$CLUSTER", words


@pytest.mark.skipif(shutil.which("gcloud") is None, reason="the gcloud CLI is not installed")
def test_gcloud_knows_every_flag_the_scripts_pass():
    ansi = re.compile(r"\x1b\[[0-9;]*m")
    for script in SCRIPTS:
        for words in commands(script):
            if words[0] != "gcloud":
                continue
            positional = [w for w in words[1:] if not w.startswith("--")]
            run = subprocess.run(
                ["gcloud", *positional, "--help"], capture_output=True, text=True, timeout=120
            )
            assert run.returncode == 0, run.stderr
            known = set(re.findall(r"--([a-z][a-z0-9-]*)", ansi.sub("", run.stdout)))
            unknown = set(flags(words)) - known
            assert not unknown, f"{script.name}: gcloud {' '.join(positional)}: {unknown}"


def kps_install() -> tuple[str, str]:
    """(release, namespace) of kube-prometheus-stack in install.sh."""
    (install,) = [
        words
        for words in commands(EXAMPLES / "install.sh")
        if words[:2] == ["helm", "install"] and words[3] == KPS_CHART
    ]
    return install[2], install[install.index("-n") + 1]


def test_grafana_is_reached_where_kube_prometheus_stack_puts_it():
    release, namespace = kps_install()
    grafana = f"{release}-grafana"  # its Service and its admin Secret
    shown = commands(EXAMPLES / "grafana.sh")
    assert ["kubectl", "-n", namespace, "get", "secret", grafana] == shown[1][:6]
    assert ["kubectl", "-n", namespace, "port-forward", f"service/{grafana}", "3000:80"] in shown
    assert "<http://localhost:3000>" in QUICKSTART.read_text()


def test_the_values_file_names_the_kps_release_and_its_namespace():
    # helm itself renders the chart with this file in test_on_cluster.py.
    values = yaml.safe_load((EXAMPLES / "evokube-values.yaml").read_text())
    release, namespace = kps_install()
    assert (
        values["serviceMonitor"]["labels"] == values["podMonitor"]["labels"] == {"release": release}
    )
    assert values["dashboard"]["namespace"] == namespace
    # The chart's default NetworkPolicy admits scrapes from kube-prometheus-stack's namespace.
    defaults = yaml.safe_load((REPO / "helm" / "evokube" / "values.yaml").read_text())
    assert "networkPolicy" not in values
    (peer,) = defaults["networkPolicy"]["metricsFrom"]
    assert peer["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": namespace}
