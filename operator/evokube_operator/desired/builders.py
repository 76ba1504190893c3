"""The objects an experiment needs, as pure functions of the experiment.

Nothing here talks to the API server or reads a clock: the same experiment
always gives the same objects, so the reconciler can apply them again and
again (server-side apply) and tests can check them without a cluster.

Names are deterministic, so an operator that restarts finds what it created
before instead of creating it twice; it takes up only objects the experiment
controls (ownership.py), as anybody may take a name first:

| object | name |
|---|---|
| headless Service | `<experiment>` |
| NetworkPolicy (unless turned off) | `<experiment>` |
| ServiceAccount, Role, RoleBinding | `<experiment>-trainer` |
| Indexed Job of attempt n | `<experiment>-<n>` (n = status.attempt) |
| multislice JobSet of attempt n (jobset.py) | `<experiment>-<n>`, Jobs `...-slice-<s>` |
| its manifest ConfigMap | `<experiment>-<n>-manifest` |
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from evokube_operator import api
from evokube_operator.reading import placement
from evokube_operator.reading.spec import Accelerator, Experiment, ExperimentSpec
from evokube_operator.rules import failure
from evokube_operator.util import plain


# -- names -------------------------------------------------------------------------
def service_name(experiment: str) -> str:
    return experiment


def network_policy_name(experiment: str) -> str:
    return experiment


def trainer_account_name(experiment: str) -> str:
    return f"{experiment}-trainer"


def pod_account_name(exp: Experiment, spec: ExperimentSpec) -> str:
    """The account the pods run as: spec.serviceAccountName (opted in), else the operator's."""
    return spec.service_account_name or trainer_account_name(exp.name)


def job_name(experiment: str, attempt: int) -> str:
    return f"{experiment}-{attempt}"


def manifest_name(job: str) -> str:
    """The manifest ConfigMap of the Job `job`: the Job's cleanup finds it by the Job's name."""
    return f"{job}-manifest"


# The JobSet's one replicated Job: one Job per slice, <jobset>-slice-<s> (JobSet's naming).
SLICE_JOB = "slice"


def slice_job_name(experiment: str, attempt: int, slice_id: int | str) -> str:
    """The Job of slice `slice_id` of the attempt's JobSet (`$(VAR)` in an env value works)."""
    return f"{job_name(experiment, attempt)}-{SLICE_JOB}-{slice_id}"


def host_job_name(experiment: str, attempt: int, slices: int, slice_id: int | str = 0) -> str:
    """The Job whose pods are the hosts of slice `slice_id`: the gang's own Job on one slice."""
    if slices == 1:
        return job_name(experiment, attempt)
    return slice_job_name(experiment, attempt, slice_id)


def coordinator_host(experiment: str, attempt: int, slices: int = 1) -> str:
    """Host 0 (of slice 0), by its stable name under the headless Service."""
    return f"{host_job_name(experiment, attempt, slices)}-0.{service_name(experiment)}"


def coordinator_address(experiment: str, attempt: int, port: int, slices: int = 1) -> str:
    return f"{coordinator_host(experiment, attempt, slices)}:{port}"


# -- metadata ------------------------------------------------------------------------
def owner_reference(exp: Experiment) -> dict[str, Any]:
    """Makes the experiment own an object: deleting the experiment deletes it."""
    return {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "name": exp.name,
        "uid": exp.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def common_labels(experiment: str) -> dict[str, str]:
    return {
        api.LABEL_NAME: api.APP_NAME,
        api.LABEL_INSTANCE: experiment,
        api.LABEL_MANAGED_BY: api.MANAGED_BY,
        api.LABEL_EXPERIMENT: experiment,
    }


def gang_selector(experiment: str) -> dict[str, str]:
    """The labels every pod of the experiment's gangs has, whatever the attempt."""
    return {api.LABEL_EXPERIMENT: experiment, api.LABEL_MANAGED_BY: api.MANAGED_BY}


def _metadata(exp: Experiment, name: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": exp.namespace,
        "labels": common_labels(exp.name),
        "ownerReferences": [owner_reference(exp)],
        **extra,
    }


# -- the objects that live as long as the experiment -------------------------------------
def manifest_yaml(exp: Experiment) -> str:
    """The experiment as the trainer reads it from EVOKUBE_MANIFEST."""
    document = {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": exp.name, "namespace": exp.namespace},
        "spec": plain(exp.spec),
    }
    return yaml.safe_dump(document, sort_keys=False)


def manifest_config_map(exp: Experiment, attempt: int) -> dict[str, Any]:
    """The attempt's manifest, created before its Job and deleted with it.

    One object per attempt, not an annotation of the pod template: that copied the spec
    into the Job and every pod, and into each watch cache holding them (benchmarks/README.md).
    """
    name = manifest_name(job_name(exp.name, attempt))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(exp, name, labels=attempt_labels(exp, attempt)),
        "data": {api.MANIFEST_FILE: manifest_yaml(exp)},
    }


