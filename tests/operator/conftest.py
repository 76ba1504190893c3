"""What operator tests use on the real control plane; the fixtures are in tests/conftest.py,
so that every package shares one of each (a second definition here would start a second
operator, holding the same Lease).

- `crd`: the ERLExperiment CRD, server-side applied once per session.
- `operator`: one `evokube-operator` process for the session, watching every
  namespace, running as a ServiceAccount bound to the operator's own
  ClusterRole as the Helm chart renders it (helm/evokube), so a missing
  permission fails the tests, with the chart's admission policies in place
  (host 0's token, the status guard). Tests may kill and restart it.
- `k8s`: small helpers (apply, read, wait) that say what they waited for and
  show the operator's last log lines when a wait times out.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import uuid
import warnings
from pathlib import Path

import yaml

from tests.cluster.controlplane import free_port, wait_until

REPO = Path(__file__).resolve().parents[2]
OPERATOR_NAMESPACE = "evokube-system"
# Leader election at test speed: a killed leader is replaced within about 4.5 s.
FAST_LEASE = (
    "--leader-election-lease-duration=4",
    "--leader-election-renew-deadline=3",
    "--leader-election-retry-period=0.5",
)
# The session's operator, which every cluster test shares: with two test workers on 2 cores a
# renewal can take seconds, and a 3 s deadline lost the Lease mid-suite (the operator then
# exits, as it should). A killed one is still replaced within about 10 s.
SESSION_LEASE = (
    "--leader-election-lease-duration=10",
    "--leader-election-renew-deadline=8",
    "--leader-election-retry-period=0.5",
)
GROUP, VERSION, PLURAL = "evokube.io", "v1alpha1", "erlexperiments"


def service_account_kubeconfig(cluster, api_client, namespace, name, path: Path) -> Path:
    """A kubeconfig that authenticates as a ServiceAccount with a TokenRequest token."""
    from kubernetes import client

    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=7200)
    )
    token = (
        client.CoreV1Api(api_client)
        .create_namespaced_service_account_token(name, namespace, request)
        .status.token
    )
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "test",
                "cluster": {
                    "server": cluster.state.server,
                    "certificate-authority": str(cluster.workdir / "pki" / "ca.crt"),
                },
            }
        ],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": name}}],
        "current-context": "test",
    }
    path.write_text(yaml.safe_dump(config))
    return path


class OperatorProcess:
    """`evokube-operator` as a child process: started, probed, killed, restarted."""

    def __init__(
        self,
        kubeconfig: Path,
        log_dir: Path,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
    ):
        self.kubeconfig = kubeconfig
        self.log_dir = log_dir
        self.args = args  # more command-line arguments, e.g. --namespace
        self.env = env or {}  # more environment, e.g. POD_NAME
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        name = self.env.get("POD_NAME", "operator")
        return self.log_dir / f"{name}-{self.starts}.log"

    def start(self, timeout: float = 60) -> None:
        self.starts += 1
        command = [
            str(Path(sys.executable).with_name("evokube-operator")),
            "--kubeconfig",
            str(self.kubeconfig),
            "--metrics-port",
            str(self.port),
            "--metrics-address",
            "127.0.0.1",
            *self.args,
        ]
        log = self.log_path.open("w")
        self.proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **self.env},
        )
        log.close()
        wait_until(
            lambda: self.get("/readyz")[0] == 200 or not self.alive(),
            timeout,
            "the operator to become ready",
        )
        assert self.alive(), f"the operator exited at start:\n{self.log_tail()}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def restart_if_exited(self) -> None:
        """Start the operator again if it ended on its own (it exits when it loses its Lease,
        for its Deployment to restart it), warning with the end of its log."""
        if self.proc is None or self.alive():
            return
        warnings.warn(
            f"the operator exited with {self.proc.returncode}; restarting it as its Deployment "
            f"would. The end of its log:\n{self.log_tail()}",
            stacklevel=2,
        )
        self.start()

    def kill(self) -> None:
        """SIGKILL: no cleanup at all, as when a node dies."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return 0, ""

    def metric(self, name: str, **labels: str) -> float:
        """The value of one sample of /metrics (0 when absent)."""
        _, text = self.get("/metrics")
        wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        for line in text.splitlines():
            if line.startswith("#") or " " not in line:
                continue
            series, value = line.rsplit(" ", 1)
            metric, _, label_text = series.partition("{")
            if metric != name:
                continue
            found = ",".join(sorted(label_text.rstrip("}").split(","))) if label_text else ""
            if found == wanted:
                return float(value)
        return 0.0

    def metric_sum(self, name: str, but: str | None = None) -> float:
        """The sum over every label set of one metric (but those with the label `but`)."""
        _, text = self.get("/metrics")
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if (line.startswith(name + "{") or line.startswith(name + " "))
            and (but is None or but not in line)
        )

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"


