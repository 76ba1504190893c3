"""The reconcile decision, as a pure function: what was observed in, a Plan out.

`decide` reads an experiment (its spec and the status the operator wrote
last), the Jobs and pods it owns, and the time, and says what the status
should become, which Events to post, and which Jobs to create or delete. It
is a short list of early-return steps; each rule lives in `rules/`.

The reconciler (reconcile.py) carries a Plan out in a fixed order: one status
write, then Events, then Job deletions and creations. Writing the status
first is what makes a crash harmless: a new attempt number is durable before
its Job exists, so the next reconcile creates exactly that Job.

A new attempt's Job is created only once the pods of earlier gangs have
stopped (a deleted Job's pods go on running while they checkpoint), so that
two gangs of one experiment do not write its checkpoint directory at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, cast

from evokube_operator import api
from evokube_operator import conditions as cond
from evokube_operator.desired import builders, gangs
from evokube_operator.reading.observe import JobEvent, JobView, PodView, QueueView, gang_pods
from evokube_operator.reading.ownership import Blocker, location_blocker
from evokube_operator.reading.spec import (
    Experiment,
    ExperimentSpec,
    SpecError,
    experiment_checkpoint_location,
    format_time,
    parse_spec,
    parse_time,
)
from evokube_operator.rules import deadline, failure, refusal, startup, success, timer
from evokube_operator.util import clip

# A pod still there this long after its deletionTimestamp (the time by which it should be
# gone) no longer holds the next gang back: its node, and the kubelet that would stop it,
# is presumably lost, and waiting for it would hold the experiment up for good. 60 s is
# well past a busy kubelet's lag, and the kubelet kills whatever still runs (a checkpoint
# write too) once the grace period is over.
STUCK_POD_MARGIN = timedelta(seconds=60)
# While the next gang waits for earlier pods, decide again this often even without a pod
# event (pod events wake the reconcile when they stop; this is a safety net).
WAIT_FOR_PODS_REQUEUE_SECONDS = 15.0
# While Blocked (a name conflict, a claim not opted in), look again this often: the fix is a
# person's edit to an object the operator does not watch.
BLOCKED_REQUEUE_SECONDS = 15.0
# A Job's pods normally appear within a second or two; only a Job that has lacked pods this
# long has its FailedCreate events read, so that a normal start costs no extra API call.
JOB_EVENTS_GRACE_SECONDS = 5.0
# While a gang lacks pods, read its Job's events again (and decide again) this often: a refused
# pod changes nothing that the operator watches. The reconciler reads them no more often.
JOB_EVENTS_REQUEUE_SECONDS = 15.0
# While a Job waits for Kueue, read its Workload again (and decide again) this often: the
# operator does not watch Workloads, and the Queued condition shows Kueue's latest word.
QUEUE_REQUEUE_SECONDS = 15.0

# status field name in the API -> attribute of Status
_FIELDS = {
    "phase": "phase",
    "observedGeneration": "observed_generation",
    "hosts": "hosts",
    "slices": "slices",
    "restarts": "restarts",
    "preemptions": "preemptions",
    "attempt": "attempt",
    "startTime": "start_time",
    "completionTime": "completion_time",
    "jobName": "job_name",
    "jobUID": "job_uid",
    "coordinatorAddress": "coordinator_address",
    "checkpointLocation": "checkpoint_location",
    "conditions": "conditions",
}


@dataclass(frozen=True)
class Status:
    """The operator's part of status (status.progress is the trainer's and never here)."""

    phase: str | None = None
    observed_generation: int | None = None
    hosts: int | None = None  # of all slices
    slices: int | None = None  # only when more than 1 (multislice: a JobSet)
    restarts: int = 0
    preemptions: int = 0
    # The gang attempt (the Job's name, its pods' LABEL_ATTEMPT): one more at each gang restart,
    # counted or not; a gang Kueue evicts keeps its Job, so its preemption adds none.
    attempt: int = 0
    start_time: str | None = None
    completion_time: str | None = None
    job_name: str | None = None
    # The uid of Job job_name once the operator has seen it: set, and that Job gone,
    # means someone else deleted it (unset: not created yet).
    job_uid: str | None = None
    coordinator_address: str | None = None
    checkpoint_location: str | None = None
    conditions: cond.Conditions = ()

    @classmethod
    def from_dict(cls, status: Mapping[str, Any]) -> Status:
        values: dict[str, Any] = {
            attr: status.get(key) for key, attr in _FIELDS.items() if key in status
        }
        values["restarts"] = int(values.get("restarts") or 0)
        values["preemptions"] = int(values.get("preemptions") or 0)
        # Before status.attempt existed, every preemption started a new attempt.
        if values.get("attempt") is None:
            values["attempt"] = values["restarts"] + values["preemptions"]
        values["conditions"] = tuple(values.get("conditions") or ())
        return cls(**values)

    def patch_from(self, old: Status) -> dict[str, Any]:
        """A JSON merge patch of status that turns `old` into this (None deletes a field)."""
        patch: dict[str, Any] = {}
        for key, attr in _FIELDS.items():
            new, before = getattr(self, attr), getattr(old, attr)
            if new != before:
                patch[key] = [dict(c) for c in new] if attr == "conditions" else new
        if patch.keys() & {"restarts", "preemptions", "jobName"}:
            # A status without attempt reads as restarts + preemptions (from_dict): written
            # with every new Job and count, since a Kueue eviction moves one and not the attempt.
            patch["attempt"] = self.attempt
        return patch


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass(frozen=True)
class Observation:
    experiment: Experiment
    jobs: tuple[JobView, ...]
    pods: tuple[PodView, ...]
    now: datetime
    # The API server refused an object this attempt needs (the reconciler tried to create it).
    refused: refusal.Refusal | None = None
    # The experiment was just read from the API server, not from the watch cache.
    fresh: bool = False
    # What keeps the current attempt's Job from being created (the reconciler checked).
    blocked: Blocker | None = None
    # The current Job's FailedCreate events, read only when a Plan asked (READ_JOB_EVENTS).
    job_events: tuple[JobEvent, ...] | None = None
    # The uid of the current Job, which the API server confirmed gone (READ_JOB).
    job_gone: str | None = None
    # What Kueue says of the current Job's Workload, read only when a Plan asked (READ_QUEUE).
    queue: QueueView | None = None


# What a Plan may ask the reconciler to read about the current Job before acting on it. decide
# asks for each only while its Observation lacks the answer, and decides again once it is there.
READ_JOB = "job"  # missing from the watch: is it really gone? (Observation.job_gone)
READ_JOB_EVENTS = "job-events"  # its FailedCreate events (Observation.job_events)
READ_QUEUE = "queue"  # suspended: what Kueue says of it (Observation.queue)


@dataclass(frozen=True)
class Read:
    """One read of a Plan (Plan.read), about the current Job."""

    what: str  # READ_JOB, READ_JOB_EVENTS or READ_QUEUE
    job: str  # the Job's name
    uid: str  # and uid


@dataclass(frozen=True)
class Plan:
    status: Status
    events: tuple[Event, ...] = ()
    create_job: int | None = None  # the attempt whose Job to create
    job_deadline: int | None = None  # activeDeadlineSeconds for that Job
    delete_jobs: tuple[str, ...] = ()
    delete_experiment: bool = False
    requeue_after: float | None = None
    # The status seen is older than a Job seen: read the experiment again, decide again.
    stale: bool = False
    # What to read before this plan may be acted on: read it, decide again.
    read: Read | None = None
    # The spec this plan was decided from (`desired_spec`); None when none was parsed (deleted,
    # finished, invalid). The reconciler builds the Job and the owned objects from it.
    spec: ExperimentSpec | None = None


@dataclass(frozen=True)
class _Step:
    """What every step needs: the observation and its time stamp, once."""

    obs: Observation
    now: str
    timeouts: startup.Timeouts = startup.DEFAULT_TIMEOUTS
    default_checkpoints: str | None = None  # the operator's default checkpoint location

    @property
    def exp(self) -> Experiment:
        return self.obs.experiment

    def conditions(self, status: Status, *updates: cond.Condition) -> cond.Conditions:
        return cond.set_all(status.conditions, updates, self.exp.generation, self.now)

    def clear(self, conditions: cond.Conditions, kind: str, reason: str, message: str):
        return cond.clear(conditions, kind, reason, message, self.exp.generation, self.now)

    def live_jobs(self, keep: str | None = None) -> tuple[str, ...]:
        """Names of the Jobs that still exist, but `keep`."""
        return tuple(j.name for j in self.obs.jobs if j.name != keep and not j.deleting)

    def unfinished_jobs(self) -> tuple[str, ...]:
        return tuple(
            j.name for j in self.obs.jobs if not j.deleting and not j.complete and j.failure is None
        )

    def unstopped_pods(self) -> tuple[PodView, ...]:
        """Pods (of any attempt, or of a namesake) that may still run, but stuck ones."""
        return tuple(
            p
            for p in self.obs.pods
            if p.phase not in ("Succeeded", "Failed")
            and (
                p.deletion_timestamp is None
                or self.obs.now - p.deletion_timestamp <= STUCK_POD_MARGIN
            )
        )


def desired_spec(exp: Experiment, default_checkpoints: str | None) -> ExperimentSpec:
    """The spec the operator acts on (SpecError if it cannot). `default_checkpoints` is the
    operator's default checkpoint location; an experiment without its own keeps the one its
    status already names, so a changed default never moves a running experiment away from
    its checkpoints. Parsed once per decision, and carried in its Plan."""
    named = Status.from_dict(exp.status).checkpoint_location
    return parse_spec(
        exp.spec,
        named or experiment_checkpoint_location(default_checkpoints, exp.namespace, exp.name),
    )


def decide(
    obs: Observation,
    timeouts: startup.Timeouts = startup.DEFAULT_TIMEOUTS,
    default_checkpoints: str | None = None,
) -> Plan:
    """The next status and actions (see `desired_spec` for `default_checkpoints`)."""
    exp = obs.experiment
    # Only Jobs this very experiment owns (not a deleted namesake's, not look-alikes).
    obs = replace(obs, jobs=tuple(j for j in obs.jobs if j.owner_uid == exp.uid))
    step = _Step(obs, format_time(obs.now), timeouts, default_checkpoints)
    old = Status.from_dict(exp.status)
    if exp.deleting:
        return Plan(old)
    if old.phase in api.FINISHED_PHASES:
        return _finished(step, old)
    try:
        spec = desired_spec(exp, default_checkpoints)
    except SpecError as err:
        return _fail(step, old, api.REASON_INVALID_SPEC, str(err), None)
    return replace(_decide_active(step, old, spec), spec=spec)


def _decide_active(step: _Step, old: Status, spec: ExperimentSpec) -> Plan:
    """`decide` for an experiment neither deleted nor finished, whose spec parsed."""
    obs, exp = step.obs, step.exp
    newest = max((j.attempt for j in obs.jobs if j.attempt is not None), default=-1)
    if newest > old.attempt and not obs.fresh:
        return Plan(old, stale=True)
    if obs.refused is not None and obs.refused.final:
        return _fail(step, old, obs.refused.reason, obs.refused.message, spec)
    if spec.suspend:
        return _suspend(step, old, spec)
    status, events = old, cast(tuple[Event, ...], ())
    if status.phase == api.SUSPENDED:
        status, events = _resume(step, status)
    left = timer.remaining(parse_time(status.start_time), spec.active_deadline_seconds, obs.now)
    if left is not None and left <= 0:
        message = f"active for more than activeDeadlineSeconds ({spec.active_deadline_seconds}s)"
        return _fail(step, status, api.REASON_DEADLINE, message, spec, events)
    name = builders.job_name(exp.name, status.attempt)
    job = next((j for j in obs.jobs if j.name == name and not j.deleting), None)
    if job is None:
        if status.job_uid is not None and status.job_name == name:
            # Someone deleted it; a new attempt stops the gang, so not on the watch's word alone.
            if obs.job_gone != status.job_uid:
                return Plan(old, read=Read(READ_JOB, name, status.job_uid))
            return _job_deleted(step, status, spec, name, events)
        return _start(step, status, spec, events)
    if status.job_uid != job.uid:
        status = replace(status, job_uid=job.uid)
    pods = [p for p in gang_pods(job, obs.pods) if not _evicted_earlier(p, job)]
    if job.suspended and job.failure is None and not job.complete:
        return _queued(step, status, spec, job, events, left)
    failed = failure.classify(job, pods)
    if failed is not None and failed.kind == failure.DEADLINE and (left is None or left > 5):
        # The Job's deadline was set from an older, shorter spec.activeDeadlineSeconds.
        message = f"{failed.message}; the experiment's own deadline is later"
        failed = failure.GangFailure(failure.DISRUPTION, message)
    if failed is not None:
        verdict = failure.verdict(failed, status.restarts, spec.max_restarts)
        if verdict.restart:
            return _restart(step, status, spec, verdict, events)
        # backoffLimit 0: the Job controller stops the other hosts and keeps the pods (logs).
        return _fail(step, status, verdict.reason, verdict.message, spec, events, stop=False)
    if success.succeeded(job, pods, spec.accelerator.processes):
        return _succeed(step, status, spec, job, events)
    return _progress(step, status, spec, job, pods, events, left)


def _evicted_earlier(pod: PodView, job: JobView) -> bool:
    """A pod of a gang Kueue evicted before the Job's last admission: being deleted (the Job
    controller deletes the pods of a suspended Job) and created before that admission. The
    deletion is what tells: the Job controller creates a new gang's pods before it writes the
    admission's time (both in whole seconds), so a new pod may look older than it."""
    return (
        pod.deleting
        and job.resumed_at is not None
        and pod.created_at is not None
        and pod.created_at < job.resumed_at
    )


