"""Pod settings of the spec (serviceAccountName, env, envFrom, volumes, volumeMounts,
imagePullSecrets, terminationGracePeriodSeconds): how the builders put them into the pod, and
that what they use of the namespace must opt in (docs/security.md), on the real control plane."""

from pathlib import Path

import pytest
import yaml

from evokube_operator import api as evokube
from evokube_operator.desired import builders
from evokube_operator.reading.ownership import listing_blocker, opt_in_blocker
from evokube_operator.reading.spec import Reference, parse_spec
from tests.helm.chart import trainer_token_mode
from tests.operator.conftest import experiment_manifest
from tests.operator.factories import experiment

REPO = Path(__file__).resolve().parents[2]
WANDB_KEY = {"name": "WANDB_API_KEY", "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "k"}}}
SHM = {"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}
SETTINGS = {
    "serviceAccountName": "wi-trainer",
    "terminationGracePeriodSeconds": 120,
    "imagePullSecrets": [{"name": "registry"}],
    "env": [{"name": "NCCL_DEBUG", "value": "INFO"}, WANDB_KEY],
    "envFrom": [{"prefix": "RUN_", "configMapRef": {"name": "run"}}],
    "volumes": [
        SHM,
        {"name": "data", "persistentVolumeClaim": {"claimName": "data", "readOnly": True}},
        {"name": "conf", "configMap": {"name": "conf"}},
        {
            "name": "keys",
            "projected": {"sources": [{"secret": {"name": "gcs"}}, {"configMap": {"name": "ca"}}]},
        },
        {"name": "bucket", "csi": {"driver": "d.example", "nodePublishSecretRef": {"name": "csi"}}},
    ],
    "volumeMounts": [
        {"name": "shm", "mountPath": "/dev/shm"},
        {"name": "data", "mountPath": "/data", "readOnly": True},
        {"name": "conf", "mountPath": "/etc/trainer"},
        {"name": "keys", "mountPath": "/var/keys"},
        {"name": "bucket", "mountPath": "/bucket"},
    ],
}


def test_the_pod_gets_the_settings_after_the_operators_own():
    exp = experiment(**SETTINGS)
    spec = parse_spec(exp.spec)
    pod = builders.job(exp, spec, 0)["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    contract = builders.trainer_env(exp, spec, 0)
    assert container["env"] == [*contract, *SETTINGS["env"]]  # the contract first
    assert container["envFrom"] == SETTINGS["envFrom"]
    assert container["volumeMounts"][-5:] == SETTINGS["volumeMounts"]
    assert [v["name"] for v in pod["volumes"]] == [
        "manifest", "scratch", "checkpoints", "shm", "data", "conf", "keys", "bucket",
    ]  # fmt: skip
    assert pod["serviceAccountName"] == "wi-trainer"
    assert pod["automountServiceAccountToken"] is False  # still only host 0 gets a token
    assert pod["imagePullSecrets"] == [{"name": "registry"}]
    assert pod["terminationGracePeriodSeconds"] == 120
    pod_security, container_security = builders.security_contexts(spec.accelerator)
    assert (pod["securityContext"], container["securityContext"]) == (
        pod_security,
        container_security,
    )


def test_without_settings_the_pod_is_as_before():
    exp = experiment()
    pod = builders.job(exp, parse_spec(exp.spec), 0)["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "demo-trainer"
    assert "envFrom" not in pod["containers"][0]
    assert not {"imagePullSecrets", "terminationGracePeriodSeconds"} & set(pod)


def test_an_existing_account_is_bound_and_none_is_created():
    exp = experiment(serviceAccountName="wi-trainer")
    spec = parse_spec(exp.spec)
    objects = builders.static_objects(exp, spec)
    assert "ServiceAccount" not in {o["kind"] for o in objects}
    (binding,) = [o for o in objects if o["kind"] == "RoleBinding"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "wi-trainer", "namespace": "ns"}
    ]
    assert binding["roleRef"]["name"] == "demo-trainer"  # the experiment's own Role


def test_every_reference_names_its_field():
    spec = parse_spec(
        experiment(**SETTINGS, checkpoint={"location": "/ckpt", "volumeClaimName": "ckpt"}).spec
    )
    assert spec.references() == [
        Reference("ServiceAccount", "wi-trainer", "spec.serviceAccountName"),
        Reference("PersistentVolumeClaim", "ckpt", "spec.checkpoint.volumeClaimName"),
        Reference("Secret", "registry", "spec.imagePullSecrets[0].name"),
        Reference("Secret", "wandb", "spec.env[1].valueFrom.secretKeyRef.name"),
        Reference("ConfigMap", "run", "spec.envFrom[0].configMapRef.name"),
        Reference(
            "PersistentVolumeClaim", "data", "spec.volumes[1].persistentVolumeClaim.claimName"
        ),
        Reference("ConfigMap", "conf", "spec.volumes[2].configMap.name"),
        Reference("Secret", "gcs", "spec.volumes[3].projected.sources[0].secret.name"),
        Reference("ConfigMap", "ca", "spec.volumes[3].projected.sources[1].configMap.name"),
        Reference("Secret", "csi", "spec.volumes[4].csi.nodePublishSecretRef.name"),
    ]


ACCOUNT = Reference("ServiceAccount", "wi-trainer", "spec.serviceAccountName")


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (None, "spec.serviceAccountName: ServiceAccount wi-trainer does not exist"),
        ({"metadata": {}}, "spec.serviceAccountName: ServiceAccount wi-trainer lacks the label"),
        (
            {"metadata": {"labels": {evokube.LABEL_TRAINER_ACCOUNT: "yes"}}},
            "ServiceAccount wi-trainer lacks the label",
        ),
    ],
)
def test_an_account_must_opt_in_with_its_label(body, said):
    blocker = opt_in_blocker(ACCOUNT, body)
    assert blocker is not None and blocker.reason == evokube.REASON_ACCOUNT_NOT_ALLOWED
    assert said in blocker.message and evokube.LABEL_TRAINER_ACCOUNT in blocker.message
    opted_in = {"metadata": {"labels": {evokube.LABEL_TRAINER_ACCOUNT: "true"}}}
    assert opt_in_blocker(ACCOUNT, opted_in) is None


def test_secrets_and_config_maps_must_be_listed_by_the_namespace():
    refs = parse_spec(experiment(**SETTINGS).spec).references()
    listed = {
        evokube.ANNOTATION_TRAINER_SECRETS: "registry, wandb,gcs ,csi",
        evokube.ANNOTATION_TRAINER_CONFIGMAPS: "run,conf,ca",
    }
    assert listing_blocker(refs, {"metadata": {"annotations": listed}}) is None
    listed[evokube.ANNOTATION_TRAINER_SECRETS] = "registry,gcs,csi,wandb-other"
    blocker = listing_blocker(refs, {"metadata": {"annotations": listed}})
    assert blocker is not None and blocker.reason == evokube.REASON_REFERENCE_NOT_ALLOWED
    assert blocker.message.startswith(
        "spec.env[1].valueFrom.secretKeyRef.name: Secret wandb is not listed in the namespace's "
        f"annotation {evokube.ANNOTATION_TRAINER_SECRETS}"
    )
    nothing_listed = listing_blocker(refs, {"metadata": {}})
    assert nothing_listed is not None and nothing_listed.message.count("is not listed") == 7


# -- on the real control plane ---------------------------------------------------------------
def blocked(k8s, namespace, name):
    condition = k8s.condition(namespace, name, evokube.COND_BLOCKED)
    return condition if condition and condition["status"] == "True" else None


def blocked_saying(k8s, namespace, name, text):
    return k8s.wait(
        lambda: (c := blocked(k8s, namespace, name)) and text in c["message"] and c,
        f"{name} Blocked, saying {text!r}",
    )


def can_patch_status(cluster, namespace, account, experiment_name):
    run = cluster.kubectl(
        "auth", "can-i", "patch", f"erlexperiments.evokube.io/{experiment_name}",
        "--subresource=status", "-n", namespace,
        f"--as=system:serviceaccount:{namespace}:{account}", check=False,
    )  # fmt: skip
    return run.stdout.strip() == "yes"


@pytest.mark.cluster
def test_pods_run_as_an_existing_account_only_once_it_opts_in(k8s, cluster, namespace):
    k8s.apply(experiment_manifest("wi", namespace, serviceAccountName="wi-trainer"))
    condition = blocked_saying(k8s, namespace, "wi", "ServiceAccount wi-trainer does not exist")
    assert condition["reason"] == evokube.REASON_ACCOUNT_NOT_ALLOWED
    annotation = {"iam.gke.io/gcp-service-account": "wi@project.iam.gserviceaccount.com"}
    account = {"metadata": {"name": "wi-trainer", "annotations": annotation}}
    k8s.core.create_namespaced_service_account(namespace, account)
    blocked_saying(k8s, namespace, "wi", "lacks the label")
    assert not k8s.jobs(namespace, "wi")
    assert not can_patch_status(cluster, namespace, "wi-trainer", "wi")  # nothing bound yet
    label = {"metadata": {"labels": {evokube.LABEL_TRAINER_ACCOUNT: "true"}}}
    k8s.core.patch_namespaced_service_account("wi-trainer", namespace, label)
    k8s.wait_running_gang(namespace, "wi", 1, timeout=60)
    (job,) = k8s.jobs(namespace, "wi")
    assert job.spec.template.spec.service_account_name == "wi-trainer"
    accounts = {a.metadata.name for a in k8s.core.list_namespaced_service_account(namespace).items}
    assert accounts == {"default", "wi-trainer"}  # no wi-trainer of the operator's making
    assert can_patch_status(cluster, namespace, "wi-trainer", "wi")
    assert not can_patch_status(cluster, namespace, "wi-trainer", "other")
    ours = k8s.core.read_namespaced_service_account("wi-trainer", namespace)
    assert not ours.metadata.owner_references  # still the namespace's, untouched
    cleared = k8s.condition(namespace, "wi", evokube.COND_BLOCKED)
    assert (cleared["status"], cleared["reason"]) == ("False", evokube.REASON_UNBLOCKED)


@pytest.mark.cluster
def test_secrets_and_config_maps_reach_the_pods_only_while_the_namespace_lists_them(
    k8s, cluster, namespace
):
    listing = {
        evokube.ANNOTATION_TRAINER_SECRETS: "wandb,registry",
        evokube.ANNOTATION_TRAINER_CONFIGMAPS: "run",
    }
    k8s.core.patch_namespace(namespace, {"metadata": {"annotations": listing}})
    settings = {
        "imagePullSecrets": [{"name": "registry"}],
        "env": [WANDB_KEY],
        "envFrom": [{"configMapRef": {"name": "run"}}],
        "volumes": [SHM, {"name": "key", "secret": {"secretName": "wandb"}}],
        "volumeMounts": [
            {"name": "shm", "mountPath": "/dev/shm"},
            {"name": "key", "mountPath": "/var/wandb", "readOnly": True},
        ],
        "terminationGracePeriodSeconds": 300,
    }
    k8s.apply(experiment_manifest("s", namespace, maxRestarts=3, **settings))
    k8s.wait_running_gang(namespace, "s", 1)
    (job,) = k8s.jobs(namespace, "s")
    pod = job.spec.template.spec
    assert pod.containers[0].env[-1].value_from.secret_key_ref.name == "wandb"
    assert pod.containers[0].env_from[0].config_map_ref.name == "run"
    assert {v.name for v in pod.volumes} >= {"shm", "key"}
    assert pod.image_pull_secrets[0].name == "registry"
    assert pod.termination_grace_period_seconds == 300
    # The namespace takes the Secret back: the next attempt waits, Blocked, naming it.
    revoked = {evokube.ANNOTATION_TRAINER_SECRETS: "registry"}
    k8s.core.patch_namespace(namespace, {"metadata": {"annotations": revoked}})
    (pod_0,) = k8s.running_pods(namespace, "s", "s-0")
    k8s.exit_pod(namespace, pod_0.metadata.name, evokube.EXIT_RETRIABLE)
    condition = blocked_saying(k8s, namespace, "s", "Secret wandb is not listed")
    assert condition["reason"] == evokube.REASON_REFERENCE_NOT_ALLOWED
    assert "spec.env[0].valueFrom.secretKeyRef.name" in condition["message"]
    assert "spec.volumes[1].secret.secretName" in condition["message"]
    assert "s-1" not in [j.metadata.name for j in k8s.jobs(namespace, "s")]
    k8s.core.patch_namespace(namespace, {"metadata": {"annotations": listing}})
    k8s.wait_running_gang(namespace, "s", 1, timeout=60)
    assert [j.metadata.name for j in k8s.jobs(namespace, "s")] == ["s-1"]


@pytest.mark.cluster
def test_the_documented_example_runs_once_the_namespace_opted_in(k8s, cluster, namespace):
    example = yaml.safe_load((REPO / "examples" / "pod-settings-gpu.yaml").read_text())
    example["metadata"]["namespace"] = namespace
    run = k8s.apply(example, check=False)  # the namespace lists nothing yet
    assert run.returncode != 0 and "spec.env: Secret wandb is not listed" in run.stderr
    account = {
        "metadata": {"name": "trainer-gcs", "labels": {evokube.LABEL_TRAINER_ACCOUNT: "true"}}
    }
    k8s.core.create_namespaced_service_account(namespace, account)
    listing = {
        evokube.ANNOTATION_TRAINER_SECRETS: "wandb,registry",
        evokube.ANNOTATION_TRAINER_CONFIGMAPS: "nccl-tuning",
    }
    k8s.core.patch_namespace(namespace, {"metadata": {"annotations": listing}})
    k8s.apply(example)
    name = example["metadata"]["name"]
    k8s.wait_running_gang(namespace, name, 1, timeout=60)
    (job,) = k8s.jobs(namespace, name)
    pod = job.spec.template.spec
    assert pod.service_account_name == "trainer-gcs"
    assert pod.termination_grace_period_seconds == 120
    (shm,) = [v for v in pod.volumes if v.name == "shm"]
    assert (shm.empty_dir.medium, shm.empty_dir.size_limit) == ("Memory", "8Gi")
    env = [e.name for e in pod.containers[0].env]
    assert env[-3:] == ["XLA_FLAGS", "NCCL_DEBUG", "WANDB_API_KEY"]


@pytest.mark.cluster
def test_every_setting_passes_pod_security_restricted_once_everything_opted_in(
    k8s, cluster, namespace
):
    """A claim in spec.volumes opts in like the checkpoint claim; then the API server's
    PodSecurity admission ("restricted") creates the gang's pods with every setting, and
    host 0 gets a token (every host, before Kubernetes 1.36), of the account named."""
    every_host = trainer_token_mode(cluster) == evokube.TOKEN_EVERY_HOST
    k8s.core.patch_namespace(
        namespace,
        {
            "metadata": {
                "labels": {"pod-security.kubernetes.io/enforce": "restricted"},
                "annotations": {
                    evokube.ANNOTATION_TRAINER_SECRETS: "registry,wandb,gcs,csi",
                    evokube.ANNOTATION_TRAINER_CONFIGMAPS: "run,conf,ca",
                },
            }
        },
    )
    account = {
        "metadata": {"name": "wi-trainer", "labels": {evokube.LABEL_TRAINER_ACCOUNT: "true"}}
    }
    k8s.core.create_namespaced_service_account(namespace, account)
    claim = {
        "metadata": {"name": "data"},
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "storageClassName": "",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    k8s.core.create_namespaced_persistent_volume_claim(namespace, claim)
    hosts = {"type": "cpu", "hosts": 2}
    k8s.apply(experiment_manifest("all", namespace, accelerator=hosts, **SETTINGS))
    condition = blocked_saying(
        k8s, namespace, "all", "spec.volumes[1].persistentVolumeClaim.claimName: "
        "PersistentVolumeClaim data lacks the label",
    )  # fmt: skip
    assert condition["reason"] == evokube.REASON_CLAIM_NOT_ALLOWED
    label = {"metadata": {"labels": {evokube.LABEL_CHECKPOINT_CLAIM: "true"}}}
    k8s.core.patch_namespaced_persistent_volume_claim("data", namespace, label)
    # The claim is not bound (no storage here): the pods are created, not scheduled.
    pods = k8s.wait(lambda: len(p := k8s.pods(namespace, "all")) == 2 and p, "2 pods", timeout=60)
    for pod in pods:
        index = pod.metadata.labels["batch.kubernetes.io/job-completion-index"]
        assert pod.spec.service_account_name == "wi-trainer"
        volumes = {v.name for v in pod.spec.volumes}
        assert {"shm", "data", "conf", "keys", "bucket"} <= volumes
        # Host 0's alone, or every host's where no MutatingAdmissionPolicy is served.
        assert ("evokube-api-access" in volumes) == (index == "0" or every_host)
