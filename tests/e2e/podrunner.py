"""A kubelet for tests: the pods bound to one node pool run as local processes.

No container runtime runs on our CI machines, and kwok only pretends. For the
end-to-end tests something must really run the operator and the trainers, so
`PodRunner` plays kubelet for a small pool of nodes of its own (they carry no
kwok annotation; kwok keeps every other pool):

- it registers the nodes, keeps them Ready and renews their Leases;
- it takes the pods the scheduler binds to them, materializes their volumes in
  a folder per pod and runs the container's `command` + `args` as a local
  process, the project's virtual environment first on PATH (the "image");
- it reports what happens through the API server, as kubelet does: phase
  Running with the container running (Ready once its readiness probe passes),
  then terminated with the exit code (128 + signal when killed) and phase
  Succeeded or Failed; `restartPolicy: Always` and `OnFailure` restart the
  container (restartCount + 1);
- a pod being deleted (an eviction too) gets SIGTERM, then SIGKILL after its
  grace period; its final status is reported, then the pod deleted for good.

Where a pod and a local process differ, the runner bridges the gap:

- network: every pod has its own port space, the machine has one. Each
  declared `containerPort` gets a free loopback port; env values and args equal
  to that port number (also `--flag=<port>`) are rewritten to it.
- DNS: `<hostname>.<subdomain>[.<namespace>.svc...]:<port>` (a pod under a
  headless Service, e.g. the JAX coordinator) in env values and args becomes
  `127.0.0.1:<that pod's local port for port>`.
- volumes: each is a folder under the runner's work folder (a PVC: its PV's
  `hostPath`); env values and args under a `mountPath` are rewritten.
- env: `$(VAR)` in a value is expanded from the variables declared before it, as
  kubelet does (`$$` is a literal `$`); a fieldRef may name any label or annotation
  (JobSet's `jobset.sigs.k8s.io/job-index`, a Job's completion index).
- API access: instead of in-cluster config (`KUBERNETES_SERVICE_*` and the
  token at a fixed path), `KUBECONFIG` names the same bound ServiceAccount token
  and CA (minted through TokenRequest, as kubelet does) and the API server's
  loopback address.
- image, `securityContext`, resources: ignored; the process runs as the test's
  user, from the virtual environment. BestEffort pods (no requests) run at
  nice 10: kubelet gives them the least CPU too.
- probes: only `readinessProbe.httpGet`, each second until ready, then every
  `periodSeconds`.

The chosen ports, the pid and the log file are recorded in the pod's
annotation `evokube.test/local-process` (JSON), so tests scrape and signal
pods through what the API server shows. Given a `targets_file`, the runner also
keeps there, for Prometheus's file_sd, every port of its running pods with the
`__meta_kubernetes_*` labels Kubernetes discovery would give it (Debian's
Prometheus is built without Kubernetes discovery).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from evokube_operator.api import LABEL_CHECKPOINT_CLAIM as CHECKPOINT_CLAIM_LABEL
from tests.cluster.controlplane import ControlPlane, free_port, wait_until

log = logging.getLogger(__name__)

POOL_LABEL = "evokube.io/test-pool"
TAINT_KEY = "evokube.test/pod-runner"
PROCESS_ANNOTATION = "evokube.test/local-process"
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
LOOPBACK = "127.0.0.1"
LEASE_NAMESPACE = "kube-node-lease"
HEARTBEAT_S = 10.0
RESTART_DELAY_S = 1.0  # kubelet starts at 10 s and doubles; tests cannot wait that long
DEFAULT_GRACE_S = 30
BEST_EFFORT_NICE = 10
MESSAGE_BYTES = 2048  # kubelet's cap on a termination message read from the log
VENV_BIN = Path(sys.executable).parent


class NotReady(Exception):
    """Something the pod needs is not there yet (a ConfigMap, a bound claim): try again."""


class Unsupported(Exception):
    """The pod asks for something this runner does not do; the pod fails, saying what."""


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def local_process(pod: dict[str, Any]) -> dict[str, Any] | None:
    """What the runner recorded about a pod's process (pid, ports, log), from its annotation."""
    raw = (pod.get("metadata", {}).get("annotations") or {}).get(PROCESS_ANNOTATION)
    return json.loads(raw) if raw else None


