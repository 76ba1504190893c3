"""The CRD on the real API server: what it refuses (schema and CEL), defaults, columns, names."""

import copy
import json
import re

import pytest

from evokube_operator.reading.spec import parse_spec
from evokube_trainer.runtime import manifest
from tests.bad_manifests import BAD_MANIFESTS, GOOD_MANIFESTS, ids, with_changes
from tests.e2e.scenarios import table_columns
from tests.operator.conftest import experiment_manifest

pytestmark = pytest.mark.cluster


def bad_manifest(namespace: str, changes: dict) -> dict:
    """The shared base manifest as "bad" in `namespace`, with `changes` applied."""
    base = with_changes({"metadata": {"name": "bad", "namespace": namespace}})
    return with_changes(changes, base)


DRY_RUN_NAMESPACE = "crd-dry-run"


def opted_in_namespace(cluster) -> None:
    """DRY_RUN_NAMESPACE, listing every Secret and ConfigMap the good manifests name: the chart's
    experiment policy (installed once any test started the operator) checks those lists, and
    this module tests the CRD's own rules."""
    names: dict[str, set[str]] = {"Secret": set(), "ConfigMap": set()}
    for case in GOOD_MANIFESTS:
        spec = parse_spec(bad_manifest(DRY_RUN_NAMESPACE, case.changes)["spec"])
        for ref in spec.references():
            names.get(ref.kind, set()).add(ref.name)
    cluster.kubectl("create", "namespace", DRY_RUN_NAMESPACE, check=False)
    cluster.kubectl(
        "annotate",
        "--overwrite",
        "namespace",
        DRY_RUN_NAMESPACE,
        f"evokube.io/trainer-secrets={','.join(sorted(names['Secret']))}",
        f"evokube.io/trainer-configmaps={','.join(sorted(names['ConfigMap']))}",
    )


def refused_fields(err) -> set[str]:
    """The field paths an API server's refusal (an ApiException) names."""
    status = json.loads(err.body)
    causes = (status.get("details") or {}).get("causes") or []
    # A cause without a field ("<nil>") is the server's note that it skipped CEL rules, or a
    # oneOf that failed, which names its field in the message.
    fields = {c["field"] for c in causes if c.get("field") not in (None, "", "<nil>")}
    message = status.get("message", "")
    fields |= set(re.findall(r'unknown field "([^"]+)"', message))
    fields |= set(re.findall(r'"([^"]+)" must validate one and only one schema', message))
    return fields or {f"(unparsed) {message}"}


def dry_run_refusals(objects, plural: str, body: dict) -> set[str]:
    """Create `body` (an evokube.io object of `plural`) with dryRun=All and strict field
    validation, as `kubectl apply` validates; the field paths refused (empty: admitted)."""
    from kubernetes import client

    try:
        objects.create_namespaced_custom_object(
            "evokube.io",
            "v1alpha1",
            body["metadata"]["namespace"],
            plural,
            body,
            dry_run="All",
            field_validation="Strict",
        )
    except client.ApiException as err:
        return refused_fields(err)
    return set()


@pytest.fixture(scope="module")
def dry_run(cluster, crd):
    """Create an ERLExperiment with dryRun=All and strict field validation, as `kubectl apply`
    validates; returns the field paths the API server refused (empty: admitted)."""
    from kubernetes import client

    opted_in_namespace(cluster)
    api_client = cluster.api_client()
    objects = client.CustomObjectsApi(api_client)

    def create(changes: dict) -> set[str]:
        return dry_run_refusals(objects, "erlexperiments", bad_manifest(DRY_RUN_NAMESPACE, changes))

    yield create
    api_client.close()


def validate_fields(changes: dict) -> set[str]:
    """The field paths `evokube validate` refuses (empty: valid)."""
    return {e.path for e in manifest.check(bad_manifest("default", changes))[1]}


@pytest.mark.parametrize(
    ("changes", "field"),
    [(c.changes, c.field) for c in BAD_MANIFESTS],
    ids=ids(BAD_MANIFESTS),
)
def test_the_api_server_and_validate_refuse_invalid_manifests_naming_the_field(
    dry_run, changes, field
):
    server = dry_run(changes)
    assert field in server, f"API server: {server}"
    assert validate_fields(changes) == server  # the same fields, no more, no fewer


@pytest.mark.parametrize("changes", [c.changes for c in GOOD_MANIFESTS], ids=ids(GOOD_MANIFESTS))
def test_the_api_server_and_validate_admit_the_edge_cases(dry_run, changes):
    assert dry_run(changes) == set()
    assert validate_fields(changes) == set()


