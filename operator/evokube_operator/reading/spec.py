"""The parts of an ERLExperiment the operator acts on, read into immutable values.

The API server has already applied the CRD's defaults and rules, so parsing
is mostly renaming. It stays defensive anyway (an older CRD, an object written
before a rule existed): anything that cannot run raises SpecError, which the
reconciler turns into phase Failed, reason InvalidSpec, instead of a crash.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import evokube_contract as contract
from evokube_operator import api
from evokube_operator.reading import placement


class SpecError(ValueError):
    """The experiment cannot run as written; the message names the field."""


@dataclass(frozen=True)
class Accelerator:
    """Where each host runs and how many of them there are."""

    type: str  # cpu | gpu | tpu
    hosts: int  # of one slice
    devices_per_host: int  # cpu: XLA host devices; gpu: GPUs; tpu: chips
    gpu_product: str | None = None
    tpu_type: str | None = None
    tpu_topology: str | None = None
    # TPU slices of this type and topology, joined over the data-center network (multislice:
    # docs/multislice.md); 1 for cpu and gpu, whose gangs over several nodes are `hosts`.
    slices: int = 1

    @property
    def processes(self) -> int:
        """Pods (jax.distributed processes) of all slices."""
        return self.slices * self.hosts


@dataclass(frozen=True)
class Reference:
    """An object of the namespace the trainer pods would use, and the field that names it."""

    kind: str  # Secret | ConfigMap | PersistentVolumeClaim | ServiceAccount
    name: str
    field: str  # spec.env[2].valueFrom.secretKeyRef.name, for the Blocked message


@dataclass(frozen=True)
class ExperimentSpec:
    """What the builders need from spec, with the CRD's defaults filled in."""

    image: str
    accelerator: Accelerator
    image_pull_policy: str = "IfNotPresent"
    suspend: bool = False
    resources: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    affinity: Mapping[str, Any] | None = None
    # spec.placement resolved (placement.exclusive_topology_key): the node label naming the
    # slice the gang has to itself; None: the gang is not exclusive.
    exclusive_topology_key: str | None = None
    priority_class_name: str | None = None
    queue_name: str | None = None  # Kueue LocalQueue: the Job is created suspended
    workload_priority_class_name: str | None = None
    pod_labels: Mapping[str, str] = field(default_factory=dict)
    pod_annotations: Mapping[str, str] = field(default_factory=dict)
    checkpoint_location: str = api.DEFAULT_CHECKPOINT_DIR
    checkpoint_claim: str | None = None
    max_restarts: int = 3
    ttl_seconds_after_finished: int | None = None
    active_deadline_seconds: int | None = None
    metrics_port: int = api.METRICS_PORT
    coordinator_port: int = api.COORDINATOR_PORT
    # Pod settings: the CRD's typed schema has checked them; they reach the pod as written.
    service_account_name: str | None = None  # None: the operator's <name>-trainer
    termination_grace_period_seconds: int | None = None  # None: Kubernetes' 30 s
    image_pull_secrets: tuple[str, ...] = ()
    env: tuple[Mapping[str, Any], ...] = ()
    env_from: tuple[Mapping[str, Any], ...] = ()
    volumes: tuple[Mapping[str, Any], ...] = ()
    volume_mounts: tuple[Mapping[str, Any], ...] = ()

    def references(self) -> list[Reference]:
        """Every object of the namespace the pods would use, each with the field naming it."""
        refs: list[Reference] = []
        if self.service_account_name:
            refs.append(
                Reference("ServiceAccount", self.service_account_name, "spec.serviceAccountName")
            )
        if self.checkpoint_claim:
            field = "spec.checkpoint.volumeClaimName"
            refs.append(Reference("PersistentVolumeClaim", self.checkpoint_claim, field))
        for i, name in enumerate(self.image_pull_secrets):
            refs.append(Reference("Secret", name, f"spec.imagePullSecrets[{i}].name"))
        for i, var in enumerate(self.env):
            source = var.get("valueFrom") or {}
            for key, kind in (("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap")):
                if key in source:
                    field = f"spec.env[{i}].valueFrom.{key}.name"
                    refs.append(Reference(kind, source[key]["name"], field))
        for i, source in enumerate(self.env_from):
            for key, kind in (("secretRef", "Secret"), ("configMapRef", "ConfigMap")):
                if key in source:
                    refs.append(
                        Reference(kind, source[key]["name"], f"spec.envFrom[{i}].{key}.name")
                    )
        for i, volume in enumerate(self.volumes):
            refs.extend(_volume_references(volume, f"spec.volumes[{i}]"))
        return refs


