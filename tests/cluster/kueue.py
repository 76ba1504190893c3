"""The real Kueue controller (sigs.k8s.io/kueue) on a test control plane.

build.sh builds Kueue's manager (cmd/kueue) from the Go module proxy and keeps,
beside it, the module's CRDs and webhook manifests (config/components/crd and
config/components/webhook). `Kueue` runs that manager as a local process
against a started `ControlPlane`, as its Deployment would run in a cluster but
without a Service in front of it:

- Kueue's CRDs are server-side applied; those that Kueue's own kustomization
  gives a conversion webhook get one here too.
- Its admission webhooks are registered with `clientConfig.url`
  (https://127.0.0.1:<port>/<path>) and the caBundle of a CA made for this one
  run with openssl, instead of `clientConfig.service`: nothing on loopback
  routes to a Service. Only the webhooks for Kueue's own API group and for the
  integrations that are enabled are registered, so a Kueue started for batch
  Jobs never sits between the API server and a Pod or a Deployment.
- Kueue's internal certificate management is off (it would make a certificate
  for the Service's DNS name); the manager serves the certificate made here.
  It then also wants a metrics certificate at /etc/kueue/metrics/certs; unless
  the machine has one there, the manager runs in a private mount namespace
  whose /etc is an overlay holding ours, and the machine's /etc is not touched.
- `start` returns once kube-controller-manager's garbage collector knows
  Kueue's kinds, so that a deleted Job's Workload goes and frees its quota.

`stop` deletes the webhook configurations before it ends the process, so a
stopped Kueue never fails another test's Job creation. The CRDs stay.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import secrets
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.cluster.controlplane import HERE, ClusterError, ControlPlane, _pid_alive, free_port

GROUP = "kueue.x-k8s.io"
API_VERSION = f"{GROUP}/v1beta2"
QUEUE_LABEL = f"{GROUP}/queue-name"
PRIORITY_LABEL = f"{GROUP}/priority-class"
NAMESPACE = "kueue-system"
MUTATING = "kueue-mutating-webhook-configuration"
VALIDATING = "kueue-validating-webhook-configuration"
# The manager reads its metrics serving certificate from this fixed path when
# internal certificate management is off (cmd/kueue/main.go in v0.17.0).
METRICS_CERT_DIR = Path("/etc/kueue/metrics/certs")


# libyaml's loader where PyYAML has it: the Workload CRD alone is 19,000 lines.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load(path: Path) -> Any:
    return yaml.load(path.read_text(), Loader=_Loader)


def kueue_folder() -> Path:
    """Build Kueue (a no-op when cached) and return its cache folder."""
    out = subprocess.run(
        ["bash", str(HERE / "build.sh"), "kueue"], check=True, stdout=subprocess.PIPE, text=True
    ).stdout.split()
    return Path(out[-1])


@dataclass(frozen=True)
class WaitForPodsReady:
    """Kueue's `waitForPodsReady` settings (Go durations such as "30s", "5m").

    `block_admission` keeps every later workload of a ClusterQueue waiting until
    the admitted one has all its pods ready. `requeuing` is passed as
    `requeuingStrategy` (keys timestamp, backoffLimitCount, backoffBaseSeconds,
    backoffMaxSeconds).
    """

    timeout: str = "5m"
    block_admission: bool = True
    recovery_timeout: str | None = None
    requeuing: dict[str, Any] | None = None

    def config(self) -> dict[str, Any]:
        config: dict[str, Any] = {"timeout": self.timeout, "blockAdmission": self.block_admission}
        if self.recovery_timeout is not None:
            config["recoveryTimeout"] = self.recovery_timeout
        if self.requeuing is not None:
            config["requeuingStrategy"] = dict(self.requeuing)
        return config


@dataclass(frozen=True)
class KueueSettings:
    """What a Kueue run is configured with; equal settings mean an equal manager.

    `frameworks` are Kueue integration names ("batch/job", "pod",
    "jobset.x-k8s.io/jobset", ...). `config` is merged last, key by key at the top
    level, into the Configuration file, for anything not covered here.
    """

    frameworks: tuple[str, ...] = ("batch/job",)
    wait_for_pods_ready: WaitForPodsReady | None = None
    feature_gates: tuple[tuple[str, bool], ...] = (("VisibilityOnDemand", False),)
    config: tuple[tuple[str, Any], ...] = ()


def framework_resource(framework: str) -> tuple[str, str]:
    """The (API group, resource) that an integration's webhooks intercept."""
    if framework == "pod":
        return "", "pods"
    if framework in ("deployment", "statefulset"):
        return "apps", framework + "s"
    group, _, kind = framework.partition("/")
    return group, kind + "s"


