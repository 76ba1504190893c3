"""Leader election through a coordination.k8s.io/v1 Lease: one replica acts, the others wait.

Every replica watches (Kopf's indices stay warm everywhere); only the holder
of the Lease reconciles. The rules are client-go's:

- a replica takes the Lease when it does not exist, has no holder (released
  on a clean shutdown), or has not changed for `leaseDurationSeconds` as
  measured on the replica's own monotonic clock since it first saw that
  version; clocks of different nodes never need to agree;
- the holder renews it every retry period with an update guarded by the
  resourceVersion it read, so two replicas can never both win one round;
- the holder may write only until `renew_deadline` after the start of its
  last successful renewal (`Elector.leading`, the fence the reconciler's
  writes check), which ends before any other replica may take the Lease;
  after that it steps down, and the operator exits so that Kubernetes
  restarts it as a follower.

The decisions are pure functions of the Lease body and the time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from evokube_operator.cluster.kube import ApiError, Kube

log = logging.getLogger(__name__)

LEASES = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
IN_CLUSTER_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
FALLBACK_NAMESPACE = "evokube-system"  # out of a cluster, without POD_NAMESPACE


@dataclass(frozen=True)
class LeaderElection:
    """Which Lease, and how long a holder keeps it (client-go's defaults)."""

    namespace: str = FALLBACK_NAMESPACE
    name: str = "evokube-operator"
    lease_duration: float = 15.0  # a silent holder is presumed dead after this
    renew_deadline: float = 10.0  # the holder stops writing this long after its last renewal
    retry_period: float = 2.0  # renew (and, when following, look) this often

    def __post_init__(self) -> None:
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "leader election needs 0 < retry period < renew deadline < lease duration"
            )


def own_namespace() -> str:
    """The operator's namespace: POD_NAMESPACE, else the in-cluster account's, else a default."""
    if os.environ.get("POD_NAMESPACE"):
        return os.environ["POD_NAMESPACE"]
    try:
        return IN_CLUSTER_NAMESPACE.read_text().strip() or FALLBACK_NAMESPACE
    except OSError:
        return FALLBACK_NAMESPACE


def new_identity() -> str:
    """The pod's name plus a random suffix: a restarted container is a new holder."""
    base = os.environ.get("POD_NAME") or socket.gethostname()
    return f"{base}-{uuid.uuid4().hex[:8]}"


# -- pure decisions -------------------------------------------------------------------------
def holder(lease: Mapping[str, Any] | None) -> str:
    """The Lease's holder; "" when there is no Lease or it was released."""
    return ((lease or {}).get("spec") or {}).get("holderIdentity") or ""


def version(lease: Mapping[str, Any] | None) -> str:
    return ((lease or {}).get("metadata") or {}).get("resourceVersion", "")


def may_take(
    lease: Mapping[str, Any] | None,
    identity: str,
    first_seen: float,
    now: float,
) -> bool:
    """May `identity` write itself into `lease` now?

    `first_seen` is when this replica first saw the Lease's current version
    (monotonic clock): a holder that renews changes the version, so a version
    unchanged for leaseDurationSeconds means the holder is gone.
    """
    if lease is None or holder(lease) in ("", identity):
        return True
    duration = (lease.get("spec") or {}).get("leaseDurationSeconds") or 0
    return now - first_seen >= duration


def still_leading(renewed_at: float | None, now: float, renew_deadline: float) -> bool:
    """True until renew_deadline after the start of the last successful renewal."""
    return renewed_at is not None and now - renewed_at < renew_deadline


def _timestamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def claimed(
    lease: Mapping[str, Any] | None,
    identity: str,
    election: LeaderElection,
    now: datetime,
) -> dict[str, Any]:
    """The Lease as `identity` writes it when taking or renewing it (resourceVersion kept)."""
    spec = dict((lease or {}).get("spec") or {})
    taking = holder(lease) != identity
    metadata = dict((lease or {}).get("metadata") or {"name": election.name})
    metadata["namespace"] = election.namespace
    spec.update(
        holderIdentity=identity,
        leaseDurationSeconds=max(1, round(election.lease_duration)),
        renewTime=_timestamp(now),
    )
    if taking:
        spec["acquireTime"] = _timestamp(now)
        spec["leaseTransitions"] = spec.get("leaseTransitions", 0) + (1 if lease else 0)
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": metadata,
        "spec": spec,
    }


def released(lease: Mapping[str, Any]) -> dict[str, Any]:
    """The Lease without a holder: any follower may take it at once."""
    spec = {k: v for k, v in (lease.get("spec") or {}).items() if k != "holderIdentity"}
    return {**lease, "spec": spec}


