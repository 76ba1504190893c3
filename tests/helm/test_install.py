"""`helm install` into the test control plane, then prove the chart's RBAC is enough and no more.

The operator's pod itself runs on a kwok node (it only looks Ready); the real
operator runs here, as the chart's ServiceAccount (a TokenRequest token) with
the Deployment's own arguments, and drives an experiment from creation through
a gang restart to Succeeded and its TTL deletion. Then `kubectl auth can-i`
shows the account can do what docs/helm.md tables and nothing else, and the
release is upgraded and uninstalled.

The tests of this module run in file order against one release.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from tests.helm.chart import CHART, OWN_RELEASE_LABEL, REPO, documents, helm, value_args
from tests.operator.conftest import (
    GROUP,
    PLURAL,
    VERSION,
    K8s,
    OperatorProcess,
    experiment_manifest,
    release_gangs,
    service_account_kubeconfig,
)

pytestmark = pytest.mark.cluster

RELEASE = "evokube-chart"  # <fullname> is the release name: it contains "evokube"
ACCOUNT = f"{RELEASE}-operator"
NAME = ACCOUNT  # Deployment, ClusterRole, Role and their bindings


@dataclass
class Release:
    name: str
    namespace: str  # the release's
    watched: list[str]  # watchNamespaces
    spare: str  # not watched at first; the upgrade adds it
    folder: Path
    installed: bool = True
    operator: OperatorProcess | None = field(default=None, repr=False)

    @property
    def user(self) -> str:
        """The operator's ServiceAccount: <fullname>-operator, <fullname> being the release name."""
        return f"system:serviceaccount:{self.namespace}:{self.name}-operator"


def install_args(release: Release, watched: list[str]) -> list[str]:
    values = {"watchNamespaces": watched, "serviceMonitor": {"labels": {"release": "kps"}}}
    return [
        release.name,
        str(CHART),
        "--namespace",
        release.namespace,
        "--wait",
        "--timeout=120s",
        *value_args(values, release.folder),
    ]


@pytest.fixture(scope="module")
def release(cluster, crd, monitoring_crds, tmp_path_factory):
    suffix = uuid.uuid4().hex[:6]
    names = [f"{prefix}-{suffix}" for prefix in ("evokube-chart", "chart-team-a", "chart-team-b")]
    for name in names:
        cluster.kubectl("create", "namespace", name)
        cluster.kubectl("label", "namespace", name, f"{OWN_RELEASE_LABEL}={RELEASE}")
    # The operator's pod must meet the Pod Security Standard "restricted".
    cluster.kubectl("label", "namespace", names[0], "pod-security.kubernetes.io/enforce=restricted")
    rel = Release(RELEASE, names[0], [names[1]], names[2], tmp_path_factory.mktemp("release"))
    helm(cluster, "install", *install_args(rel, rel.watched))
    yield rel
    if rel.operator is not None:
        rel.operator.stop()
    api_client = cluster.api_client()
    try:
        release_gangs(K8s(cluster, api_client, None), names[1])
    finally:
        api_client.close()
    if rel.installed:
        helm(cluster, "uninstall", RELEASE, "--namespace", rel.namespace, check=False)
    for name in names:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


# -- what docs/helm.md promises ------------------------------------------------------------------
def documented_rules() -> dict[str, set[tuple[str, str]]]:
    """The Permissions table of docs/helm.md: scope -> {(resource as kubectl prints it, verb)}."""
    text = (REPO / "docs" / "helm.md").read_text()
    section = text.split("## Permissions", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]
    rules: dict[str, set[tuple[str, str]]] = {}
    for row in rows:
        scope, groups, resources, verbs = (cell.strip() for cell in row.strip("|").split("|"))
        for group in (g.strip().strip("`") for g in groups.split(",")):
            group = "" if group == "core" else group
            for resource in (r.strip().strip("`") for r in resources.split(",")):
                for verb in (v.strip() for v in verbs.split(",")):
                    rules.setdefault(scope, set()).add((qualified(resource, group), verb))
    assert set(rules) == {
        "watched",
        "the release's namespace",
        "cluster",
        "cluster, with `watchNamespaces` only",
    }, rules
    return rules


