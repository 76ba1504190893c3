"""The real Kueue controller (sigs.k8s.io/kueue) on a test control plane.

build.sh builds Kueue's manager (cmd/kueue) from the Go module proxy and keeps,
beside it, the module's CRDs and webhook manifests (config/components/crd and
config/components/webhook). `Kueue` runs that manager against a started
`ControlPlane` as webhook_manager.py runs any such manager (CRDs, loopback
webhooks, a CA of its own), and adds what is Kueue's:

- Only the webhooks for Kueue's own API group and for the integrations that
  are enabled are registered, so a Kueue started for batch Jobs never sits
  between the API server and a Pod or a Deployment. An integration's CRDs
  (JobSet's, say) must exist before Kueue starts: start that controller first.
- With its internal certificate management off the manager wants a metrics
  certificate at /etc/kueue/metrics/certs; unless the machine has one there,
  the manager runs in a private mount namespace whose /etc is an overlay
  holding ours, and the machine's /etc is not touched.
- `start` returns once kube-controller-manager's garbage collector knows
  Kueue's kinds, so that a deleted Job's Workload goes and frees its quota.
"""

from __future__ import annotations

import json
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from tests.cluster.controlplane import ClusterError, ControlPlane
from tests.cluster.webhook_manager import WebhookManager, component_folder

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


def kueue_folder() -> Path:
    """Build Kueue (a no-op when cached) and return its cache folder."""
    return component_folder("kueue")


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
class Kueue(WebhookManager):
    """One Kueue manager process on a started control plane."""

    component: ClassVar[str] = "kueue"
    webhook_names: ClassVar[dict[str, str]] = {
        "MutatingWebhookConfiguration": MUTATING,
        "ValidatingWebhookConfiguration": VALIDATING,
    }

    settings: KueueSettings = field(default_factory=KueueSettings)
    wait_for_gc: bool = True
    _private_etc: bool = field(default=False, repr=False)

    def prepare(self) -> None:
        self.cluster.kubectl("create", "namespace", NAMESPACE, check=False)

    def after_start(self, timeout: float) -> None:
        if self.wait_for_gc:
            self.wait_for_garbage_collector(timeout)

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
                "certDir": str(self.serving_certs),
            },
            "clientConnection": {"qps": 50, "burst": 100},
            "integrations": {"frameworks": list(s.frameworks)},
            "featureGates": dict(s.feature_gates),
        }
        if s.wait_for_pods_ready is not None:
            config["waitForPodsReady"] = s.wait_for_pods_ready.config()
        config.update(dict(s.config))
        return config

    def wanted(self, hook: dict) -> bool:
        """Kueue's own API group and the enabled integrations."""
        wanted = {framework_resource(f) for f in self.settings.frameworks}
        for rule in hook.get("rules") or []:
            groups, resources = rule.get("apiGroups") or [], rule.get("resources") or []
            if groups and all(g == GROUP for g in groups):
                return True
            if any((g, r) in wanted for g in groups for r in resources):
                return True
        return False

    def command(self) -> list[str]:
        manager = super().command()
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
            str(self.serving_certs),
            *manager,
        ]

    def exit_hint(self) -> str:
        if self._private_etc and "mount" in self.tail():
            return f" (no private /etc could be mounted: provide {METRICS_CERT_DIR})"
        return ""

    def webhooks_answer(self) -> bool:
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
        if self.dry_run(flavor) is None:
            return False
        job = self.dry_run(job)
        return job is not None and job["spec"].get("suspend") is True


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