class K8s:
    """The few things operator tests do to the cluster, with waits that explain themselves."""

    def __init__(self, cluster, api_client, operator: OperatorProcess | None):
        from kubernetes import client

        self.cluster = cluster
        self.api_client = api_client
        self.operator = operator
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.rbac = client.RbacAuthorizationV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    # -- experiments --------------------------------------------------------------------
    def apply(self, manifest: dict, check: bool = True) -> subprocess.CompletedProcess:
        """`kubectl apply -f -`, as a researcher would."""
        return self.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(manifest), check=check)

    def experiment(self, namespace: str, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)

    def patch_spec(self, namespace: str, name: str, spec: dict) -> None:
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name, {"spec": spec}
        )

    def status(self, namespace: str, name: str) -> dict:
        return self.experiment(namespace, name).get("status") or {}

    def condition(self, namespace: str, name: str, kind: str) -> dict | None:
        conditions = self.status(namespace, name).get("conditions") or []
        return next((c for c in conditions if c["type"] == kind), None)

    # -- what it owns ---------------------------------------------------------------------
    def jobs(self, namespace: str, experiment: str) -> list:
        selector = f"evokube.io/experiment={experiment}"
        return self.batch.list_namespaced_job(namespace, label_selector=selector).items

    def pods(self, namespace: str, experiment: str, job: str | None = None) -> list:
        selector = f"evokube.io/experiment={experiment}"
        if job:
            selector += f",batch.kubernetes.io/job-name={job}"
        return self.core.list_namespaced_pod(namespace, label_selector=selector).items

    def running_pods(self, namespace: str, experiment: str, job: str) -> list:
        return [
            p
            for p in self.pods(namespace, experiment, job)
            if p.status.phase == "Running" and not p.metadata.deletion_timestamp
        ]

    def exit_pod(self, namespace: str, pod: str, code: int) -> None:
        """The test cluster's kwok stages end a pod with this exit code."""
        self.core.patch_namespaced_pod(
            pod, namespace, {"metadata": {"annotations": {"evokube.test/exit-code": str(code)}}}
        )

    def succeed(self, namespace: str, name: str, seeds: list[dict]) -> None:
        """Play a running experiment's trainer to the end: its per-seed outcome into
        status.progress.seeds (as process 0 writes it), then every host exits 0."""
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, name, {"status": {"progress": {"seeds": seeds}}}
        )
        job = self.status(namespace, name)["jobName"]
        for pod in self.running_pods(namespace, name, job):
            self.exit_pod(namespace, pod.metadata.name, 0)

    def events(self, namespace: str, name: str) -> list[str]:
        items = self.core.list_namespaced_event(
            namespace,
            field_selector=f"involvedObject.name={name},involvedObject.kind=ERLExperiment",
        ).items
        return [e.reason for e in sorted(items, key=lambda e: e.metadata.creation_timestamp)]

    def wait_event(self, namespace: str, name: str, reason: str, timeout: float = 30) -> None:
        """An Event with `reason` about the experiment (posted just after the status write
        that goes with it, so a test that saw the status waits a moment for it)."""
        self.wait(lambda: reason in self.events(namespace, name), f"a {reason} Event", timeout)

    # -- waiting --------------------------------------------------------------------------
    def wait(self, predicate, what: str, timeout: float = 30):
        try:
            return wait_until(predicate, timeout, what, interval=0.2)
        except TimeoutError as err:
            tail = self.operator.log_tail() if self.operator else ""
            raise TimeoutError(f"{err}\n--- operator log ---\n{tail}") from None

    def wait_phase(self, namespace: str, name: str, phase: str, timeout: float = 30) -> dict:
        """The status once the experiment is in `phase`; one not created yet (a sweep's child,
        say) is waited for too."""

        from kubernetes import client

        def current() -> dict | None:
            try:
                return self.status(namespace, name)
            except client.ApiException as err:
                if err.status == 404:
                    return None
                raise

        def reached():
            status = current()
            return status if status and status.get("phase") == phase else None

        try:
            return self.wait(reached, f"{namespace}/{name} to be {phase}", timeout)
        except TimeoutError as err:
            status = json.dumps(current(), indent=1)
            raise TimeoutError(f"{err}\n--- status ---\n{status}") from None

    def wait_running_gang(self, namespace: str, name: str, hosts: int, timeout: float = 30):
        """Phase Running and every host's pod of the current Job running; returns the status."""
        status = self.wait_phase(namespace, name, "Running", timeout)
        self.wait(
            lambda: len(self.running_pods(namespace, name, status["jobName"])) == hosts,
            f"{hosts} running pods of {status['jobName']}",
            timeout,
        )
        return status