def qualified(resource: str, group: str) -> str:
    """`kubectl auth can-i --list` spelling: resource.group, subresource after the group."""
    base, _, sub = resource.partition("/")
    name = f"{base}.{group}" if group else base
    return f"{name}/{sub}" if sub else name


def can_i_list(cluster, namespace: str, user: str) -> set[tuple[str, str]]:
    """(resource, verb) pairs `kubectl auth can-i --list` grants `user` in `namespace`.

    Rules restricted to resource names are kept as `resource[name,...]`.
    """
    out = cluster.kubectl("auth", "can-i", "--list", "-n", namespace, f"--as={user}").stdout
    header, *lines = out.splitlines()
    columns = ("Resources", "Non-Resource URLs", "Resource Names", "Verbs")
    starts = [header.index(c) for c in columns]
    granted = set()
    for line in lines:
        resource = line[starts[0] : starts[1]].strip()
        names = line[starts[2] : starts[3]].strip()
        verbs = line[starts[3] :].strip().strip("[]").split()
        if not resource:
            continue  # non-resource URLs (discovery, health): every account has them
        if names != "[]":
            resource = f"{resource}{names}"
        granted |= {(resource, verb) for verb in verbs}
    return granted


def granted_by_chart(cluster, release: Release, namespace: str) -> set[tuple[str, str]]:
    """What the chart's account may do in `namespace` beyond any bare ServiceAccount."""
    baseline = f"system:serviceaccount:{release.namespace}:default"
    return can_i_list(cluster, namespace, release.user) - can_i_list(cluster, namespace, baseline)


def can_i(cluster, user: str, namespace: str, verb: str, resource: str) -> bool:
    run = cluster.kubectl(
        "auth", "can-i", verb, resource, "-n", namespace, f"--as={user}", check=False
    )
    return run.stdout.strip() == "yes"


# -- the tests ------------------------------------------------------------------------------------
def test_install_waits_for_a_ready_operator_and_creates_everything(cluster, release):
    status = helm(cluster, "status", RELEASE, "-n", release.namespace).stdout
    assert "STATUS: deployed" in status and "REVISION: 1" in status
    assert f"rollout status deployment/{NAME}" in status  # NOTES.txt
    # Admitted under "restricted" (the namespace enforces it) and Ready.
    ready = cluster.kubectl(
        "get", "deployment", NAME, "-n", release.namespace, "-o", "jsonpath={.status.readyReplicas}"
    ).stdout
    assert ready == "2"  # two replicas; they elect a leader
    for kind, name in [
        ("serviceaccount", ACCOUNT),
        ("service", NAME),
        ("servicemonitor", NAME),
        ("podmonitor", f"{RELEASE}-trainers"),
        ("configmap", f"{RELEASE}-dashboard"),
    ]:
        cluster.kubectl("get", kind, name, "-n", release.namespace)
    cluster.kubectl("get", "role,rolebinding", NAME, "-n", release.watched[0])
    # Host 0's token the way this server offers (docs/helm.md, "Kubernetes versions").
    served = cluster.kubectl(
        "api-resources", "--api-group=admissionregistration.k8s.io", "-o", "name"
    ).stdout.split()
    if "mutatingadmissionpolicies.admissionregistration.k8s.io" in served:
        policy, notes = "mutatingadmissionpolicy", "host 0 of each gang gets an API token"
    else:
        policy, notes = "validatingadmissionpolicy", "every host gets an API token"
    cluster.kubectl("get", f"{policy},{policy}binding", f"{RELEASE}-trainer-token")
    assert notes in status, status
    assert (
        "release: kps"
        in cluster.kubectl(
            "get", "servicemonitor", NAME, "-n", release.namespace, "-o", "yaml"
        ).stdout
    )


