"""What the end-to-end tests and the demo do to a running `Stack`, and what they measure.

Each scenario applies tests/e2e/experiment.yaml (or a changed copy) in its own
namespace, disturbs the run (a killed trainer, an eviction, a killed operator),
waits until the experiment succeeds and returns a `Report`: the measurements
the tests assert on, and a `Timeline` of everything that happened, which the
demo prints and a failing test shows.
"""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

import yaml

from evokube_operator.api import TPU_ACCELERATOR_SELECTOR, TPU_RESOURCE, TPU_TOPOLOGY_SELECTOR
from evokube_operator.desired import jobset
from tests.cluster.controlplane import wait_until
from tests.e2e.podrunner import local_process
from tests.e2e.stack import (
    EXPERIMENT,
    GROUP,
    PLURAL,
    RELEASE_NAMESPACE,
    TPU_CHIPS,
    TPU_TOPOLOGY,
    TPU_TYPE,
    VERSION,
    Samples,
    Stack,
)
from tests.objectstore.emulators import Emulator, start_fake_gcs

RESUMED = re.compile(r"resumed from checkpoint at generation (\d+)")
STOPPED = re.compile(r"stopped at generation (\d+): (.*)")
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"


# -- the timeline ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Entry:
    at: float  # seconds since the timeline began
    clock: str
    what: str
    detail: str


class Timeline:
    """Timestamped lines of what happened; echoed as they come when `echo` is given."""

    def __init__(self, echo: TextIO | None = None):
        self.started = time.monotonic()
        self.entries: list[Entry] = []
        self.echo = echo
        self._lock = threading.Lock()

    def add(self, what: str, detail: str = "") -> None:
        entry = Entry(
            time.monotonic() - self.started, datetime.now().strftime("%H:%M:%S"), what, detail
        )
        with self._lock:
            self.entries.append(entry)
            if self.echo is not None:
                print(format_entry(entry), file=self.echo, flush=True)

    def __str__(self) -> str:
        return "\n".join(format_entry(e) for e in self.entries)


def format_entry(entry: Entry) -> str:
    return f"{entry.clock} {entry.at:+7.1f}s  {entry.what:<22} {entry.detail}".rstrip()


