"""A real Kubernetes control plane on loopback, for tests and local development.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok run as
local processes (no container runtime is needed): TLS everywhere the API
server listens, token authentication, RBAC, the ServiceAccount admission
plugin and token signing. kwok plays kubelet for fake TPU, GPU and CPU node
pools (see nodes.yaml and kwok-stages.yaml).

Everything a running cluster needs to be found again (pids, ports, tokens)
sits in `<workdir>/state.json`, so `python -m tests.cluster down` can stop a
cluster that another process started.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
# Identities the cluster knows: name -> (user, groups). Each gets a static token.
IDENTITIES = {
    "admin": ("evokube-admin", ["system:masters"]),
    "controller-manager": ("system:kube-controller-manager", []),
    "scheduler": ("system:kube-scheduler", []),
    "kwok": ("evokube-kwok", ["system:masters"]),
}
FAKE_NODE_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
SERVICE_CIDR = "10.96.0.0/16"
NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"


class ClusterError(RuntimeError):
    """A component did not come up; the message names it and its log file."""


def wait_until(predicate: Callable[[], object], timeout: float, what: str, interval=0.2):
    """Poll `predicate` until it returns something truthy, and return that.

    Raises TimeoutError saying what was awaited, so a failing test says why.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def read_versions() -> dict[str, str]:
    """The pinned versions from versions.env (KEY=VALUE lines)."""
    versions = {}
    for line in (HERE / "versions.env").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            versions[key] = value
    return versions


