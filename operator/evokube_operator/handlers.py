"""Kopf handlers: each one line of intent; the work happens in the controller.

- startup / cleanup: settings, the API client, leader election, the controller
  and the metrics server;
- login: credentials from the same kubeconfig (or in-cluster account) as the client;
- indices: the experiments, Jobs and pods, kept in memory for reconciles (trimmed views);
- every event of an experiment, its Jobs and its pods: ask the controller to
  reconcile that experiment;
- every event of an ERLSweep and of the experiments labelled with its name: ask the sweep
  controller to reconcile that sweep (a child's phase or progress moves its summary).

Only event handlers, no create/update/resume/delete ones: Kopf keeps no state
for them, so it never writes to an experiment (no progress or last-handled
annotations, no finalizer) and two replicas cannot fight over such writes.
Deleting an experiment never waits for the operator; owner references let
the garbage collector delete what it owned. Every replica watches; only the
holder of the Lease reconciles (leader.py).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Mapping
from typing import Any

import kopf

from evokube_contract import sweep
from evokube_operator import api
from evokube_operator.cluster.kube import Kube
from evokube_operator.cluster.leader import Elector, FencedKube, new_identity
from evokube_operator.cluster.metrics import Metrics, Server
from evokube_operator.desired import gangs
from evokube_operator.options import Options, client_configuration
from evokube_operator.reading.observe import (
    ExperimentView,
    JobView,
    PodView,
    SweepChildView,
    sweep_body,
)
from evokube_operator.reconcilers.controller import Controller, Indices, SweepIndices
from evokube_operator.reconcilers.reconcile import Reconciler
from evokube_operator.reconcilers.sweep_reconcile import SweepReconciler

OWNED = {api.LABEL_EXPERIMENT: kopf.PRESENT}
SWEEP_CHILD = {sweep.SWEEP_LABEL: kopf.PRESENT}
SWEEP_WORKERS = 2  # sweeps reconciled at once: each is a few cached reads and a write
LIST_CHUNK = 100  # objects per page of the first listing
IDLE_WORKER_SECONDS = 0.2
STOP_SECONDS = 10.0  # for the reconciles in flight at shutdown, before the Lease is released
log = logging.getLogger(__name__)


# Kinds the operator watches only if the cluster serves them when it starts. Kopf takes up a
# CRD installed later only if the API server's discovery already lists it at the CRD's last
# event, which it often does not; so a change in what is served starts Kopf over, in-process
# (cli.main), watching what is served then.
OPTIONAL_GANGS = tuple(b for b in gangs.BACKENDS.values() if b.optional)
OPTIONAL_KINDS = (*(b.kind for b in OPTIONAL_GANGS), sweep.SWEEP_KIND)
SERVED_CHECK_SECONDS = 20.0


def served_kinds(kube: Kube) -> dict[str, bool]:
    """Whether the cluster serves each of OPTIONAL_KINDS now, as Kopf starts its watches;
    said once for each that it does not."""
    served = {kind: kube.serves(kind) for kind in OPTIONAL_KINDS}
    for backend in OPTIONAL_GANGS:
        if not served[backend.kind]:
            log.warning(
                "%s %s is not served: experiments that need it stay Blocked (%s) until it is "
                "installed (this operator then starts its watches again)",
                backend.api_version,
                backend.kind,
                backend.not_served_reason,
            )
    if not served[sweep.SWEEP_KIND]:
        log.warning(
            "%s/%s %s is not served: sweeps are not reconciled until its CRD is installed "
            "(this operator then starts its watches again)",
            api.GROUP,
            api.VERSION,
            sweep.SWEEP_PLURAL,
        )
    return served


async def rewatch_when_served_changes(
    memo: kopf.Memo, kube: Kube, served: Mapping[str, bool]
) -> None:
    """Every SERVED_CHECK_SECONDS, ask discovery again; once a kind of OPTIONAL_KINDS has
    come or gone since the watches started, stop Kopf as a SIGTERM would (reconciles drained,
    the Lease released) with `memo.rewatch` set: `cli.main` starts it again in the same
    process, watching what is served now. Experiments Blocked with JobSetNotServed go on
    within a minute of JobSet's install, with no one restarting anything."""
    while True:
        await asyncio.sleep(SERVED_CHECK_SECONDS)
        for kind, was in served.items():
            try:
                now = await asyncio.to_thread(kube.serves, kind)
            except Exception as err:  # the API server away: asked again next time
                log.debug("discovery of %s failed: %s", kind, err)
                continue
            if now != was:
                change = "now served" if now else "no longer served"
                log.warning("%s is %s: starting the watches again", kind, change)
                memo.rewatch = True
                memo.stop_flag.set()
                return


