"""Every contract value is written once: files that cannot import Python restate it exactly.

The CRD (and the chart's byte-identical copy), the Dockerfile, pyproject.toml and the chart's
templates cannot import evokube_contract (or the operator's api module); each place where they
restate one of its values is read here and compared with the constant. No Python module of
operator/, trainer/ or benchmarks/ writes a contract value as a literal, and no other shipped
file restates one of its ports, variable names, keys or paths.
"""

from __future__ import annotations

import ast
import os
import re
import tomllib
from pathlib import Path

import pytest
import yaml

import evokube_contract as contract
from evokube_contract import sweep
from evokube_operator import api
from evokube_operator.options import Options
from evokube_trainer.runtime import manifest
from tests.bad_manifests import with_changes

REPO = Path(__file__).resolve().parents[2]
CRDS = ("crds/erlexperiments.evokube.io.yaml", "helm/evokube/crds/erlexperiments.evokube.io.yaml")
# The ERLSweep CRD's template schema is the ERLExperiment CRD's spec schema, generated from it
# and kept equal to it (tests/test_sweep_model.py): it restates what that one does.
SWEEP_CRDS = ("crds/erlsweeps.evokube.io.yaml", "helm/evokube/crds/erlsweeps.evokube.io.yaml")
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
    ("_helpers.tpl", r"resources: \[(erl[^\]/]*)", {contract.PLURAL, sweep.SWEEP_PLURAL}),
]


@pytest.mark.parametrize(("template", "pattern", "values"), CHART_COPIES)
def test_the_charts_templates_restate_the_operators_names(template, pattern, values):
    found = {m.group(1) for m in re.finditer(pattern, (TEMPLATES / template).read_text())}
    assert found and found <= values, f"{template}: {pattern} found {found}"


# -- no value written twice -------------------------------------------------------------------
def _values() -> dict[str | int, str]:
    """Every value of the contract (its tuples' items too), with a constant's name for it."""
    values: dict[str | int, str] = {}
    for name, value in vars(contract).items():
        items = value if isinstance(value, tuple) else (value,)
        for item in items:
            if name.isupper() and isinstance(item, str | int) and not isinstance(item, bool):
                values.setdefault(item, name)
    return values


def _keys() -> dict[str, str]:
    """The values that stay recognisable inside a longer string: environment variable names,
    label and annotation keys, paths (but /tmp, everyone's), the API version."""
    names = (*contract.ENV_VARS, contract.ENV_PREFIX)
    return {
        v: n
        for v, n in _values().items()
        if isinstance(v, str) and (v in names or "/" in v) and v != contract.SCRATCH_DIR
    }


def _pattern(value: str | int) -> re.Pattern:
    """`value` standing alone: not part of a longer name, number, key or path."""
    return re.compile(rf"(?<![\w./-]){re.escape(str(value))}(?![\w-])")


# Python literals that equal a contract value by coincidence, and what they are.
COINCIDENCES = {
    (
        "operator/evokube_operator/desired/builders.py",
        "checkpoints",
    ): "the checkpoint volume's name",
    ("trainer/evokube_trainer/runtime/entrypoint.py", "evokube-train"): "the logger's name",
}


def _docstrings(tree: ast.AST) -> set[int]:
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, owners)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }


def test_no_python_module_writes_a_contract_value_again():
    values, keys = _values(), {v: _pattern(v) for v in _keys()}
    copies = []
    for root in ("operator", "trainer", "benchmarks"):
        for path in sorted((REPO / root).rglob("*.py")):
            where = str(path.relative_to(REPO))
            if path.parent.name == "evokube_contract":
                continue
            tree = ast.parse(path.read_text())
            docstrings = _docstrings(tree)
            for node in ast.walk(tree):
                if not isinstance(node, ast.Constant) or id(node) in docstrings:
                    continue
                value = node.value
                if isinstance(value, bool) or not isinstance(value, str | int) or value == 0:
                    continue
                if value in values and (where, value) not in COINCIDENCES:
                    copies.append(f"{where}:{node.lineno}: {value!r} is {values[value]}")
                elif isinstance(value, str):
                    copies += [
                        f"{where}:{node.lineno}: {value!r} spells {values[key]}"
                        for key, pattern in keys.items()
                        if key != value and pattern.search(value)
                    ]
    assert copies == [], "use evokube_contract's constants:\n" + "\n".join(copies)


# Files that cannot import Python and restate contract values (each checked above, or by the
# CRD's spec.env test in test_contract.py), with the constants each may restate. Documentation
# (docs/, *.md), examples (validated against the CRD) and tests are prose and fixtures.
ENV_RULES = {
    "ENV_PREFIX",
    "ENV_COORDINATOR",
    "ENV_NUM_PROCESSES",
    "ENV_PROCESS_ID",
    "ENV_HOME",
    "ENV_XLA_FLAGS",
    "ENV_TPU_WORKER_ID",
    "ENV_TPU_WORKER_HOSTNAMES",
    "ENV_MEGASCALE_COORDINATOR",
    "ENV_MEGASCALE_NUM_SLICES",
    "ENV_MEGASCALE_SLICE_ID",
    "ENV_MEGASCALE_PORT",
    "ENV_LOG_LEVEL",
}
KNOWN_COPIES = {
    # EXPOSE; HOME is the image's own home, which the operator's HOME replaces in pods.
    "Dockerfile": {"METRICS_PORT", "COORDINATOR_PORT", "ENV_HOME"},
    # Port defaults, the mount-path rule, the spec.env rules and their description.
    **{
        path: {"METRICS_PORT", "COORDINATOR_PORT", "MANIFEST_DIR", *ENV_RULES}
        for path in (*CRDS, *SWEEP_CRDS)
    },
    "helm/evokube/templates/admission.yaml": {"COMPLETION_INDEX_ANNOTATION", "JOB_INDEX_LABEL"},
}
NOT_SHIPPED = {"docs", "examples", "tests", "runs", "build", "dist", "node_modules"}


def _shipped_files() -> list[Path]:
    """The repository's files but Python, Markdown, documentation, examples and tests."""
    found = []
    for folder, subfolders, files in os.walk(REPO):
        subfolders[:] = [
            d for d in subfolders if d not in NOT_SHIPPED and not d.startswith((".", "__"))
        ]
        found += [Path(folder, f) for f in files if not f.endswith((".py", ".md", ".pyc"))]
    return found


def test_files_that_cannot_import_python_restate_the_contract_only_where_checked():
    patterns = {name: _pattern(value) for value, name in _keys().items()}
    patterns |= {
        name: _pattern(value)
        for value, name in _values().items()
        if isinstance(value, int) and value >= 1024  # ports
    }
    found = {}
    for path in _shipped_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        names = {name for name, pattern in patterns.items() if pattern.search(text)}
        if names:
            found[str(path.relative_to(REPO))] = names
    assert found == KNOWN_COPIES