def test_the_account_may_do_what_docs_helm_md_tables_and_nothing_more(cluster, release):
    rules = documented_rules()
    cluster_rules = rules["cluster"] | rules["cluster, with `watchNamespaces` only"]
    assert (
        granted_by_chart(cluster, release, release.watched[0]) == rules["watched"] | cluster_rules
    )
    assert granted_by_chart(cluster, release, release.spare) == cluster_rules
    own = granted_by_chart(cluster, release, release.namespace)
    assert own == rules["the release's namespace"] | cluster_rules
    user, watched = release.user, release.watched[0]
    for verb, resource in [
        ("get", "secrets"),
        ("create", "pods"),
        ("delete", "pods"),
        ("update", "erlexperiments.evokube.io"),
        ("patch", "erlexperiments.evokube.io"),  # a sweep creates its children, never edits one
        ("create", "erlsweeps.evokube.io"),
        ("delete", "erlsweeps.evokube.io"),  # a sweep's children go by garbage collection
        # Its manifest ConfigMaps it creates and deletes by name, owned ones only
        # (test_reconcile, test_ownership); it cannot enumerate the tenants'.
        ("list", "configmaps"),
        ("watch", "configmaps"),
        ("escalate", "roles.rbac.authorization.k8s.io"),
        ("bind", "roles.rbac.authorization.k8s.io"),
        ("create", "deployments.apps"),
    ]:
        assert not can_i(cluster, user, watched, verb, resource), f"may {verb} {resource}"
    assert can_i(cluster, user, watched, "create", "jobs.batch")
    assert can_i(cluster, user, watched, "create", "erlexperiments.evokube.io")
    assert not can_i(cluster, user, release.spare, "create", "jobs.batch")
    assert not can_i(cluster, user, release.spare, "list", "erlexperiments.evokube.io")


def test_the_operator_as_the_charts_account_runs_an_experiment_to_the_end(
    cluster, release, tmp_path
):
    deployment = documents(
        cluster.kubectl("get", "deployment", NAME, "-n", release.namespace, "-o", "yaml").stdout
    )[0]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["evokube-operator"]
    # The Deployment's arguments, but metrics on a free loopback port (the test's).
    args = tuple(a for a in container["args"] if not a.startswith("--metrics-"))
    assert f"--namespace={release.watched[0]}" in args
    api_client = cluster.api_client()
    kubeconfig = service_account_kubeconfig(
        cluster, api_client, release.namespace, ACCOUNT, tmp_path / "kubeconfig"
    )
    release.operator = OperatorProcess(kubeconfig, tmp_path, args)
    release.operator.start()
    k8s = K8s(cluster, api_client, release.operator)
    namespace, name = release.watched[0], "chart-lifecycle"
    try:
        k8s.apply(
            experiment_manifest(
                name,
                namespace,
                accelerator={"type": "cpu", "hosts": 2},
                maxRestarts=1,
                ttlSecondsAfterFinished=2,
            )
        )
        status = k8s.wait_running_gang(namespace, name, 2)
        assert status["jobName"] == f"{name}-0"
        for kind in ("service", "serviceaccount", "role", "rolebinding"):
            cluster.kubectl("get", kind, "-n", namespace, "-l", f"evokube.io/experiment={name}")
        pod = k8s.running_pods(namespace, name, f"{name}-0")[0]
        k8s.exit_pod(namespace, pod.metadata.name, 75)  # retriable: a gang restart
        k8s.wait(lambda: k8s.status(namespace, name).get("jobName") == f"{name}-1", "attempt 1")
        status = k8s.wait_running_gang(namespace, name, 2)
        assert status["restarts"] == 1
        for pod in k8s.running_pods(namespace, name, f"{name}-1"):
            k8s.exit_pod(namespace, pod.metadata.name, 0)
        k8s.wait_phase(namespace, name, "Succeeded")
        for reason in ("RetriableFailure", "Completed"):
            k8s.wait_event(namespace, name, reason)
        k8s.wait(
            lambda: (
                not k8s.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL)[
                    "items"
                ]
            ),
            "the TTL to delete the experiment",
        )
        assert release.operator.metric("evokube_operator_gang_restarts_total", kind="counted") == 1
        # Nothing was refused along the way: no request of the operator's own client got a 403,
        # and no line of its log (Kopf's watches included) says forbidden. A bare "403" is not
        # searched for: log timestamps carry milliseconds such as ",403".
        _, metrics = release.operator.get("/metrics")
        refused = [
            line
            for line in metrics.splitlines()
            if line.startswith("evokube_operator_api_requests_total{")
            and 'code="403"' in line
            and float(line.rsplit(" ", 1)[1]) > 0
        ]
        assert not refused, refused
        forbidden = re.findall(r"(?im)^.*forbidden.*$", release.operator.log_path.read_text())
        assert not forbidden, "\n".join(forbidden[:5])
    finally:
        release_gangs(k8s, namespace)
        release.operator.stop()
        release.operator = None
        api_client.close()


