"""The chart's experiment policy (values `policy`), judged by the real API server.

The policy is rendered for a release watching one throwaway namespace, so its
binding covers that namespace alone; every refusal must name the field.
"""

from __future__ import annotations

import pytest
import yaml

from tests.cluster.controlplane import wait_until
from tests.helm.chart import ADMISSION_TEMPLATE, OWN_RELEASE_LABEL, documents, render
from tests.operator.conftest import experiment_manifest

pytestmark = pytest.mark.cluster

VALUES = {
    "policy": {
        "allowedImages": ["ghcr.io/evokube/", "registry.example/rl/"],
        "allowedPriorityClasses": ["team-low", "team-high"],
        "allowedWorkloadPriorityClasses": ["sweep"],
        "allowedTolerationKeys": ["dedicated", "google.com/tpu"],
        "allowedCSIDrivers": ["gcsfuse.csi.storage.gke.io"],
    },
    # Only the experiment policy matters here.
    "admission": {"trainerToken": False, "statusGuard": False},
}
ONLY_THE_EXPERIMENT_POLICY = {"admission": VALUES["admission"]}
FUSE = {"name": "fuse", "csi": {"driver": "gcsfuse.csi.storage.gke.io"}}


def csi(driver: str) -> dict:
    return {"name": "v", "csi": {"driver": driver, "volumeAttributes": {"a": "b"}}}


def police(cluster, make_namespace, values) -> tuple[str, str]:
    """A new namespace under the experiment policy rendered from `values` alone:
    (namespace, the policy's YAML, for deleting it)."""
    namespace = make_namespace("policed")
    cluster.kubectl("label", "namespace", namespace, f"{OWN_RELEASE_LABEL}=policy")
    release = f"evokube-{namespace}"
    policy = render(
        cluster,
        release,
        "evokube-system",
        {**values, "watchNamespaces": [namespace]},
        show_only=[ADMISSION_TEMPLATE],
    )
    cluster.kubectl("apply", "-f", "-", input=policy)

    def unlisted_driver_refused():  # no values list it
        # By this release's policy: a policy of another test's release, still going, or
        # a CRD not yet served would fail the probe too.
        probe = experiment_manifest("probe", namespace, volumes=[csi("probe.invalid")])
        run = apply(cluster, probe, dry_run=True)
        return run.returncode != 0 and f"{release}-experiment-policy" in run.stderr

    wait_until(unlisted_driver_refused, 30, "the experiment policy to take effect")
    return namespace, policy


@pytest.fixture
def policed(cluster, crd, make_namespace):
    """A namespace under the policy of VALUES; the policy goes with the test."""
    namespace, policy = police(cluster, make_namespace, VALUES)
    yield namespace
    cluster.kubectl("delete", "-f", "-", "--wait=false", input=policy, check=False)


def apply(cluster, manifest, dry_run=False):
    args = ["apply", "-f", "-"] + (["--dry-run=server"] if dry_run else [])
    return cluster.kubectl(*args, input=yaml.safe_dump(manifest), check=False)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"image": "docker.io/evil/miner:1"},
            "spec.image: docker.io/evil/miner:1 does not start with an allowed prefix "
            "(ghcr.io/evokube/, registry.example/rl/)",
        ),
        (
            {"image": "ghcr.io/evokube-x/trainer:1"},
            "spec.image: ghcr.io/evokube-x/trainer:1 does not start with an allowed prefix",
        ),
        (
            {"priorityClassName": "team-urgent"},
            "spec.priorityClassName: team-urgent is not allowed (allowed: team-low, team-high)",
        ),
        (
            {"queueName": "research", "workloadPriorityClassName": "paper"},
            "spec.workloadPriorityClassName: paper is not allowed (allowed: sweep)",
        ),
        (
            {"tolerations": [{"key": "example.com/reserved", "operator": "Exists"}]},
            "spec.tolerations: only the keys dedicated, google.com/tpu may be tolerated",
        ),
        (
            {"volumes": [FUSE, csi("evil.csi.example")]},
            "spec.volumes[1].csi.driver: evil.csi.example: the chart value "
            "policy.allowedCSIDrivers lists gcsfuse.csi.storage.gke.io",
        ),
    ],
    ids=[
        "image",
        "image-prefix-lookalike",
        "other-class",
        "other-workload-class",
        "taint",
        "csi-driver",
    ],
)
def test_the_policy_refuses_what_the_values_do_not_allow(cluster, policed, spec, message):
    run = apply(cluster, experiment_manifest("refused", policed, **spec))
    assert run.returncode != 0
    assert message in run.stderr, run.stderr
    assert "ValidatingAdmissionPolicy" in run.stderr


def test_the_policy_admits_what_the_values_allow_and_judges_each_spec_change(cluster, policed):
    allowed = experiment_manifest(
        "allowed",
        policed,
        image="registry.example/rl/trainer:2",
        priorityClassName="team-high",
        queueName="research",
        workloadPriorityClassName="sweep",
        tolerations=[{"key": "dedicated", "operator": "Equal", "value": "rl"}],
        volumes=[FUSE],
        suspend=True,
    )
    assert apply(cluster, allowed).returncode == 0
    changed = {**allowed, "spec": {**allowed["spec"], "image": "quay.io/other/trainer:2"}}
    run = apply(cluster, changed)
    assert run.returncode != 0 and "spec.image: quay.io/other/trainer:2" in run.stderr