def manifest_volume(exp: Experiment, attempt: int) -> dict[str, Any]:
    """The attempt's ConfigMap as the file MANIFEST_FILE: every host of one gang reads the
    same manifest, and a spec edit reaches the next attempt's."""
    item = {"key": api.MANIFEST_FILE, "path": api.MANIFEST_FILE}
    return {
        "name": "manifest",
        "configMap": {"name": manifest_name(job_name(exp.name, attempt)), "items": [item]},
    }


def token_volume() -> dict[str, Any]:
    """The volume kubelet would mount for automountServiceAccountToken, under our own name.

    The same as the chart's MutatingAdmissionPolicy adds to host 0 (templates/admission.yaml).
    """
    return {
        "name": api.TOKEN_VOLUME,
        "projected": {
            "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3600, "path": "token"}},
                {
                    "configMap": {
                        "name": "kube-root-ca.crt",
                        "items": [{"key": "ca.crt", "path": "ca.crt"}],
                    }
                },
                {
                    "downwardAPI": {
                        "items": [
                            {
                                "path": "namespace",
                                "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                            }
                        ]
                    }
                },
            ]
        },
    }


def service(exp: Experiment, spec: ExperimentSpec) -> dict[str, Any]:
    """Headless: gives every pod the DNS name <job>-<index>.<service>, ready or not."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(exp, service_name(exp.name)),
        "spec": {
            "clusterIP": "None",
            # Hosts must find the coordinator before anything is ready.
            "publishNotReadyAddresses": True,
            "selector": gang_selector(exp.name),
            "ports": [
                {
                    "name": api.COORDINATOR_PORT_NAME,
                    "port": spec.coordinator_port,
                    "protocol": "TCP",
                },
                {"name": api.METRICS_PORT_NAME, "port": spec.metrics_port, "protocol": "TCP"},
            ],
        },
    }


@dataclass(frozen=True)
class NetworkAccess:
    """Who may reach an experiment's pods besides its own gang (operator flags, chart values)."""

    # NetworkPolicyPeers allowed on the metrics port (Prometheus); empty: nobody.
    metrics_from: tuple[Mapping[str, Any], ...] = ()