@dataclass
class LocalPod:
    """One pod this runner runs: its rendered container and the process's life."""

    namespace: str
    name: str
    uid: str
    node: str
    folder: Path
    container: dict[str, Any]
    command: list[str]
    env: dict[str, str]
    ports: dict[str, int]  # container port name (or number) -> local port
    labels: dict[str, str]  # the pod's labels
    restart_policy: str
    readiness: tuple[str, int, float] | None  # (path, local port, period)
    best_effort: bool  # QoS class BestEffort: no requests, lowest CPU priority
    proc: subprocess.Popen | None = None
    started_at: str = ""
    restarts: int = 0
    last_state: dict[str, Any] = field(default_factory=dict)
    ready: bool = False
    next_probe: float = 0.0
    restart_at: float | None = None
    deleting: bool = False
    kill_at: float | None = None  # SIGKILL when the grace period is over
    done: bool = False  # terminal status reported
    exit_code: int | None = None  # the last exit of its container
    disrupted: bool = False  # the API server had set DisruptionTarget when it ended

    @property
    def log_path(self) -> Path:
        return self.folder / f"{self.container['name']}-{self.restarts}.log"

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signum)


class PodRunner:
    """Plays kubelet for `nodes` nodes labelled `evokube.io/test-pool=<pool>`.

    With `taint` the nodes are tainted `evokube.test/pod-runner=true:NoSchedule`: only
    pods that tolerate it and select the pool (`node_selector`, `tolerations`) land here.
    Without (the laptop cluster), any pod the scheduler fits here does. `add_pool` registers
    more pools (a TPU slice's labels and chips, say) run by the same runner.
    """

    def __init__(
        self,
        cluster: ControlPlane,
        workdir: Path,
        *,
        pool: str = "local",
        nodes: int = 2,
        taint: bool = True,
        targets_file: Path | None = None,
        bin_dir: Path = VENV_BIN,
        poll_s: float = 0.25,
    ):
        from kubernetes import client

        self.cluster = cluster
        self.workdir = Path(workdir).resolve()
        self.pool = pool
        self.node_names = [f"{pool}-{i}" for i in range(nodes)]
        self._node_kinds: dict[str, tuple[dict[str, str], dict[str, str]]] = {
            name: ({POOL_LABEL: pool}, {}) for name in self.node_names
        }  # node -> (labels, extra capacity)
        self.taint = taint
        self.targets_file = targets_file
        self._targets: list[dict] | None = None
        self.bin_dir = bin_dir
        self.poll_s = poll_s
        self.api = cluster.api_client()
        self.core = client.CoreV1Api(self.api)
        self.coordination = client.CoordinationV1Api(self.api)
        self.pods: dict[str, LocalPod] = {}  # by pod uid
        self._ports: dict[tuple, int] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_heartbeat = 0.0
        self._registered_at = _now()

    # -- for manifests -------------------------------------------------------------------
    @property
    def node_selector(self) -> dict[str, str]:
        return {POOL_LABEL: self.pool}

    @property
    def tolerations(self) -> list[dict[str, str]]:
        return (
            [{"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}] if self.taint else []
        )

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, timeout: float = 60) -> None:
        """Register the nodes, wait until the scheduler may use them, start playing kubelet."""
        (self.workdir / "pods").mkdir(parents=True, exist_ok=True)
        for name in self.node_names:
            self._register(name)
        self._heartbeat()
        wait_until(self._nodes_usable, timeout, f"nodes {self.node_names} to be Ready, untainted")
        self._thread = threading.Thread(target=self._loop, name="pod-runner", daemon=True)
        self._thread.start()

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop playing kubelet and end every process (SIGTERM, then SIGKILL)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        live = [p for p in self.pods.values() if p.proc is not None and p.proc.poll() is None]
        for pod in live:
            pod.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for pod in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                pod.proc.wait(max(0.1, deadline - time.monotonic()))
            pod.signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                pod.proc.wait(5)
        self.api.close()

    def endings(self, namespace: str) -> dict[str, tuple[int | None, bool]]:
        """Each pod run in `namespace`: (last exit code or None, DisruptionTarget at the end)."""
        return {
            p.name: (p.exit_code, p.disrupted)
            for p in self.pods.values()
            if p.namespace == namespace
        }

    def kill(self, namespace: str, name: str, signum: int = signal.SIGKILL) -> int:
        """Signal a pod's process as a crash or `kill` would; returns its pid."""
        pod = next(p for p in self.pods.values() if (p.namespace, p.name) == (namespace, name))
        assert pod.proc is not None and pod.proc.poll() is None, f"{name} has no live process"
        pod.signal(signum)
        return pod.proc.pid

    def add_pool(
        self,
        pool: str,
        nodes: int,
        labels: dict[str, str] | None = None,
        capacity: dict[str, str] | None = None,
        timeout: float = 60,
    ) -> list[str]:
        """Register `nodes` more nodes of `pool`, with extra `labels` and `capacity`
        (e.g. google.com/tpu), tainted as the first pool's. One runner, one port space: pods
        of every pool find each other's ports. Returns the new nodes' names."""
        names = [f"{pool}-{i}" for i in range(nodes)]
        for name in names:
            self._node_kinds[name] = ({**(labels or {}), POOL_LABEL: pool}, dict(capacity or {}))
            self._register(name)
        self.node_names = [*self.node_names, *names]  # a new list: the loop may be iterating
        self._heartbeat()
        wait_until(self._nodes_usable, timeout, f"nodes {names} to be Ready, untainted")
        return names

    # -- local storage ---------------------------------------------------------------------
    def provision_claim(self, namespace: str, claim: str, size: str = "1Gi") -> Path:
        """A PersistentVolumeClaim bound to a hostPath PV in the runner's folder (RWX), opted
        in as an experiment's checkpoint claim (the label the operator requires)."""
        path = self.workdir / "volumes" / f"{namespace}-{claim}"
        path.mkdir(parents=True, exist_ok=True)
        pv_name = f"{namespace}-{claim}"[:253]
        spec = {"accessModes": ["ReadWriteMany"], "storageClassName": ""}
        self.core.create_persistent_volume(
            {
                "apiVersion": "v1",
                "kind": "PersistentVolume",
                "metadata": {"name": pv_name, "labels": {POOL_LABEL: self.pool}},
                "spec": {
                    **spec,
                    "capacity": {"storage": size},
                    "hostPath": {"path": str(path), "type": "Directory"},
                    "persistentVolumeReclaimPolicy": "Retain",
                    "claimRef": {"namespace": namespace, "name": claim},
                },
            }
        )
        self.core.create_namespaced_persistent_volume_claim(
            namespace,
            {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "metadata": {
                    "name": claim,
                    "namespace": namespace,
                    "labels": {CHECKPOINT_CLAIM_LABEL: "true"},
                },
                "spec": {
                    **spec,
                    "volumeName": pv_name,
                    "resources": {"requests": {"storage": size}},
                },
            },
        )
        wait_until(
            lambda: (
                self.core.read_namespaced_persistent_volume_claim(claim, namespace).status.phase
                == "Bound"
            ),
            60,
            f"claim {namespace}/{claim} to be Bound",
        )
        return path

    # -- nodes -------------------------------------------------------------------------------
    def _register(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    **self._node_kinds[name][0],
                },
            },
            "spec": {
                "taints": [{"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"}]
                if self.taint
                else []
            },
        }
        try:
            self.core.create_node(node)
        except ApiException as err:
            if err.status != 409:
                raise

    def _node_status(self, name: str) -> dict[str, Any]:
        ok = {"lastHeartbeatTime": _now(), "lastTransitionTime": self._registered_at}
        capacity = {"cpu": "8", "memory": "16Gi", "pods": "20", **self._node_kinds[name][1]}
        return {
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady", **ok},
                *(
                    {"type": kind, "status": "False", "reason": f"KubeletHasNo{kind}", **ok}
                    for kind in ("MemoryPressure", "DiskPressure", "PIDPressure")
                ),
            ],
            "addresses": [{"type": "InternalIP", "address": LOOPBACK}],
            "capacity": capacity,
            "allocatable": capacity,
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "evokube-pod-runner",
                "containerRuntimeVersion": "local-process://0",
                "kernelVersion": "",
                "kubeProxyVersion": "",
                "bootID": "",
                "machineID": "",
                "osImage": "",
                "systemUUID": "",
            },
        }

    def _heartbeat(self) -> None:
        """Node status and Lease, as kubelet renews them (the node controller watches both)."""
        from kubernetes.client.exceptions import ApiException

        for name in self.node_names:
            self.core.patch_node_status(name, {"status": self._node_status(name)})
            lease = {"spec": {"holderIdentity": name, "leaseDurationSeconds": 40}}
            lease["spec"]["renewTime"] = _micro_now()
            try:
                self.coordination.patch_namespaced_lease(name, LEASE_NAMESPACE, lease)
            except ApiException as err:
                if err.status != 404:
                    raise
                node_uid = self.core.read_node(name).metadata.uid
                lease["metadata"] = {
                    "name": name,
                    "ownerReferences": [
                        {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}
                    ],
                }
                self.coordination.create_namespaced_lease(LEASE_NAMESPACE, lease)

    def _nodes_usable(self) -> bool:
        for name in self.node_names:
            node = self.core.read_node(name)
            ready = any(c.type == "Ready" and c.status == "True" for c in node.status.conditions)
            foreign = [t for t in node.spec.taints or [] if t.key != TAINT_KEY]
            if not ready or foreign:
                return False
        return True

    # -- the loop ------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self._tick()
            except Exception:  # an API hiccup must not end the "kubelet"
                log.exception("pod runner tick failed")

    def _tick(self) -> None:
        if time.monotonic() >= self._next_heartbeat:
            self._heartbeat()
            self._next_heartbeat = time.monotonic() + HEARTBEAT_S
        seen: dict[str, dict] = {}
        for node in self.node_names:
            for pod in self._list(f"spec.nodeName={node}"):
                seen[pod["metadata"]["uid"]] = pod
        for pod in seen.values():
            self._sync(pod)
        for uid, local in list(self.pods.items()):
            if uid not in seen and not local.done:  # force-deleted: nothing left to report to
                local.signal(signal.SIGKILL)
                local.done = True
            self._supervise(local)
        if self.targets_file is not None:
            self._write_targets()

    def _write_targets(self) -> None:
        """The running pods' ports as file_sd targets, rewritten (atomically) when they change."""
        targets = [
            {
                "targets": [f"{LOOPBACK}:{port}"],
                "labels": {**_meta_labels(p), "__meta_kubernetes_pod_container_port_name": name},
            }
            for p in self.pods.values()
            if p.proc is not None and p.proc.poll() is None
            for name, port in p.ports.items()
        ]
        if targets != self._targets:
            partial = self.targets_file.with_suffix(".partial")
            partial.write_text(json.dumps(targets, indent=1))
            partial.replace(self.targets_file)
            self._targets = targets

    def _list(self, field_selector: str) -> list[dict]:
        response = self.core.list_pod_for_all_namespaces(
            field_selector=field_selector, _preload_content=False
        )
        return json.loads(response.data)["items"]

    def _sync(self, pod: dict) -> None:
        """A pod as the API server shows it: start it, or pass on its deletion."""
        meta = pod["metadata"]
        local = self.pods.get(meta["uid"])
        deleting = bool(meta.get("deletionTimestamp"))
        if local is None:
            if pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
                return
            if deleting:  # deleted before it ever ran
                self._fail_pod(pod, "Deleted", "deleted before it started", delete=True)
                return
            try:
                local = self._prepare(pod)
            except NotReady as err:
                log.info("%s/%s waits: %s", meta["namespace"], meta["name"], err)
                return
            except Unsupported as err:
                log.warning("%s/%s cannot run here: %s", meta["namespace"], meta["name"], err)
                self._fail_pod(pod, "UnsupportedByPodRunner", str(err))
                return
            self.pods[meta["uid"]] = local
            self._spawn(local)
            return
        if deleting and not local.deleting:
            local.deleting = True
            grace = meta.get("deletionGracePeriodSeconds")
            if grace is None:
                grace = pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
            local.signal(signal.SIGTERM)
            local.kill_at = time.monotonic() + grace

    def _supervise(self, local: LocalPod) -> None:
        """Follow one process: grace periods, readiness, exits, restarts."""
        if local.done:
            return
        now = time.monotonic()
        if local.proc is not None and local.proc.poll() is None:
            if local.kill_at is not None and now >= local.kill_at:
                local.signal(signal.SIGKILL)
            elif local.readiness and now >= local.next_probe:
                self._probe(local, now)
            return
        if local.proc is not None:  # it just exited
            code = local.proc.returncode
            code = local.exit_code = code if code >= 0 else 128 - code
            local.proc = None
            if not local.deleting and _restarts(local.restart_policy, code):
                local.last_state = {"terminated": self._terminated(local, code)}
                local.restarts += 1
                local.restart_at = now + RESTART_DELAY_S
                self._report(local, "Running", {"waiting": {"reason": "CrashLoopBackOff"}})
                return
            self._finish(local, code)
            return
        if local.deleting:  # deleted while waiting to restart
            self._finish(local, local.last_state["terminated"]["exitCode"])
        elif local.restart_at is not None and now >= local.restart_at:
            local.restart_at = None
            self._spawn(local)

    # -- rendering a pod ---------------------------------------------------------------------
    def _prepare(self, pod: dict) -> LocalPod:
        meta, spec = pod["metadata"], pod["spec"]
        if spec.get("initContainers") or len(spec["containers"]) != 1:
            raise Unsupported("the pod runner runs pods of exactly one container")
        container = spec["containers"][0]
        if not container.get("command"):
            raise Unsupported("the pod runner needs the container's command (no image here)")
        folder = self.workdir / "pods" / meta["namespace"] / f"{meta['name']}-{meta['uid'][:8]}"
        folder.mkdir(parents=True, exist_ok=True)
        volumes = self._volumes(pod, folder / "volumes")
        mounts = sorted(
            (
                (m["mountPath"].rstrip("/") or "/", volumes[m["name"]] / m.get("subPath", ""))
                for m in container.get("volumeMounts", [])
            ),
            key=lambda pair: -len(pair[0]),
        )
        ports = {
            str(p.get("name") or p["containerPort"]): self._own_port(pod, p["containerPort"])
            for p in container.get("ports", [])
        }
        rewrite = _Rewriter(pod, mounts, self._local_port)
        env = self._env(pod, container, rewrite)
        command = [rewrite(a) for a in [*container["command"], *container.get("args", [])]]
        local = LocalPod(
            namespace=meta["namespace"],
            name=meta["name"],
            uid=meta["uid"],
            node=spec["nodeName"],
            folder=folder,
            container=container,
            command=command,
            env=env,
            ports=ports,
            labels=meta.get("labels") or {},
            restart_policy=spec.get("restartPolicy", "Always"),
            readiness=_readiness(container, ports),
            best_effort=pod.get("status", {}).get("qosClass") == "BestEffort",
        )
        token_dir = dict(mounts).get(SERVICE_ACCOUNT_DIR)
        if token_dir is not None:
            env["KUBECONFIG"] = str(self._kubeconfig(folder, token_dir))
        return local

    def _own_port(self, pod: dict, port: int) -> int:
        spec = pod["spec"]
        host = spec.get("hostname") or pod["metadata"]["name"]
        return self._local_port(pod["metadata"]["namespace"], host, spec.get("subdomain", ""), port)

    def _local_port(self, namespace: str, host: str, subdomain: str, port: int) -> int:
        """The loopback port standing in for `port` of the pod `host.subdomain`."""
        key = (namespace, host, subdomain, int(port))
        if key not in self._ports:
            taken = set(self._ports.values())
            chosen = free_port()
            while chosen in taken:
                chosen = free_port()
            self._ports[key] = chosen
        return self._ports[key]

    def _env(self, pod: dict, container: dict, rewrite: _Rewriter) -> dict[str, str]:
        """The process environment: PATH with the venv first, then the container's env."""
        env = {
            "PATH": os.pathsep.join([str(self.bin_dir), "/usr/local/bin", "/usr/bin", "/bin"]),
            "HOME": str(self.workdir / "pods"),
            "LANG": "C.UTF-8",
        }
        if container.get("envFrom"):
            raise Unsupported("envFrom")
        declared: dict[str, str] = {}  # as the container sees them, before the runner's rewrites
        for var in container.get("env", []):
            source = var.get("valueFrom")
            if source is None:
                value = expand(var.get("value", ""), declared)
            elif "fieldRef" in source:
                value = field_value(pod, source["fieldRef"]["fieldPath"])
            else:
                raise Unsupported(f"env {var['name']}: only value and fieldRef")
            declared[var["name"]] = value
            env[var["name"]] = rewrite(value)
        return env

    # -- volumes -----------------------------------------------------------------------------
    def _volumes(self, pod: dict, root: Path) -> dict[str, Path]:
        """Each volume of the pod as a local folder."""
        out = {}
        for volume in pod["spec"].get("volumes", []):
            name = volume["name"]
            target = root / name
            if "configMap" in volume:
                data = self._config_map(pod["metadata"]["namespace"], volume["configMap"]["name"])
                _write_items(target, data, volume["configMap"].get("items"))
            elif "emptyDir" in volume:
                target.mkdir(parents=True, exist_ok=True)
            elif "persistentVolumeClaim" in volume:
                target = self._claim_path(pod, volume["persistentVolumeClaim"]["claimName"])
            elif "projected" in volume:
                self._projected(pod, volume["projected"]["sources"], target)
            elif "downwardAPI" in volume:
                _write_downward_api(pod, volume["downwardAPI"]["items"], target)
            else:
                raise Unsupported(
                    f"volume {name}: only configMap, emptyDir, PVC, projected and downwardAPI"
                )
            out[name] = target
        return out

    def _claim_path(self, pod: dict, claim: str) -> Path:
        pvc = self.core.read_namespaced_persistent_volume_claim(claim, pod["metadata"]["namespace"])
        if pvc.status.phase != "Bound":
            raise NotReady(f"claim {claim} is {pvc.status.phase}")
        pv = self.core.read_persistent_volume(pvc.spec.volume_name)
        source = pv.spec.host_path or pv.spec.local
        if source is None:
            raise Unsupported(f"PV {pv.metadata.name}: only hostPath and local PVs are folders")
        Path(source.path).mkdir(parents=True, exist_ok=True)
        return Path(source.path)

    def _projected(self, pod: dict, sources: list[dict], target: Path) -> None:
        """The ServiceAccount volume and its kind: a bound token, the root CA, the namespace."""
        from kubernetes import client

        meta = pod["metadata"]
        for source in sources:
            if "serviceAccountToken" in source:
                spec = source["serviceAccountToken"]
                audience = spec.get("audience")
                request = client.AuthenticationV1TokenRequest(
                    spec=client.V1TokenRequestSpec(
                        audiences=[audience] if audience else [],
                        expiration_seconds=spec.get("expirationSeconds", 3600),
                        bound_object_ref=client.V1BoundObjectReference(
                            api_version="v1", kind="Pod", name=meta["name"], uid=meta["uid"]
                        ),
                    )
                )
                token = self.core.create_namespaced_service_account_token(
                    pod["spec"].get("serviceAccountName", "default"), meta["namespace"], request
                ).status.token
                _write_items(target, {spec["path"]: token}, None)
            elif "configMap" in source:
                data = self._config_map(meta["namespace"], source["configMap"]["name"])
                _write_items(target, data, source["configMap"].get("items"))
            elif "downwardAPI" in source:
                _write_downward_api(pod, source["downwardAPI"]["items"], target)
            else:
                raise Unsupported(f"projected source {sorted(source)}")

    def _config_map(self, namespace: str, name: str) -> dict[str, str]:
        from kubernetes.client.exceptions import ApiException

        try:
            return self.core.read_namespaced_config_map(name, namespace).data or {}
        except ApiException as err:
            if err.status == 404:
                raise NotReady(f"ConfigMap {name} does not exist yet") from None
            raise

    def _kubeconfig(self, folder: Path, token_dir: Path) -> Path:
        """In-cluster access, as a kubeconfig: the pod's bound token and CA, the real server."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "in-cluster",
                    "cluster": {
                        "server": self.cluster.state.server,
                        "certificate-authority": str(token_dir / "ca.crt"),
                    },
                }
            ],
            "users": [{"name": "pod", "user": {"tokenFile": str(token_dir / "token")}}],
            "contexts": [
                {
                    "name": "in-cluster",
                    "context": {
                        "cluster": "in-cluster",
                        "user": "pod",
                        "namespace": (token_dir / "namespace").read_text(),
                    },
                }
            ],
            "current-context": "in-cluster",
        }
        path = folder / "kubeconfig"
        path.write_text(yaml.safe_dump(config))
        return path

    # -- running and reporting -----------------------------------------------------------------
    def _spawn(self, local: LocalPod) -> None:
        executable = shutil.which(local.command[0], path=local.env["PATH"])
        if executable is None:
            self._finish(local, 127, f"{local.command[0]}: not found on the runner's PATH")
            return
        with local.log_path.open("ab") as out:
            local.proc = subprocess.Popen(
                [executable, *local.command[1:]],
                env=local.env,
                cwd=local.folder,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        if local.best_effort:  # kubelet gives BestEffort pods the least CPU (cpu.shares 2)
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, local.proc.pid, BEST_EFFORT_NICE)
        local.started_at = _now()
        local.ready = local.readiness is None
        local.next_probe = time.monotonic()
        self._annotate(local)
        self._report(local, "Running", {"running": {"startedAt": local.started_at}})
        log.info("%s/%s: pid %d on %s", local.namespace, local.name, local.proc.pid, local.node)

    def _annotate(self, local: LocalPod) -> None:
        record = {
            "pid": local.proc.pid if local.proc else None,
            "ports": local.ports,
            "log": str(local.log_path),
            "folder": str(local.folder),
        }
        body = {"metadata": {"annotations": {PROCESS_ANNOTATION: json.dumps(record)}}}
        with contextlib.suppress(Exception):  # the pod may be gone already
            self.core.patch_namespaced_pod(local.name, local.namespace, body)

    def _probe(self, local: LocalPod, now: float) -> None:
        path, port, period = local.readiness
        try:
            with urllib.request.urlopen(f"http://{LOOPBACK}:{port}{path}", timeout=1) as response:
                ready = 200 <= response.status < 400
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            ready = False
        local.next_probe = now + (period if ready else 1.0)
        if ready != local.ready:
            local.ready = ready
            self._report(local, "Running", {"running": {"startedAt": local.started_at}})

    def _terminated(self, local: LocalPod, code: int, message: str = "") -> dict[str, Any]:
        if not message and code != 0:
            policy = local.container.get("terminationMessagePolicy")
            if policy == "FallbackToLogsOnError" and local.log_path.exists():
                tail = local.log_path.read_bytes()[-MESSAGE_BYTES:]
                message = "\n".join(tail.decode(errors="replace").splitlines()[-80:])
        state = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": local.started_at or _now(),
            "finishedAt": _now(),
        }
        if message:
            state["message"] = message
        return state

    def _finish(self, local: LocalPod, code: int, message: str = "") -> None:
        """Report the final state, then, for a pod being deleted, delete it for good."""
        succeeded = code == 0 and local.restart_policy != "Always"
        phase = "Succeeded" if succeeded else "Failed"
        self._report(local, phase, {"terminated": self._terminated(local, code, message)})
        local.done = True
        log.info("%s/%s: exited %d (%s)", local.namespace, local.name, code, phase)
        if local.deleting:
            self._delete_now(local.namespace, local.name, local.uid)

    def _fail_pod(self, pod: dict, reason: str, message: str, delete: bool = False) -> None:
        """A pod that never ran: phase Failed, saying why (then gone, if it was deleted)."""
        meta = pod["metadata"]
        status = {"phase": "Failed", "reason": reason, "message": message}
        with contextlib.suppress(Exception):
            self.core.patch_namespaced_pod_status(
                meta["name"], meta["namespace"], {"status": status}
            )
        if delete:
            self._delete_now(meta["namespace"], meta["name"], meta["uid"])

    def _delete_now(self, namespace: str, name: str, uid: str) -> None:
        """What kubelet does once a deleted pod's containers are gone: delete, grace 0."""
        from kubernetes import client

        options = client.V1DeleteOptions(
            grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid)
        )
        with contextlib.suppress(Exception):
            self.core.delete_namespaced_pod(name, namespace, body=options)

    def _report(self, local: LocalPod, phase: str, state: dict[str, Any]) -> None:
        """Write the pod's status (read, change, replace; again on a conflict)."""
        from kubernetes.client.exceptions import ApiException

        running = "running" in state
        ready = running and local.ready
        for _ in range(5):
            try:
                response = self.core.read_namespaced_pod_status(
                    local.name, local.namespace, _preload_content=False
                )
            except ApiException as err:
                if err.status == 404:
                    return
                raise
            pod = json.loads(response.data)
            if pod["metadata"]["uid"] != local.uid:
                return
            status = pod.setdefault("status", {})
            status.update(
                phase=phase,
                hostIP=LOOPBACK,
                hostIPs=[{"ip": LOOPBACK}],
                podIP=LOOPBACK,
                podIPs=[{"ip": LOOPBACK}],
            )
            status.setdefault("startTime", local.started_at or _now())
            status["containerStatuses"] = [
                {
                    "name": local.container["name"],
                    "image": local.container.get("image", ""),
                    "imageID": "",
                    "containerID": f"local-process://{local.uid}/{local.restarts}",
                    "ready": ready,
                    "started": running,
                    "restartCount": local.restarts,
                    "state": state,
                    "lastState": local.last_state,
                }
            ]
            finished = phase in ("Succeeded", "Failed")
            _set_conditions(status, ready=ready, finished=finished)
            local.disrupted = any(
                c["type"] == "DisruptionTarget" and c["status"] == "True"
                for c in status["conditions"]
            )
            try:
                self.core.replace_namespaced_pod_status(local.name, local.namespace, pod)
                return
            except ApiException as err:
                if err.status == 404:
                    return
                if err.status != 409:
                    raise