class NotLeading(Exception):
    """A write refused before it was sent: this replica does not hold the Lease (any more)."""


class FencedKube(Kube):
    """Kube whose writes are refused unless `may_write()`: reads pass, writes need the Lease.

    Checked before every write, in the reconcile thread itself, so a reconcile
    in flight when leadership ends sends nothing more.
    """

    def __init__(self, *args: Any, may_write: Callable[[], bool], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._may_write = may_write

    def request(self, verb: str, kind: str, path: str, *args: Any, **kwargs: Any) -> dict:
        if verb != "GET" and not self._may_write():
            raise NotLeading(f"{verb} {kind} refused: this replica does not hold the Lease")
        return super().request(verb, kind, path, *args, **kwargs)


# -- the elector ----------------------------------------------------------------------------
class Elector:
    """Campaigns for the Lease, renews it while leading, releases it on a clean stop.

    The blocking API calls run in threads; `leading` may be read from any thread.
    """

    def __init__(
        self,
        kube: Kube,
        election: LeaderElection,
        identity: str,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], datetime] = lambda: datetime.now(UTC),
    ):
        self.kube = kube
        self.election = election
        self.identity = identity
        self._clock = clock
        self._wall = wall
        self._path = LEASES.format(namespace=election.namespace)
        self._seen: tuple[str, float] = ("", 0.0)  # (resourceVersion, first seen)
        self._renewed_at: float | None = None
        self._done = False  # stepped down or released: never leading again

    @property
    def leading(self) -> bool:
        """Whether this replica may write now (the fence; see the module's docstring)."""
        return not self._done and still_leading(
            self._renewed_at, self._clock(), self.election.renew_deadline
        )

    async def run(self, on_leading: Callable[[], None]) -> None:
        """Campaign until leader, call `on_leading`, renew; return once leadership is lost."""
        while not await self._attempt():
            await asyncio.sleep(self.election.retry_period)
        log.info("leading: holding Lease %s/%s", self.election.namespace, self.election.name)
        on_leading()
        while True:
            await asyncio.sleep(self.election.retry_period)
            renewed = await self._attempt()
            if not renewed and not self.leading:
                self._done = True
                return

    async def _attempt(self) -> bool:
        """One round of take-or-renew, bounded so a hung request cannot delay stepping down."""
        timeout = self.election.renew_deadline
        if self._renewed_at is not None:  # past the deadline, an answer comes too late
            timeout = self._renewed_at + self.election.renew_deadline - self._clock()
            if timeout <= 0:
                return False
        try:
            return await asyncio.wait_for(asyncio.to_thread(self._take_or_renew), timeout)
        except (ApiError, TimeoutError) as err:
            log.warning("Lease %s: %s", self.election.name, err or "no answer in time")
            return False

    def _take_or_renew(self) -> bool:
        """Read the Lease and write it if allowed; once leadership was lost, never again."""
        if self._renewed_at is not None and not self.leading:
            self._done = True
        if self._done:
            return False
        started = self._clock()
        lease = self._read()
        if lease is not None and version(lease) != self._seen[0]:
            self._seen = (version(lease), started)
        if holder(lease) not in ("", self.identity) and self._renewed_at is not None:
            self._done = True  # somebody else holds it: the fence closes now
            log.error("Lease %s was taken by %s", self.election.name, holder(lease))
            return False
        if not may_take(lease, self.identity, self._seen[1], started):
            return False
        body = claimed(lease, self.identity, self.election, self._wall())
        try:
            if lease is None:
                self.kube.request("POST", "Lease", self._path, body=body)
            else:
                self.kube.request("PUT", "Lease", f"{self._path}/{self.election.name}", body=body)
        except ApiError as err:
            if err.status == 409:  # another replica wrote first
                return False
            raise
        if not self._done:
            self._renewed_at = started
        return True

    def _read(self) -> dict[str, Any] | None:
        try:
            return self.kube.request("GET", "Lease", f"{self._path}/{self.election.name}")
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    async def release(self) -> None:
        """Stop writing, then hand the Lease back so that a follower takes it at once."""
        was_leading = self.leading
        self._done = True
        if not was_leading:
            return
        try:
            lease = await asyncio.to_thread(self._read)
            if lease is not None and holder(lease) == self.identity:
                path = f"{self._path}/{self.election.name}"
                await asyncio.to_thread(
                    self.kube.request, "PUT", "Lease", path, body=released(lease)
                )
                log.info("released Lease %s/%s", self.election.namespace, self.election.name)
        except ApiError as err:  # it expires on its own
            log.warning("could not release Lease %s: %s", self.election.name, err)