@dataclass(frozen=True)
class Experiment:
    """Identity, spec and status of one ERLExperiment, as read from the API."""

    name: str
    namespace: str
    uid: str
    generation: int
    resource_version: str
    spec: Mapping[str, Any]
    status: Mapping[str, Any]
    deleting: bool = False

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Experiment:
        return cls(
            **identity(body),
            spec=body.get("spec") or {},
            status=body.get("status") or {},
            deleting=bool((body.get("metadata") or {}).get("deletionTimestamp")),
        )


def identity(body: Mapping[str, Any]) -> dict[str, Any]:
    """What an experiment object is known by: name, namespace, uid, generation and
    resourceVersion, read from its metadata (the fields Experiment and the cache share)."""
    meta = body.get("metadata") or {}
    return {
        "name": meta["name"],
        "namespace": meta["namespace"],
        "uid": meta.get("uid", ""),
        "generation": int(meta.get("generation") or 0),
        "resource_version": str(meta.get("resourceVersion") or ""),
    }

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


def _volume_references(volume: Mapping[str, Any], path: str) -> list[Reference]:
    if "persistentVolumeClaim" in volume:
        claim = volume["persistentVolumeClaim"]["claimName"]
        return [
            Reference("PersistentVolumeClaim", claim, f"{path}.persistentVolumeClaim.claimName")
        ]
    if "secret" in volume:
        return [Reference("Secret", volume["secret"]["secretName"], f"{path}.secret.secretName")]
    if "configMap" in volume:
        return [Reference("ConfigMap", volume["configMap"]["name"], f"{path}.configMap.name")]
    if "nodePublishSecretRef" in volume.get("csi", {}):
        secret = volume["csi"]["nodePublishSecretRef"]["name"]
        return [Reference("Secret", secret, f"{path}.csi.nodePublishSecretRef.name")]
    refs = []
    for j, source in enumerate((volume.get("projected") or {}).get("sources") or []):
        for key, kind in (("secret", "Secret"), ("configMap", "ConfigMap")):
            if key in source:
                field = f"{path}.projected.sources[{j}].{key}.name"
                refs.append(Reference(kind, source[key]["name"], field))
    return refs