# -- helpers -------------------------------------------------------------------------------------
_FIELD_INDEX = re.compile(r"metadata\.(labels|annotations)\['(.+)'\]")


def _write_downward_api(pod: dict, items: list[dict], target: Path) -> None:
    """Downward-API files: each item's fieldRef (an annotation, the pod's name, ...)."""
    target.mkdir(parents=True, exist_ok=True)
    for item in items:
        if "fieldRef" not in item:
            raise Unsupported(f"downwardAPI item {item.get('path')}: only fieldRef")
        _write_items(target, {item["path"]: field_value(pod, item["fieldRef"]["fieldPath"])}, None)


_REFERENCE = re.compile(r"\$\$|\$\(([-._a-zA-Z][-._a-zA-Z0-9]*)\)")


def expand(value: str, defined: dict[str, str]) -> str:
    """Kubelet's expansion of an env value: `$(NAME)` of a variable declared before it,
    `$$` as `$`; a reference to anything else stays as written."""

    def one(match: re.Match) -> str:
        name = match.group(1)
        if name is None:
            return "$"
        return defined.get(name, match.group(0))

    return _REFERENCE.sub(one, value)


def field_value(pod: dict, path: str) -> str:
    """The value of a downward-API `fieldRef` for this pod."""
    meta, spec = pod["metadata"], pod["spec"]
    indexed = _FIELD_INDEX.fullmatch(path)
    if indexed:
        kind, key = indexed.groups()
        return (meta.get(kind) or {}).get(key, "")
    simple = {
        "metadata.name": meta["name"],
        "metadata.namespace": meta["namespace"],
        "metadata.uid": meta["uid"],
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.hostIP": LOOPBACK,
        "status.podIP": LOOPBACK,
        "status.hostIPs": LOOPBACK,
        "status.podIPs": LOOPBACK,
    }
    if path not in simple:
        raise Unsupported(f"fieldRef {path}")
    return simple[path]