# -- steps ------------------------------------------------------------------------------
def _start(step: _Step, status: Status, spec: ExperimentSpec, events=()) -> Plan:
    """No Job for the current attempt: record it in status, then create it.

    Not while pods of an earlier gang still run (they may be writing a checkpoint): the
    status is written and the other Jobs deleted, but the Job waits for a later reconcile.
    Not while Blocked: the checkpoint location reaches into another namespace's folder, the
    reconciler found a name conflict or a claim not opted in, or the API server refused an object
    for a cause that may pass (then with backoff).
    """
    exp = step.exp
    blocker = step.obs.blocked or location_blocker(
        spec.checkpoint_location, step.default_checkpoints, exp.namespace
    )
    if blocker is not None:
        return _blocked(step, status, spec, blocker, events)
    refused = step.obs.refused
    if refused is not None:
        blocker = Blocker(refused.reason, refused.message)
        return _blocked(step, status, spec, blocker, events, backoff=True)
    attempt, hosts, slices = status.attempt, spec.accelerator.processes, spec.accelerator.slices
    name = builders.job_name(exp.name, attempt)
    start = status.start_time or step.now
    phase = api.RESTARTING if status.phase == api.RESTARTING else api.PENDING
    status = replace(
        status,
        phase=phase,
        observed_generation=exp.generation,
        hosts=hosts,
        slices=gangs.status_slices(spec),
        job_name=name,
        job_uid=None,
        coordinator_address=builders.coordinator_address(
            exp.name, attempt, spec.coordinator_port, slices
        ),
        checkpoint_location=spec.checkpoint_location,
        start_time=start,
    )
    waiting = bool(step.unstopped_pods())
    if waiting:  # No pod count in the message: it changes only once, so the wait costs one write.
        reason, message = (
            api.REASON_WAITING_FOR_PREVIOUS_PODS,
            f"Job {name} waits for the pods of an earlier gang to stop",
        )
    else:
        reason, message = (
            api.REASON_WAITING_FOR_HOSTS,
            f"waiting for the {hosts} hosts of Job {name} to run",
        )
    running = cond.Condition(api.COND_RUNNING, False, reason, message)
    conditions = step.conditions(status, running, *_queue_at_start(spec, name, status))
    conditions, events = _checkpoint_durability(step, conditions, spec, events)
    if not waiting and cond.is_true(conditions, api.COND_BLOCKED):
        unblocked = f"nothing keeps Job {name} from being created any more"
        conditions = step.clear(conditions, api.COND_BLOCKED, api.REASON_UNBLOCKED, unblocked)
        events = (*events, Event("Normal", api.REASON_UNBLOCKED, unblocked))
    status = replace(status, conditions=conditions)
    start_at, now = parse_time(start), step.obs.now
    requeue = timer.remaining(start_at, spec.active_deadline_seconds, now)
    job_deadline = deadline.job_deadline(start_at, spec.active_deadline_seconds, now)
    if waiting:
        wait = WAIT_FOR_PODS_REQUEUE_SECONDS
        requeue, job_deadline = (wait if requeue is None else min(wait, requeue)), None
    return Plan(
        status,
        events=tuple(events),
        create_job=None if waiting else attempt,
        job_deadline=job_deadline,
        delete_jobs=step.live_jobs(keep=name),
        requeue_after=requeue,
    )