# -- watching what the cluster shows -----------------------------------------------------------
class Watcher:
    """Follows the experiment and its pods (watch streams: no state is missed) and polls
    its Jobs and the operator pod; adds every change to the timeline."""

    def __init__(self, stack: Stack, namespace: str, name: str, timeline: Timeline):
        self.stack, self.namespace, self.name, self.timeline = stack, namespace, name, timeline
        self.progress: list[tuple[int, float | None]] = []  # (generation, best) as status shows
        self.tables: list[tuple[str, str]] = []  # `kubectl get erlx` (header, row) at each
        self.jobs: dict[str, set[str]] = {}  # Job (or JobSet) name -> every uid seen
        self.phases: list[str] = []
        self._pods: dict[str, tuple] = {}
        self._operator: tuple | None = None  # (restart count, pid) of the running operator
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        custom, core = self.stack.custom, self.stack.core
        self._spawn(
            self._follow,
            custom.list_namespaced_custom_object,
            (GROUP, VERSION, self.namespace, PLURAL),
            {"field_selector": f"metadata.name={self.name}"},
            self._on_experiment,
        )
        self._spawn(
            self._follow,
            core.list_namespaced_pod,
            (self.namespace,),
            {"label_selector": f"evokube.io/experiment={self.name}"},
            self._on_pod,
        )
        self._spawn(self._poll)

    def _spawn(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, name="e2e-watcher", daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)

    def _follow(self, list_fn, args: tuple, kwargs: dict, handle) -> None:
        """Every state of the listed objects: a watch, renewed from where the last one ended."""
        from kubernetes import watch

        version = None
        while not self._stop.is_set():
            stream = watch.Watch()
            since = {"resource_version": version} if version else {}
            try:
                for event in stream.stream(list_fn, *args, timeout_seconds=3, **kwargs, **since):
                    body = event["raw_object"]
                    if event["type"] == "ERROR":  # 410 Gone: too old; list afresh
                        version = None
                        break
                    version = body["metadata"]["resourceVersion"]
                    handle(body)
                    if self._stop.is_set():
                        break
            except Exception as err:  # an API hiccup: watch again
                self.timeline.add("watcher", f"watch failed: {str(err).splitlines()[0]}")
                version = None
                self._stop.wait(0.5)
            finally:
                stream.stop()

    def _poll(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self._look_at_jobs()
                self._look_at_operator()
            except Exception as err:  # an API hiccup: look again next time
                self.timeline.add("watcher", f"could not look: {str(err).splitlines()[0]}")

    def _on_experiment(self, experiment: dict[str, Any]) -> None:
        status = experiment.get("status") or {}
        phase = status.get("phase")
        if phase and (not self.phases or self.phases[-1] != phase):
            self.phases.append(phase)
            self.timeline.add(f"phase {phase}", _phase_detail(status))
        progress = status.get("progress") or {}
        if "generation" in progress:
            seen = (progress["generation"], progress.get("bestFitness"))
            if not self.progress or self.progress[-1] != seen:
                self.progress.append(seen)
                header, row = self.stack.get_row(self.namespace, self.name)
                self.tables.append((header, row))
                self.timeline.add("kubectl get erlx", row)

    def _look_at_jobs(self) -> None:
        for kind, name, uid in gang_objects(self.stack, self.namespace, self.name):
            uids = self.jobs.setdefault(name, set())
            if uid not in uids:
                uids.add(uid)
                self.timeline.add(f"{kind} created", f"{name} (uid {uid[:8]})")

    def _on_pod(self, pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        state = _container_state(pod)
        key = (pod["status"].get("phase"), next(iter(state), None))
        if self._pods.get(name) == key:
            return
        self._pods[name] = key
        index = int(pod["metadata"]["annotations"][COMPLETION_INDEX])
        if "running" in state:
            process = local_process(pod) or {}
            self.timeline.add(
                "pod running",
                f"{name}: host {index} on {pod['spec']['nodeName']}, pid {process.get('pid')}",
            )
        elif "terminated" in state:
            code = state["terminated"]["exitCode"]
            disrupted = _disruption(pod)
            why = f", {disrupted}" if disrupted else ""
            self.timeline.add(
                f"pod {pod['status']['phase']}", f"{name}: host {index}, exit code {code}{why}"
            )

    def _look_at_operator(self) -> None:
        pod = self.stack.operator_pod()
        if "running" not in _container_state(pod):
            return
        seen = (_container_restarts(pod), (local_process(pod) or {}).get("pid"))
        if self._operator is not None and seen != self._operator:
            self.timeline.add("operator restarted", f"container restart {seen[0]}, pid {seen[1]}")
        self._operator = seen


def gang_objects(stack: Stack, ns: str, name: str) -> list[tuple[str, str, str]]:
    """(kind, name, uid) of the experiment's Jobs and, with JobSet running, JobSets (a
    multislice gang's Job)."""
    selector = f"evokube.io/experiment={name}"
    jobs = stack.batch.list_namespaced_job(ns, label_selector=selector).items
    seen = [("Job", job.metadata.name, job.metadata.uid) for job in jobs]
    if stack.jobset is not None:
        jobsets = stack.custom.list_namespaced_custom_object(
            jobset.GROUP, jobset.VERSION, ns, jobset.PLURAL, label_selector=selector
        )["items"]
        seen += [("JobSet", j["metadata"]["name"], j["metadata"]["uid"]) for j in jobsets]
    return seen


def gang_object(stack: Stack, ns: str, job: str, slices: int) -> dict[str, Any]:
    """A gang attempt's Job, or with slices its JobSet, as the API server shows it."""
    if slices == 1:
        response = stack.batch.read_namespaced_job(job, ns, _preload_content=False)
        return json.loads(response.data)
    return stack.custom.get_namespaced_custom_object(
        jobset.GROUP, jobset.VERSION, ns, jobset.PLURAL, job
    )


def table_columns(header: str, row: str) -> dict[str, str]:
    """One row of a kubectl table as {column: cell}, cut where the header's columns start."""
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    ends = [*starts[1:], None]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, ends, strict=True)}


def _phase_detail(status: dict[str, Any]) -> str:
    counts = f"restarts {status.get('restarts', 0)}, preemptions {status.get('preemptions', 0)}"
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    phase = status.get("phase")
    if phase in ("Restarting", "Succeeded", "Failed"):
        condition = conditions.get(phase, {})
        message = (condition.get("message") or "").splitlines()[0][:120]
        return f"{condition.get('reason', '')}: {message} ({counts})"
    return f"Job {status.get('jobName', '-')} ({counts})"