@contextlib.contextmanager
def stand_in(cluster, api, operator, operator_kubeconfig, namespace: str, lease: str, *args: str):
    """The session's operator pauses; one with these extra arguments (and a Lease of its own,
    named `lease`-<random>) takes its place, as K8s helpers; the session's operator comes back."""
    operator.stop()
    process = OperatorProcess(
        operator_kubeconfig,
        Path(tempfile.mkdtemp(prefix=f"{lease}-operator-")),
        (
            f"--leader-election-namespace={OPERATOR_NAMESPACE}",
            f"--leader-election-lease-name={lease}-{uuid.uuid4().hex[:8]}",
            *FAST_LEASE,
            *args,
        ),
    )
    process.start()
    helper = K8s(cluster, api, process)
    try:
        yield helper
    finally:
        release_gangs(helper, namespace)
        process.stop()
        operator.start()


def release_gangs(k8s: K8s, namespace: str) -> None:
    """Delete the test's experiments and wait for their pods before the namespace goes.

    Namespace deletion removes pods first (OrderedNamespaceDeletion) while their
    Job still exists; a Job with a pod failure policy keeps its finalizer on a
    pod until the pod reaches a terminal phase, which a real kubelet reports and
    kwok's delete stage does not. Deleting the experiment first deletes the Job
    (garbage collector), which releases the pods and the nodes' capacity.
    """
    # Sweeps first: a sweep would create a deleted child again (its garbage collector takes them).
    for kind in ("erls", "erlx"):
        k8s.cluster.kubectl("delete", kind, "--all", "-n", namespace, "--wait=false", check=False)
    selector = "app.kubernetes.io/managed-by=evokube-operator"
    k8s.wait(
        lambda: not k8s.core.list_namespaced_pod(namespace, label_selector=selector).items,
        f"the trainer pods in {namespace} to be gone",
    )


def experiment_manifest(name: str, namespace: str, **spec) -> dict:
    """A small valid experiment; keyword arguments replace top-level spec fields."""
    base = {
        "image": "ghcr.io/evokube/trainer-cpu:0.1.0",
        "algorithm": {"name": "openes"},
        "environment": {"name": "gymnax/Pendulum-v1"},
        "population": {"size": 64},
        "stopping": {"maxGenerations": 100},
    }
    base.update(spec)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ERLExperiment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": base,
    }


def sweep_manifest(
    name: str, namespace: str, parameters: list[dict], max_parallel: int = 1, **spec
) -> dict:
    """An ERLSweep of experiment_manifest's experiment (keyword arguments: its spec fields)."""
    template = experiment_manifest("unused", namespace, **spec)["spec"]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ERLSweep",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "template": {"metadata": {"labels": {"team": "a"}}, "spec": template},
            "parameters": parameters,
            "maxParallel": max_parallel,
        },
    }


def documented_tenant_quotas() -> list[dict]:
    """The ResourceQuotas docs/security.md recommends for each tenant namespace."""
    text = (REPO / "docs" / "security.md").read_text()
    section = text.split("## Per tenant: what the chart recommends", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    return [quota for quota in yaml.safe_load_all(block) if quota]


def suspended_experiment(k8s: K8s, namespace: str, name: str) -> dict:
    """A small experiment created suspended (so it owns no Job or objects yet), once the
    operator has given it a phase; its body as the API server returns it."""
    k8s.apply(experiment_manifest(name, namespace, suspend=True))
    return k8s.wait(
        lambda: (e := k8s.experiment(namespace, name)).get("status", {}).get("phase") and e,
        f"{name} to be Suspended",
    )


def quota_of_none(name: str, resource: str) -> dict:
    """A ResourceQuota allowing no `resource` (e.g. `pods`, `count/jobs.batch`)."""
    return {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": name},
        "spec": {"hard": {resource: "0"}},
    }


def apply_quotas(k8s: K8s, namespace: str, quotas: list[dict]) -> None:
    """Create the quotas and wait until the quota controller counts them (until then the API
    server refuses what they cover)."""
    for quota in quotas:
        k8s.core.create_namespaced_resource_quota(namespace, quota)
    for quota in quotas:
        name = quota["metadata"]["name"]
        k8s.wait(
            lambda n=name: k8s.core.read_namespaced_resource_quota(n, namespace).status.hard,
            f"quota {name} to be counted",
        )