def _checkpoint_durability(
    step: _Step, conditions: cond.Conditions, spec: ExperimentSpec, events
) -> tuple[cond.Conditions, tuple[Event, ...]]:
    """CheckpointsEphemeral, True with a Warning Event when it turns so, while checkpoints go to
    an emptyDir: the gang still starts, but a restart will begin again from generation 1."""
    ephemeral = spec.checkpoint_location.startswith("/") and not spec.checkpoint_claim
    if ephemeral == cond.is_true(conditions, api.COND_CHECKPOINTS_EPHEMERAL):
        return conditions, tuple(events)
    if not ephemeral:
        message = f"checkpoints go to {spec.checkpoint_location}, which outlives the pods"
        cleared = step.clear(
            conditions, api.COND_CHECKPOINTS_EPHEMERAL, api.REASON_DURABLE_CHECKPOINTS, message
        )
        return cleared, tuple(events)
    message = (
        f"checkpoints go to an emptyDir at {spec.checkpoint_location}: progress will not survive "
        "a gang restart (preemption, a lost host), which starts over from generation 1; set "
        "spec.checkpoint.location to a gs:// or s3:// URL (or a path with volumeClaimName), or "
        "the chart's checkpoints.defaultLocation"
    )
    warning = cond.Condition(
        api.COND_CHECKPOINTS_EPHEMERAL, True, api.REASON_EMPTYDIR_CHECKPOINTS, message
    )
    conditions = cond.set_all(conditions, (warning,), step.exp.generation, step.now)
    return conditions, (*events, Event("Warning", api.REASON_EMPTYDIR_CHECKPOINTS, message))


