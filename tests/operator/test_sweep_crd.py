"""The ERLSweep CRD on the real API server: what it refuses (naming the field, as `evokube
validate` does), its defaults and its printer columns."""

import json

import pytest

from evokube_contract import sweep as contract
from evokube_trainer.runtime import manifest
from tests.bad_manifests import ids, with_changes
from tests.bad_sweeps import BAD_SWEEPS, SWEEP
from tests.e2e.scenarios import table_columns
from tests.operator.test_crd import dry_run_refusals

pytestmark = pytest.mark.cluster


def sweep_manifest(namespace: str, changes: dict) -> dict:
    base = with_changes({"metadata.namespace": namespace}, SWEEP)
    return with_changes(changes, base)


@pytest.fixture(scope="module")
def dry_run(cluster, crd):
    """Create an ERLSweep with dryRun=All and strict field validation; returns the field paths
    the API server refused (empty: admitted)."""
    from kubernetes import client

    api_client = cluster.api_client()
    objects = client.CustomObjectsApi(api_client)

    def create(changes: dict) -> set[str]:
        return dry_run_refusals(objects, contract.SWEEP_PLURAL, sweep_manifest("default", changes))

    yield create
    api_client.close()


def validate_fields(changes: dict) -> set[str]:
    doc = sweep_manifest("default", changes)
    return {e.path for e in manifest.check(doc, manifest.SWEEP_CRD_FILE)[1]}


@pytest.mark.parametrize(
    ("changes", "field"), [(c.changes, c.field) for c in BAD_SWEEPS], ids=ids(BAD_SWEEPS)
)
def test_the_api_server_and_validate_refuse_invalid_sweeps_naming_the_field(
    dry_run, changes, field
):
    server = dry_run(changes)
    assert field in server, f"API server: {server}"
    # Not the same set: where a oneOf fails, the API server also names its branches' fields.
    assert field in validate_fields(changes)


def test_the_base_sweep_is_admitted_with_its_defaults(cluster, crd, api, namespace):
    from kubernetes import client

    cluster.kubectl("apply", "-f", "-", input=json.dumps(sweep_manifest(namespace, {})))
    spec = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "evokube.io", "v1alpha1", namespace, contract.SWEEP_PLURAL, "ok"
    )["spec"]
    assert (spec["seed"], spec["maxParallel"], spec["samples"]) == (0, 1, 2)


def test_kubectl_get_erls_shows_the_columns(cluster, crd, namespace):
    cluster.kubectl("apply", "-f", "-", input=json.dumps(sweep_manifest(namespace, {})))
    header, row = cluster.kubectl("get", "erls", "-n", namespace).stdout.splitlines()
    columns = table_columns(header, row)
    assert list(columns) == [
        "NAME", "PHASE", "CHILDREN", "RUNNING", "SUCCEEDED", "FAILED", "BEST", "AGE"
    ]  # fmt: skip
    assert columns["NAME"] == "ok"