class _Rewriter:
    """Rewrites a value the container sees into what the local process needs (see the table)."""

    _ADDRESS = re.compile(r"([a-z0-9]([-a-z0-9]*[a-z0-9])?)\.([a-z0-9.-]+):(\d+)")

    def __init__(self, pod: dict, mounts: list[tuple[str, Path]], local_port):
        self.namespace = pod["metadata"]["namespace"]
        self.subdomain = pod["spec"].get("subdomain", "")
        self.own_host = pod["spec"].get("hostname") or pod["metadata"]["name"]
        self.mounts = mounts
        self.local_port = local_port
        self.own_ports = {
            int(p["containerPort"]) for c in pod["spec"]["containers"] for p in c.get("ports", [])
        }

    def __call__(self, value: str) -> str:
        if value.startswith("-") and "=" in value:
            flag, _, rest = value.partition("=")
            return f"{flag}={self(rest)}"
        for mount, folder in self.mounts:
            if value == mount or value.startswith(mount.rstrip("/") + "/"):
                return str(folder) + value[len(mount) :]
        if value.isdigit() and int(value) in self.own_ports:
            return str(self.local_port(self.namespace, self.own_host, self.subdomain, int(value)))
        return self._ADDRESS.sub(self._address, value)

    def _address(self, match: re.Match) -> str:
        host, rest, port = match.group(1), match.group(3), int(match.group(4))
        subdomain, *suffix = rest.split(".")
        cluster_suffix = [self.namespace, "svc", "cluster", "local"]
        if subdomain != self.subdomain or suffix != cluster_suffix[: len(suffix)]:
            return match.group(0)
        return f"{LOOPBACK}:{self.local_port(self.namespace, host, subdomain, port)}"