def _blocked(
    step: _Step,
    status: Status,
    spec: ExperimentSpec,
    blocker: Blocker,
    events=(),
    backoff: bool = False,
) -> Plan:
    """No Job until a person acts: Blocked says why (a Warning Event the first time), and
    the reconciler looks again every BLOCKED_REQUEUE_SECONDS, or with `backoff` after as long
    as it has been Blocked (rules/refusal.py). The status names no Job."""
    condition = cond.Condition(api.COND_BLOCKED, True, blocker.reason, blocker.message)
    conditions = step.conditions(status, condition)
    if conditions != status.conditions:
        events = (*events, Event("Warning", blocker.reason, blocker.message))
    status = replace(
        status,
        phase=api.RESTARTING if status.phase == api.RESTARTING else api.PENDING,
        observed_generation=step.exp.generation,
        hosts=spec.accelerator.processes,
        slices=gangs.status_slices(spec),
        job_name=None,
        job_uid=None,
        coordinator_address=None,
        # A refused location is never recorded: status would carry it on (desired_spec).
        checkpoint_location=status.checkpoint_location
        if blocker.reason == api.REASON_LOCATION_NOT_ALLOWED
        else spec.checkpoint_location,
        conditions=conditions,
    )
    left = timer.remaining(
        parse_time(status.start_time), spec.active_deadline_seconds, step.obs.now
    )
    wait = BLOCKED_REQUEUE_SECONDS
    if backoff:
        since = (cond.find(conditions, api.COND_BLOCKED) or {}).get("lastTransitionTime")
        wait = refusal.retry_after(parse_time(since), step.obs.now)
    requeue = wait if left is None else min(wait, left)
    return Plan(
        status,
        events=tuple(events),
        delete_jobs=step.live_jobs(),
        requeue_after=requeue,
    )