def _objects(value: Any, path: str) -> tuple[Mapping[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise SpecError(f"spec.{path}: expected a list of objects")
    return tuple(value)


# The CRD's caps on spec.accelerator.tpu.slices and on the hosts of all slices together.
MAX_SLICES = 64
MAX_HOSTS = 4096

# The CRD's maximum for durations: ten years, which datetime arithmetic holds comfortably.
MAX_SECONDS = 315_360_000


def _int(
    value: Any,
    path: str,
    default: int | None = None,
    minimum: int = 0,
    maximum: int = 2**63 - 1,
) -> int | None:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise SpecError(
            f"spec.{path}: expected an integer from {minimum} to {maximum}, got {value!r}"
        )
    return value


def _mapping(value: Any, path: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SpecError(f"spec.{path}: expected an object, got {value!r}")
    return value


def topology_chips(topology: str) -> int:
    """Chips in a TPU topology such as 4x4 or 2x2x4, or SpecError naming the field."""
    try:
        return contract.topology_chips(topology)
    except ValueError:
        raise SpecError(
            f"spec.accelerator.tpu.topology: {topology!r} is not like 4x4 or 2x2x4"
        ) from None


def parse_accelerator(raw: Mapping[str, Any]) -> Accelerator:
    kind = raw.get("type", "cpu")
    hosts = _int(raw.get("hosts"), "accelerator.hosts", minimum=1)
    if kind == "cpu":
        devices = _int(raw.get("devicesPerHost"), "accelerator.devicesPerHost", 1, minimum=1)
        return Accelerator("cpu", hosts or 1, devices or 1)
    if kind == "gpu":
        gpu = _mapping(raw.get("gpu"), "accelerator.gpu")
        count = _int(gpu.get("count"), "accelerator.gpu.count", minimum=1)
        if count is None:
            raise SpecError("spec.accelerator.gpu.count: required when accelerator.type is gpu")
        return Accelerator("gpu", hosts or 1, count, gpu_product=gpu.get("product") or None)
    if kind == "tpu":
        tpu = _mapping(raw.get("tpu"), "accelerator.tpu")
        if not tpu.get("type") or not tpu.get("topology"):
            raise SpecError("spec.accelerator.tpu: type and topology are required for tpu")
        chips_per_host = _int(tpu.get("chipsPerHost"), "accelerator.tpu.chipsPerHost", 4, 1) or 4
        chips = topology_chips(str(tpu["topology"]))
        if chips % chips_per_host:
            raise SpecError(
                f"spec.accelerator.tpu.topology: {chips} chips are not a multiple of "
                f"chipsPerHost {chips_per_host}"
            )
        derived = chips // chips_per_host
        if hosts is not None and hosts != derived:
            raise SpecError(
                f"spec.accelerator.hosts: {hosts} does not match topology {tpu['topology']} "
                f"with {chips_per_host} chips per host ({derived} hosts)"
            )
        slices = _int(tpu.get("slices"), "accelerator.tpu.slices", 1, 1, MAX_SLICES) or 1
        if slices * derived > MAX_HOSTS:
            raise SpecError(
                f"spec.accelerator.tpu.slices: {slices} slices of {derived} hosts are more "
                f"than {MAX_HOSTS} hosts"
            )
        return Accelerator(
            "tpu",
            derived,
            chips_per_host,
            tpu_type=str(tpu["type"]),
            tpu_topology=str(tpu["topology"]),
            slices=slices,
        )
    raise SpecError(f"spec.accelerator.type: unsupported value {kind!r}")


def parse_spec(
    raw: Mapping[str, Any], default_checkpoint_location: str | None = None
) -> ExperimentSpec:
    """The operator's view of spec; raises SpecError for what cannot run. Without
    spec.checkpoint.location (and volumeClaimName), checkpoints go to
    `default_checkpoint_location` when given, else to an emptyDir at api.DEFAULT_CHECKPOINT_DIR."""
    if not isinstance(raw, Mapping):
        raise SpecError("spec: expected an object")
    image = raw.get("image")
    if not isinstance(image, str) or not image.strip():
        raise SpecError("spec.image: a container image is required")
    checkpoint = _mapping(raw.get("checkpoint"), "checkpoint")
    tolerations = raw.get("tolerations") or []
    if not isinstance(tolerations, list) or not all(isinstance(t, Mapping) for t in tolerations):
        raise SpecError("spec.tolerations: expected a list of objects")
    affinity = _mapping(raw.get("affinity"), "affinity")
    _pod_terms_in_own_namespace(affinity)
    accelerator = parse_accelerator(_mapping(raw.get("accelerator"), "accelerator"))
    return ExperimentSpec(
        image=image,
        accelerator=accelerator,
        image_pull_policy=raw.get("imagePullPolicy") or "IfNotPresent",
        suspend=bool(raw.get("suspend", False)),
        resources=_mapping(raw.get("resources"), "resources"),
        node_selector=_mapping(raw.get("nodeSelector"), "nodeSelector"),
        tolerations=tuple(tolerations),
        affinity=affinity or None,
        exclusive_topology_key=_exclusive_topology_key(raw.get("placement"), accelerator),
        priority_class_name=raw.get("priorityClassName") or None,
        queue_name=raw.get("queueName") or None,
        workload_priority_class_name=raw.get("workloadPriorityClassName") or None,
        pod_labels=_mapping(raw.get("podLabels"), "podLabels"),
        pod_annotations=_mapping(raw.get("podAnnotations"), "podAnnotations"),
        # A claim without a location is mounted at the default path, not overridden.
        checkpoint_location=checkpoint.get("location")
        or (None if checkpoint.get("volumeClaimName") else default_checkpoint_location)
        or api.DEFAULT_CHECKPOINT_DIR,
        checkpoint_claim=checkpoint.get("volumeClaimName") or None,
        max_restarts=_int(raw.get("maxRestarts"), "maxRestarts", 3) or 0,
        ttl_seconds_after_finished=_int(
            raw.get("ttlSecondsAfterFinished"), "ttlSecondsAfterFinished", maximum=MAX_SECONDS
        ),
        active_deadline_seconds=_int(
            raw.get("activeDeadlineSeconds"), "activeDeadlineSeconds", None, 1, MAX_SECONDS
        ),
        metrics_port=_int(raw.get("metricsPort"), "metricsPort", api.METRICS_PORT, minimum=1)
        or api.METRICS_PORT,
        coordinator_port=_int(
            raw.get("coordinatorPort"), "coordinatorPort", api.COORDINATOR_PORT, minimum=1
        )
        or api.COORDINATOR_PORT,
        service_account_name=raw.get("serviceAccountName") or None,
        termination_grace_period_seconds=_int(
            raw.get("terminationGracePeriodSeconds"), "terminationGracePeriodSeconds", None, 1, 3600
        ),
        image_pull_secrets=tuple(
            s["name"] for s in _objects(raw.get("imagePullSecrets"), "imagePullSecrets")
        ),
        env=_objects(raw.get("env"), "env"),
        env_from=_objects(raw.get("envFrom"), "envFrom"),
        volumes=_objects(raw.get("volumes"), "volumes"),
        volume_mounts=_objects(raw.get("volumeMounts"), "volumeMounts"),
    )


def _pod_terms_in_own_namespace(affinity: Mapping[str, Any]) -> None:
    """Refuse pod (anti-)affinity terms that select pods of other namespaces: the CRD does, and
    this holds for an experiment stored before it did (docs/security.md, "Scheduling")."""
    for kind in ("podAffinity", "podAntiAffinity"):
        section = _mapping(affinity.get(kind), f"affinity.{kind}")
        required, preferred = (
            _objects(section.get(when), f"affinity.{kind}.{when}")
            for when in (placement.REQUIRED, placement.PREFERRED)
        )
        terms = {f"{placement.REQUIRED}[{i}]": term for i, term in enumerate(required)}
        for i, weighted in enumerate(preferred):
            path = f"{placement.PREFERRED}[{i}].podAffinityTerm"
            terms[path] = _mapping(weighted.get("podAffinityTerm"), f"affinity.{kind}.{path}")
        for path, term in terms.items():
            for key in ("namespaceSelector", "namespaces"):
                value = term.get(key)
                # A namespaceSelector, even {}, selects other namespaces; an empty list, none.
                if value is not None and (key == "namespaceSelector" or value):
                    raise SpecError(
                        f"spec.affinity.{kind}.{path}.{key}: pod affinity and anti-affinity "
                        "terms apply to the experiment's own namespace"
                    )


def _exclusive_topology_key(raw: Any, accelerator: Accelerator) -> str | None:
    placement_spec = _mapping(raw, "placement")
    exclusive = placement_spec.get("exclusive")
    if exclusive is not None and not isinstance(exclusive, bool):
        raise SpecError("spec.placement.exclusive: expected true or false")
    key = placement_spec.get("topologyKey")
    if key is not None and (not isinstance(key, str) or not key):
        raise SpecError("spec.placement.topologyKey: expected a node label key")
    return placement.exclusive_topology_key(placement_spec, accelerator.type, accelerator.hosts)


def experiment_checkpoint_location(default: str | None, namespace: str, name: str) -> str | None:
    """`<default>/<namespace>/<name>`: an experiment's own folder under the operator's default
    checkpoint location (--default-checkpoint-location); None without one."""
    return f"{default.rstrip('/')}/{namespace}/{name}" if default else None


# -- time stamps as Kubernetes writes them ------------------------------------------
def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