@kopf.on.startup()
async def start(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    """Kopf passes each index (still empty here, filled in place later) by its function name."""
    options: Options = memo.options
    settings.peering.standalone = True  # a Lease elects the leader, not Kopf's peering
    # Never added; named so that Kopf never removes another operator's finalizer.
    settings.persistence.finalizer = "operator.evokube.io/finalizer"
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = int(options.watch_timeout_seconds)
    settings.watching.client_timeout = options.watch_timeout_seconds + 10
    # The first listing in pages: a new leader among a thousand large experiments (and their
    # Jobs and pods) never holds them all at once.
    settings.watching.chunk_size = LIST_CHUNK
    # Kopf's per-object worker holds its last event (the whole object) until it exits idle:
    # 5 s by default, which during a launch is every object's body at once.
    settings.queueing.idle_timeout = IDLE_WORKER_SECONDS
    # Only our own Jobs and pods travel from the API server.
    managed = f"{api.LABEL_MANAGED_BY}={api.MANAGED_BY}"
    settings.watching.label_selectors["v1", "pods"] = managed
    for backend in gangs.BACKENDS.values():
        settings.watching.label_selectors[backend.group, backend.version, backend.plural] = managed

    metrics = Metrics()
    election, elector = options.leader_election, None
    if election is None:
        kube = Kube.from_configuration(client_configuration(options), count=metrics.api_request)
    else:
        lease_kube = Kube.from_configuration(
            client_configuration(options),
            count=metrics.api_request,
            timeout=election.renew_deadline,
        )
        elector = Elector(lease_kube, election, new_identity())
        kube = FencedKube.from_configuration(
            client_configuration(options),
            count=metrics.api_request,
            may_write=lambda: elector.leading,
        )
    served = served_kinds(kube)
    memo.served_check = asyncio.create_task(
        rewatch_when_served_changes(memo, kube, served), name="evokube-served-kinds"
    )
    controller = Controller(
        Reconciler(
            kube,
            network=options.network_access,
            timeouts=options.start_timeouts,
            default_checkpoints=options.default_checkpoint_location,
            trainer_token=options.trainer_token,
            watched_kinds=frozenset(k for k in gangs.BACKENDS if served.get(k, True)),
        ),
        Indices(
            kwargs["experiment_index"],
            kwargs["job_index"],
            kwargs["pod_index"],
            kwargs["jobset_index"],
        ),
        metrics,
        workers=options.workers,
        resync_seconds=options.resync_seconds,
    )
    sweeps = Controller(
        SweepReconciler(kube, metrics),
        SweepIndices(kwargs["sweep_index"], kwargs["sweep_child_index"]),
        metrics,
        workers=SWEEP_WORKERS,
        resync_seconds=options.resync_seconds,
        phases=False,
    )
    memo.kube, memo.controller, memo.sweeps, memo.server = kube, controller, sweeps, None
    memo.elector, memo.campaign = elector, None
    memo.decided_on = {}  # key -> ExperimentView.inputs() of what was last sent to reconcile
    controllers = (controller, sweeps)
    if elector is None:
        _start(controllers)
    else:
        memo.campaign = asyncio.create_task(_lead(elector, controllers), name="evokube-leader")
    leading = (lambda: True) if elector is None else (lambda: elector.leading)
    metrics.leader.set_function(lambda: float(leading()))
    if options.metrics_port:
        server = Server(
            metrics,
            lambda: all(c.alive for c in controllers),
            lambda: _api_reachable(kube),
            role=lambda: "leader" if leading() else "follower",
        )
        await server.start(options.metrics_host, options.metrics_port)
        server.started = True
        memo.server = server


def _start(controllers: tuple[Controller, ...]) -> None:
    for controller in controllers:
        controller.start()


async def _lead(elector: Elector, controllers: tuple[Controller, ...]) -> None:
    """Campaign, reconcile while leading, and exit once leadership is lost.

    Exiting is the simplest safe step-down (controller-runtime does the same):
    nothing of this process acts any more, and Kubernetes restarts it as a
    follower with fresh state.
    """
    try:
        await elector.run(on_leading=lambda: _start(controllers))
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("leader election failed")
    log.error("lost the Lease %s: exiting, to restart as a follower", elector.election.name)
    logging.shutdown()
    os._exit(1)


async def _api_reachable(kube: Kube) -> bool:
    path = f"/apis/{api.GROUP}/{api.VERSION}"
    try:
        await asyncio.to_thread(kube.request, "GET", "APIResources", path)
    except Exception:
        return False
    return True


@kopf.on.cleanup()
async def stop(memo: kopf.Memo, **_: Any) -> None:
    """Stop campaigning, let the reconciles in flight end, then hand the Lease over."""
    for task in ("campaign", "served_check"):
        if getattr(memo, task, None) is not None:
            getattr(memo, task).cancel()
    if getattr(memo, "server", None) is not None:
        await memo.server.stop()
    stopped = True
    controllers = [getattr(memo, n, None) for n in ("controller", "sweeps")]
    if any(c is not None for c in controllers):
        stopping = (c.stop() for c in controllers if c is not None)
        try:
            await asyncio.wait_for(asyncio.gather(*stopping), STOP_SECONDS)
        except TimeoutError:
            stopped = False  # a write may still be on its way: let the Lease expire instead
            log.warning(
                "reconciles still running after %.0fs; not releasing the Lease", STOP_SECONDS
            )
    if getattr(memo, "elector", None) is not None:
        if stopped:
            await memo.elector.release()
        memo.elector.kube.close()
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
    return {(namespace, name): ExperimentView.from_body(body)}


@kopf.index(
    gangs.INDEXED_JOB.group, gangs.INDEXED_JOB.version, gangs.INDEXED_JOB.plural, labels=OWNED
)
def job_index(body: kopf.Body, namespace: str | None, labels: kopf.Labels, **_: Any):
    return {(namespace, labels[api.LABEL_EXPERIMENT]): JobView.from_body(body)}


# Multislice gangs (jobset.py). Without the JobSet CRD, Kopf only warns that it cannot watch
# them, and the reconciler keeps such an experiment Blocked (reason JobSetNotServed).
@kopf.index(gangs.JOBSET.group, gangs.JOBSET.version, gangs.JOBSET.plural, labels=OWNED)
def jobset_index(body: kopf.Body, namespace: str | None, labels: kopf.Labels, **_: Any):
    return {(namespace, labels[api.LABEL_EXPERIMENT]): JobView.from_body(body)}


@kopf.index("v1", "pods", labels=OWNED)
def pod_index(body: kopf.Body, namespace: str | None, labels: kopf.Labels, **_: Any):
    return {(namespace, labels[api.LABEL_EXPERIMENT]): PodView.from_body(body)}


# -- what to reconcile -----------------------------------------------------------------------
def wants_reconcile(seen: dict, key: tuple, event_type: str | None, body: Mapping[str, Any]):
    """Whether an experiment's event changes anything a reconcile decides on (all but
    status.progress and status.result, which process 0 of every gang patches every few
    seconds, and metadata the operator never reads); remembers a digest of it in `seen`.
    Deletions and the first sight always do; a trainer's patch never."""
    if event_type == "DELETED":
        seen.pop(key, None)
        return True
    inputs = ExperimentView.from_body(body).inputs()
    if seen.get(key) == inputs:
        return False
    seen[key] = inputs
    return True


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def experiment_event(
    namespace: str | None,
    name: str,
    body: kopf.Body,
    type: str | None,  # Kopf's name for the watch event's type
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """Any change but the trainer's progress patches, the first listing (adopt what exists:
    deterministic names) and deletion (a last reconcile finds nothing and forgets it)."""
    if wants_reconcile(memo.decided_on, (namespace, name), type, body):
        memo.controller.changed((namespace, name))


# -- its Jobs and pods ----------------------------------------------------------------------
@kopf.on.event(
    gangs.INDEXED_JOB.group, gangs.INDEXED_JOB.version, gangs.INDEXED_JOB.plural, labels=OWNED
)
async def job_event(namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    memo.controller.changed((namespace, labels[api.LABEL_EXPERIMENT]))


@kopf.on.event(gangs.JOBSET.group, gangs.JOBSET.version, gangs.JOBSET.plural, labels=OWNED)
async def jobset_event(
    namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any
) -> None:
    memo.controller.changed((namespace, labels[api.LABEL_EXPERIMENT]))


@kopf.on.event("v1", "pods", labels=OWNED)
async def pod_event(namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    memo.controller.changed((namespace, labels[api.LABEL_EXPERIMENT]))


# -- sweeps and their children ----------------------------------------------------------------
@kopf.index(api.GROUP, api.VERSION, sweep.SWEEP_PLURAL)
def sweep_index(body: kopf.Body, namespace: str | None, name: str, **_: Any):
    return {(namespace, name): sweep_body(body)}


@kopf.index(api.GROUP, api.VERSION, api.PLURAL, labels=SWEEP_CHILD)
def sweep_child_index(body: kopf.Body, namespace: str | None, labels: kopf.Labels, **_: Any):
    return {(namespace, labels[sweep.SWEEP_LABEL]): SweepChildView.from_body(body)}


@kopf.on.event(api.GROUP, api.VERSION, sweep.SWEEP_PLURAL)
async def sweep_event(namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    memo.sweeps.changed((namespace, name))


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL, labels=SWEEP_CHILD)
async def sweep_child_event(
    namespace: str | None, labels: kopf.Labels, memo: kopf.Memo, **_: Any
) -> None:
    memo.sweeps.changed((namespace, labels[sweep.SWEEP_LABEL]))