# -- rendered ------------------------------------------------------------------------------------
def test_the_policies_cover_the_watched_namespaces_and_trust_the_charts_operator(cluster):
    values = {"watchNamespaces": ["team-a"], "serviceAccount": {"name": "evk-sa"}}
    objects = documents(render(cluster, "rl", "ops", values))
    bindings = {o["metadata"]["name"]: o for o in objects if o["kind"].endswith("PolicyBinding")}
    assert sorted(bindings) == [
        "rl-evokube-experiment-policy",
        "rl-evokube-status-guard",
        "rl-evokube-trainer-token",
    ]
    for binding in bindings.values():
        assert binding["spec"]["policyName"] == binding["metadata"]["name"]
        assert binding["spec"]["matchResources"]["namespaceSelector"] == {
            "matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a"]}
            ]
        }
    (guard,) = [
        o
        for o in objects
        if o["kind"] == "ValidatingAdmissionPolicy" and "guard" in o["metadata"]["name"]
    ]
    (condition,) = guard["spec"]["matchConditions"]
    assert '"system:serviceaccount:ops:evk-sa"' in condition["expression"]
    (fence,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    assert fence["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"] == (
        "evokube-operator"
    )
    assert fence["spec"]["ingress"] == [
        {
            "from": [
                {
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": "monitoring"}
                    }
                }
            ],
            "ports": [{"port": "metrics", "protocol": "TCP"}],
        }
    ]


def test_turned_off_the_chart_installs_no_token_policy_guard_or_network_policy(cluster):
    values = {
        "admission": {"trainerToken": False, "statusGuard": False},
        "networkPolicy": {"enabled": False, "metricsFrom": []},
    }
    objects = documents(render(cluster, "evokube", "evokube-system", values))
    names = {o["metadata"]["name"] for o in objects if "Admission" in o["kind"]}
    assert names == {"evokube-experiment-policy"}
    assert not [o for o in objects if o["kind"] == "NetworkPolicy"]
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--no-network-policy" in args
    assert "--trainer-token=none" in args  # the operator says so on every experiment
    assert not [a for a in args if a.startswith("--metrics-from")]


def test_secrets_and_config_maps_the_namespace_does_not_list_are_refused(cluster, policed):
    """The operator cannot read Secrets, and the author may not: the namespace's annotations
    say which ones (and which ConfigMaps) its experiments may put into their pods."""
    cluster.kubectl(
        "annotate", "namespace", policed,
        "evokube.io/trainer-secrets=wandb, registry", "evokube.io/trainer-configmaps=run",
    )  # fmt: skip
    wandb = {"name": "K", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "k"}}}
    listed = {
        "env": [wandb],
        "envFrom": [{"configMapRef": {"name": "run"}}],
        "imagePullSecrets": [{"name": "registry"}],
        "volumes": [{"name": "p", "projected": {"sources": [{"secret": {"name": "wandb"}}]}}],
    }
    assert (
        apply(cluster, experiment_manifest("listed", policed, **listed), dry_run=True).returncode
        == 0
    )
    for spec, message in [
        (
            {
                "env": [
                    wandb,
                    {"name": "D", "valueFrom": {"secretKeyRef": {"name": "db", "key": "p"}}},
                ]
            },
            "spec.env: Secret db is not listed in the namespace annotation "
            "evokube.io/trainer-secrets",
        ),
        (
            {"volumes": [{"name": "c", "configMap": {"name": "other"}}]},
            "spec.volumes: ConfigMap other is not listed in the namespace annotation "
            "evokube.io/trainer-configmaps",
        ),
        (
            {"envFrom": [{"secretRef": {"name": "db"}}], "imagePullSecrets": [{"name": "pull"}]},
            "spec.imagePullSecrets: Secret pull is not listed in the namespace annotation "
            "evokube.io/trainer-secrets; spec.envFrom: Secret db is not listed",
        ),
        (
            {"volumes": [{"name": "p", "projected": {"sources": [{"secret": {"name": "db"}}]}}]},
            "spec.volumes: a projected volume names a Secret or ConfigMap not listed",
        ),
    ]:
        run = apply(cluster, experiment_manifest("unlisted", policed, **spec), dry_run=True)
        assert run.returncode != 0 and message in run.stderr, run.stderr


def test_by_default_no_csi_volume_is_admitted(cluster, crd, make_namespace):
    """An inline CSI volume runs the driver on the node with the author's attributes: the chart
    allows none until policy.allowedCSIDrivers lists the drivers the cluster trusts."""
    namespace, policy = police(cluster, make_namespace, ONLY_THE_EXPERIMENT_POLICY)
    try:
        run = apply(cluster, experiment_manifest("fuse", namespace, volumes=[FUSE]))
        assert run.returncode != 0
        assert (
            "spec.volumes[0].csi.driver: gcsfuse.csi.storage.gke.io: the chart value "
            "policy.allowedCSIDrivers lists no CSI driver"
        ) in run.stderr, run.stderr
        assert apply(cluster, experiment_manifest("plain", namespace)).returncode == 0
    finally:
        cluster.kubectl("delete", "-f", "-", "--wait=false", input=policy, check=False)
