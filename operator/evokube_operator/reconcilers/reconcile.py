"""One reconcile of one experiment: decide (pure), then act, in a fixed order.

    observe ─► decide ⇄ read what its plan asks for (a Job the watch lost, the Job's
                        events, Kueue's word on it), until the plan asks for nothing
               ─► create the owned objects from the plan's spec (when needed; a name
                  conflict, a checkpoint claim not opted in, a refusal by the API server:
                  decide again, Blocked or Failed)
               ─► write status (one merge patch, resourceVersion-guarded)
               ─► post Events ─► delete Jobs ─► create the Job (a name conflict or a
                  refusal: decide again, and write that) ─► (TTL) delete

The experiment, its Jobs and its pods come from the operator's watch caches,
so an experiment whose gang is simply running costs no API call at all. A
decision that would create a Job is never taken on a possibly stale read:
either the same reconcile's status write succeeded (the write is guarded by
the resourceVersion it was decided on) or the experiment is read afresh
first. A conflict means someone wrote in between (the trainer's progress,
a user): read, decide again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from evokube_operator import api
from evokube_operator import conditions as cond
from evokube_operator.cluster.kube import ApiError, Kube, refused_write
from evokube_operator.desired import builders, gangs
from evokube_operator.plans.decide import (
    JOB_EVENTS_REQUEUE_SECONDS,
    QUEUE_REQUEUE_SECONDS,
    READ_JOB,
    READ_JOB_EVENTS,
    READ_QUEUE,
    Observation,
    Plan,
    Read,
    Status,
    decide,
)
from evokube_operator.reading.observe import ExperimentView, JobEvent, JobView, PodView, QueueView
from evokube_operator.reading.ownership import (
    LABEL_OPT_INS,
    LISTING_ANNOTATIONS,
    Blocker,
    NameConflict,
    creation_waves,
    is_owned_by,
    listing_blocker,
    name_conflict,
    opt_in_blocker,
)
from evokube_operator.reading.spec import Experiment, ExperimentSpec, format_time
from evokube_operator.rules import startup
from evokube_operator.rules.refusal import Refusal

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (namespace, name)
ACTIVE_PHASES = frozenset({api.PENDING, api.QUEUED, api.RUNNING, api.RESTARTING})
MAX_CONFLICTS = 4
# What keeps an attempt's Job from being created: a person must act (Blocker), or the API
# server refused an object it needs (Refusal: final, or it may pass).
Stop = Blocker | Refusal


@dataclass
class _Memory:
    """What one operator process remembers about one experiment (lost on restart, by design)."""

    last_written: ExperimentView | None = None  # what our last status write returned (_written)
    statics: tuple[str, int] | None = None  # (uid, generation) last applied
    # (Job uid, when read, its FailedCreate events): read at most once a requeue interval.
    job_events: tuple[str, datetime, tuple[JobEvent, ...]] | None = None
    # (Job uid, when read, what Kueue said of its Workload): the same, while the Job is queued.
    queue: tuple[str, datetime, QueueView] | None = None


@dataclass(frozen=True)
class Outcome:
    """What the controller and the metrics need to know about one reconcile."""

    phase: str | None
    requeue_after: float | None = None
    restarts: int = 0  # gang restarts started by this reconcile (counted)
    preemptions: int = 0  # and the uncounted kind
    api_calls: int = 0


def _written(body: dict[str, Any], cached_generation: Any) -> ExperimentView:
    """The view of what our status write returned, without its spec where the watch cache
    holds the same generation's: the spec is most of an experiment (issue 22), and until the
    cache catches up the cache's copy of it is the same (the cache only moves forward)."""
    if body["metadata"].get("generation") == cached_generation:
        body = {**body, "spec": None}
    return ExperimentView.from_body(body)


def _resource_version(version: Any) -> int:
    try:
        return int(version)
    except (TypeError, ValueError):
        return -1