def _container_state(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = pod.get("status", {}).get("containerStatuses") or [{}]
    return statuses[0].get("state") or {}


def _container_restarts(pod: dict[str, Any]) -> int:
    statuses = pod.get("status", {}).get("containerStatuses") or [{}]
    return statuses[0].get("restartCount", 0)


def _disruption(pod: dict[str, Any]) -> str | None:
    for condition in pod["status"].get("conditions") or []:
        if condition["type"] == "DisruptionTarget" and condition["status"] == "True":
            return f"DisruptionTarget ({condition.get('reason', '')})"
    return None


# -- what the scenarios share ------------------------------------------------------------------
@dataclass
class Report:
    """What one scenario measured; `timeline` says how it went."""

    timeline: Timeline
    watcher: Watcher
    status: dict[str, Any] = field(default_factory=dict)  # the final status
    target: float = 0.0
    interval: int = 0  # checkpoint.intervalGenerations
    disturbed_at: int = 0  # the generation the gang had reached when disturbed
    resumed_at: int = -1  # the generation the next attempt resumed from
    stopped: dict[str, str] = field(default_factory=dict)  # pod -> its "stopped at ..." line
    mid_run: dict[int, Samples] = field(default_factory=dict)  # host -> its /metrics
    operator_before: Samples = field(default_factory=dict)  # the operator's /metrics at start
    operator: Samples = field(default_factory=dict)  # and at the end
    events: list[str] = field(default_factory=list)  # the experiment's Event reasons
    # pod -> (exit code, DisruptionTarget), as the runner reported them
    endings: dict[str, tuple[int | None, bool]] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return str(self.timeline)


def experiment_document(**spec_changes: Any) -> dict[str, Any]:
    """experiment.yaml, with top-level spec fields merged (one level deep) from `spec_changes`
    (None drops a field, at either level)."""
    document = yaml.safe_load(EXPERIMENT.read_text())
    for key, value in spec_changes.items():
        old = document["spec"].get(key)
        if isinstance(old, dict) and isinstance(value, dict):
            value = {k: v for k, v in {**old, **value}.items() if v is not None}
        document["spec"][key] = value
    return document


def _wait(report: Report, what: str, predicate, timeout: float, interval: float = 0.2):
    """Wait for `predicate`; give up at once if the experiment failed. Errors show the timeline."""

    def done_or_failed():
        if report.watcher.phases and report.watcher.phases[-1] == "Failed":
            raise AssertionError(f"the experiment failed while waiting for {what}")
        return predicate()

    try:
        return wait_until(done_or_failed, timeout, what, interval=interval)
    except (TimeoutError, AssertionError) as err:
        logs = _trainer_log_tails(report.watcher)
        raise type(err)(f"{err}\n--- timeline ---\n{report.timeline}{logs}") from None


def _trainer_log_tails(watcher: Watcher, lines: int = 25) -> str:
    """The end of each trainer pod's log the runner kept, for a failing test to show why."""
    tails = []
    for local in watcher.stack.runner.pods.values():
        if local.namespace != watcher.namespace or not local.name.startswith(f"{watcher.name}-"):
            continue
        if local.log_path.exists():
            text = local.log_path.read_text(errors="replace").splitlines()[-lines:]
            tails.append(f"--- {local.name}: {local.log_path.name} ---\n" + "\n".join(text))
    return "".join(f"\n{tail}" for tail in tails)


def _running_gang(
    stack: Stack, ns: str, job: str, hosts: int, report: Report, slices: int = 1
) -> dict:
    """The running pods of `job` by host; of a multislice gang's JobSet by (slice, host)."""

    def gang():
        pods = stack.trainer_pods(ns, job) if slices == 1 else stack.slice_pods(ns, job)
        running = {
            i: p
            for i, p in pods.items()
            if "running" in _container_state(p) and local_process(p) is not None
        }
        return running if len(running) == slices * hosts else None

    return _wait(report, f"{slices * hosts} running pods of {job}", gang, 180)


def _generation(stack: Stack, pod: dict[str, Any]) -> int:
    """The generation a trainer pod's /metrics shows (0 before the first)."""
    samples = stack.scrape(pod)
    return int(max((v for (n, _), v in samples.items() if n == "evokube_generation"), default=0))


def _log_match(pod: dict[str, Any], pattern: re.Pattern) -> re.Match | None:
    process = local_process(pod)
    if process is None or not Path(process["log"]).exists():
        return None
    return pattern.search(Path(process["log"]).read_text(errors="replace"))


def _train_until(
    stack: Stack, ns: str, job: str, generation: int, report: Report, slices: int = 1
) -> dict:
    """Wait for the gang of `job` (2 hosts a slice) to reach `generation`; returns its pods
    by host (by (slice, host) with slices)."""
    pods = _running_gang(stack, ns, job, 2, report, slices)
    first = pods[min(pods)]  # process 0
    _wait(
        report,
        f"generation {generation} on /metrics of {job}",
        lambda: _generation(stack, first) >= generation,
        180,
        interval=0.05,  # a generation takes tens of milliseconds
    )
    return pods


def _finish(
    stack: Stack, ns: str, name: str, attempt_job: str, report: Report, slices: int = 1
) -> Report:
    """Wait for the next attempt to resume and the experiment to succeed; fill the report."""
    pods = _running_gang(stack, ns, attempt_job, 2, report, slices)
    match = _wait(
        report,
        f"{attempt_job} to resume from a checkpoint",
        lambda: _log_match(pods[min(pods)], RESUMED),
        120,
    )
    report.resumed_at = int(match.group(1))
    report.timeline.add(
        "resumed", f"{attempt_job} from the checkpoint of generation {report.resumed_at}"
    )
    _wait(
        report, f"{ns}/{name} to succeed", lambda: report.watcher.phases[-1:] == ["Succeeded"], 240
    )
    report.status = stack.status(ns, name)
    report.operator = stack.operator_samples()
    events = stack.core.list_namespaced_event(
        ns, field_selector=f"involvedObject.name={name},involvedObject.kind=ERLExperiment"
    ).items
    # resourceVersion orders them as they were created (timestamps have whole seconds).
    report.events = [
        e.reason for e in sorted(events, key=lambda e: int(e.metadata.resource_version))
    ]
    report.endings = stack.runner.endings(ns)
    return report


def _stopped_lines(stack: Stack, ns: str, job: str, report: Report) -> None:
    """Each pod's "stopped at generation G: why" line, from the logs the runner kept."""
    for local in stack.runner.pods.values():
        if local.namespace == ns and local.name.startswith(f"{job}-"):
            match = STOPPED.search(local.log_path.read_text(errors="replace"))
            if match:
                report.stopped[local.name] = match.group(0)


# -- the scenarios -----------------------------------------------------------------------------
# Generation at which a trainer is killed: after the checkpoint of 5, long before the
# target (generation 64). Checkpoints are written synchronously, so whenever the kill
# lands, the newest complete one is at most one interval behind.
KILL_AT = 7
# The evicted run's length: chunks of about a second each (no checkpoint ends them), so
# the SIGTERM has several seconds to land after the generation the eviction waits for.
EVICTED_RUN_GENERATIONS = 600


def _begin(stack: Stack, ns: str, timeline: Timeline, **spec_changes: Any) -> Report:
    """Apply experiment.yaml (changed by `spec_changes`, if any); the watcher starts first."""
    document = experiment_document(**spec_changes)
    name, spec = document["metadata"]["name"], document["spec"]
    report = Report(timeline, Watcher(stack, ns, name, timeline))
    report.target = spec["stopping"].get("targetFitness")
    report.interval = spec["checkpoint"]["intervalGenerations"]
    report.operator_before = stack.operator_samples()
    report.watcher.start()
    stack.apply(ns, document if spec_changes else None)
    changed = ", ".join(f"{k}: {v}" for k, v in spec_changes.items())
    timeline.add("kubectl apply", f"-n {ns} -f tests/e2e/experiment.yaml {changed}".rstrip())
    report.notes["uid"] = stack.experiment(ns, name)["metadata"]["uid"]
    return report


def killed_trainer(stack: Stack, ns: str, timeline: Timeline, **spec_changes: Any) -> Report:
    """SIGKILL one trainer mid-run: a counted gang restart that resumes from the checkpoint
    (in experiment.yaml's claim, or where `spec_changes` put it)."""
    report = _begin(stack, ns, timeline, **spec_changes)
    name = report.watcher.name
    try:
        pods = _train_until(stack, ns, f"{name}-0", KILL_AT, report)
        report.mid_run = {i: stack.scrape(p) for i, p in pods.items()}
        victim = pods[1]["metadata"]["name"]
        pid = stack.runner.kill(ns, victim, signal.SIGKILL)
        # The survivor cannot compute another generation without its peer.
        report.disturbed_at = _generation(stack, pods[0]) or _generation_of(report.mid_run[0])
        timeline.add("SIGKILL", f"pid {pid} (host 1, {victim}) at generation {report.disturbed_at}")
        return _finish(stack, ns, name, f"{name}-1", report)
    finally:
        report.watcher.stop()


def evicted_trainer(stack: Stack, ns: str, timeline: Timeline) -> Report:
    """Evict one trainer pod: the gang checkpoints on SIGTERM; the restart is not counted."""
    from kubernetes import client

    # No periodic checkpoint (the resume point must be the SIGTERM one), so a chunk runs
    # about a second of generations: a run that stops at its target (generation 64) could
    # finish in the chunk after the one the eviction waits for, before the SIGTERM lands.
    # It runs to maxGenerations instead, several chunks past the eviction, and its best
    # fitness passes the usual target on the way.
    report = _begin(
        stack,
        ns,
        timeline,
        maxRestarts=0,
        checkpoint={"intervalGenerations": 1000},
        stopping={"targetFitness": None, "maxGenerations": EVICTED_RUN_GENERATIONS},
    )
    report.target = yaml.safe_load(EXPERIMENT.read_text())["spec"]["stopping"]["targetFitness"]
    name = report.watcher.name
    try:
        pods = _train_until(stack, ns, f"{name}-0", 8, report)
        victim = pods[1]["metadata"]["name"]
        report.disturbed_at = _generation(stack, pods[0])
        eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=victim, namespace=ns))
        stack.core.create_namespaced_pod_eviction(victim, ns, eviction)
        timeline.add("evicted", f"{victim} (host 1) through the Eviction API")
        _finish(stack, ns, name, f"{name}-1", report)
        _stopped_lines(stack, ns, f"{name}-0", report)
        return report
    finally:
        report.watcher.stop()


