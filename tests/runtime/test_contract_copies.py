"""Every contract value is written once: files that cannot import Python restate it exactly.

The CRD (and the chart's byte-identical copy), the Dockerfile, pyproject.toml and the chart's
templates cannot import evokube_contract (or the operator's api module); each place where they
restate one of its values is read here and compared with the constant.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

import evokube_contract as contract
from evokube_operator import api
from evokube_operator.options import Options
from evokube_trainer.runtime import manifest
from tests.bad_manifests import with_changes

REPO = Path(__file__).resolve().parents[2]
CRDS = ("crds/erlexperiments.evokube.io.yaml", "helm/evokube/crds/erlexperiments.evokube.io.yaml")
TEMPLATES = REPO / "helm" / "evokube" / "templates"


@pytest.mark.parametrize("path", CRDS)
def test_the_crd_names_the_contracts_api_and_defaults_its_ports(path):
    crd = yaml.safe_load((REPO / path).read_text())
    assert crd["metadata"]["name"] == f"{contract.PLURAL}.{contract.GROUP}"
    assert crd["spec"]["group"] == contract.GROUP
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"]) == (contract.KIND, contract.PLURAL)
    (version,) = crd["spec"]["versions"]
    assert version["name"] == contract.VERSION
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec["metricsPort"]["default"] == contract.METRICS_PORT
    assert spec["coordinatorPort"]["default"] == contract.COORDINATOR_PORT


@pytest.mark.parametrize(
    "path", [contract.MANIFEST_DIR, contract.MANIFEST_PATH, contract.SCRATCH_DIR]
)
def test_the_crd_keeps_volume_mounts_off_the_operators_mounts(path):
    # The CRD's mountPath rule spells these paths inside a regular expression.
    doc = with_changes(
        {
            "spec.volumes": [{"name": "v", "emptyDir": {}}],
            "spec.volumeMounts": [{"name": "v", "mountPath": path}],
        }
    )
    assert "spec.volumeMounts[0].mountPath" in {e.path for e in manifest.check(doc)[1]}


def _dockerfile(instruction: str) -> str:
    (line,) = [
        line
        for line in (REPO / "Dockerfile").read_text().splitlines()
        if line.startswith(f"{instruction} ")
    ]
    return line.removeprefix(f"{instruction} ")


def test_the_image_exposes_the_contracts_ports_and_runs_the_trainer():
    exposed = {int(port) for port in _dockerfile("EXPOSE").split()}
    assert exposed == {Options().metrics_port, contract.METRICS_PORT, contract.COORDINATOR_PORT}
    assert yaml.safe_load(_dockerfile("CMD")) == list(contract.TRAINER_COMMAND)
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert contract.TRAINER_COMMAND[0] in scripts


# (template, a pattern whose first group restates a value, the values it may restate); each
# pattern matches at least once.
CHART_COPIES = [
    ("podmonitor.yaml", r"- port: (\S+)", {api.METRICS_PORT_NAME}),
    ("podmonitor.yaml", r"app\.kubernetes\.io/name: ([^{\s]\S*)", {api.APP_NAME}),
    ("podmonitor.yaml", r"app\.kubernetes\.io/managed-by: (\S+)", {api.MANAGED_BY}),
    ("admission.yaml", r"app\.kubernetes\.io/managed-by: (\S+)", {api.MANAGED_BY}),
    ("admission.yaml", r"(\S+/job-completion-index): ", {contract.COMPLETION_INDEX_ANNOTATION}),
    ("admission.yaml", r"c\.name == '([^']+)'", {contract.CONTAINER}),
    ("admission.yaml", r"indexOf\('([^']+)'\)", {contract.CONTAINER}),
    (
        "admission.yaml",
        r"'(evokube\.io/[^' ]+)'",
        {api.ANNOTATION_TRAINER_SECRETS, api.ANNOTATION_TRAINER_CONFIGMAPS},
    ),
    ("admission.yaml", r"apiGroups: \[(\w[^\]]*)\]", {contract.GROUP}),
    ("admission.yaml", r"resources: \[(erl[^\]/]*)", {contract.PLURAL}),
    ("_helpers.tpl", r"apiGroups: \[(evokube[^\]]*)\]", {contract.GROUP}),
    ("_helpers.tpl", r"resources: \[(erl[^\]/]*)", {contract.PLURAL}),
]


@pytest.mark.parametrize(("template", "pattern", "values"), CHART_COPIES)
def test_the_charts_templates_restate_the_operators_names(template, pattern, values):
    found = {m.group(1) for m in re.finditer(pattern, (TEMPLATES / template).read_text())}
    assert found and found <= values, f"{template}: {pattern} found {found}"
