"""A kubebuilder controller manager with admission webhooks, run as a local process
against a started `ControlPlane` (Kueue: kueue.py; JobSet: jobset.py).

Both ship, beside their binary (build.sh keeps them in the cache folder), the
module's CRDs and webhook manifests with the kustomizations that finish them.
`WebhookManager` does what their Deployment and a Service would do in a cluster,
without either:

- the CRDs are server-side applied; those that the kustomization gives a
  conversion webhook get one here too;
- the webhook configurations are registered with `clientConfig.url`
  (https://127.0.0.1:<port>/<path>) and the caBundle of a CA made for this one
  run with openssl, instead of `clientConfig.service`: nothing on loopback
  routes to a Service. The manager's own certificate management is off; it
  serves the certificate made here;
- `stop` deletes the webhook configurations before it ends the process, so a
  stopped manager never fails another test's object creation. The CRDs stay.

A subclass names its build component, webhook configurations and log, and
supplies its configuration file, which webhooks it wants, and a probe that the
webhooks answer.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml

from tests.cluster.controlplane import HERE, ClusterError, ControlPlane, _pid_alive, free_port

# libyaml's loader where PyYAML has it: Kueue's Workload CRD alone is 19,000 lines.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(path: Path) -> Any:
    return yaml.load(path.read_text(), Loader=_Loader)


def component_folder(component: str) -> Path:
    """Build a component of build.sh (a no-op when cached) and return its cache folder."""
    out = subprocess.run(
        ["bash", str(HERE / "build.sh"), component], check=True, stdout=subprocess.PIPE, text=True
    ).stdout.split()
    return Path(out[-1])


def kustomized_webhooks(webhook_dir: Path) -> list[dict]:
    """manifests.yaml with the patches of its kustomization.yaml applied.

    Two patch shapes occur: an inline document whose webhooks replace fields of the
    manifest's webhooks of the same name (Kueue), and a file of JSON 6902 `replace`
    operations on `/webhooks/<i>` of the target kind (JobSet)."""
    docs = [d for d in yaml.safe_load_all((webhook_dir / "manifests.yaml").read_text()) if d]
    for patch in load_yaml(webhook_dir / "kustomization.yaml").get("patches") or []:
        body = (
            yaml.safe_load(patch["patch"])
            if "patch" in patch
            else load_yaml(webhook_dir / patch["path"])
        )
        if isinstance(body, list):
            for doc in docs:
                if doc["kind"] == patch["target"]["kind"]:
                    for op in body:
                        _, key, index = op["path"].split("/")
                        if op["op"] != "replace" or key != "webhooks":
                            raise ClusterError(f"unsupported webhook patch {op['op']} {op['path']}")
                        doc["webhooks"][int(index)] = op["value"]
            continue
        overrides = {hook["name"]: hook for hook in body.get("webhooks") or []}
        for doc in docs:
            if doc["kind"] == body.get("kind"):
                doc["webhooks"] = [{**h, **overrides.get(h["name"], {})} for h in doc["webhooks"]]
    return docs


@dataclass
class WebhookManager(ABC):
    """One manager process on a started control plane."""

    component: ClassVar[str]  # build.sh's name for it, and the binary's
    # kind -> name of the webhook configurations registered for it
    webhook_names: ClassVar[dict[str, str]]

    cluster: ControlPlane
    # Keyword-only from here: a subclass's own fields follow `cluster` (Kueue(cluster, settings)).
    _: KW_ONLY
    folder: Path | None = None
    webhook_port: int = 0
    health_port: int = 0
    metrics_port: int = 0
    process: subprocess.Popen | None = field(default=None, repr=False)
    started_in: float = 0.0

    # -- what a subclass supplies ------------------------------------------------
    @property
    def name(self) -> str:
        """Its log and its entry in the cluster's state.json."""
        return self.component

    @abstractmethod
    def configuration(self) -> dict[str, Any]:
        """The manager's configuration file (written to config.yaml)."""

    def wanted(self, hook: dict) -> bool:
        """Whether to register one webhook of the manifests."""
        return True

    @abstractmethod
    def webhooks_answer(self) -> bool:
        """A dry-run request that only passes once the webhooks serve."""

    def prepare(self) -> None:  # noqa: B027 (optional hook)
        """Called after the certificates are written, before the CRDs go in."""

    def after_start(self, timeout: float) -> None:  # noqa: B027 (optional hook)
        """Called once the webhooks answer."""

    def command(self) -> list[str]:
        return [
            str(self.binary),
            f"--config={self.workdir / 'config.yaml'}",
            "--zap-log-level=2",
        ]

    def exit_hint(self) -> str:
        """Appended to the error when the process exits early."""
        return ""

    # -- paths ---------------------------------------------------------------
    @property
    def workdir(self) -> Path:
        return self.cluster.workdir / self.name

    @property
    def log(self) -> Path:
        return self.cluster.log(self.name)

    @property
    def binary(self) -> Path:
        return self._folder() / self.component

    @property
    def serving_certs(self) -> Path:
        """tls.crt and tls.key for 127.0.0.1, signed by `ca_bundle`'s CA."""
        return self.workdir / "pki" / "serving"

    def _folder(self) -> Path:
        if self.folder is None:
            self.folder = component_folder(self.component)
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
        # A manager that an earlier, killed test run left on a reused cluster goes
        # first, with its webhooks: two would both act on the same objects.
        self.stop()
        self._folder()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.webhook_port, self.health_port, self.metrics_port = (free_port() for _ in range(3))
        try:
            self._write_pki()
            self.prepare()
            self.install_crds(timeout)
            (self.workdir / "config.yaml").write_text(yaml.safe_dump(self.configuration()))
            self._spawn()
            self._wait(self._ready, timeout, "ready (/readyz)")
            self.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(self.webhooks()))
            self._wait(self.webhooks_answer, timeout, "answering through its webhooks")
            self.after_start(timeout)
        except BaseException:
            self.stop()
            raise
        self.started_in = time.monotonic() - began

    def stop(self, grace: float = 10.0) -> None:
        """Unregister the webhooks, then end the manager. The CRDs stay installed."""
        for kind, name in self.webhook_names.items():
            self.cluster.kubectl("delete", kind.lower(), name, "--ignore-not-found", check=False)
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

    # -- manifests -----------------------------------------------------------
    def crds(self) -> list[dict]:
        """The CRDs, with the conversion webhooks the kustomization adds pointed at
        this run's URL."""
        crd_dir = self._folder() / "config" / "crd"
        kustomization = load_yaml(crd_dir / "kustomization.yaml")
        converted = set()
        for patch in kustomization.get("patches") or []:
            path = patch.get("path", "")
            if Path(path).name.startswith("webhook_in_"):
                converted.add(load_yaml(crd_dir / path)["metadata"]["name"])
        crds = []
        for resource in kustomization["resources"]:
            crd = load_yaml(crd_dir / resource)
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
        # Server-side: Kueue's Workload CRD is far too large for client-side apply.
        self.cluster.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            f"--field-manager=evokube-tests-{self.component}",
            "-f",
            "-",
            input=json.dumps({"apiVersion": "v1", "kind": "List", "items": crds}),
        )
        names = [c["metadata"]["name"] for c in crds]

        def established() -> bool:
            out = self.cluster.kubectl("get", "crd", *names, "-o", "json", check=False)
            if out.returncode != 0:
                return False
            got = json.loads(out.stdout)  # one name gives the object, several a List
            ok = {
                c["metadata"]["name"]
                for c in got.get("items", [got])
                for cond in (c.get("status") or {}).get("conditions") or []
                if cond["type"] == "Established" and cond["status"] == "True"
            }
            return set(names) <= ok

        self._wait(established, timeout, f"{len(names)} CRDs Established", need_process=False)
        return names

    def webhooks(self) -> list[dict]:
        """The webhook configurations as the kustomization finishes them, those that
        `wanted` keeps, with URLs on loopback and this run's CA."""
        out = []
        for doc in kustomized_webhooks(self._folder() / "config" / "webhook"):
            hooks = [
                {
                    **hook,
                    "clientConfig": {
                        "url": self.url(hook["clientConfig"]["service"]["path"]),
                        "caBundle": self.ca_bundle,
                    },
                }
                for hook in doc["webhooks"]
                if self.wanted(hook)
            ]
            out.append(
                {
                    "apiVersion": doc["apiVersion"],
                    "kind": doc["kind"],
                    "metadata": {"name": self.webhook_names[doc["kind"]]},
                    "webhooks": hooks,
                }
            )
        return out

    def dry_run(self, obj: dict) -> dict | None:
        """`obj` as a server-side dry-run create returns it (webhooks applied), or None
        when the API server refused it."""
        run = self.cluster.kubectl(
            "create", "--dry-run=server", "-o", "json", "-f", "-",
            input=json.dumps(obj), check=False,
        )  # fmt: skip
        return json.loads(run.stdout) if run.returncode == 0 else None

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
        self.serving_certs.mkdir(parents=True)
        ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
        self._openssl(
            "req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "3650",
            "-subj", f"/CN=evokube-test-{self.component}-ca",
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

    def _spawn(self) -> None:
        # One of the cluster's own processes, so that stopping the cluster (or
        # `python -m tests.cluster down`) ends a manager left behind as well.
        env = {**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)}
        self.process = self.cluster.spawn(self.name, self.command(), env, cwd=self.workdir)
        self.cluster.state.save()

    def tail(self, lines: int = 20) -> str:
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
                raise ClusterError(
                    f"{self.name} exited with code {self.process.returncode} before {what}"
                    f"{self.exit_hint()}; see {self.log}:\n{self.tail()}"
                )
            if ready():
                return
            time.sleep(0.2)
        raise ClusterError(
            f"{self.name} did not become {what} within {timeout:.0f}s; "
            f"see {self.log}:\n{self.tail()}"
        )

    def _ready(self) -> bool:
        url = f"http://127.0.0.1:{self.health_port}/readyz"
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False
