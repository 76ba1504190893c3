"""A real scanner, checkov, over the rendered chart and the objects the operator builds.

checkov lives in a virtual environment of its own, .venv-checkov (`make
checkov`), so its pinned dependencies never meet the project's. .checkov.yaml
skips, each with its reason, what the project decided against everywhere; an
object that keeps a finding on purpose says why itself (the Deployment's
checkov.io/skip annotation) or, for the Jobs the operator builds, in KEPT.
"""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from evokube_operator.desired import builders
from evokube_operator.reading.spec import parse_spec
from tests.helm.chart import MONITORING_APIS, REPO, render
from tests.operator.factories import GPU, TPU, experiment
from tests.operator.test_pod_settings import SETTINGS as POD_SETTINGS

pytestmark = pytest.mark.cluster

CHECKOV = REPO / ".venv-checkov" / "bin" / "checkov"
MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
ACCELERATORS = {"cpu": {"type": "cpu", "hosts": 2}, "gpu": GPU, "tpu": TPU}
KEPT = {
    # libtpu opens /dev/accel* and /dev/vfio/*, which GKE's TPU device plugin leaves to
    # root: TPU pods run as root, under Pod Security "baseline" (docs/security.md).
    ("Job.ns.tpu-0", "CKV_K8S_23"): "TPU pods run as root",
    # Secrets as environment variables: spec.env may take a Secret's key (WANDB_API_KEY is
    # read from the environment); the author's choice, spec.volumes offers the file form.
    ("Job.ns.settings-0", "CKV_K8S_35"): "a Secret in spec.env",
}
# A Job nobody should build: the scanner must flag it, or it is not looking.
CONTROL = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {"name": "control", "namespace": "ns"},
    "spec": {
        "template": {
            "spec": {
                "restartPolicy": "Never",
                "hostPID": True,
                "containers": [
                    {
                        "name": "c",
                        "image": "busybox",
                        "securityContext": {"privileged": True},
                    }
                ],
            }
        }
    },
}


def operator_objects() -> list[dict]:
    """What the operator creates for a CPU, a GPU and a TPU experiment and a CPU one with every
    pod setting (NetworkPolicy on)."""
    objects = []
    for name, accelerator in {**ACCELERATORS, "settings": ACCELERATORS["cpu"]}.items():
        settings = POD_SETTINGS if name == "settings" else {}
        exp = experiment(name=name, accelerator=accelerator, **settings)
        spec = parse_spec(exp.spec)
        access = builders.NetworkAccess(metrics_from=(MONITORING,))
        objects += [*builders.static_objects(exp, spec, access), builders.job(exp, spec, 0)]
    return objects


def checkov(folder) -> dict:
    assert CHECKOV.exists(), f"{CHECKOV} is missing: run `make checkov`"
    run = subprocess.run(
        [
            str(CHECKOV),
            "--directory",
            str(folder),
            "--config-file",
            str(REPO / ".checkov.yaml"),
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.stdout.startswith("{"), f"checkov failed ({run.returncode}):\n{run.stderr[-3000:]}"
    return json.loads(run.stdout)


def test_checkov_finds_nothing_in_the_chart_and_the_trainer_jobs_but_what_is_kept(
    cluster, tmp_path
):
    chart = render(cluster, "evokube", "evokube-system", api_versions=MONITORING_APIS)
    (tmp_path / "chart.yaml").write_text(chart)
    (tmp_path / "operator.yaml").write_text(yaml.safe_dump_all(operator_objects()))
    (tmp_path / "control.yaml").write_text(yaml.safe_dump(CONTROL))
    results = checkov(tmp_path)["results"]

    failed = {(f["resource"], f["check_id"]) for f in results["failed_checks"]}
    control = {check for resource, check in failed if resource == "Job.ns.control"}
    # privileged, hostPID, privilege escalation, root: the scanner looks.
    assert {"CKV_K8S_16", "CKV_K8S_17", "CKV_K8S_20", "CKV_K8S_23"} <= control, control
    assert {f for f in failed if f[0] != "Job.ns.control"} == set(KEPT)
    skipped = {(s["resource"], s["check_id"]) for s in results["skipped_checks"]}
    assert skipped == {("Deployment.evokube-system.evokube-operator", "CKV_K8S_38")}
    scanned = {p["resource"] for p in results["passed_checks"]}
    for name in [*ACCELERATORS, "settings"]:
        assert f"Job.ns.{name}-0" in scanned
    assert "Deployment.evokube-system.evokube-operator" in scanned