def killed_operator(stack: Stack, ns: str, timeline: Timeline) -> Report:
    """Kill the operator between writing a restart into status and creating the new Job."""
    report = _begin(stack, ns, timeline)
    name = report.watcher.name
    next_job = f"{name}-1"
    try:
        pods = _train_until(stack, ns, f"{name}-0", KILL_AT, report)
        hold = JobHold(stack, ns, next_job)
        hold.install()
        timeline.add("hold", f"a ResourceQuota of no Jobs refuses Job {next_job} for now")
        victim = pods[0]["metadata"]["name"]
        report.disturbed_at = _generation(stack, pods[1])
        pid = stack.runner.kill(ns, victim, signal.SIGKILL)
        timeline.add("SIGKILL", f"pid {pid} (host 0, {victim}) at generation {report.disturbed_at}")

        def restart_half_done():
            status = stack.status(ns, name)
            blocked = [c for c in status.get("conditions", []) if c["type"] == "Blocked"]
            return status.get("restarts") == 1 and [
                (c["status"], c["reason"]) for c in blocked
            ] == [("True", "CreationFailing")]

        _wait(report, f"the operator to be refused Job {next_job}", restart_half_done, 120)
        report.notes["status_at_crash"] = stack.status(ns, name)
        report.notes["jobs_at_crash"] = sorted(
            j.metadata.name
            for j in stack.batch.list_namespaced_job(ns).items
            if not j.metadata.deletion_timestamp
        )
        operator = stack.operator_pod()
        pid = stack.runner.kill(RELEASE_NAMESPACE, operator["metadata"]["name"], signal.SIGKILL)
        timeline.add(
            "SIGKILL operator", f"pid {pid}: attempt 1 is Blocked, its Job {next_job} refused"
        )
        hold.remove()
        timeline.add("hold removed", f"Job {next_job} may be created")
        _finish(stack, ns, name, next_job, report)
        report.notes["operator_restarts"] = _container_restarts(stack.operator_pod())
        return report
    finally:
        report.watcher.stop()