@dataclass
class Reconciler:
    kube: Kube
    clock: Callable[[], datetime] = field(default=lambda: datetime.now(UTC))
    network: builders.NetworkAccess | None = None  # None: no NetworkPolicy per experiment
    timeouts: startup.Timeouts = startup.DEFAULT_TIMEOUTS  # of pods that cannot start
    default_checkpoints: str | None = None  # bucket URL; experiments get <it>/<ns>/<name>
    trainer_token: str = api.TOKEN_HOST_0  # which trainer pods hold an API token
    # The gang kinds the operator watches: those the cluster served when the watches started
    # (they start again if that changes: handlers.rewatch_when_served_changes).
    watched_kinds: frozenset[str] = frozenset(gangs.BACKENDS)
    _memory: dict[Key, _Memory] = field(default_factory=dict)

    def forget(self, key: Key) -> None:
        self._memory.pop(key, None)

    def _freshest(self, key: Key, cached: dict[str, Any]) -> dict[str, Any]:
        """The watch cache's copy, unless our own last write is newer than it. Once the cache
        has caught up, our copy is dropped: a second copy of every experiment's spec would
        double what the operator holds."""
        memory = self._memory.setdefault(key, _Memory())
        written = memory.last_written
        if written is None:
            return cached
        meta = cached["metadata"]
        same_object = written.uid == meta.get("uid")
        newer = _resource_version(written.resource_version) > _resource_version(
            meta.get("resourceVersion")
        )
        if same_object and newer:
            freshest = written.body()
            if not freshest["spec"]:  # left out: the cache's is the same generation's
                freshest["spec"] = cached["spec"]
            return freshest
        memory.last_written = None
        return cached

    def reconcile(
        self,
        key: Key,
        body: dict[str, Any] | None,
        jobs: tuple[JobView, ...],
        pods: tuple[PodView, ...],
    ) -> Outcome:
        if body is None:
            self.forget(key)
            return Outcome(None)
        memory = self._memory.setdefault(key, _Memory())
        cached_generation = body["metadata"].get("generation")
        body = self._freshest(key, body)
        fresh = False
        stop: Stop | None = None  # what keeps this attempt's Job from being created
        before: Status | None = None  # the status before this reconcile's first write
        for _ in range(MAX_CONFLICTS):
            exp = Experiment.from_body(body)
            old = Status.from_dict(exp.status)
            observation = Observation(
                exp,
                jobs,
                pods,
                self.clock(),
                refused=stop if isinstance(stop, Refusal) else None,
                fresh=fresh,
                blocked=stop if isinstance(stop, Blocker) else None,
            )
            plan = decide(observation, self.timeouts, self.default_checkpoints)
            done: set[Read] = set()
            while (read := plan.read) is not None and read not in done:
                done.add(read)
                observation = self._gather(exp, read, observation, memory)
                plan = decide(observation, self.timeouts, self.default_checkpoints)
            patch = plan.status.patch_from(old)
            if not fresh and (plan.stale or (plan.create_job is not None and not patch)):
                body, fresh = self._read(key), True
                if body is None:
                    return Outcome(None)
                continue
            if stop is None:
                stop = self._prepare(exp, plan, patch, old, memory)
                if stop is not None:
                    continue  # decide again: Blocked, or Failed
            if patch or any(cond.is_true(old.conditions, c) for c in cond.BESIDE_PLAN):
                patch = _status_whole_again(patch, plan.status, old, exp.generation, self.clock())
                try:
                    body = self.kube.patch_status(
                        exp.namespace, exp.name, patch, exp.resource_version
                    )
                except ApiError as err:
                    if err.status == 409:
                        log.debug("%s/%s: status conflict, reading again", *key)
                        body, fresh = self._read(key), True
                        if body is None:
                            return Outcome(None)
                        continue
                    if err.status == 404:
                        self.forget(key)
                        return Outcome(None)
                    if refused_write(err):
                        self._status_refused(body, err)
                    raise
                memory.last_written = _written(body, cached_generation)
                before = before or old
            stopped = self._act(exp, body, plan, jobs)
            if stopped is not None:
                stop, fresh = stopped, True  # `body` is the API server's answer to our write
                continue  # decide again, and write that
            before = before or old
            return Outcome(
                phase=plan.status.phase,
                requeue_after=plan.requeue_after,
                restarts=plan.status.restarts - before.restarts,
                preemptions=plan.status.preemptions - before.preemptions,
            )
        raise ApiError(409, f"the status of {key[0]}/{key[1]} kept changing; will retry")

    # -- steps -------------------------------------------------------------------------------
    def _status_refused(self, body: dict[str, Any], err: ApiError) -> None:
        """The API server refused the status write as it is (a bug of ours: every field is
        bounded): say so where users look, a condition and an Event, and let the reconcile
        fail on to its retries, acting on nothing the status does not record."""
        message = f"the API server refused the experiment's status: {err}"
        incomplete = cond.Condition(
            api.COND_STATUS_INCOMPLETE, True, api.REASON_STATUS_REFUSED, message
        )
        mark_beside_plan(self.kube, body, api.KIND, incomplete, self.clock())

    def report_failure(self, key: Key, body: dict[str, Any] | None, err: Exception) -> None:
        """A reconcile raised what no API error explains (the controller retries it)."""
        if body is not None:
            mark_beside_plan(self.kube, body, api.KIND, cond.failing(err), self.clock())

    def _read(self, key: Key) -> dict[str, Any] | None:
        try:
            return self.kube.get(api.KIND, *key)
        except ApiError as err:
            if err.status == 404:
                self.forget(key)
                return None
            raise

    def _gather(
        self, exp: Experiment, read: Read, observation: Observation, memory: _Memory
    ) -> Observation:
        """`observation` with what `read` asks for. decide asks for each read only while its
        observation lacks it, and the reconcile does each at most once (a Job the API server
        shows but the watch does not, and that the experiment does not own, is asked for
        again: the plan without it stands), so a pass makes three reads at most."""
        if read.what == READ_JOB:
            return self._look_for_job(exp, read, observation)
        if read.what == READ_JOB_EVENTS:
            return replace(observation, job_events=self._job_events(exp.namespace, read, memory))
        assert read.what == READ_QUEUE, read
        return replace(observation, queue=self._queue(exp.namespace, read, memory))

    def _job_events(self, namespace: str, job: Read, memory: _Memory) -> tuple[JobEvent, ...]:
        """The Job's FailedCreate events, listed at most once per JOB_EVENTS_REQUEUE_SECONDS
        (a failed read counts: it is a diagnosis, worth a log line, never a retry)."""
        name, uid = job.job, job.uid

        def read() -> tuple[JobEvent, ...]:
            selector = (
                f"involvedObject.kind=Job,involvedObject.name={name},involvedObject.uid={uid},"
                f"reason={startup.FAILED_CREATE}"
            )
            try:
                found = self.kube.list("Event", namespace, fieldSelector=selector)
            except ApiError as err:
                log.warning("%s: the events of Job %s not read: %s", namespace, name, err)
                return ()
            return tuple(JobEvent.from_body(e) for e in found)

        return self._read_at_most_every(memory, "job_events", uid, JOB_EVENTS_REQUEUE_SECONDS, read)

    def _queue(self, namespace: str, job: Read, memory: _Memory) -> QueueView:
        """What Kueue says of the suspended Job's Workload, read at most once per
        QUEUE_REQUEUE_SECONDS. No Workload kind at all (404: Kueue not installed) reads as
        no Workload; other failures are logged and read the same."""
        name, uid = job.job, job.uid

        def read() -> QueueView:
            selector = f"{api.KUEUE_JOB_UID_LABEL}={uid}"
            try:
                found = self.kube.list("Workload", namespace, labelSelector=selector)
            except ApiError as err:
                if err.status != 404:
                    log.warning("%s: the Workload of Job %s not read: %s", namespace, name, err)
                return QueueView(False)
            return QueueView.from_workloads(found)

        return self._read_at_most_every(memory, "queue", uid, QUEUE_REQUEUE_SECONDS, read)

    def _read_at_most_every(self, memory: _Memory, slot: str, uid: str, seconds: float, read):
        """read() about the Job `uid`, or what it gave less than `seconds` ago (kept in the
        memory's `slot` as (uid, when, value))."""
        now = self.clock()
        kept = getattr(memory, slot)
        if kept is not None:
            read_uid, read_at, value = kept
            if read_uid == uid and (now - read_at).total_seconds() < seconds:
                return value
        value = read()
        setattr(memory, slot, (uid, now, value))
        return value

    def _prepare(
        self, exp: Experiment, plan: Plan, patch: dict, old: Status, memory: _Memory
    ) -> Stop | None:
        """Before the status write: what keeps the plan's Job from being created, if anything.

        What the pods would use of the namespace must have opted in (_references_blocker);
        the owned objects are created (or, ours already, applied) once per generation and
        process; while Blocked, the Job's creation is tried in a dry run too (its name may be
        taken, the API server may refuse it again), so that nothing is written while the
        cause stays. Only the first two cost calls on a plain launch.
        """
        spec = plan.spec
        if exp.deleting or spec is None or plan.status.phase not in ACTIVE_PHASES:
            return None
        creating = plan.create_job is not None
        if creating:
            blocker = self._gang_blocker(spec) or self._references_blocker(exp, spec)
            if blocker is not None:
                return blocker
        conflicts: list[NameConflict] = []
        fresh_generation = memory.statics != (exp.uid, exp.generation)
        try:
            if fresh_generation and (creating or "observedGeneration" in patch):
                for wave in creation_waves(builders.static_objects(exp, spec, self.network)):
                    conflicts = self.kube.create_owned_all(wave, exp.uid)
                    if conflicts:
                        break
                else:
                    memory.statics = (exp.uid, exp.generation)
            if creating and cond.is_true(old.conditions, api.COND_BLOCKED):
                conflicts += self._try_job(exp, plan)
        except Refusal as refused:
            log.warning("%s/%s: %s", exp.namespace, exp.name, refused.message)
            return refused if creating else None  # a running gang goes on
        blocker = name_conflict(conflicts)
        if blocker is not None:
            log.warning("%s/%s: %s", exp.namespace, exp.name, blocker.message)
        return blocker if creating else None  # a running gang goes on

    def _look_for_job(self, exp: Experiment, job: Read, observation: Observation) -> Observation:
        """The watch no longer shows the current Job: the API server says whether it is gone
        (or being deleted), or the watch is just behind (then decide with the Job as read)."""
        name, uid = job.job, job.uid
        kind = gangs.backend_for(int(exp.status.get("slices") or 1)).kind
        try:
            found: dict[str, Any] | None = self.kube.get(kind, exp.namespace, name)
        except ApiError as err:
            if err.status != 404:
                raise
            found = None
        if found is not None and found["metadata"].get("uid") == uid:
            view = JobView.from_body(found)
            if not view.deleting:
                return replace(observation, jobs=(*observation.jobs, view))
        return replace(observation, job_gone=uid)

    def _gang_blocker(self, spec: ExperimentSpec) -> Blocker | None:
        """A gang of a kind that a cluster may lack (gangs.py) needs a cluster that serves it and
        an operator that watches it (one started before its install does not yet); a person
        must act, hence Blocked."""
        backend = gangs.backend_for(spec.accelerator.slices)
        if not backend.optional:
            return None
        served = self.kube.serves(backend.kind)  # asked at each creation: it may go or come
        if served and backend.kind in self.watched_kinds:
            return None
        assert backend.needed_by is not None and backend.not_served_reason is not None
        gang = f"{backend.needed_by(spec)} runs as a {backend.kind} ({backend.api_version}), "
        if served:
            message = gang + (
                "which this cluster began to serve after the operator started: the operator "
                f"starts its watches again to watch {backend.kind}s (within a minute)"
            )
        else:
            message = gang + f"which this cluster does not serve; {backend.install}"
        return Blocker(backend.not_served_reason, message)

    def _references_blocker(self, exp: Experiment, spec: ExperimentSpec) -> Blocker | None:
        """The first reason the spec's references keep the Job from being created: an account or
        claim without its opt-in label (each read), a Secret or ConfigMap the namespace does not
        list (the namespace read once; Secrets never)."""
        refs = spec.references()
        for ref in refs:
            if ref.kind in LABEL_OPT_INS:
                blocker = opt_in_blocker(ref, self._read_or_none(ref.kind, exp.namespace, ref.name))
                if blocker is not None:
                    return blocker
        if not any(ref.kind in LISTING_ANNOTATIONS for ref in refs):
            return None
        return listing_blocker(refs, self._read_or_none("Namespace", "", exp.namespace))

    def _read_or_none(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return self.kube.get(kind, namespace, name)
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    def _try_job(self, exp: Experiment, plan: Plan) -> list[NameConflict]:
        """The plan's manifest and Job created in a dry run: those under their names that this
        experiment does not control (one it does: adopted), if any; a refusal is raised."""
        conflicts = []
        for obj in self._attempt(exp, plan):
            try:
                self.kube.create_owned(obj, exp.uid, update=False, dry_run=True)
            except NameConflict as conflict:
                conflicts.append(conflict)
        return conflicts

    def _attempt(self, exp: Experiment, plan: Plan) -> tuple[dict[str, Any], dict[str, Any]]:
        """(manifest ConfigMap, Job or multislice JobSet) of the plan's attempt, in the order
        they are created."""
        assert plan.spec is not None and plan.create_job is not None, "decide plans no Job"
        build = gangs.backend_for(plan.spec.accelerator.slices).build
        job = build(
            exp, plan.spec, plan.create_job, plan.job_deadline, trainer_token=self.trainer_token
        )
        return builders.manifest_config_map(exp, plan.create_job), job

    def _delete_manifest(self, exp: Experiment, name: str) -> None:
        """An attempt's manifest ConfigMap, if this experiment controls it: a namesake of the
        tenant's (the one that blocked an attempt, say) stays, as every object not ours does."""
        try:
            found = self.kube.get("ConfigMap", exp.namespace, name)
        except ApiError as err:
            if err.status == 404:
                return
            raise
        if is_owned_by(found, exp.uid):
            self.kube.delete("ConfigMap", exp.namespace, name, uid=found["metadata"].get("uid"))

    def _act(
        self, exp: Experiment, body: dict[str, Any], plan: Plan, jobs: tuple[JobView, ...]
    ) -> Stop | None:
        """After the status write: Events, Job deletions, the Job, the TTL's deletion. What
        kept the Job from being created, if anything (the reconcile decides again)."""
        for event in plan.events:
            self._event(body, event.type, event.reason, event.message)
        owned = {j.name: j for j in jobs if j.owner_uid == exp.uid and not j.deleting}
        for name in plan.delete_jobs:  # decide names only Jobs it saw this experiment own
            kind = owned[name].kind
            if self.kube.delete(kind, exp.namespace, name, uid=owned[name].uid):
                log.info("%s/%s: deleted %s %s", exp.namespace, exp.name, kind, name)
        spent = set(plan.delete_jobs)
        if plan.create_job:  # the last attempt's, whoever deleted its Job
            spent.add(builders.job_name(exp.name, plan.create_job - 1))
        for name in sorted(spent):  # each attempt's manifest goes with its Job
            self._delete_manifest(exp, builders.manifest_name(name))
        if plan.create_job is not None:
            manifest, job = self._attempt(exp, plan)
            name = job["metadata"]["name"]
            try:  # the manifest is applied: a spec edited since an earlier try reaches it
                self.kube.create_owned(manifest, exp.uid)
                _, created = self.kube.create_owned(job, exp.uid, update=False)
            except NameConflict as conflict:
                blocker = name_conflict([conflict])
                assert blocker is not None
                log.warning("%s/%s: blocked: %s", exp.namespace, exp.name, blocker.message)
                return blocker
            except Refusal as refused:
                log.warning("%s/%s: %s", exp.namespace, exp.name, refused.message)
                return refused
            if created:
                hosts = gangs.hosts_of(plan.spec)
                message = f"created {job['kind']} {name}: {hosts}, attempt {plan.create_job}"
                log.info("%s/%s: %s", exp.namespace, exp.name, message)
                self._event(body, "Normal", api.REASON_JOB_CREATED, message)
                if self.trainer_token == api.TOKEN_NONE:
                    self._event(body, "Warning", api.REASON_PROGRESS_NOT_REPORTED, api.NO_TOKEN)
        if plan.delete_experiment:
            self.kube.delete(api.KIND, exp.namespace, exp.name, uid=exp.uid)
            log.info("%s/%s: deleted after its TTL", exp.namespace, exp.name)
        return None

    def _event(self, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        post_event(self.kube, body, type_, reason, message)


def _status_whole_again(
    patch: dict[str, Any], status: Status, old: Status, generation: int, now: datetime
) -> dict[str, Any]:
    """`patch`, which the API server is to take whole, with the BESIDE_PLAN conditions an
    earlier reconcile left True set False."""
    if not any(cond.is_true(old.conditions, c) for c in cond.BESIDE_PLAN):
        return patch
    conditions = cond.clear_beside_plan(status.conditions, generation, format_time(now))
    return {**patch, "conditions": [dict(c) for c in conditions]}


def mark_beside_plan(
    kube: Kube, body: Mapping[str, Any], kind: str, condition: cond.Condition, now: datetime
) -> None:
    """Write `condition` alone into the conditions of `body` (an experiment or a sweep), and
    post its Event the first time it turns True: what users see of a reconcile that cannot
    go on, rather than a retry loop only the operator's log shows."""
    meta = body["metadata"]
    log.error("%s/%s: %s: %s", meta["namespace"], meta["name"], condition.reason, condition.message)
    old = tuple((body.get("status") or {}).get("conditions") or ())
    generation = int(meta.get("generation") or 0)
    conditions = cond.set_condition(old, condition, generation, format_time(now))
    try:
        kube.patch_status(
            meta["namespace"],
            meta["name"],
            {"conditions": [dict(c) for c in conditions]},
            meta.get("resourceVersion", ""),
            kind=kind,
        )
    except ApiError as err:
        log.warning(
            "%s/%s: condition %s not written: %s",
            meta["namespace"],
            meta["name"],
            condition.type,
            err,
        )
        return
    if not cond.is_true(old, condition.type):
        post_event(kube, body, "Warning", condition.reason, condition.message)


def post_event(kube: Kube, body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    """An Event about `body` (an experiment or a sweep), worth a log line, never a retry."""
    try:
        kube.post_event(body, type_, reason, message)
    except ApiError as err:
        meta = body["metadata"]
        log.warning("%s/%s: event %s not posted: %s", meta["namespace"], meta["name"], reason, err)