def network_policy(exp: Experiment, spec: ExperimentSpec, access: NetworkAccess) -> dict[str, Any]:
    """Ingress to the gang: from its own pods, from `access.metrics_from` to metrics, nothing else.

    The gang may reach each other on any port, not only the coordinator's:
    collectives (gloo on CPU, NCCL on GPU, DCN between TPU slices) connect host
    to host on ports they choose at run time. Egress stays open: host 0 talks to
    the API server, checkpoints may go to gs://.
    """
    gang = gang_selector(exp.name)
    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": {"matchLabels": gang}}]}]
    if access.metrics_from:  # a rule without `from` would admit everyone
        ingress.append(
            {
                "from": plain(access.metrics_from),
                "ports": [{"port": spec.metrics_port, "protocol": "TCP"}],
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(exp, network_policy_name(exp.name)),
        "spec": {
            "podSelector": {"matchLabels": gang},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def service_account(exp: Experiment) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(exp, trainer_account_name(exp.name)),
    }


def role(exp: Experiment) -> dict[str, Any]:
    """The trainer may read and patch the status of its own experiment, nothing else."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _metadata(exp, trainer_account_name(exp.name)),
        "rules": [
            {
                "apiGroups": [api.GROUP],
                "resources": [f"{api.PLURAL}/status"],
                "resourceNames": [exp.name],
                "verbs": ["get", "patch"],
            }
        ],
    }


def role_binding(exp: Experiment, spec: ExperimentSpec) -> dict[str, Any]:
    """The status Role, granted to the account the pods run as."""
    name = trainer_account_name(exp.name)
    account = pod_account_name(exp, spec)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(exp, name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": exp.namespace}],
    }


def static_objects(
    exp: Experiment, spec: ExperimentSpec, network: NetworkAccess | None = None
) -> list[dict[str, Any]]:
    """Everything but the Job; all of it must exist before the Job (its pods need it).

    `network` None: no NetworkPolicy (the operator's --no-network-policy). With
    spec.serviceAccountName the pods run as that (existing, opted-in) account: no
    ServiceAccount of our own.
    """
    objects = [service(exp, spec)]
    if not spec.service_account_name:
        objects.append(service_account(exp))
    objects += [role(exp), role_binding(exp, spec)]
    if network is not None:
        objects.append(network_policy(exp, spec, network))
    return objects


# -- accelerator specifics ------------------------------------------------------------------
def accelerator_node_selector(acc: Accelerator) -> dict[str, str]:
    if acc.type == "tpu":
        return {
            api.TPU_ACCELERATOR_SELECTOR: acc.tpu_type or "",
            api.TPU_TOPOLOGY_SELECTOR: acc.tpu_topology or "",
        }
    if acc.type == "gpu" and acc.gpu_product:
        return {api.GPU_PRODUCT_SELECTOR: acc.gpu_product}
    return {}


def accelerator_resources(acc: Accelerator) -> dict[str, int]:
    if acc.type == "tpu":
        return {api.TPU_RESOURCE: acc.devices_per_host}
    if acc.type == "gpu":
        return {api.GPU_RESOURCE: acc.devices_per_host}
    return {}


def accelerator_tolerations(acc: Accelerator) -> list[dict[str, str]]:
    """GKE taints accelerator nodes with their resource name (google.com/tpu, nvidia.com/gpu)."""
    resource = {"tpu": api.TPU_RESOURCE, "gpu": api.GPU_RESOURCE}.get(acc.type)
    if resource is None:
        return []
    return [{"key": resource, "operator": "Exists", "effect": "NoSchedule"}]


def security_contexts(acc: Accelerator) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pod, container) security contexts.

    Every pod: no capabilities, no privilege escalation, the runtime's seccomp
    profile and a read-only root filesystem (the trainer writes only to the
    scratch volume at /tmp, its HOME, and to the checkpoint volume). CPU and
    GPU pods also run as the fixed non-root user, so they meet the Pod Security
    Standard "restricted" (NVIDIA's device plugin makes /dev/nvidia* usable by
    any user). TPU pods keep the image's user, root, and so meet "baseline":
    libtpu opens the TPU device files (/dev/accel*, /dev/vfio/*), which GKE's
    TPU device plugin leaves owned by root (docs/security.md).
    """
    pod: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
    container: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }
    if acc.type != "tpu":
        pod = {
            "runAsNonRoot": True,
            "runAsUser": api.TRAINER_UID,
            "runAsGroup": api.TRAINER_UID,
            "fsGroup": api.TRAINER_UID,
            **pod,
        }
    return pod, container


# -- the Job ----------------------------------------------------------------------------------
def trainer_env(exp: Experiment, spec: ExperimentSpec, attempt: int) -> list[dict[str, Any]]:
    """The operator/trainer contract of docs/architecture.md, in a fixed order.

    Only what depends on the pod, the attempt or the operator's settings: what the user wrote
    (and the experiment's name and namespace) reaches the trainer in the manifest alone.
    """
    acc = spec.accelerator
    index = f"metadata.annotations['{api.COMPLETION_INDEX_ANNOTATION}']"
    env: list[dict[str, Any]] = [
        {"name": api.ENV_MANIFEST, "value": api.MANIFEST_PATH},
        {
            "name": api.ENV_COORDINATOR,
            "value": coordinator_address(exp.name, attempt, spec.coordinator_port, acc.slices),
        },
        {"name": api.ENV_NUM_PROCESSES, "value": str(acc.processes)},
        # Within its slice; the trainer adds the slice's (evokube_contract.global_process_id).
        {"name": api.ENV_PROCESS_ID, "valueFrom": {"fieldRef": {"fieldPath": index}}},
        {"name": api.ENV_CHECKPOINT_DIR, "value": spec.checkpoint_location},
        {"name": api.ENV_METRICS_PORT, "value": str(spec.metrics_port)},
        {"name": api.ENV_REPORT_STATUS, "value": "1"},
        {"name": api.ENV_HOME, "value": api.SCRATCH_DIR},
    ]
    if acc.type == "cpu":
        env.append(
            {
                "name": api.ENV_XLA_FLAGS,
                "value": f"--xla_force_host_platform_device_count={acc.devices_per_host}",
            }
        )
    slice_id = placement.SLICE_ID_REF  # resolved by the kubelet from the env var above it
    if acc.slices > 1:  # libtpu joins the slices (placement.py); defines SLICE_ID_REF's variable
        coordinator = coordinator_host(exp.name, attempt, acc.slices)
        env += placement.megascale_env(coordinator, acc.slices)
    if acc.type == "tpu" and acc.hosts > 1:  # libtpu's view of the slice (placement.py)
        job = host_job_name(exp.name, attempt, acc.slices, slice_id)
        env += placement.tpu_worker_env(job, service_name(exp.name), acc.hosts, index)
    return env


def container_resources(spec: ExperimentSpec) -> dict[str, dict[str, Any]]:
    """The user's requests and limits plus the accelerator's resource in both."""
    extra = accelerator_resources(spec.accelerator)
    out: dict[str, dict[str, Any]] = {}
    for kind in ("requests", "limits"):
        merged = {**dict(spec.resources.get(kind) or {}), **extra}
        if merged:
            out[kind] = merged
    return out


def _checkpoint_volume(spec: ExperimentSpec) -> tuple[list[dict], list[dict]]:
    """(volumes, mounts) for a checkpoint path in the pod; none for gs:// and the like."""
    if not spec.checkpoint_location.startswith("/"):
        return [], []
    source: dict[str, Any] = (
        {"persistentVolumeClaim": {"claimName": spec.checkpoint_claim}}
        if spec.checkpoint_claim
        else {"emptyDir": {}}
    )
    return (
        [{"name": "checkpoints", **source}],
        [{"name": "checkpoints", "mountPath": spec.checkpoint_location}],
    )


def attempt_labels(exp: Experiment, attempt: int) -> dict[str, str]:
    return {**common_labels(exp.name), api.LABEL_ATTEMPT: str(attempt)}


def job_labels(exp: Experiment, spec: ExperimentSpec, attempt: int) -> dict[str, str]:
    labels = attempt_labels(exp, attempt)
    if spec.queue_name:
        labels[api.KUEUE_QUEUE_LABEL] = spec.queue_name
        if spec.workload_priority_class_name:
            labels[api.KUEUE_PRIORITY_LABEL] = spec.workload_priority_class_name
    return labels


def pod_labels(exp: Experiment, spec: ExperimentSpec, attempt: int) -> dict[str, str]:
    return {
        **spec.pod_labels,
        **attempt_labels(exp, attempt),
        placement.GANG_LABEL: gang_key(exp, attempt),
    }


def gang_key(exp: Experiment, attempt: int) -> str:
    """The attempt's gang, as exclusive placement names it (placement.GANG_LABEL)."""
    return placement.gang_key(exp.namespace, job_name(exp.name, attempt))


def _tolerations(spec: ExperimentSpec) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = accelerator_tolerations(spec.accelerator)
    for toleration in spec.tolerations:
        if dict(toleration) not in out:
            out.append(dict(toleration))
    return out


def pod_template(
    exp: Experiment,
    spec: ExperimentSpec,
    attempt: int,
    trainer_token: str = api.TOKEN_HOST_0,
    exclusive_topology_key: str | None = None,
) -> dict[str, Any]:
    """The pod template of every trainer host, on one slice or many (jobset.py).

    `exclusive_topology_key`: the slice the gang keeps to itself by pod (anti-)affinity terms
    (placement.py); None where nothing or JobSet's exclusive-topology annotation does it.
    """
    acc = spec.accelerator
    pod_security, container_security = security_contexts(acc)
    checkpoint_volumes, checkpoint_mounts = _checkpoint_volume(spec)
    # Where no MutatingAdmissionPolicy can give host 0 alone a token (before Kubernetes 1.36).
    token_volumes, token_mounts = [], []
    if trainer_token == api.TOKEN_EVERY_HOST:
        token_volumes = [token_volume()]
        token_mounts = [{"name": api.TOKEN_VOLUME, "mountPath": api.TOKEN_DIR, "readOnly": True}]
    container: dict[str, Any] = {
        "name": api.CONTAINER,
        "image": spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": list(api.TRAINER_COMMAND),
        # The contract's variables first; spec.env may not name them (the CRD refuses it).
        "env": [*trainer_env(exp, spec, attempt), *plain(spec.env)],
        "ports": [
            {
                "name": api.COORDINATOR_PORT_NAME,
                "containerPort": spec.coordinator_port,
                "protocol": "TCP",
            },
            {"name": api.METRICS_PORT_NAME, "containerPort": spec.metrics_port, "protocol": "TCP"},
        ],
        "volumeMounts": [
            {"name": "manifest", "mountPath": api.MANIFEST_DIR, "readOnly": True},
            {"name": "scratch", "mountPath": api.SCRATCH_DIR},
            *checkpoint_mounts,
            *token_mounts,
            *plain(spec.volume_mounts),
        ],
        "securityContext": container_security,
        # A trainer that fails says why in its last log lines; status shows them.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if spec.env_from:  # env, the contract's above all, wins over envFrom
        container["envFrom"] = plain(spec.env_from)
    resources = container_resources(spec)
    if resources:
        container["resources"] = resources
    pod_spec: dict[str, Any] = {
        "subdomain": service_name(exp.name),
        "restartPolicy": "Never",
        "serviceAccountName": pod_account_name(exp, spec),
        # Only host 0 reports status: the chart's MutatingAdmissionPolicy mounts a token
        # into the pod of completion index 0 alone, or (TOKEN_EVERY_HOST) the chart's
        # ValidatingAdmissionPolicy refuses the other hosts' writes (docs/security.md).
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security,
        "containers": [container],
        "volumes": [
            manifest_volume(exp, attempt),
            {"name": "scratch", "emptyDir": {}},
            *checkpoint_volumes,
            *token_volumes,
            *plain(spec.volumes),
        ],
    }
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": name} for name in spec.image_pull_secrets]
    if spec.termination_grace_period_seconds is not None:
        pod_spec["terminationGracePeriodSeconds"] = spec.termination_grace_period_seconds
    node_selector = {**spec.node_selector, **accelerator_node_selector(acc)}
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    tolerations = _tolerations(spec)
    if tolerations:
        pod_spec["tolerations"] = tolerations
    # The user's affinity, plus one slice to itself for an exclusive gang (placement.py).
    affinity = placement.pod_affinity(spec.affinity, gang_key(exp, attempt), exclusive_topology_key)
    if affinity:
        pod_spec["affinity"] = affinity
    if spec.priority_class_name:
        pod_spec["priorityClassName"] = spec.priority_class_name
    template_meta: dict[str, Any] = {"labels": pod_labels(exp, spec, attempt)}
    if spec.pod_annotations:
        template_meta["annotations"] = dict(spec.pod_annotations)
    return {"metadata": template_meta, "spec": pod_spec}


def indexed_job_spec(
    spec: ExperimentSpec, template: Mapping[str, Any], active_deadline_seconds: int | None
) -> dict[str, Any]:
    """One slice's Indexed Job: one pod per host, all or nothing."""
    hosts = spec.accelerator.hosts
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": hosts,
        "parallelism": hosts,
        "backoffLimit": 0,
        "podFailurePolicy": failure.pod_failure_policy(),
        "template": template,
    }
    if active_deadline_seconds is not None:
        job_spec["activeDeadlineSeconds"] = max(1, int(active_deadline_seconds))
    return job_spec


def gang_metadata(exp: Experiment, spec: ExperimentSpec, attempt: int) -> dict[str, Any]:
    """The metadata of an attempt's gang object: its Job, or its JobSet (jobset.py)."""
    return _metadata(exp, job_name(exp.name, attempt), labels=job_labels(exp, spec, attempt))


def job(
    exp: Experiment,
    spec: ExperimentSpec,
    attempt: int,
    active_deadline_seconds: int | None = None,
    trainer_token: str = api.TOKEN_HOST_0,
) -> dict[str, Any]:
    """The Indexed Job of one gang attempt on one slice."""
    template = pod_template(exp, spec, attempt, trainer_token, spec.exclusive_topology_key)
    job_spec = indexed_job_spec(spec, template, active_deadline_seconds)
    if spec.queue_name:  # Kueue admits it (unsuspends) when the whole gang fits its quota
        job_spec["suspend"] = True
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": gang_metadata(exp, spec, attempt),
        "spec": job_spec,
    }