def _job_deleted(step: _Step, status: Status, spec: ExperimentSpec, name: str, events=()):
    """Someone else deleted the current Job: the next attempt, under a new name, uncounted."""
    message = f"Job {name} was deleted, not by the operator"
    verdict = failure.Verdict(True, False, api.REASON_JOB_DELETED, message)
    return _restart(step, status, spec, verdict, events)


def _restart(
    step: _Step, status: Status, spec: ExperimentSpec, verdict: failure.Verdict, events=()
) -> Plan:
    """The gang failed but may go on: a new attempt, from the newest checkpoint."""
    status = replace(
        status,
        phase=api.RESTARTING,
        restarts=status.restarts + (1 if verdict.counted else 0),
        preemptions=status.preemptions + (0 if verdict.counted else 1),
        attempt=status.attempt + 1,
    )
    status = replace(
        status,
        conditions=step.conditions(
            status, cond.Condition(api.COND_RESTARTING, True, verdict.reason, verdict.message)
        ),
    )
    kind = "Warning" if verdict.counted else "Normal"
    event = Event(kind, verdict.reason, f"{verdict.message}; attempt {status.attempt} starts")
    return _start(step, status, spec, (*events, event))


def _fail(
    step: _Step,
    status: Status,
    reason: str,
    message: str,
    spec: ExperimentSpec | None,
    events=(),
    stop: bool = True,
) -> Plan:
    """Final. With `stop`, Jobs still running are deleted; otherwise they are kept."""
    conditions = step.conditions(status, cond.Condition(api.COND_FAILED, True, reason, message))
    conditions = step.clear(conditions, api.COND_RUNNING, api.REASON_FINISHED, "failed")
    conditions = step.clear(conditions, api.COND_RESTARTING, api.REASON_FINISHED, "failed")
    status = replace(
        status,
        phase=api.FAILED,
        observed_generation=step.exp.generation,
        completion_time=step.now,
        conditions=conditions,
    )
    return Plan(
        status,
        events=(*events, Event("Warning", reason, message)),
        delete_jobs=step.unfinished_jobs() if stop else (),
        requeue_after=timer.remaining(
            step.obs.now, spec.ttl_seconds_after_finished if spec else None, step.obs.now
        ),
    )