@dataclass(frozen=True)
class Binaries:
    """Folders holding the pinned binaries, as build.sh leaves them in the cache."""

    etcd: Path
    kwok: Path
    helm: Path
    kubernetes: Path

    @classmethod
    def build(cls) -> Binaries:
        """Run build.sh (a no-op when the cache is warm) and return its folders."""
        out = subprocess.run(
            ["bash", str(HERE / "build.sh"), "etcd", "kwok", "helm", "kubernetes"],
            check=True,
            stdout=subprocess.PIPE,
            text=True,
        ).stdout.split()
        return cls(*(Path(p) for p in out[-4:]))

    def path(self, name: str) -> str:
        folder = {"etcd": self.etcd, "kwok": self.kwok, "helm": self.helm}.get(
            name, self.kubernetes
        )
        return str(folder / name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class ClusterState:
    """What a running cluster leaves on disk to be found again."""

    workdir: str
    api_port: int
    ports: dict[str, int]
    tokens: dict[str, str]
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    def save(self) -> None:
        Path(self.workdir, "state.json").write_text(json.dumps(asdict(self), indent=2))

    @classmethod
    def load(cls, workdir: Path) -> ClusterState | None:
        path = workdir / "state.json"
        return cls(**json.loads(path.read_text())) if path.exists() else None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(FileNotFoundError):
        # A zombie child (ours, not yet reaped) is as good as dead.
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    return False


class ControlPlane:
    """Start, find and stop one test cluster living in `workdir`."""

    def __init__(
        self,
        workdir: Path,
        binaries: Binaries | None = None,
        controller_manager_qps: int | None = None,
        pool_sizes: Mapping[str, int] | None = None,
        pool_copies: Mapping[str, str] | None = None,
    ):
        """`controller_manager_qps` raises kube-controller-manager's client rate limit (burst
        twice that) from its default of 20/s; `pool_sizes` overrides nodes.yaml's node count of
        the pools it names; `pool_copies` adds pools (new name -> nodes.yaml pool to copy, see
        `fake_nodes`). Scale benchmarks need them, tests do not."""
        self.workdir = Path(workdir).resolve()
        self._binaries = binaries
        self._kcm_qps = controller_manager_qps
        self._pool_sizes = dict(pool_sizes or {})
        self._pool_copies = dict(pool_copies or {})
        self._procs: dict[str, subprocess.Popen] = {}
        self.state = ClusterState.load(self.workdir)

    # -- paths ---------------------------------------------------------------
    @property
    def binaries(self) -> Binaries:
        if self._binaries is None:
            self._binaries = Binaries.build()
        return self._binaries

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (group system:masters)."""
        return self.workdir / "kubeconfig"

    def log(self, component: str) -> Path:
        return self.workdir / "logs" / f"{component}.log"

    def api_client(self, token: str | None = None):
        """A kubernetes-client ApiClient; admin unless another token is given."""
        from kubernetes import client

        config = client.Configuration()
        config.host = self.state.server
        config.ssl_ca_cert = str(self.workdir / "pki" / "ca.crt")
        config.api_key = {"authorization": token or self.state.tokens["admin"]}
        config.api_key_prefix = {"authorization": "Bearer"}
        return client.ApiClient(config)

    def kubectl(self, *args: str, check: bool = True, input: str | None = None):
        """Run our pinned kubectl as admin; returns the CompletedProcess.

        With check, a failure raises an error that carries kubectl's stderr.
        """
        run = subprocess.run(
            [self.binaries.path("kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            input=input,
        )
        if check and run.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed: {run.stderr.strip()}")
        return run

    # -- lifecycle -----------------------------------------------------------
    def is_running(self) -> bool:
        if self.state is None or not self.state.pids:
            return False
        return all(_pid_alive(p) for p in self.state.pids.values()) and self._api_ready()

    def start(self, timeout: float = 120.0) -> None:
        """Bring the whole cluster up, or raise ClusterError naming what failed.

        A failure stops whatever had already started.
        """
        if self.is_running():
            return
        self.stop()
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        ports = {name: free_port() for name in ("etcd", "etcd-peer", "kcm", "scheduler", "kwok")}
        self.state = ClusterState(
            workdir=str(self.workdir),
            api_port=free_port(),
            ports=ports,
            tokens={name: secrets.token_hex(16) for name in IDENTITIES},
        )
        try:
            self._write_pki()
            self._write_kubeconfigs()
            self._start_etcd(timeout)
            self._start_apiserver(timeout)
            self._start_controller_manager(timeout)
            self._start_scheduler(timeout)
            self._start_kwok()
            self._create_nodes(timeout)
        except BaseException:
            self.stop()
            raise

    def stop(self, grace: float = 10.0) -> None:
        """Stop every component (newest first) and leave no process behind."""
        if self.state is None:
            return
        for name in reversed(list(self.state.pids)):
            self._end(name, grace)
        self.state.pids = {}
        self.state.save()

    def _end(self, name: str, grace: float) -> None:
        pid = self.state.pids[name]
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        while _pid_alive(pid) and time.monotonic() < deadline:
            self._reap(name)
            time.sleep(0.05)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        self._reap(name, block=True)

    def describe(self, name: str) -> str:
        """Whether a component still runs, and the end of its log: what a failure report needs."""
        pid = self.state.pids.get(name)
        alive = pid is not None and _pid_alive(pid)
        state = "running" if alive else "not running"
        return f"{name} {state}; {self.log(name)} ends:\n{self._tail(name)}"

    def restart_controller_manager(self, timeout: float = 60.0) -> None:
        """Stop kube-controller-manager and start it again (its log keeps both lives). It holds
        no state of its own: its controllers pick up where the API server says they are."""
        if "kube-controller-manager" in self.state.pids:
            self._end("kube-controller-manager", grace=10.0)
        self._start_controller_manager(timeout)

    def wait_for_default_account(self, namespace: str, timeout: float = 30.0) -> None:
        """Wait for kube-controller-manager to create a new namespace's default
        ServiceAccount (pods cannot be created before it).

        A controller manager that died or hung mid-session (seen once in CI: every later
        namespace timed out) is reported as a warning with its log and restarted once, so
        one broken component does not fail every later test of the session; a second
        timeout raises with that report.
        """
        from kubernetes import client

        with contextlib.closing(self.api_client()) as api:
            core = client.CoreV1Api(api)

            def exists() -> bool:
                accounts = core.list_namespaced_service_account(namespace).items
                return any(sa.metadata.name == "default" for sa in accounts)

            what = f"the default ServiceAccount in {namespace}"
            try:
                wait_until(exists, timeout, what)
                return
            except TimeoutError:
                report = self.describe("kube-controller-manager")
            warnings.warn(f"no {what} after {timeout:.0f}s; restarting {report}", stacklevel=2)
            self.restart_controller_manager()
            try:
                wait_until(exists, timeout, what)
            except TimeoutError as error:
                raise TimeoutError(f"{error} after a restart of:\n{report}") from None

    def _reap(self, name: str, block: bool = False) -> None:
        proc = self._procs.get(name)
        if proc is not None:
            if block:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
            else:
                proc.poll()

    # -- pieces --------------------------------------------------------------
    def _openssl(self, *args: str) -> None:
        subprocess.run(
            ["openssl", *args], check=True, capture_output=True, cwd=self.workdir / "pki"
        )

    def _write_pki(self) -> None:
        pki = self.workdir / "pki"
        pki.mkdir(exist_ok=True)
        days = "3650"
        self._openssl(
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            days,
            "-subj",
            "/CN=evokube-test-ca",
        )
        self._openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "apiserver.key",
            "-out",
            "apiserver.csr",
            "-subj",
            "/CN=kube-apiserver",
        )
        sans = ",".join(
            [
                "IP:127.0.0.1",
                "IP:10.96.0.1",
                "DNS:localhost",
                "DNS:kubernetes",
                "DNS:kubernetes.default",
                "DNS:kubernetes.default.svc",
                "DNS:kubernetes.default.svc.cluster.local",
            ]
        )
        (pki / "san.cnf").write_text(f"subjectAltName={sans}\n")
        self._openssl(
            "x509",
            "-req",
            "-in",
            "apiserver.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "apiserver.crt",
            "-days",
            days,
            "-extfile",
            "san.cnf",
        )
        self._openssl("genrsa", "-out", "sa.key", "2048")
        self._openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")
        rows = [
            f'{self.state.tokens[name]},{user},{user},"{",".join(groups)}"'
            for name, (user, groups) in IDENTITIES.items()
        ]
        (pki / "tokens.csv").write_text("\n".join(rows) + "\n")
        os.chmod(pki / "tokens.csv", 0o600)

    def write_kubeconfig(self, path: Path, token: str, namespace: str = "default") -> Path:
        """A kubeconfig for this cluster that authenticates with `token`."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "evokube-test",
                    "cluster": {
                        "server": self.state.server,
                        "certificate-authority": str(self.workdir / "pki" / "ca.crt"),
                    },
                }
            ],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "evokube-test",
                    "context": {"cluster": "evokube-test", "user": "user", "namespace": namespace},
                }
            ],
            "current-context": "evokube-test",
        }
        path.write_text(yaml.safe_dump(config))
        os.chmod(path, 0o600)
        return path

    def _write_kubeconfigs(self) -> None:
        self.write_kubeconfig(self.kubeconfig, self.state.tokens["admin"])
        for name in ("controller-manager", "scheduler", "kwok"):
            self.write_kubeconfig(self.workdir / f"{name}.kubeconfig", self.state.tokens[name])

    def spawn(
        self,
        name: str,
        args: list[str],
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen:
        """Start a process that belongs to this cluster: in a session of its own (it outlives
        whoever started it), logging to logs/<name>.log, its pid in state.json, so that
        `stop` ends it too, newest first. `cwd`: the cluster's folder unless given."""
        with open(self.log(name), "ab") as log:
            proc = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=cwd or self.workdir,
                env=env,
            )
        self._procs[name] = proc
        self.state.pids[name] = proc.pid
        self.state.save()
        return proc

    def wait_for(self, name: str, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Poll `ready` until true; fail fast, naming the log, if the process dies."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            proc = self._procs.get(name)
            if proc is not None and proc.poll() is not None:
                raise ClusterError(
                    f"{name} exited with code {proc.returncode} before {what}; "
                    f"see {self.log(name)}:\n{self._tail(name)}"
                )
            if ready():
                return
            time.sleep(0.2)
        raise ClusterError(
            f"{name} did not become {what} within {timeout:.0f}s; "
            f"see {self.log(name)}:\n{self._tail(name)}"
        )

    def _tail(self, name: str, lines: int = 15) -> str:
        try:
            return "\n".join(self.log(name).read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log written)"

    def _https_ok(self, port: int, path: str, token: str | None = None) -> bool:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE  # component health ports use self-signed certs
        if port == self.state.api_port:
            ctx = ssl.create_default_context(cafile=str(self.workdir / "pki" / "ca.crt"))
        req = urllib.request.Request(f"https://127.0.0.1:{port}{path}")
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, timeout=2, context=ctx) as resp:
                return resp.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, ssl.SSLError):
            return False

    def _api_ready(self) -> bool:
        return self._https_ok(self.state.api_port, "/readyz", self.state.tokens["admin"])

    def _start_etcd(self, timeout: float) -> None:
        client = f"http://127.0.0.1:{self.state.ports['etcd']}"
        peer = f"http://127.0.0.1:{self.state.ports['etcd-peer']}"
        self.spawn(
            "etcd",
            [
                self.binaries.path("etcd"),
                "--name=evokube",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={client}",
                f"--advertise-client-urls={client}",
                f"--listen-peer-urls={peer}",
                f"--initial-advertise-peer-urls={peer}",
                f"--initial-cluster=evokube={peer}",
                "--listen-metrics-urls=",
                # A throwaway test store: durability is not worth the fsync cost here.
                "--unsafe-no-fsync",
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
        )

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"{client}/health", timeout=2) as resp:
                    return json.load(resp).get("health") == "true"
            except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
                return False

        self.wait_for("etcd", healthy, timeout, "healthy")

    def _start_apiserver(self, timeout: float) -> None:
        pki = self.workdir / "pki"
        self.spawn(
            "kube-apiserver",
            [
                self.binaries.path("kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{self.state.ports['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.state.api_port}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--token-auth-file={pki / 'tokens.csv'}",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # A loopback address cannot be a Service endpoint; nothing here
                # routes to the in-cluster `kubernetes` Service anyway.
                "--endpoint-reconciler-type=none",
                f"--cert-dir={pki}",
                "--allow-privileged=true",
                "--profiling=false",
            ],
        )
        self.wait_for("kube-apiserver", self._api_ready, timeout, "ready (/readyz)")

    def _start_controller_manager(self, timeout: float) -> None:
        pki = self.workdir / "pki"
        port = self.state.ports["kcm"]
        self.spawn(
            "kube-controller-manager",
            [
                self.binaries.path("kube-controller-manager"),
                f"--kubeconfig={self.workdir / 'controller-manager.kubeconfig'}",
                f"--authentication-kubeconfig={self.workdir / 'controller-manager.kubeconfig'}",
                f"--authorization-kubeconfig={self.workdir / 'controller-manager.kubeconfig'}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--controllers=*",
                *(
                    [f"--kube-api-qps={self._kcm_qps}", f"--kube-api-burst={2 * self._kcm_qps}"]
                    if self._kcm_qps
                    else []
                ),
            ],
        )
        self.wait_for(
            "kube-controller-manager",
            lambda: self._https_ok(port, "/healthz"),
            timeout,
            "healthy (/healthz)",
        )

    def _start_scheduler(self, timeout: float) -> None:
        port = self.state.ports["scheduler"]
        kubeconfig = self.workdir / "scheduler.kubeconfig"
        self.spawn(
            "kube-scheduler",
            [
                self.binaries.path("kube-scheduler"),
                f"--kubeconfig={kubeconfig}",
                f"--authentication-kubeconfig={kubeconfig}",
                f"--authorization-kubeconfig={kubeconfig}",
                "--bind-address=127.0.0.1",
                f"--secure-port={port}",
                "--leader-elect=false",
            ],
        )
        self.wait_for(
            "kube-scheduler", lambda: self._https_ok(port, "/readyz"), timeout, "ready (/readyz)"
        )

    def _start_kwok(self) -> None:
        key, value = FAKE_NODE_ANNOTATION
        self.spawn(
            "kwok",
            [
                self.binaries.path("kwok"),
                f"--kubeconfig={self.workdir / 'kwok.kubeconfig'}",
                "--manage-all-nodes=false",
                f"--manage-nodes-with-annotation-selector={key}={value}",
                f"--config={HERE / 'kwok-stages.yaml'}",
                f"--server-address=127.0.0.1:{self.state.ports['kwok']}",
                "--node-lease-duration-seconds=40",
            ],
        )

    def _create_nodes(self, timeout: float) -> None:
        """Create the fake node pools of nodes.yaml and wait until all are Ready."""
        manifests = fake_nodes(self._pool_sizes, self._pool_copies)
        self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(manifests))
        names = [m["metadata"]["name"] for m in manifests]

        def all_ready() -> bool:
            out = self.kubectl("get", "nodes", "-o", "json", check=False)
            if out.returncode != 0:
                return False
            ready = {
                n["metadata"]["name"]
                for n in json.loads(out.stdout)["items"]
                for c in n.get("status", {}).get("conditions", [])
                if c["type"] == "Ready" and c["status"] == "True"
            }
            return set(names) <= ready

        self.wait_for("kwok", all_ready, timeout, f"managing {len(names)} Ready nodes")