def _readiness(container: dict, ports: dict[str, int]) -> tuple[str, int, float] | None:
    probe = container.get("readinessProbe")
    if not probe:
        return None
    http = probe.get("httpGet")
    if http is None:
        raise Unsupported("only httpGet readiness probes")
    port = ports.get(str(http["port"]))
    if port is None:
        raise Unsupported(f"readiness probe port {http['port']} is not a declared containerPort")
    return http.get("path", "/"), port, float(probe.get("periodSeconds", 10))


def _meta_labels(pod: LocalPod) -> dict[str, str]:
    """Some of what Prometheus's Kubernetes discovery (role pod) labels a pod's targets with."""
    labels = {
        f"__meta_kubernetes_pod_label_{re.sub(r'[^a-zA-Z0-9_]', '_', key)}": value
        for key, value in pod.labels.items()
    }
    return {
        **labels,
        "__meta_kubernetes_namespace": pod.namespace,
        "__meta_kubernetes_pod_name": pod.name,
        "__meta_kubernetes_pod_node_name": pod.node,
    }


def _restarts(policy: str, code: int) -> bool:
    return policy == "Always" or (policy == "OnFailure" and code != 0)


def _write_items(target: Path, data: dict[str, str], items: list[dict] | None) -> None:
    target.mkdir(parents=True, exist_ok=True)
    pairs = [(i["key"], i["path"]) for i in items] if items else [(k, k) for k in data]
    for key, path in pairs:
        if key not in data:
            raise NotReady(f"key {key} is missing")
        (target / path).parent.mkdir(parents=True, exist_ok=True)
        (target / path).write_text(data[key])


def _set_conditions(status: dict[str, Any], *, ready: bool, finished: bool) -> None:
    """Kubelet's pod conditions; PodScheduled and DisruptionTarget stay as they are."""
    now = _now()
    wanted = {
        "PodReadyToStartContainers": not finished,
        "Initialized": True,
        "ContainersReady": ready,
        "Ready": ready,
    }
    conditions = [c for c in status.get("conditions", []) if c["type"] not in wanted]
    old = {c["type"]: c for c in status.get("conditions", [])}
    for kind, value in wanted.items():
        text = "True" if value else "False"
        condition = {"type": kind, "status": text, "lastTransitionTime": now}
        if kind in old and old[kind]["status"] == text:
            condition["lastTransitionTime"] = old[kind].get("lastTransitionTime", now)
        if not value and finished and kind in ("ContainersReady", "Ready"):
            condition["reason"] = "PodCompleted"
        conditions.append(condition)
    status["conditions"] = conditions