def _succeed(step: _Step, status: Status, spec: ExperimentSpec, job: JobView, events=()):
    message = f"all {spec.accelerator.processes} hosts of Job {job.name} exited 0"
    conditions = step.conditions(
        status, cond.Condition(api.COND_SUCCEEDED, True, api.REASON_COMPLETED, message)
    )
    conditions = step.clear(conditions, api.COND_RUNNING, api.REASON_FINISHED, "succeeded")
    conditions = step.clear(conditions, api.COND_RESTARTING, api.REASON_FINISHED, "succeeded")
    completed = job.completion_time or step.now
    status = replace(
        status,
        phase=api.SUCCEEDED,
        observed_generation=step.exp.generation,
        completion_time=completed,
        conditions=conditions,
    )
    return Plan(
        status,
        events=(*events, Event("Normal", api.REASON_COMPLETED, message)),
        delete_jobs=step.live_jobs(keep=job.name),
        requeue_after=timer.remaining(
            parse_time(completed), spec.ttl_seconds_after_finished, step.obs.now
        ),
    )


def _suspend(step: _Step, status: Status, spec: ExperimentSpec) -> Plan:
    """spec.suspend: no Job at all; a gang that had started counts as preempted."""
    events: tuple[Event, ...] = ()
    if status.phase != api.SUSPENDED:
        started = status.job_name is not None
        status = replace(
            status,
            phase=api.SUSPENDED,
            preemptions=status.preemptions + (1 if started else 0),
            attempt=status.attempt + (1 if started else 0),
            job_name=None,
            job_uid=None,
            coordinator_address=None,
        )
        message = "spec.suspend is true: the trainer Job is removed, checkpoints are kept"
        events = (Event("Normal", api.REASON_SUSPENDED, message),)
        conditions = step.conditions(
            status,
            cond.Condition(api.COND_SUSPENDED, True, api.REASON_SUSPENDED, message),
            cond.Condition(api.COND_RUNNING, False, api.REASON_SUSPENDED, "suspended"),
        )
        conditions = step.clear(conditions, api.COND_RESTARTING, api.REASON_SUSPENDED, "suspended")
        conditions = step.clear(conditions, api.COND_BLOCKED, api.REASON_SUSPENDED, "suspended")
        status = replace(status, conditions=conditions)
    status = replace(status, observed_generation=step.exp.generation)
    return Plan(status, events=events, delete_jobs=step.live_jobs())


def _resume(step: _Step, status: Status) -> tuple[Status, tuple[Event, ...]]:
    message = "spec.suspend is false: the gang resumes from the newest checkpoint"
    status = replace(status, phase=api.PENDING, start_time=None)
    conditions = step.conditions(
        status, cond.Condition(api.COND_SUSPENDED, False, api.REASON_RESUMED, message)
    )
    return replace(status, conditions=conditions), (Event("Normal", api.REASON_RESUMED, message),)


