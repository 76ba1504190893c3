"""The chart in helm/evokube, driven with the pinned helm binary of the test cluster.

Also used by the operator tests: they run the operator with the RBAC this chart
renders, the one copy of the operator's permissions.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "helm" / "evokube"
# What `helm template` needs to render the ServiceMonitor and the PodMonitor.
MONITORING_APIS = (
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PodMonitor",
)
RBAC_TEMPLATES = ("templates/serviceaccount.yaml", "templates/rbac.yaml")
ADMISSION_TEMPLATE = "templates/admission.yaml"
# Namespaces a test installs a release of its own for: the session operator's
# admission policies (operator_policies) leave them to that release's policies.
OWN_RELEASE_LABEL = "evokube.test/own-release"


def helm(cluster, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run the pinned helm against `cluster` as admin, with its own config and cache folders."""
    home = cluster.workdir / "helm"
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
        "KUBECONFIG": str(cluster.kubeconfig),
    }
    run = subprocess.run(
        [cluster.binaries.path("helm"), *args], capture_output=True, text=True, env=env
    )
    if check and run.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)} failed ({run.returncode}):\n{run.stderr}")
    return run


def value_args(values: Mapping[str, Any] | None, folder: Path) -> list[str]:
    """`--values FILE` for a values dict (written into `folder`), or nothing."""
    if not values:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(dict(values))
    path = folder / f"values-{hashlib.sha1(text.encode()).hexdigest()[:12]}.yaml"
    path.write_text(text)
    return ["--values", str(path)]


def render(
    cluster,
    release: str,
    namespace: str,
    values: Mapping[str, Any] | None = None,
    *,
    show_only: Iterable[str] = (),
    api_versions: Iterable[str] = (),
    kube_version: str | None = None,
    live: bool = False,
) -> str:
    """`helm template` output: offline (for helm's own Kubernetes version, or `kube_version`),
    or (live) for `cluster`'s version and admission APIs."""
    args = ["template", release, str(CHART), "--namespace", namespace]
    if kube_version:
        args += ["--kube-version", kube_version]
    if live:
        args += capabilities(cluster)
    args += value_args(values, cluster.workdir / "helm" / "values")
    for template in show_only:
        args += ["--show-only", template]
    for api in api_versions:
        args += ["--api-versions", api]
    return helm(cluster, *args).stdout


@functools.cache
def _served(kubeconfig: Path, kubectl: str) -> tuple[str, ...]:
    server = json.loads(
        subprocess.run(
            [kubectl, f"--kubeconfig={kubeconfig}", "version", "-o", "json"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )["serverVersion"]["gitVersion"]
    group = "admissionregistration.k8s.io"
    kinds = []
    for version in ("v1", "v1beta1"):
        raw = subprocess.run(
            [kubectl, f"--kubeconfig={kubeconfig}", "get", "--raw", f"/apis/{group}/{version}"],
            capture_output=True,
            text=True,
        )
        if raw.returncode == 0:
            resources = json.loads(raw.stdout)["resources"]
            kinds += [f"{group}/{version}/{r['kind']}" for r in resources if "/" not in r["name"]]
    return ("--kube-version", server, *(arg for kind in kinds for arg in ("--api-versions", kind)))


def capabilities(cluster) -> tuple[str, ...]:
    """`helm template` flags for what `helm install` on `cluster` sees: its version and the
    admission kinds it serves (the chart picks the trainer's token mechanism from them)."""
    return _served(cluster.kubeconfig, cluster.binaries.path("kubectl"))


def trainer_token_mode(cluster, values=None) -> str:
    """The operator's --trainer-token as the chart would set it on `cluster`."""
    (deployment,) = documents(
        render(
            cluster,
            "evokube",
            "evokube-system",
            values,
            show_only=["templates/deployment.yaml"],
            live=True,
        )
    )
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (arg,) = [a for a in container["args"] if a.startswith("--trainer-token=")]
    return arg.partition("=")[2]


def documents(text: str) -> list[dict]:
    """The objects of a multi-document YAML stream, empty documents dropped."""
    return [doc for doc in yaml.safe_load_all(text) if doc]


def operator_rbac(cluster, release: str, namespace: str, values=None) -> str:
    """The chart's ServiceAccount and RBAC for the operator, ready for `kubectl apply`."""
    return render(cluster, release, namespace, values, show_only=RBAC_TEMPLATES)


def operator_policies(cluster, release: str, namespace: str, values=None) -> str:
    """The chart's admission policies, bound to every namespace but OWN_RELEASE_LABEL's.

    Two releases' status guards in one namespace would each refuse the other's
    operator, so namespaces of a test's own release are left out.
    """
    objects = documents(
        render(cluster, release, namespace, values, show_only=[ADMISSION_TEMPLATE], live=True)
    )
    for obj in objects:
        if obj["kind"].endswith("Binding"):
            obj["spec"]["matchResources"] = {
                "namespaceSelector": {
                    "matchExpressions": [{"key": OWN_RELEASE_LABEL, "operator": "DoesNotExist"}]
                }
            }
    return yaml.safe_dump_all(objects)