def _generation_of(samples: Samples) -> int:
    return int(max((v for (n, _), v in samples.items() if n == "evokube_generation"), default=0))


class JobHold:
    """A ResourceQuota of no Jobs in the namespace: creating any Job is refused (403, "exceeded
    quota"), which the operator treats as a refusal that may pass and retries
    (policies/refusal.py), until the quota is removed. Jobs that exist stay."""

    def __init__(self, stack: Stack, namespace: str, job: str):
        self.stack, self.namespace, self.job = stack, namespace, job
        self.name = "e2e-hold"

    def install(self) -> None:
        quota = {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {"hard": {"count/jobs.batch": "0"}},
        }
        self.stack.cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(quota))
        wait_until(self._refused, 30, f"the hold on Job {self.job} to take effect")

    def _refused(self) -> bool:
        run = self.stack.cluster.kubectl(
            "create", "job", self.job, "--image=x", "-n", self.namespace, "--dry-run=server",
            check=False,
        )  # fmt: skip
        return run.returncode != 0 and "quota" in run.stderr

    def remove(self) -> None:
        self.stack.cluster.kubectl("delete", "resourcequota", self.name, "-n", self.namespace)
        wait_until(lambda: not self._refused(), 30, f"the hold on Job {self.job} to go")


def killed_trainer_in_a_bucket(
    stack: Stack, ns: str, timeline: Timeline, emulator: Emulator | None = None
) -> Report:
    """SIGKILL one trainer of a gang that checkpoints to a bucket (fake-gcs-server unless
    `emulator` is given): no claim, no shared disk; the fresh pods resume from the bucket."""
    own = emulator is None
    if emulator is None:
        emulator = start_fake_gcs(stack.workdir / f"fake-gcs-{ns}.log")
    try:
        emulator.filesystem().mkdir("e2e-checkpoints")
        location = emulator.url("e2e-checkpoints", ns, "cartpole")
        timeline.add("bucket", f"{location} on {emulator.endpoint}")
        return killed_trainer(
            stack,
            ns,
            timeline,
            checkpoint={"location": location, "volumeClaimName": None},
            env=[{"name": key, "value": value} for key, value in emulator.env.items()],
        )
    finally:
        if own:
            emulator.stop()


# -- a multislice gang on JobSet ---------------------------------------------------------------
SLICES = 2
TPU_POOLS = ("slice-a", "slice-b")  # the runner's TPU node pools (Stack.add_tpu_slices)