def _progress(
    step: _Step,
    status: Status,
    spec: ExperimentSpec,
    job: JobView,
    pods: list[PodView],
    events,
    left: float | None,
) -> Plan:
    """The Job exists and nothing has ended: Pending, Running or still Restarting."""
    hosts = spec.accelerator.processes
    events = tuple(events)
    if cond.is_true(status.conditions, api.COND_QUEUED):
        message = f"Kueue admitted Job {job.name}"
        status = replace(
            status,
            phase=api.PENDING if status.phase == api.QUEUED else status.phase,
            conditions=step.clear(status.conditions, api.COND_QUEUED, api.REASON_ADMITTED, message),
        )
        events = (*events, Event("Normal", api.REASON_ADMITTED, message))
    if success.all_running(pods, hosts):
        phase = api.RUNNING
        running = cond.Condition(
            api.COND_RUNNING,
            True,
            api.REASON_ALL_HOSTS_RUNNING,
            f"all {hosts} hosts of Job {job.name} are running",
        )
    else:
        phase = api.RESTARTING if status.phase == api.RESTARTING else api.PENDING
        running = cond.Condition(
            api.COND_RUNNING,
            False,
            api.REASON_WAITING_FOR_HOSTS,
            f"waiting for the {hosts} hosts of Job {job.name} to run",
        )
    diagnosis, wants_events = startup.Diagnosis(), False
    if phase != api.RUNNING:
        diagnosis, wants_events = _start_check(step, job, pods, hosts)
    if diagnosis.waiting is not None:
        running = replace(running, message=clip(f"{running.message}: {diagnosis.waiting}"))
    problem = diagnosis.problem
    if problem is not None and problem.final:
        return _fail(step, status, problem.reason, problem.message, spec, events)
    conditions = step.conditions(status, running)
    conditions, events = _set_blocked(step, conditions, problem, events)
    if phase == api.RUNNING:
        conditions = step.clear(
            conditions,
            api.COND_RESTARTING,
            api.REASON_RECOVERED,
            f"attempt {status.attempt} runs on all {hosts} hosts",
        )
    if phase != status.phase:
        kind = "Normal" if phase != api.PENDING or status.phase is None else "Warning"
        events = (*events, Event(kind, running.reason, running.message))
    status = replace(
        status,
        phase=phase,
        observed_generation=step.exp.generation,
        conditions=conditions,
    )
    waits = [w for w in (left, diagnosis.recheck_after) if w is not None]
    return Plan(
        status,
        events=events,
        delete_jobs=step.live_jobs(keep=job.name),
        requeue_after=min(waits, default=None),
        read=Read(READ_JOB_EVENTS, job.name, job.uid)
        if wants_events and step.obs.job_events is None
        else None,
    )


def _queue_at_start(spec: ExperimentSpec, job: str, status: Status) -> tuple[cond.Condition, ...]:
    """The Queued condition for a new Job: True (waiting) with a queue; with none, a Queued
    condition left from an earlier attempt is turned False."""
    if spec.queue_name:
        message = f"Job {job} waits for admission by LocalQueue {spec.queue_name}"
        return (cond.Condition(api.COND_QUEUED, True, api.REASON_JOB_SUSPENDED, message),)
    if cond.find(status.conditions, api.COND_QUEUED) is None:
        return ()
    message = f"Job {job} has no queue (spec.queueName is unset)"
    return (cond.Condition(api.COND_QUEUED, False, api.REASON_NO_QUEUE, message),)


