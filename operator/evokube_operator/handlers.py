"""Kopf handlers: each one line of intent; the work happens in the controller.

- startup / cleanup: settings, the API client, the controller and the metrics server;
- login: credentials from the same kubeconfig (or in-cluster account) as the client;
- indices: the experiments, Jobs and pods, kept in memory for reconciles;
- create / resume / update / delete of an experiment, and every event of its
  Jobs and pods: ask the controller to reconcile that experiment.

Kopf's own bookkeeping is kept out of status (status is the operator's and
the trainer's, see docs/architecture.md): handlers return nothing, progress
and the last handled spec go to annotations under operator.evokube.io, and
no handler needs a finalizer, so deleting an experiment never waits for the
operator; owner references let the garbage collector delete what it owned.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf

from evokube_operator import api
from evokube_operator.builders import plain
from evokube_operator.controller import Controller, Indices
from evokube_operator.kube import Kube
from evokube_operator.metrics import Metrics, Server
from evokube_operator.observe import JobView, PodView
from evokube_operator.options import Options, client_configuration
from evokube_operator.reconcile import Reconciler

ANNOTATION_PREFIX = "operator.evokube.io"
OWNED = {api.LABEL_EXPERIMENT: kopf.PRESENT}


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    """Kopf passes each index (still empty here, filled in place later) by its function name."""
    options: Options = memo.options
    settings.peering.standalone = True  # one replica, see docs/operator.md
    settings.persistence.finalizer = f"{ANNOTATION_PREFIX}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = int(options.watch_timeout_seconds)
    settings.watching.client_timeout = options.watch_timeout_seconds + 10
    # Only our own Jobs and pods travel from the API server.
    managed = f"{api.LABEL_MANAGED_BY}={api.MANAGED_BY}"
    settings.watching.label_selectors["batch", "v1", "jobs"] = managed
    settings.watching.label_selectors["v1", "pods"] = managed

    metrics = Metrics()
    kube = Kube.from_configuration(client_configuration(options), count=metrics.api_request)
    controller = Controller(
        Reconciler(kube),
        Indices(kwargs["experiment_index"], kwargs["job_index"], kwargs["pod_index"]),
        metrics,
        workers=options.workers,
        resync_seconds=options.resync_seconds,
    )
    controller.start()
    memo.kube, memo.controller, memo.server = kube, controller, None
    if options.metrics_port:
        server = Server(metrics, lambda: controller.alive, lambda: _api_reachable(kube))
        await server.start(options.metrics_host, options.metrics_port)
        server.started = True
        memo.server = server


async def _api_reachable(kube: Kube) -> bool:
    path = f"/apis/{api.GROUP}/{api.VERSION}"
    try:
        await asyncio.to_thread(kube.request, "GET", "APIResources", path)
    except Exception:
        return False
    return True


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    if getattr(memo, "server", None) is not None:
        await memo.server.stop()
    if getattr(memo, "controller", None) is not None:
        await memo.controller.stop()
    if getattr(memo, "kube", None) is not None:
        memo.kube.close()


@kopf.on.login()
def login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    configuration = client_configuration(memo.options)
    header = (
        configuration.get_api_key_with_prefix("BearerToken")
        or configuration.get_api_key_with_prefix("authorization")
        or ""
    )
    scheme, _space, token = header.rpartition(" ")
    return kopf.ConnectionInfo(
        server=configuration.host,
        ca_path=configuration.ssl_ca_cert,
        insecure=not configuration.verify_ssl,
        username=configuration.username or None,
        password=configuration.password or None,
        scheme=scheme or None,
        token=token or None,
        certificate_path=configuration.cert_file,
        private_key_path=configuration.key_file,
    )


# -- indices: what reconciles read instead of the API ---------------------------------------
@kopf.index(api.GROUP, api.VERSION, api.PLURAL)
def experiment_index(body: kopf.Body, namespace: str | None, name: str, **_: Any):
    copy = plain(body)  # a deep copy, safe to hand to worker threads
    copy["metadata"].pop("managedFields", None)  # often the bulk of an object, never read
    return {(namespace, name): copy}


@kopf.index("batch", "v1", "jobs", labels=OWNED)
def job_index(body: kopf.Body, namespace: str | None, labels: kopf.Labels, **_: Any):
    return {(namespace, labels[api.LABEL_EXPERIMENT]): JobView.from_body(body)}


@kopf.index("v1", "pods", labels=OWNED)
def pod_index(body: kopf.Body, namespace: str | None, labels: kopf.Labels, **_: Any):
    return {(namespace, labels[api.LABEL_EXPERIMENT]): PodView.from_body(body)}


# -- the experiment's life cycle -------------------------------------------------------------
@kopf.on.create(api.GROUP, api.VERSION, api.PLURAL)
async def created(namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    memo.controller.request((namespace, name))


@kopf.on.resume(api.GROUP, api.VERSION, api.PLURAL)
async def resumed(namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    """At operator start: adopt what the experiment already has (deterministic names)."""
    memo.controller.request((namespace, name))


@kopf.on.update(api.GROUP, api.VERSION, api.PLURAL)
async def updated(namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    memo.controller.request((namespace, name))


@kopf.on.delete(api.GROUP, api.VERSION, api.PLURAL, optional=True)
async def deleting(namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    """Seen only while something else (foreground deletion) holds the object; no finalizer
    of ours ever does. The garbage collector deletes what it owned."""
    memo.controller.request((namespace, name))


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def gone(type: str, namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    """Once deleted, a last reconcile finds nothing and forgets the experiment."""
    if type == "DELETED":
        memo.controller.request((namespace, name))


# -- its Jobs and pods ----------------------------------------------------------------------
@kopf.on.event("batch", "v1", "jobs", labels=OWNED)
async def job_event(namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    memo.controller.request((namespace, labels[api.LABEL_EXPERIMENT]))


@kopf.on.event("v1", "pods", labels=OWNED)
async def pod_event(namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    memo.controller.request((namespace, labels[api.LABEL_EXPERIMENT]))