def multislice_spec() -> dict[str, Any]:
    """experiment.yaml's spec changes for SLICES v5e slices of 2 hosts (the runner's TPU
    pools, none of kwok's)."""
    accelerator = {
        "type": "tpu",
        "hosts": None,
        "devicesPerHost": None,
        "tpu": {
            "type": TPU_TYPE,
            "topology": TPU_TOPOLOGY,
            "chipsPerHost": TPU_CHIPS,
            "slices": SLICES,
        },
    }
    # The population is sharded over every chip of every slice (2 x 8). Twice experiment.yaml's
    # population reaches the target by generation 10 at its learning rate, in about a second:
    # a fifth of it keeps the run going past KILL_AT for tens of generations.
    return {
        "accelerator": accelerator,
        "population": {"size": 16},
        "algorithm": {"name": "openes", "ec": {"noiseStd": 0.1, "learningRate": 0.01}},
        "nodeSelector": None,
    }


def _tpu_slices(stack: Stack, timeline: Timeline) -> None:
    """The runner's TPU_POOLS, added on first use."""
    if not stack.tpu_pools:
        stack.add_tpu_slices(TPU_POOLS, hosts=2)
        timeline.add("tpu pools", f"{TPU_POOLS}, 2 hosts each, run by the pod runner")


def _slice_facts(stack: Stack, ns: str, pods: dict) -> dict[tuple[int, int], dict[str, Any]]:
    """Each running pod's environment as its process got it, and its node's pool."""
    by_uid = {local.uid: local for local in stack.runner.pods.values()}
    facts = {}
    for key, pod in pods.items():
        node = stack.core.read_node(pod["spec"]["nodeName"])
        facts[key] = {
            "env": by_uid[pod["metadata"]["uid"]].env,
            "pool": node.metadata.labels["cloud.google.com/gke-nodepool"],
            "name": pod["metadata"]["name"],
        }
    return facts


def multislice_killed_trainer(stack: Stack, ns: str, timeline: Timeline) -> Report:
    """A 2-slice x 2-host gang as one JobSet; SIGKILL a host of slice 1 mid-run: the JobSet
    fails as a whole, the operator starts the next attempt's JobSet, which resumes from the
    checkpoint."""
    _tpu_slices(stack, timeline)
    report = _begin(stack, ns, timeline, **multislice_spec())
    name = report.watcher.name
    try:
        pods = _train_until(stack, ns, f"{name}-0", KILL_AT, report, SLICES)
        report.notes["gang"] = _slice_facts(stack, ns, pods)
        report.mid_run = {2 * s + h: stack.scrape(p) for (s, h), p in pods.items()}
        victim = pods[(1, 1)]["metadata"]["name"]
        pid = stack.runner.kill(ns, victim, signal.SIGKILL)
        report.disturbed_at = _generation(stack, pods[(0, 0)]) or _generation_of(report.mid_run[0])
        timeline.add(
            "SIGKILL", f"pid {pid} (slice 1 host 1, {victim}) at generation {report.disturbed_at}"
        )
        _finish(stack, ns, name, f"{name}-1", report, SLICES)
        report.notes["resumed_gang"] = _slice_facts(stack, ns, stack.slice_pods(ns, f"{name}-1"))
        return report
    finally:
        report.watcher.stop()


# -- Kueue preempts a running gang ----------------------------------------------------------------
QUEUE, CLUSTER_QUEUE, FLAVOR = "gangs", "e2e-gangs", "e2e-local"
LOW, HIGH = "e2e-low", "e2e-high"  # WorkloadPriorityClasses
SPRINT = "sprint"  # the high-priority experiment
# The low-priority run must still be training when Kueue's preemption reaches its pods, which
# takes seconds (more on a loaded machine) while a generation takes tens of milliseconds: it
# runs to a fixed generation (its target is out of CartPole's reach), far past KILL_AT.
LOW_RUN = {"targetFitness": 1000.0, "maxGenerations": 400}
ONE_CPU_EACH = {"requests": {"cpu": "1"}}  # what Kueue counts: a 2-host gang is 2 CPUs


class _Tagged:
    """A timeline that tags another watcher's lines (two experiments share one timeline)."""

    def __init__(self, timeline: Timeline, tag: str):
        self.timeline, self.tag = timeline, tag

    def add(self, what: str, detail: str = "") -> None:
        self.timeline.add(what, f"[{self.tag}] {detail}")


