"""The chart rendered: lint, schema, what each template produces, and a server-side dry run
of every manifest against the real API server."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.cluster.controlplane import read_versions
from tests.helm.chart import CHART, MONITORING_APIS, REPO, documents, helm, render, value_args

pytestmark = pytest.mark.cluster


def custom_values(watched: list[str], dashboard_namespace: str) -> dict:
    """Every group of values.yaml set to something other than its default."""
    return {
        "fullnameOverride": "evk",
        "watchNamespaces": watched,
        "image": {
            "repository": "registry.example/rl/operator",
            "tag": "1.2.3",
            "pullPolicy": "Always",
        },
        "imagePullSecrets": [{"name": "regcred"}],
        "checkpoints": {"defaultLocation": "s3://team-bucket/evokube"},
        "operator": {
            "replicas": 3,
            "leaderElection": {
                "enabled": True,
                "leaseName": "rl-lease",
                "leaseDurationSeconds": 20,
                "renewDeadlineSeconds": 12,
                "retryPeriodSeconds": 3,
            },
            "workers": 2,
            "resyncSeconds": 60,
            "watchTimeoutSeconds": 120,
            "imagePullTimeoutSeconds": 900,
            "unschedulableTimeoutSeconds": 60,
            "verbose": True,
            "extraArgs": ["--debug"],
            "extraEnv": [{"name": "TZ", "value": "UTC"}],
        },
        "serviceAccount": {"name": "evk-sa", "annotations": {"example.com/role": "trainer-admin"}},
        "metrics": {"port": 9090, "service": {"type": "ClusterIP", "port": 9091}},
        "serviceMonitor": {"labels": {"release": "kps"}, "interval": "15s", "scrapeTimeout": "5s"},
        "podMonitor": {"labels": {"release": "kps"}, "interval": "10s", "scrapeTimeout": "5s"},
        "dashboard": {
            "labels": {"grafana_dashboard": "evokube", "team": "rl"},
            "annotations": {"grafana_folder": "ERL"},
            "namespace": dashboard_namespace,
        },
        "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}},
        "probes": {"liveness": {"periodSeconds": 30, "failureThreshold": 5}},
        "podAnnotations": {"example.com/owner": "rl-team"},
        "podLabels": {"team": "rl"},
        "nodeSelector": {"cloud.google.com/gke-nodepool": "cpu"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops"}],
        "affinity": {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 1,
                        "preference": {
                            "matchExpressions": [
                                {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}
                            ]
                        },
                    }
                ]
            }
        },
        "terminationGracePeriodSeconds": 45,
        "networkPolicy": {"metricsFrom": [PROMETHEUS]},
        "policy": {"allowedImages": ["registry.example/rl/"]},
    }


PROMETHEUS = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}


def by_kind(objects: list[dict]) -> dict[tuple[str, str, str], dict]:
    return {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o for o in objects
    }


def operator_container(objects: list[dict]) -> dict:
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


# -- offline ------------------------------------------------------------------------------------
def test_lint_is_clean_with_default_and_custom_values(cluster, tmp_path):
    for values in (None, custom_values(["team-a", "team-b"], "monitoring")):
        args = value_args(values, tmp_path)
        run = helm(cluster, "lint", "--strict", str(CHART), *args)
        assert "0 chart(s) failed" in run.stdout, run.stdout


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"watchNamespaces": ["team-*"]}, "/watchNamespaces/0"),
        ({"operator": {"workers": 0}}, "/operator/workers"),
        ({"serviceMonitor": {"interval": "soon"}}, "/serviceMonitor/interval"),
        ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"replicas": 2}, "replicas"),
        ({"checkpoints": {"defaultLocation": "/checkpoints"}}, "/checkpoints/defaultLocation"),
        ({"checkpoints": {"defaultLocation": "gs://b/../x"}}, "/checkpoints/defaultLocation"),
        (
            {"dashboard": {"labels": {"grafana_dashboard": 1}}},
            "/dashboard/labels/grafana_dashboard",
        ),
    ],
)
def test_schema_rejects_bad_values(cluster, tmp_path, values, complaint):
    args = ["template", "x", str(CHART), *value_args(values, tmp_path)]
    run = helm(cluster, *args, check=False)
    assert run.returncode != 0
    assert "schema" in run.stderr and complaint in run.stderr, run.stderr


def test_the_charts_crd_is_byte_identical_to_crds():
    ours = sorted(p.name for p in (CHART / "crds").iterdir())
    theirs = sorted(p.name for p in (REPO / "crds").iterdir())
    assert ours == theirs
    for name in ours:
        assert (CHART / "crds" / name).read_bytes() == (REPO / "crds" / name).read_bytes(), (
            f"helm/evokube/crds/{name} differs from crds/{name}: copy it again"
        )


def test_the_dashboard_configmap_carries_the_dashboard_file_unchanged(cluster):
    dashboard = (CHART / "dashboards" / "evokube.json").read_text()
    objects = documents(render(cluster, "evokube", "monitoring"))
    (config_map,) = [o for o in objects if o["metadata"]["name"] == "evokube-dashboard"]
    assert config_map["data"]["evokube.json"] == dashboard
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard)["uid"] == "evokube"


def test_defaults_two_electing_replicas_probes_and_a_locked_down_container(cluster):
    objects = documents(render(cluster, "evokube", "evokube-system"))
    kinds = by_kind(objects)
    deployment = kinds["Deployment", "evokube-system", "evokube-operator"]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    pod = deployment["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "evokube-operator"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 1000
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    container = operator_container(objects)
    assert container["image"] == "ghcr.io/evokube/operator:0.1.0"
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
    assert not any(a.startswith("--namespace") for a in container["args"])
    assert {
        "--leader-election-namespace=evokube-system",
        "--leader-election-lease-name=evokube-operator",
    } <= set(container["args"])
    env = {e["name"]: e.get("valueFrom") for e in container["env"]}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # Cluster-wide: one ClusterRole with everything, bound to the chart's account; no Role.
    role = kinds["ClusterRole", "", "evokube-operator"]
    assert {"erlexperiments", "jobs", "customresourcedefinitions"} <= {
        r for rule in role["rules"] for r in rule["resources"]
    }
    # Namespaces are only read, for the Secrets and ConfigMaps they list (docs/security.md).
    assert [r["verbs"] for r in role["rules"] if "namespaces" in r["resources"]] == [["get"]]
    binding = kinds["ClusterRoleBinding", "", "evokube-operator"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "evokube-operator", "namespace": "evokube-system"}
    ]
    # The only Role: the Lease's, in the release's namespace.
    (role,) = [o for o in objects if o["kind"] == "Role"]
    assert (role["metadata"]["namespace"], role["rules"]) == (
        "evokube-system",
        [
            {
                "apiGroups": ["coordination.k8s.io"],
                "resources": ["leases"],
                "verbs": ["get", "create", "update"],
            }
        ],
    )
    (binding,) = [o for o in objects if o["kind"] == "RoleBinding"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    # Without monitoring.coreos.com in the cluster, no monitors.
    assert not [o for o in objects if o["kind"] in ("ServiceMonitor", "PodMonitor")]


def test_custom_values_reach_the_manifests(cluster):
    values = custom_values(["team-a", "team-b"], "monitoring")
    objects = documents(render(cluster, "rl", "ops", values, api_versions=MONITORING_APIS))
    kinds = by_kind(objects)
    container = operator_container(objects)
    assert container["image"] == "registry.example/rl/operator:1.2.3"
    assert container["imagePullPolicy"] == "Always"
    assert container["args"] == [
        "--metrics-address=0.0.0.0",
        "--metrics-port=9090",
        "--workers=2",
        "--resync-seconds=60",
        "--watch-timeout-seconds=120",
        "--image-pull-timeout-seconds=900",
        "--unschedulable-timeout-seconds=60",
        "--trainer-token=host-0",
        "--namespace=team-a",
        "--namespace=team-b",
        "--default-checkpoint-location=s3://team-bucket/evokube",
        '--metrics-from=[{"podSelector":{"matchLabels":{"app.kubernetes.io/name":"prometheus"}}}]',
        "--leader-election-namespace=ops",
        "--leader-election-lease-name=rl-lease",
        "--leader-election-lease-duration=20",
        "--leader-election-renew-deadline=12",
        "--leader-election-retry-period=3",
        "--verbose",
        "--debug",
    ]
    assert {"name": "TZ", "value": "UTC"} in container["env"]
    assert container["livenessProbe"]["periodSeconds"] == 30
    assert kinds["Deployment", "ops", "evk-operator"]["spec"]["replicas"] == 3
    pod = kinds["Deployment", "ops", "evk-operator"]["spec"]["template"]
    assert pod["metadata"]["labels"]["team"] == "rl"
    assert pod["spec"]["serviceAccountName"] == "evk-sa"
    assert pod["spec"]["terminationGracePeriodSeconds"] == 45
    assert kinds["ServiceAccount", "ops", "evk-sa"]["metadata"]["annotations"]
    # Watching two namespaces: a Role in each, and cluster-wide only CRDs and namespaces.
    cluster_rules = kinds["ClusterRole", "", "evk-operator"]["rules"]
    assert sorted(r for rule in cluster_rules for r in rule["resources"]) == [
        "customresourcedefinitions",
        "namespaces",
    ]
    for namespace in ("team-a", "team-b"):
        role = kinds["Role", namespace, "evk-operator"]
        assert "erlexperiments" in {r for rule in role["rules"] for r in rule["resources"]}
        binding = kinds["RoleBinding", namespace, "evk-operator"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "evk-sa", "namespace": "ops"}
        ]
    monitor = kinds["ServiceMonitor", "ops", "evk-operator"]
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["endpoints"][0]["interval"] == "15s"
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    pods = kinds["PodMonitor", "ops", "evk-trainers"]
    assert pods["metadata"]["labels"]["release"] == "kps"
    assert pods["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    assert pods["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "evokube-trainer"
    dashboard = kinds["ConfigMap", "monitoring", "evk-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "evokube"
    assert dashboard["metadata"]["annotations"] == {"grafana_folder": "ERL"}
    service = kinds["Service", "ops", "evk-operator"]
    assert service["spec"]["ports"][0]["port"] == 9091


def test_without_leader_election_one_recreated_replica_and_no_lease_role(cluster, tmp_path):
    values = {"operator": {"replicas": 1, "leaderElection": {"enabled": False}}}
    objects = documents(render(cluster, "evokube", "evokube-system", values))
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert "--no-leader-elect" in operator_container(objects)["args"]
    assert not [o for o in objects if o["kind"] in ("Role", "RoleBinding")]
    # Two replicas without a Lease would both act: refused.
    values["operator"]["replicas"] = 2
    args = ["template", "x", str(CHART), *value_args(values, tmp_path)]
    run = helm(cluster, *args, check=False)
    assert run.returncode != 0 and "needs operator.leaderElection.enabled" in run.stderr


# -- Kubernetes versions (docs/helm.md, "Kubernetes versions") -----------------------------------
ADMISSION = "admissionregistration.k8s.io"
VAP = f"{ADMISSION}/v1/ValidatingAdmissionPolicy"


@pytest.mark.parametrize(
    ("kube_version", "api_versions", "mode", "policy"),
    [
        ("1.37.2", (), "host-0", f"{ADMISSION}/v1 MutatingAdmissionPolicy"),
        ("1.36.0", (), "host-0", f"{ADMISSION}/v1 MutatingAdmissionPolicy"),
        ("1.35.4", (), "every-host", f"{ADMISSION}/v1 ValidatingAdmissionPolicy"),
        # A server's own list (helm install): what it serves, whatever its version.
        (
            "1.35.4",
            (VAP, f"{ADMISSION}/v1beta1/MutatingAdmissionPolicy"),
            "host-0",
            f"{ADMISSION}/v1beta1 MutatingAdmissionPolicy",
        ),
        ("1.37.2", (VAP,), "every-host", f"{ADMISSION}/v1 ValidatingAdmissionPolicy"),
    ],
    ids=["1.37", "1.36", "1.35", "1.35-beta-turned-on", "1.37-turned-off"],
)
def test_the_trainers_token_comes_the_way_the_server_offers(
    cluster, kube_version, api_versions, mode, policy
):
    objects = documents(
        render(cluster, "rl", "ops", api_versions=api_versions, kube_version=kube_version)
    )
    token = {
        f"{o['apiVersion']} {o['kind']}"
        for o in objects
        if o["metadata"]["name"] == "rl-evokube-trainer-token"
    }
    assert token == {policy, f"{policy}Binding"}
    assert f"--trainer-token={mode}" in operator_container(objects)["args"]


def test_a_server_older_than_the_oldest_tested_minor_is_refused(cluster):
    """Chart.yaml's kubeVersion is the oldest pinned build's minor, the one `make test` runs."""
    oldest = read_versions()["KUBERNETES_OLDEST_VERSION"]  # vMAJOR.MINOR.PATCH
    major, minor, _ = (int(part) for part in oldest[1:].split("."))
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={major}.{minor}.0-0"
    render(cluster, "rl", "ops", kube_version=f"{major}.{minor}.0")
    run = helm(
        cluster,
        "template",
        "rl",
        str(CHART),
        "--kube-version",
        f"{major}.{minor - 1}.9",
        check=False,
    )
    assert run.returncode != 0
    assert f"chart requires kubeVersion: >={major}.{minor}.0-0" in run.stderr
    assert f"| {major}.{minor} |" in (REPO / "docs" / "helm.md").read_text()


# -- against the API server ----------------------------------------------------------------------
@pytest.mark.parametrize("variant", ["default", "custom"])
def test_every_rendered_manifest_passes_a_server_side_dry_run(
    cluster, crd, monitoring_crds, make_namespace, variant
):
    release_ns = make_namespace("chart-dry")
    cluster.kubectl("label", "namespace", release_ns, "pod-security.kubernetes.io/warn=restricted")
    values = None
    if variant == "custom":
        values = custom_values([make_namespace("chart-a"), make_namespace("chart-b")], release_ns)
    text = render(cluster, "evokube", release_ns, values, api_versions=MONITORING_APIS, live=True)
    objects = documents(text)
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "ServiceMonitor", "PodMonitor", "ConfigMap", "ClusterRole"} <= kinds
    run = cluster.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "--validate=strict",
        "--field-manager=evokube-chart-test",
        # Cluster-scoped objects of the same names may exist already (the session's operator
        # applies the chart's RBAC and policies); who owns their fields is not under test.
        "--force-conflicts",
        "-f",
        "-",
        input=text,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    assert "PodSecurity" not in run.stderr, run.stderr  # the Deployment's pod is "restricted"
    accepted = [line for line in run.stdout.splitlines() if "(server dry run)" in line]
    assert len(accepted) == len(objects), run.stdout


def test_the_crds_folder_is_what_helm_install_applies(cluster):
    """`helm show crds` prints exactly crds/ (Helm's own view of the chart)."""
    shown = helm(cluster, "show", "crds", str(CHART)).stdout
    expected = [yaml.safe_load(p.read_text()) for p in sorted((REPO / "crds").glob("*.yaml"))]
    by_name = sorted(yaml.safe_load_all(shown), key=lambda crd: crd["metadata"]["name"])
    assert by_name == sorted(expected, key=lambda crd: crd["metadata"]["name"])