def test_kubectl_apply_names_the_field_too(cluster, crd, namespace):
    # The dry runs above use the Python client; this is the path users take.
    run = cluster.kubectl(
        "apply",
        "-f",
        "-",
        input=json.dumps(bad_manifest(namespace, {"spec.seed": 2**32})),
        check=False,
    )
    assert run.returncode != 0 and "spec.seed" in run.stderr, run.stderr


def test_the_shared_base_manifest_is_admitted(cluster, crd, namespace):
    # Else the refusals above could be about the base rather than about their changes.
    cluster.kubectl("apply", "-f", "-", input=json.dumps(bad_manifest(namespace, {})))


def test_there_are_at_least_twenty_refusals():
    assert len(BAD_MANIFESTS) >= 20


def test_defaults_are_filled_in_by_the_api_server(cluster, crd, api, namespace):
    from kubernetes import client

    cluster.kubectl("apply", "-f", "-", input=json.dumps(experiment_manifest("d", namespace)))
    spec = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "evokube.io", "v1alpha1", namespace, "erlexperiments", "d"
    )["spec"]
    assert spec["maxRestarts"] == 3
    assert spec["suspend"] is False
    assert spec["metricsPort"] == 9100
    assert spec["coordinatorPort"] == 8476
    assert spec["accelerator"] == {"type": "cpu", "devicesPerHost": 1}
    assert spec["checkpoint"]["intervalGenerations"] == 10


def test_immutable_fields_stay_and_the_accelerator_changes_only_while_suspended(
    cluster, crd, namespace
):
    manifest = experiment_manifest("imm", namespace, suspend=True)
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))

    def update(**spec):
        changed = copy.deepcopy(manifest)
        changed["spec"].update(spec)
        return cluster.kubectl("apply", "-f", "-", input=json.dumps(changed), check=False)

    refused = update(algorithm={"name": "cma-es"})
    assert refused.returncode != 0 and "algorithm is immutable" in refused.stderr
    refused = update(population={"size": 128})
    assert refused.returncode != 0 and "population is immutable" in refused.stderr
    assert update(accelerator={"type": "cpu", "devicesPerHost": 2}).returncode == 0  # suspended
    manifest["spec"]["accelerator"] = {"type": "cpu", "devicesPerHost": 2}
    assert update(suspend=False).returncode == 0
    manifest["spec"]["suspend"] = False
    refused = update(accelerator={"type": "cpu", "devicesPerHost": 4})
    assert refused.returncode != 0 and "suspend it first" in refused.stderr


def test_short_name_category_and_printer_columns(cluster, crd, namespace):
    cluster.kubectl("apply", "-f", "-", input=json.dumps(experiment_manifest("cols", namespace)))
    for resource in ("erlx", "evokube", "erlexperiments.evokube.io"):
        out = cluster.kubectl("get", resource, "-n", namespace).stdout
        header = out.splitlines()[0].split()
        assert header[:4] == ["NAME", "PHASE", "ALGORITHM", "ENVIRONMENT"], out
        assert {"HOSTS", "GENERATION", "BEST", "RESTARTS", "AGE"} <= set(header)
        assert "cols" in out
    wide = cluster.kubectl("get", "erlx", "-n", namespace, "-o", "wide").stdout.splitlines()[0]
    assert {"PREEMPTIONS", "JOB", "COORDINATOR"} <= set(wide.split())


def test_wide_columns_show_the_trainers_result(cluster, crd, namespace):
    cluster.kubectl("apply", "-f", "-", input=json.dumps(experiment_manifest("best", namespace)))
    result = {
        "bestReturn": -151.5,
        "generation": 12,
        "policyURI": "s3://b/best/policies/best",
        "pipeline": "generalized",
    }
    cluster.kubectl(
        *("patch", "erlx", "best", "-n", namespace, "--subresource=status", "--type=merge"),
        "-p",
        json.dumps({"status": {"result": result}}),
    )
    out = cluster.kubectl("get", "erlx", "best", "-n", namespace, "-o", "wide").stdout
    columns = table_columns(*out.splitlines())
    assert columns["BEST-RETURN"] == "-151.5"
    assert columns["BEST-GENERATION"] == "12"
    assert columns["POLICY"] == "s3://b/best/policies/best"
    assert columns["PIPELINE"] == "generalized"  # kept by the schema, not pruned
    narrow = cluster.kubectl("get", "erlx", "best", "-n", namespace).stdout.splitlines()[0]
    assert "POLICY" not in narrow  # priority 1: -o wide only