def _kueue_objects(stack: Stack, ns: str, slices: int = 1) -> list[tuple[str, str]]:
    """A flavor for the runner's nodes (its TPU pools with slices), a ClusterQueue with quota
    for one gang (2 hosts, of 1 CPU or a slice's chips each) that preempts lower priorities,
    a LocalQueue in `ns`, two WorkloadPriorityClasses.
    Returns the cluster-scoped ones as (plural, name), to delete in reverse."""
    from tests.cluster.kueue import API_VERSION
    from tests.kueue import helpers

    runner = stack.runner
    nodes, quota = runner.node_selector, {"cpu": 2}
    if slices > 1:
        nodes = {TPU_ACCELERATOR_SELECTOR: TPU_TYPE, TPU_TOPOLOGY_SELECTOR: TPU_TOPOLOGY}
        quota = {TPU_RESOURCE: slices * 2 * TPU_CHIPS}
    flavor = {
        "apiVersion": API_VERSION,
        "kind": "ResourceFlavor",
        "metadata": {"name": FLAVOR},
        # Kueue adds these to an admitted Job's pods (the experiment has them already).
        "spec": {
            "nodeLabels": nodes,
            "tolerations": [
                {**t, "value": "true", "operator": "Equal"} for t in runner.tolerations
            ],
        },
    }
    made = []
    for plural, body in (
        ("resourceflavors", flavor),
        ("workloadpriorityclasses", _priority_class(LOW, 10)),
        ("workloadpriorityclasses", _priority_class(HIGH, 1000)),
        (
            "clusterqueues",
            helpers.cluster_queue(
                CLUSTER_QUEUE,
                {FLAVOR: quota},
                preemption={"withinClusterQueue": "LowerPriority"},
            ),
        ),
    ):
        helpers.delete_cluster_object(stack.api, plural, body["metadata"]["name"])  # a rerun
        helpers._create(stack.api, plural, body)
        made.append((plural, body["metadata"]["name"]))
    helpers.create_local_queue(stack.api, ns, QUEUE, CLUSTER_QUEUE)
    wait_until(
        lambda: helpers.is_true(helpers.get(stack.api, "clusterqueues", CLUSTER_QUEUE), "Active"),
        30,
        f"ClusterQueue {CLUSTER_QUEUE} to be active",
    )
    return made


def _priority_class(name: str, value: int) -> dict[str, Any]:
    from tests.cluster.kueue import API_VERSION

    return {
        "apiVersion": API_VERSION,
        "kind": "WorkloadPriorityClass",
        "metadata": {"name": name},
        "value": value,
    }


def kueue_preemption(
    stack: Stack, ns: str, timeline: Timeline, kueue_runner: Any = None, slices: int = 1
) -> Report:
    """Under Kueue, a high-priority experiment preempts the running gang of a low-priority one:
    the gang checkpoints on SIGTERM, waits in Queued on its suspended Job, and resumes on the
    same Job from that checkpoint once the high-priority one has finished. With `slices`,
    both are multislice experiments: JobSets that Kueue admits, each as one Workload."""
    from tests.cluster.kueue import KueueRunner, KueueSettings
    from tests.kueue import helpers

    if slices > 1:
        _tpu_slices(stack, timeline)
    gang = multislice_spec() if slices > 1 else {"resources": ONE_CPU_EACH}

    own = kueue_runner is None
    runner = KueueRunner(stack.cluster) if own else kueue_runner
    made: list[tuple[str, str]] = []
    report: Report | None = None
    sprint: Watcher | None = None
    try:
        began = time.monotonic()
        frameworks = ("batch/job", "jobset.x-k8s.io/jobset") if slices > 1 else ("batch/job",)
        kueue = runner.ensure(KueueSettings(frameworks=frameworks))
        timeline.add(
            "kueue", f"v0.17.0 manager pid {kueue.process.pid}, in {kueue.started_in:.0f}s"
        )
        made = _kueue_objects(stack, ns, slices)
        timeline.add(
            "kueue objects",
            f"ClusterQueue {CLUSTER_QUEUE} (one gang on flavor {FLAVOR}, withinClusterQueue: "
            f"LowerPriority), LocalQueue {ns}/{QUEUE}, priorities {LOW}=10 {HIGH}=1000",
        )
        report = _begin(
            stack,
            ns,
            timeline,
            queueName=QUEUE,
            workloadPriorityClassName=LOW,
            stopping=LOW_RUN,
            **gang,
        )
        report.notes["kueue_setup_s"] = time.monotonic() - began
        name, job = report.watcher.name, f"{report.watcher.name}-0"
        pods = _train_until(stack, ns, job, KILL_AT, report, slices)
        report.notes["workloads"] = [
            w["metadata"]["name"] for w in helpers.workloads(stack.api, ns)
        ]
        report.mid_run = {i: stack.scrape(p) for i, p in pods.items()}
        report.notes["low_pods"] = sorted(p["metadata"]["name"] for p in pods.values())

        # The high-priority one: a few generations, checkpoints on a claim of its own.
        stack.runner.provision_claim(ns, f"{SPRINT}-checkpoints")
        document = experiment_document(
            queueName=QUEUE,
            workloadPriorityClassName=HIGH,
            stopping={"maxGenerations": 10},
            checkpoint={"volumeClaimName": f"{SPRINT}-checkpoints"},
            **gang,
        )
        document["metadata"]["name"] = SPRINT
        sprint = Watcher(stack, ns, SPRINT, _Tagged(timeline, SPRINT))
        sprint.start()
        report.disturbed_at = _generation(stack, pods[min(pods)])
        stack.apply(ns, document)
        preempted_at = time.monotonic()
        timeline.add(
            "kubectl apply",
            f"-n {ns} {SPRINT}: priority {HIGH}, maxGenerations 10 "
            f"({name} at generation {report.disturbed_at})",
        )

        # Kueue evicts the low gang: its Job is suspended, its pods deleted; they checkpoint.
        def preempted():
            status = stack.status(ns, name)
            return status if status.get("preemptions") == 1 else None

        report.notes["preempted_status"] = _wait(report, f"Kueue to preempt {name}", preempted, 120)
        ended = lambda: all(
            stack.runner.endings(ns).get(p, (None,))[0] is not None
            for p in report.notes["low_pods"]
        )
        _wait(report, f"the pods of {job} to end", ended, 120)
        report.notes["preempted_endings"] = {
            p: stack.runner.endings(ns)[p] for p in report.notes["low_pods"]
        }
        _stopped_lines(stack, ns, job, report)
        stopped = {int(line.split()[3].rstrip(":")) for line in report.stopped.values()}
        timeline.add("checkpointed", "; ".join(sorted(report.stopped.values())))

        def saved():
            status = stack.status(ns, name)
            last = (status.get("progress") or {}).get("lastCheckpoint")
            return status if stopped and last == max(stopped) else None

        # The trainer's last progress patch (on its way out) names the SIGTERM checkpoint.
        with _quiet(report):
            report.notes["queued_status"] = _wait(report, "lastCheckpoint", saved, 30)
        report.notes["job_suspended"] = gang_object(stack, ns, job, slices)["spec"]["suspend"]
        report.notes["queued_condition"] = {
            c["type"]: c for c in stack.status(ns, name).get("conditions") or []
        }.get("Queued")

        # The high-priority one runs to Succeeded; then Kueue admits the low one's Job again.
        _wait(report, f"{SPRINT} to succeed", lambda: sprint.phases[-1:] == ["Succeeded"], 240)
        report.notes["sprint_status"] = stack.status(ns, SPRINT)
        report.notes["sprint_phases"] = list(sprint.phases)
        report.notes["sprint_admission"] = _admission_times(stack, ns, f"{SPRINT}-0", slices)
        timeline.add("admission", f"[{SPRINT}] {report.notes['sprint_admission']}")
        report.notes["queued_s"] = time.monotonic() - preempted_at
        _finish(stack, ns, name, job, report, slices)
        report.notes["admission"] = _admission_times(stack, ns, job, slices)
        timeline.add("admission", str(report.notes["admission"]))
        report.notes["jobs"] = sorted(n for _, n, _ in gang_objects(stack, ns, name))
        return report
    finally:
        if report is not None:
            report.watcher.stop()
        if sprint is not None:
            sprint.stop()
        for plural, obj in reversed(made):
            helpers.delete_cluster_object(stack.api, plural, obj)
        if own:
            runner.stop()  # webhooks first: nothing else on this cluster waits for Kueue