def fake_nodes(
    sizes: Mapping[str, int] | None = None, copies: Mapping[str, str] | None = None
) -> list[dict]:
    """The nodes of every pool of nodes.yaml, named <pool>-<i>: as many as `sizes` says, else
    as its count. `copies` adds pools (new name -> pool of nodes.yaml) shaped like another,
    their GKE node pool label the new name: more slices of one shape, for benchmarks."""
    pools = yaml.safe_load((HERE / "nodes.yaml").read_text())["pools"]
    for new, template in (copies or {}).items():
        if template not in pools or new in pools:
            raise ClusterError(f"cannot copy pool {template!r} as {new!r}")
        spec = pools[template]
        pools[new] = {**spec, "labels": {**spec["labels"], NODE_POOL_LABEL: new}}
    unknown = set(sizes or {}) - set(pools)
    if unknown:
        raise ClusterError(f"nodes.yaml has no pool {sorted(unknown)}")
    return [
        fake_node(f"{pool}-{i}", pool, spec)
        for pool, spec in pools.items()
        for i in range((sizes or {}).get(pool, spec["count"]))
    ]


def fake_node(name: str, pool: str, spec: dict) -> dict:
    """A Node object for kwok to manage, labelled and tainted like its pool."""
    key, value = FAKE_NODE_ANNOTATION
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {key: value},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                "evokube.io/test-pool": pool,
                **spec["labels"],
            },
        },
        "spec": {"taints": spec["taints"]},
        "status": {"capacity": spec["capacity"], "allocatable": spec["capacity"]},
    }