@dataclass
class Kueue:
    """One Kueue manager process on a started control plane."""

    cluster: ControlPlane
    settings: KueueSettings = field(default_factory=KueueSettings)
    folder: Path | None = None
    name: str = "kueue"
    webhook_port: int = 0
    health_port: int = 0
    metrics_port: int = 0
    process: subprocess.Popen | None = field(default=None, repr=False)
    wait_for_gc: bool = True
    started_in: float = 0.0
    _private_etc: bool = field(default=False, repr=False)

    # -- paths ---------------------------------------------------------------
    @property
    def workdir(self) -> Path:
        return self.cluster.workdir / self.name

    @property
    def log(self) -> Path:
        return self.cluster.log(self.name)

    @property
    def binary(self) -> Path:
        return self._folder() / "kueue"

    def _folder(self) -> Path:
        if self.folder is None:
            self.folder = kueue_folder()
        return self.folder

    @property
    def ca_bundle(self) -> str:
        return base64.b64encode((self.workdir / "pki" / "ca.crt").read_bytes()).decode()

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.webhook_port}{path}"

    # -- lifecycle -----------------------------------------------------------
    def is_running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, timeout: float = 120.0) -> None:
        """Install the CRDs, start the manager, register its webhooks; return once the
        webhooks answer. A failure stops whatever had started and raises ClusterError
        with the log's last lines."""
        if self.is_running():
            return
        began = time.monotonic()
        # A Kueue that an earlier, killed test run left on a reused cluster goes
        # first, with its webhooks: two managers would both admit workloads.
        self.stop()
        self._folder()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.webhook_port, self.health_port, self.metrics_port = (free_port() for _ in range(3))
        try:
            self._write_pki()
            self.cluster.kubectl("create", "namespace", NAMESPACE, check=False)
            self.install_crds(timeout)
            (self.workdir / "config.yaml").write_text(yaml.safe_dump(self.configuration()))
            self._spawn()
            self._wait(self._ready, timeout, "ready (/readyz)")
            self.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(self.webhooks()))
            self._wait(self._webhooks_answer, timeout, "answering through its webhooks")
            if self.wait_for_gc:
                self.wait_for_garbage_collector(timeout)
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began

    def stop(self, grace: float = 10.0) -> None:
        """Unregister the webhooks, then end the manager. The CRDs stay installed."""
        for kind, name in (
            ("mutatingwebhookconfiguration", MUTATING),
            ("validatingwebhookconfiguration", VALIDATING),
        ):
            self.cluster.kubectl("delete", kind, name, "--ignore-not-found", check=False)
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            self.process = None
        state = self.cluster.state
        if state is not None and self.name in state.pids:
            pid = state.pids.pop(self.name)
            if _pid_alive(pid):  # started by another process that is gone
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            state.save()

    def wait_for_garbage_collector(self, timeout: float = 60.0) -> None:
        """Wait until kube-controller-manager's garbage collector knows Kueue's kinds.

        It rereads the API's resources only every 30 s, so for up to 30 s after the
        CRDs first appear a deleted Job's Workload (owned by the Job) is not
        collected, and holds its quota. A throwaway LocalQueue owned by a ConfigMap
        shows when that is over: it goes once the ConfigMap is deleted. Immediate
        once the collector knows the kinds (a second start on the same cluster).
        """
        name = f"gc-probe-{secrets.token_hex(3)}"
        kubectl = self.cluster.kubectl
        owner = json.loads(
            kubectl("create", "configmap", name, "-n", NAMESPACE, "-o", "json").stdout
        )
        probe = {
            "apiVersion": API_VERSION,
            "kind": "LocalQueue",
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "ownerReferences": [
                    {
                        "apiVersion": "v1",
                        "kind": "ConfigMap",
                        "name": name,
                        "uid": owner["metadata"]["uid"],
                    }
                ],
            },
            "spec": {"clusterQueue": name},
        }
        kubectl("create", "-f", "-", input=json.dumps(probe))
        kubectl("delete", "configmap", name, "-n", NAMESPACE, "--wait=false")

        def collected() -> bool:
            get = kubectl("get", f"localqueues.{GROUP}", name, "-n", NAMESPACE, check=False)
            return get.returncode != 0 and "NotFound" in get.stderr

        self._wait(collected, timeout, "known to the garbage collector (probe LocalQueue)")

    # -- manifests -----------------------------------------------------------
    def configuration(self) -> dict[str, Any]:
        """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) for this run."""
        s = self.settings
        config: dict[str, Any] = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": NAMESPACE,
            "manageJobsWithoutQueueName": False,
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": f"127.0.0.1:{self.metrics_port}"},
            "webhook": {
                "host": "127.0.0.1",
                "port": self.webhook_port,
                "certDir": str(self.workdir / "pki" / "serving"),
            },
            "clientConnection": {"qps": 50, "burst": 100},
            "integrations": {"frameworks": list(s.frameworks)},
            "featureGates": dict(s.feature_gates),
        }
        if s.wait_for_pods_ready is not None:
            config["waitForPodsReady"] = s.wait_for_pods_ready.config()
        config.update(dict(s.config))
        return config

    def crds(self) -> list[dict]:
        """Kueue's CRDs, with the conversion webhooks Kueue's kustomization adds
        pointed at this run's URL."""
        crd_dir = self._folder() / "config" / "crd"
        kustomization = _load(crd_dir / "kustomization.yaml")
        converted = set()
        for patch in kustomization.get("patches") or []:
            path = patch.get("path", "")
            if Path(path).name.startswith("webhook_in_"):
                converted.add(_load(crd_dir / path)["metadata"]["name"])
        crds = []
        for resource in kustomization["resources"]:
            crd = _load(crd_dir / resource)
            if crd["metadata"]["name"] in converted:
                crd["spec"]["conversion"] = {
                    "strategy": "Webhook",
                    "webhook": {
                        "clientConfig": {"url": self.url("/convert"), "caBundle": self.ca_bundle},
                        "conversionReviewVersions": ["v1"],
                    },
                }
            crds.append(crd)
        return crds

    def install_crds(self, timeout: float = 60.0) -> list[str]:
        crds = self.crds()
        # Server-side: the Workload CRD is far too large for client-side apply.
        self.cluster.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=evokube-tests-kueue",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": crds}),
        )
        names = [c["metadata"]["name"] for c in crds]

        def established() -> bool:
            out = self.cluster.kubectl("get", "crd", *names, "-o", "json", check=False)
            if out.returncode != 0:
                return False
            ok = {
                c["metadata"]["name"]
                for c in json.loads(out.stdout)["items"]
                for cond in (c.get("status") or {}).get("conditions") or []
                if cond["type"] == "Established" and cond["status"] == "True"
            }
            return set(names) <= ok

        self._wait(established, timeout, f"{len(names)} CRDs Established", need_process=False)
        return names

    def webhooks(self) -> list[dict]:
        """Kueue's webhook configurations, as its kustomization patches them, with
        URLs on loopback and this run's CA; only Kueue's own API group and the
        enabled integrations."""
        webhook_dir = self._folder() / "config" / "webhook"
        docs = [d for d in yaml.safe_load_all((webhook_dir / "manifests.yaml").read_text()) if d]
        kustomization = _load(webhook_dir / "kustomization.yaml")
        patches = [yaml.safe_load(p["patch"]) for p in kustomization.get("patches") or []]
        wanted = {framework_resource(f) for f in self.settings.frameworks}
        names = {
            "MutatingWebhookConfiguration": MUTATING,
            "ValidatingWebhookConfiguration": VALIDATING,
        }
        out = []
        for doc in docs:
            overrides = {
                hook["name"]: hook
                for patch in patches
                if patch.get("kind") == doc["kind"]
                for hook in patch.get("webhooks") or []
            }
            hooks = []
            for hook in doc["webhooks"]:
                if not _wanted(hook, wanted):
                    continue
                hook = {**hook, **{k: v for k, v in overrides.get(hook["name"], {}).items()}}
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": self.url(path), "caBundle": self.ca_bundle}
                hooks.append(hook)
            out.append(
                {
                    "apiVersion": doc["apiVersion"],
                    "kind": doc["kind"],
                    "metadata": {"name": names[doc["kind"]]},
                    "webhooks": hooks,
                }
            )
        return out

    # -- pieces --------------------------------------------------------------
    def _openssl(self, *args: str) -> None:
        run = subprocess.run(
            ["openssl", *args], capture_output=True, text=True, cwd=self.workdir / "pki"
        )
        if run.returncode != 0:
            raise ClusterError(f"openssl {args[0]} failed: {run.stderr.strip()}")

    def _write_pki(self) -> None:
        """A CA for this run and a serving certificate for 127.0.0.1 signed by it."""
        pki = self.workdir / "pki"
        shutil.rmtree(pki, ignore_errors=True)
        (pki / "serving").mkdir(parents=True)
        ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
        self._openssl(
            "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "3650",
            "-subj", "/CN=evokube-test-kueue-ca",
        )  # fmt: skip
        self._openssl(
            "req", *ec, "-keyout", "serving/tls.key", "-out", "serving.csr",
            "-subj", "/CN=127.0.0.1",
        )  # fmt: skip
        (pki / "serving.cnf").write_text(
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
            "extendedKeyUsage=serverAuth\n"
            "keyUsage=critical,digitalSignature,keyEncipherment\n"
        )
        self._openssl(
            "x509", "-req", "-in", "serving.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "serving/tls.crt", "-days", "3650",
            "-extfile", "serving.cnf",
        )  # fmt: skip

    def _command(self) -> list[str]:
        manager = [
            str(self.binary),
            f"--config={self.workdir / 'config.yaml'}",
            "--zap-log-level=2",
        ]
        self._private_etc = not (
            (METRICS_CERT_DIR / "tls.crt").exists() and (METRICS_CERT_DIR / "tls.key").exists()
        )
        if not self._private_etc:
            return manager
        # The manager insists on a metrics certificate at a fixed path under /etc.
        # Rather than write into the machine's /etc, show the manager (and nothing
        # else) an /etc with our serving certificate there: a private mount
        # namespace with an overlay on /etc whose upper layer is a tmpfs.
        if shutil.which("unshare") is None:
            raise ClusterError(
                f"Kueue needs {METRICS_CERT_DIR}/tls.crt and tls.key (any certificate) "
                "or `unshare` (util-linux) to provide them privately"
            )
        layer = self.workdir / "etc-layer"
        layer.mkdir(exist_ok=True)
        script = (
            'set -e; mount -t tmpfs kueue-etc "$1"; '
            'mkdir -p "$1/upper/kueue/metrics/certs" "$1/work"; '
            'cp "$2/tls.crt" "$2/tls.key" "$1/upper/kueue/metrics/certs/"; '
            'mount -t overlay kueue-etc -o "lowerdir=/etc,upperdir=$1/upper,workdir=$1/work" /etc; '
            'shift 2; exec "$@"'
        )
        return [
            "unshare",
            "--mount",
            "--propagation=private",
            "sh",
            "-c",
            script,
            "kueue",
            str(layer),
            str(self.workdir / "pki" / "serving"),
            *manager,
        ]

    def _spawn(self) -> None:
        env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)}
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                self._command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.workdir,
                env=env,
            )
        # Recorded with the cluster's own processes, so that stopping the cluster
        # (or `python -m tests.cluster down`) ends a Kueue left behind as well.
        self.cluster.state.pids[self.name] = self.process.pid
        self.cluster.state.save()

    def _tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log written)"

    def _wait(
        self, ready: Callable[[], object], timeout: float, what: str, need_process: bool = True
    ) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if need_process and self.process is not None and self.process.poll() is not None:
                hint = ""
                if self._private_etc and "mount" in self._tail():
                    hint = f" (no private /etc could be mounted: provide {METRICS_CERT_DIR})"
                raise ClusterError(
                    f"kueue exited with code {self.process.returncode} before {what}{hint}; "
                    f"see {self.log}:\n{self._tail()}"
                )
            if ready():
                return
            time.sleep(0.2)
        raise ClusterError(
            f"kueue did not become {what} within {timeout:.0f}s; see {self.log}:\n{self._tail()}"
        )

    def _ready(self) -> bool:
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def _webhooks_answer(self) -> bool:
        """A dry-run ResourceFlavor and a dry-run queued Job both pass Kueue's webhooks,
        and the Job comes back suspended by the mutating one."""
        flavor = {
            "apiVersion": API_VERSION,
            "kind": "ResourceFlavor",
            "metadata": {"name": "probe"},
        }
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {
                "name": "kueue-probe",
                "namespace": "default",
                "labels": {QUEUE_LABEL: "probe"},
            },
            "spec": {
                "suspend": False,
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "c", "image": "busybox"}],
                    }
                },
            },
        }
        for obj in (flavor, job):
            run = self.cluster.kubectl(
                "create", "--dry-run=server", "-o", "json", "-f", "-",
                input=json.dumps(obj), check=False,
            )  # fmt: skip
            if run.returncode != 0:
                return False
        return json.loads(run.stdout)["spec"].get("suspend") is True


def _wanted(hook: dict, wanted: set[tuple[str, str]]) -> bool:
    """Whether a webhook belongs to Kueue's API group or an enabled integration."""
    for rule in hook.get("rules") or []:
        groups, resources = rule.get("apiGroups") or [], rule.get("resources") or []
        if groups and all(g == GROUP for g in groups):
            return True
        if any((g, r) in wanted for g in groups for r in resources):
            return True
    return False


class KueueRunner:
    """At most one Kueue on a cluster, restarted only when asked for other settings.

    Two Kueue managers on one cluster would both admit workloads, so tests that
    want different settings (waitForPodsReady, say) share this runner: `ensure`
    returns the running Kueue when its settings are equal, else stops it and
    starts one with the new settings.
    """

    def __init__(self, cluster: ControlPlane):
        self.cluster = cluster
        self.current: Kueue | None = None

    def ensure(self, settings: KueueSettings | None = None) -> Kueue:
        settings = settings or KueueSettings()
        current = self.current
        if current is not None and current.is_running() and current.settings == settings:
            return current
        self.stop()
        kueue = Kueue(self.cluster, settings)
        kueue.start()
        self.current = kueue
        return kueue

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None
