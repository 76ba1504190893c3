"""Shared pytest fixtures: one real control plane per session, a namespace per test."""

import json
import os
import re
import shutil
import uuid
from pathlib import Path

import pytest

from evokube_trainer.runtime.checkpoints import enable_compilation_cache
from tests.cluster.controlplane import ControlPlane, wait_until
from tests.helm.chart import operator_policies, operator_rbac, trainer_token_mode
from tests.operator.conftest import (
    OPERATOR_NAMESPACE,
    SESSION_LEASE,
    K8s,
    OperatorProcess,
    release_gangs,
    service_account_kubeconfig,
)

# One XLA compilation cache for what the tests compile in their own processes (the learning
# tests): kept between runs outside the repo, so a warm `make test` loads the programs an
# earlier run compiled (docs/testing.md). The trainers the tests start as processes keep their
# own, in their checkpoint location, as in a pod. The executables tests turn it off.
CACHE = Path(os.environ.get("EVOKUBE_CACHE", Path.home() / ".cache" / "evokube"))
XLA_TEST_CACHE = CACHE / "xla-tests"
XLA_TEST_CACHE_BYTES = 4 << 30  # past this (programs change with the code), it starts over


def _bounded(cache: Path) -> Path:
    if cache.exists() and sum(p.stat().st_size for p in cache.iterdir()) > XLA_TEST_CACHE_BYTES:
        shutil.rmtree(cache, ignore_errors=True)
    return cache


enable_compilation_cache(_bounded(XLA_TEST_CACHE))

# The longest files (minutes each on 2 cores), longest first: `make test` runs two workers and
# keeps a file's tests in one, so a long file collected last would run alone at the end. Only
# an order: a file missing here runs after these, as collected.
LONGEST_FIRST = (
    "tests/runtime/test_multihost.py",
    "tests/images/test_images.py",
    "tests/e2e/test_e2e.py",
    "tests/runtime/test_resume_layout.py",
    "tests/e2e/test_multislice.py",
    "tests/objectstore/test_objectstore.py",
    "tests/runtime/test_seeds_run.py",
    "tests/laptop/test_sweep.py",
)


def pytest_collection_modifyitems(items) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable


@pytest.fixture(scope="session")
def cluster(tmp_path_factory) -> ControlPlane:
    """The test control plane: started once, torn down at the end of the session.

    With EVOKUBE_TEST_CLUSTER set to the folder of a cluster started by
    `python -m tests.cluster up`, that cluster is reused and left running.
    """
    existing = os.environ.get("EVOKUBE_TEST_CLUSTER")
    if existing:
        plane = ControlPlane(Path(existing))
        if not plane.is_running():
            pytest.fail(f"EVOKUBE_TEST_CLUSTER={existing} names no running cluster")
        yield plane
        return
    plane = ControlPlane(tmp_path_factory.mktemp("cluster"))
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def api(cluster):
    """An admin ApiClient for the test cluster."""
    client = cluster.api_client()
    yield client
    client.close()


def fresh_namespace(cluster: ControlPlane, api, slug: str) -> str:
    """A new namespace `<slug>-<random>`, once its default ServiceAccount is there."""
    from kubernetes import client

    name = f"{re.sub(r'[^a-z0-9-]', '-', slug.lower())[:40].strip('-')}-{uuid.uuid4().hex[:6]}"
    client.CoreV1Api(api).create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=name))
    )
    cluster.wait_for_default_account(name)
    return name


@pytest.fixture
def namespace(cluster, api, request) -> str:
    """A fresh namespace for one test, with its default ServiceAccount ready."""
    from kubernetes import client

    name = fresh_namespace(cluster, api, request.node.name)
    yield name
    client.CoreV1Api(api).delete_namespace(name)


@pytest.fixture
def other_namespace(cluster, api) -> str:
    """A second fresh namespace: another tenant's. Its experiments go with it."""
    from kubernetes import client

    name = fresh_namespace(cluster, api, "other-tenant")
    yield name
    release_gangs(K8s(cluster, api, None), name)
    client.CoreV1Api(api).delete_namespace(name)


@pytest.fixture(scope="session")
def crd(cluster):
    """The CRDs of crds/ (ERLExperiment, ERLSweep), installed once and Established; returns
    the ERLExperiment CRD's name."""
    crds = Path(__file__).resolve().parents[1] / "crds"
    # Server-side apply: the CRD is too large for client-side apply's annotation.
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))

    def established(name: str) -> bool:
        # Not `kubectl wait`: it fails at once while a new CRD has no status.conditions yet.
        crd = json.loads(cluster.kubectl("get", "crd", name, "-o", "json").stdout)
        conditions = (crd.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    for path in sorted(crds.glob("*.yaml")):
        name = path.name.removesuffix(".yaml")
        wait_until(lambda n=name: established(n), 60, f"CRD {name} Established")
    return "erlexperiments.evokube.io"


# -- the operator: one process for the session, shared by every package ----------------------
# The chart values of the session's admission policies: the CSI drivers the pod settings of
# the tests (tests/bad_manifests.py, test_pod_settings.py) name; the chart allows none.
SESSION_VALUES = {"policy": {"allowedCSIDrivers": ["gcsfuse.csi.storage.gke.io", "d.example"]}}


@pytest.fixture(scope="session")
def operator_kubeconfig(cluster, crd, tmp_path_factory) -> Path:
    """The operator's identity: ServiceAccount evokube-system/evokube-operator, least privilege."""
    cluster.kubectl("create", "namespace", OPERATOR_NAMESPACE, check=False)
    # ServiceAccount, ClusterRole and ClusterRoleBinding `evokube-operator`.
    rbac = operator_rbac(cluster, "evokube", OPERATOR_NAMESPACE)
    cluster.kubectl("apply", "-f", "-", input=rbac)
    # Host 0's token, the status guard and the experiment policy, as the chart installs them.
    policies = operator_policies(cluster, "evokube", OPERATOR_NAMESPACE, SESSION_VALUES)
    cluster.kubectl("apply", "--server-side", "-f", "-", input=policies)
    api_client = cluster.api_client()
    try:
        return service_account_kubeconfig(
            cluster,
            api_client,
            OPERATOR_NAMESPACE,
            "evokube-operator",
            tmp_path_factory.mktemp("operator") / "kubeconfig",
        )
    finally:
        api_client.close()


@pytest.fixture(scope="session")
def operator(cluster, crd, operator_kubeconfig, tmp_path_factory):
    # What the chart would tell the operator on this server (MutatingAdmissionPolicy or not).
    token = f"--trainer-token={trainer_token_mode(cluster)}"
    process = OperatorProcess(
        operator_kubeconfig, tmp_path_factory.mktemp("operator-logs"), (*SESSION_LEASE, token)
    )
    process.start()
    yield process
    process.stop()


@pytest.fixture
def k8s(cluster, api, operator, namespace):
    operator.restart_if_exited()
    helper = K8s(cluster, api, operator)
    yield helper
    release_gangs(helper, namespace)