def test_upgrade_watches_one_more_namespace(cluster, release):
    watched = [*release.watched, release.spare]
    helm(cluster, "upgrade", *install_args(release, watched))
    status = helm(cluster, "status", RELEASE, "-n", release.namespace).stdout
    assert "STATUS: deployed" in status and "REVISION: 2" in status
    args = cluster.kubectl(
        "get", "deployment", NAME, "-n", release.namespace,
        "-o", "jsonpath={.spec.template.spec.containers[0].args}",
    ).stdout  # fmt: skip
    assert f"--namespace={release.spare}" in args
    rules = documented_rules()
    expected = rules["watched"] | rules["cluster"] | rules["cluster, with `watchNamespaces` only"]
    assert granted_by_chart(cluster, release, release.spare) == expected
    release.watched = watched


def test_uninstall_removes_the_operator_and_keeps_the_crd_and_experiments(cluster, release):
    namespace = release.watched[0]
    kept = experiment_manifest("kept", namespace, suspend=True)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(kept))
    helm(cluster, "uninstall", RELEASE, "--namespace", release.namespace, "--wait")
    release.installed = False
    for kind, name, ns in [
        ("deployment", NAME, release.namespace),
        ("serviceaccount", ACCOUNT, release.namespace),
        ("servicemonitor", NAME, release.namespace),
        ("podmonitor", f"{RELEASE}-trainers", release.namespace),
        ("configmap", f"{RELEASE}-dashboard", release.namespace),
        ("role", NAME, namespace),
        ("clusterrole", NAME, None),
        ("clusterrolebinding", NAME, None),
    ]:
        where = ["-n", ns] if ns else []
        run = cluster.kubectl("get", kind, name, *where, check=False)
        assert run.returncode != 0 and "NotFound" in run.stderr, f"{kind} {name} is still there"
    cluster.kubectl("get", "crd", "erlexperiments.evokube.io")
    cluster.kubectl("get", "erlx", "kept", "-n", namespace)


def test_a_cluster_wide_install_grants_exactly_the_documented_rules(cluster, crd, tmp_path):
    namespace = f"evokube-wide-{uuid.uuid4().hex[:6]}"
    other = f"chart-any-{uuid.uuid4().hex[:6]}"
    for name in (namespace, other):
        cluster.kubectl("create", "namespace", name)
        cluster.kubectl("label", "namespace", name, f"{OWN_RELEASE_LABEL}=evokube-wide")
    release = Release("evokube-wide", namespace, [], other, tmp_path)
    try:
        helm(cluster, "install", release.name, str(CHART), "--namespace", namespace)
        rules = documented_rules()
        assert granted_by_chart(cluster, release, other) == rules["watched"] | rules["cluster"]
        assert not can_i(cluster, release.user, other, "list", "namespaces")
    finally:
        helm(cluster, "uninstall", release.name, "--namespace", namespace, check=False)
        for name in (namespace, other):
            cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