def multislice_kueue_preemption(stack: Stack, ns: str, timeline: Timeline) -> Report:
    """kueue_preemption with two multislice experiments: Kueue admits, preempts and resumes
    each JobSet as one Workload."""
    return kueue_preemption(stack, ns, timeline, slices=SLICES)


def _admission_times(stack: Stack, ns: str, job: str, slices: int = 1) -> dict[str, str]:
    """When the Job (JobSet) was last unsuspended (its Suspended=False condition, written by
    its controller) and when its current pods were created: the operator counts only the
    pods created at or after the former as the gang."""
    conditions = (gang_object(stack, ns, job, slices).get("status") or {}).get("conditions")
    resumed = next(
        (c for c in conditions or [] if c["type"] == "Suspended" and c["status"] == "False"),
        None,
    )
    times = {"resumed": resumed["lastTransitionTime"] if resumed else "-"}
    pods = stack.trainer_pods(ns, job) if slices == 1 else stack.slice_pods(ns, job)
    for index, pod in sorted(pods.items()):
        times[f"pod {index}"] = pod["metadata"]["creationTimestamp"]
    return times


class _quiet:
    """Within: a timeout of `_wait` is recorded in the report's notes, not raised."""

    def __init__(self, report: Report):
        self.report = report

    def __enter__(self):
        return self

    def __exit__(self, kind, err, tb):
        if kind is TimeoutError:
            self.report.notes["timed_out"] = str(err).splitlines()[0]
            return True
        return False


SCENARIOS = {
    "killed-trainer": killed_trainer,
    "killed-trainer-gs": killed_trainer_in_a_bucket,
    "evicted-trainer": evicted_trainer,
    "killed-operator": killed_operator,
    "kueue-preemption": kueue_preemption,
    "multislice-killed-trainer": multislice_killed_trainer,
    "multislice-kueue-preemption": multislice_kueue_preemption,
}