def _queued(
    step: _Step,
    status: Status,
    spec: ExperimentSpec,
    job: JobView,
    events,
    left: float | None,
) -> Plan:
    """The Job is suspended by someone else than the operator (Kueue): phase Queued, with
    what Kueue says. A Job that had been admitted and is suspended again was evicted
    (preempted, or its pods were not ready in time): a preemption, on the same Job and
    attempt, which resumes from the newest checkpoint when Kueue admits it again. The
    operator never unsuspends it."""
    queue = step.obs.queue
    if queue is None:
        return Plan(status, read=Read(READ_QUEUE, job.name, job.uid))
    events = tuple(events)
    before = cond.find(status.conditions, api.COND_QUEUED)
    admitted_before = (
        before is not None
        and before.get("status") == "False"
        and before.get("reason") == api.REASON_ADMITTED
    ) or (before is None and status.phase == api.RUNNING)
    if admitted_before:
        why = f" ({queue.evicted})" if queue.evicted else ""
        message = (
            f"Job {job.name} was suspended after its admission{why}: the gang checkpoints and "
            "resumes when the queue admits it again"
        )
        status = replace(status, preemptions=status.preemptions + 1)
        events = (*events, Event("Normal", api.REASON_EVICTED, message))
    if queue.found:
        reason, message = queue.reason, queue.message or f"Job {job.name} waits for admission"
    elif spec.queue_name:
        reason = api.REASON_NO_WORKLOAD
        message = (
            f"{job.kind} {job.name} waits, and Kueue has no Workload for it: is Kueue installed "
            f"with its {gangs.BACKENDS[job.kind].kueue_framework} integration, and does LocalQueue "
            f"{spec.queue_name} exist in namespace {step.exp.namespace}?"
        )
    else:
        reason = api.REASON_NO_WORKLOAD
        message = f"Job {job.name} was suspended by someone else than the operator"
    conditions = step.conditions(
        status,
        cond.Condition(api.COND_QUEUED, True, reason, message),
        cond.Condition(
            api.COND_RUNNING, False, api.REASON_JOB_SUSPENDED, f"Job {job.name} is suspended"
        ),
    )
    if status.phase != api.QUEUED:
        events = (*events, Event("Normal", api.REASON_QUEUED, message))
    status = replace(
        status, phase=api.QUEUED, observed_generation=step.exp.generation, conditions=conditions
    )
    requeue = QUEUE_REQUEUE_SECONDS if left is None else min(QUEUE_REQUEUE_SECONDS, left)
    return Plan(
        status,
        events=events,
        delete_jobs=step.live_jobs(keep=job.name),
        requeue_after=requeue,
    )


def _start_check(
    step: _Step, job: JobView, pods: list[PodView], hosts: int
) -> tuple[startup.Diagnosis, bool]:
    """What keeps a gang that is not all running from starting (rules/startup.py), and
    whether the Job's events are needed to tell. Its recheck_after says when to look again."""
    now = step.obs.now
    missing = startup.missing_pods(pods, hosts)
    age = (now - job.created_at).total_seconds() if job.created_at else JOB_EVENTS_GRACE_SECONDS
    wants_events = missing and age >= JOB_EVENTS_GRACE_SECONDS
    job_events = (step.obs.job_events or ()) if wants_events else ()
    diagnosis = startup.diagnose(job_events, pods, now, step.timeouts)
    waits = [diagnosis.recheck_after] if diagnosis.recheck_after is not None else []
    if missing:
        waits.append(JOB_EVENTS_REQUEUE_SECONDS if wants_events else JOB_EVENTS_GRACE_SECONDS - age)
    return replace(diagnosis, recheck_after=min(waits, default=None)), wants_events


def _set_blocked(
    step: _Step, conditions: cond.Conditions, problem: startup.Problem | None, events
) -> tuple[cond.Conditions, tuple[Event, ...]]:
    """Blocked=True with the cause (a Warning Event when the cause is new), or cleared."""
    if problem is None:
        if not cond.is_true(conditions, api.COND_BLOCKED):
            return conditions, events
        message = "nothing keeps the trainer pods from starting any more"
        conditions = step.clear(conditions, api.COND_BLOCKED, api.REASON_UNBLOCKED, message)
        return conditions, (*events, Event("Normal", api.REASON_UNBLOCKED, message))
    before = cond.find(conditions, api.COND_BLOCKED)
    blocked = cond.Condition(api.COND_BLOCKED, True, problem.reason, problem.message)
    conditions = cond.set_condition(conditions, blocked, step.exp.generation, step.now)
    if before is None or before.get("status") != "True" or before.get("reason") != problem.reason:
        events = (*events, Event("Warning", problem.reason, problem.message))
    return conditions, events


def _finished(step: _Step, status: Status) -> Plan:
    """Succeeded or Failed: only the TTL is left to honour."""
    try:
        ttl_seconds = parse_spec(step.exp.spec).ttl_seconds_after_finished
    except SpecError:
        ttl_seconds = step.exp.spec.get("ttlSecondsAfterFinished")
        ttl_seconds = ttl_seconds if isinstance(ttl_seconds, int) else None
    left = timer.remaining(parse_time(status.completion_time), ttl_seconds, step.obs.now)
    status = replace(status, observed_generation=step.exp.generation)
    if left is not None and left <= 0:
        message = f"finished more than ttlSecondsAfterFinished ({ttl_seconds}s) ago: deleting"
        return Plan(
            status,
            events=(Event("Normal", api.REASON_EXPIRED, message),),
            delete_experiment=True,
        )
    return Plan(status, requeue_after=left)
