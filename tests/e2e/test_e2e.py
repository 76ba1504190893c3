"""End to end: `helm install`, `kubectl apply`, real trainers, and things going wrong.

The chart's operator and every trainer pod run as local processes on the pod
runner's pool (tests/e2e/podrunner.py); the two trainer processes of a gang form
one jax.distributed group. Each test runs one scenario of tests/e2e/scenarios.py
to Succeeded and checks what it measured; a failing assertion prints the
scenario's timeline.
"""

import numpy as np
import pytest

from evokube_trainer.policies import evaluate_policy, read_policy
from tests.e2e import scenarios
from tests.e2e.scenarios import KILL_AT, Report, Timeline, table_columns
from tests.objectstore.emulators import start_moto

pytestmark = pytest.mark.cluster

NAME = "cartpole"
PHASES = ["Pending", "Running", "Restarting", "Running", "Succeeded"]


def check_success(report: Report, location: str = "/checkpoints") -> dict:
    """Succeeded, with progress and conditions that agree; returns the status."""
    status = report.status
    assert status["phase"] == "Succeeded", report
    # Every phase the experiment went through, as a watch saw them.
    assert report.watcher.phases == PHASES, report
    assert status["hosts"] == 2 and status["completionTime"], report
    assert status["checkpointLocation"] == location
    progress = status["progress"]
    assert progress["bestFitness"] >= report.target, report
    assert progress["lastCheckpoint"] == progress["generation"], report  # saved on the way out
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["Succeeded"]["status"], conditions["Succeeded"]["reason"]) == (
        "True",
        "Completed",
    )
    assert conditions["Running"]["status"] == conditions["Restarting"]["status"] == "False"
    assert "Failed" not in conditions
    assert report.events.count("JobCreated") == 2, report.events
    assert report.events[0] == "JobCreated" and report.events[-1] == "Completed", report.events
    return status


def check_progress_rose(report: Report) -> None:
    """`kubectl get erlx` showed the generation and the best fitness rising to the end."""
    rows = [table_columns(h, r) for h, r in report.watcher.tables]
    # Process 0 patches progress at most every 5 s: the resumed attempt alone gives two rows.
    assert len(rows) >= 2, report
    generations = [int(r["GENERATION"]) for r in rows]
    best = [float(r["BEST"]) for r in rows]
    assert generations[-1] == report.status["progress"]["generation"], report
    assert generations[0] < generations[-1] and best[0] < best[-1], report
    assert best[-1] >= report.target, report


def check_policy(stack, namespace: str, report: Report, location: str) -> None:
    """status.result names the best policy, which `kubectl get erlx -o wide` shows; its
    folder (under the checkpoint `location`, a claim's folder or a bucket URL) loads with
    read_policy alone and plays CartPole."""
    result = report.status["result"]
    assert result["policyURI"] == f"{location}/policies/best", report
    assert 0 < result["generation"] <= report.status["progress"]["generation"], report
    wide = table_columns(*stack.get_row(namespace, NAME, "-o", "wide"))
    assert wide["POLICY"] == result["policyURI"], wide
    assert int(wide["BEST-GENERATION"]) == result["generation"], wide
    policy = read_policy(result["policyURI"])
    assert policy.metadata["evalReturn"] == result["bestReturn"], policy.metadata
    assert policy.metadata["generation"] == result["generation"], policy.metadata
    returns = evaluate_policy(policy, episodes=8)  # CartPole: 1 a step, at most 200 (episodeLength)
    assert np.all((returns >= 1) & (returns <= 200)), returns
    # A random policy scores about 20; the exported one plays like its evaluation did.
    assert returns.mean() >= result["bestReturn"] / 2, (returns, result)


def check_one_job_per_attempt(report: Report, attempts: int) -> None:
    assert report.watcher.jobs.keys() == {f"{NAME}-{a}" for a in range(attempts)}, report
    assert all(len(uids) == 1 for uids in report.watcher.jobs.values()), report.watcher.jobs


def counter_delta(report: Report, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return report.operator.get(key, 0.0) - report.operator_before.get(key, 0.0)


def test_a_killed_trainer_restarts_the_gang_from_its_checkpoint_to_the_target(stack, e2e_namespace):
    report = scenarios.killed_trainer(stack, e2e_namespace, Timeline())

    status = check_success(report)
    assert (status["restarts"], status.get("preemptions", 0)) == (1, 0), report
    assert status["jobName"] == f"{NAME}-1"
    check_progress_rose(report)
    # A real pod reports /checkpoints/policies/best; the pod runner hands the trainer the
    # claim's folder instead of the mount path /checkpoints (tests/e2e/podrunner.py).
    check_policy(stack, e2e_namespace, report, str(stack.claims[e2e_namespace]))
    check_one_job_per_attempt(report, 2)
    # The SIGKILLed process's pod failed with 137, which the operator retries (counted).
    assert report.endings[_pod(report, 0, 1)] == (137, False), report.endings
    assert "RetriableFailure" in report.events
    # Resumed from the newest periodic checkpoint: at most one interval is computed again.
    assert report.disturbed_at >= KILL_AT
    assert report.resumed_at > 0 and report.resumed_at % report.interval == 0, report
    assert 0 <= report.disturbed_at - report.resumed_at <= report.interval, report
    # Both hosts served their metrics mid-run, as one group of two processes.
    for host, samples in report.mid_run.items():
        labels = (("experiment", NAME), ("namespace", e2e_namespace), ("process", str(host)))
        assert samples[("evokube_generation", labels)] >= KILL_AT
        assert samples[("evokube_env_steps_total", labels)] > 0
        assert samples[("evokube_checkpoint_last_success_timestamp_seconds", labels)] > 0
        run_info = [dict(k[1]) for k in samples if k[0] == "evokube_run_info"]
        assert run_info[0]["processes"] == "2" and run_info[0]["devices"] == "2"
    assert counter_delta(report, "evokube_operator_gang_restarts_total", kind="counted") == 1


# s3:// only here (CI time: a gs:// case took 156 s): gs:// checkpoints, resumes and errors
# are covered with real trainer processes by tests/objectstore/test_objectstore.py.
@pytest.fixture(scope="module")
def bucket_emulator(tmp_path_factory):
    emulator = start_moto(tmp_path_factory.mktemp("s3") / "server.log")
    yield emulator
    emulator.stop()


def test_a_killed_trainer_resumes_from_a_bucket_on_fresh_pods(
    stack, e2e_namespace, bucket_emulator, monkeypatch
):
    """No claim, no shared disk: the new gang's pods find the checkpoints in the bucket
    (moto for s3://; the pods reach it through spec.env), and the best policy they exported
    there loads from its s3:// URI."""
    emulator = bucket_emulator
    report = scenarios.killed_trainer_in_a_bucket(stack, e2e_namespace, Timeline(), emulator)
    fs, location = emulator.filesystem(), emulator.url("e2e-checkpoints", e2e_namespace, NAME)

    status = check_success(report, location)
    assert status["restarts"] == 1, report
    conditions = {c["type"] for c in status["conditions"]}
    assert "CheckpointsEphemeral" not in conditions
    assert report.resumed_at > 0 and report.resumed_at % report.interval == 0, report
    assert 0 <= report.disturbed_at - report.resumed_at <= report.interval, report
    steps = {
        p.rsplit("/", 1)[1] for p in fs.ls(f"e2e-checkpoints/{e2e_namespace}/{NAME}/checkpoints")
    }
    assert str(status["progress"]["lastCheckpoint"]) in steps, steps
    assert fs.find(f"e2e-checkpoints/{e2e_namespace}/{NAME}/xla-cache")
    # As a laptop would read it: the emulator's settings in the environment, and no client
    # cached by earlier tests that pointed elsewhere.
    for variable, value in emulator.env.items():
        monkeypatch.setenv(variable, value)
    fs_class = type(fs)
    fs_class.clear_instance_cache()
    try:
        check_policy(stack, e2e_namespace, report, location)
    finally:
        fs_class.clear_instance_cache()


def test_an_evicted_trainer_checkpoints_on_sigterm_and_the_restart_is_not_counted(
    stack, e2e_namespace
):
    report = scenarios.evicted_trainer(stack, e2e_namespace, Timeline())

    status = check_success(report)
    # maxRestarts is 0: a counted restart would have failed the experiment.
    assert (status.get("restarts", 0), status["preemptions"]) == (0, 1), report
    assert "Preempted" in report.events
    check_one_job_per_attempt(report, 2)
    # The evicted host got SIGTERM; the gang agreed to stop, checkpointed, and both exited 75.
    assert report.endings[_pod(report, 0, 1)] == (75, True), report.endings
    assert report.endings[_pod(report, 0, 0)] == (75, False), report.endings
    # (Deleting the old Job signals the other host too, so which one names itself
    # the preempted one is a race; the generation they stopped at is not.)
    reasons = {line.split(": ", 1)[1] for line in report.stopped.values()}
    assert len(report.stopped) == 2, report.stopped
    assert reasons <= {"preempted (SIGTERM)", "a peer was preempted"}, report.stopped
    # No periodic checkpoint exists, so the resume point is the SIGTERM one: nothing lost.
    stopped_at = {int(line.split()[3].rstrip(":")) for line in report.stopped.values()}
    assert stopped_at == {report.resumed_at} and report.resumed_at >= report.disturbed_at
    assert counter_delta(report, "evokube_operator_gang_restarts_total", kind="preemption") == 1
    assert counter_delta(report, "evokube_operator_gang_restarts_total", kind="counted") == 0


def test_an_operator_killed_mid_restart_is_replaced_and_the_new_one_converges(stack, e2e_namespace):
    report = scenarios.killed_operator(stack, e2e_namespace, Timeline())

    # When the operator died, the restart was half done: status had counted the restart,
    # and the quota hold had refused attempt 1's Job (403, which may pass: Blocked, retried).
    at_crash = report.notes["status_at_crash"]
    assert (at_crash["phase"], at_crash.get("jobName"), at_crash["restarts"]) == (
        "Restarting",
        None,
        1,
    )
    assert f"{NAME}-1" not in report.notes["jobs_at_crash"]
    # The chart's Deployment pod restarted the operator, which finished the restart
    # once, created the Job once and counted nothing twice.
    assert report.notes["operator_restarts"] >= 1
    status = check_success(report)
    assert (status["restarts"], status.get("preemptions", 0)) == (1, 0), report
    assert stack.experiment(e2e_namespace, NAME)["metadata"]["uid"] == report.notes["uid"]
    check_one_job_per_attempt(report, 2)
    created = report.operator[
        (
            "evokube_operator_api_requests_total",
            (("code", "201"), ("kind", "Job"), ("verb", "POST")),
        )
    ]
    # By the new operator process, whose counters start at 0: the dry run that found the
    # hold lifted while Blocked (201, nothing written), then the one real create (the
    # watcher above saw a single Job, with a single uid, per attempt).
    assert created == 2, report
    assert 0 <= report.disturbed_at - report.resumed_at <= report.interval, report


def _pod(report: Report, attempt: int, host: int) -> str:
    """The name of the pod of `host` in `attempt`."""
    for name in report.endings:
        if name.startswith(f"{NAME}-{attempt}-{host}-"):
            return name
    raise AssertionError(f"no pod of host {host} in attempt {attempt}\n{report}")


def test_kueue_preempts_a_running_gang_which_resumes_on_its_job_from_the_sigterm_checkpoint(
    stack, e2e_namespace
):
    """The real Kueue (tests/cluster/kueue.py) on this stack's cluster, started and stopped
    by the scenario: one ClusterQueue with quota for one 2-host gang, preemption of lower
    priorities."""
    report = scenarios.kueue_preemption(stack, e2e_namespace, Timeline())
    check_kueue_preemption(report, pods=2)


def check_kueue_preemption(report: Report, pods: int) -> None:
    """Preempted as a whole into Queued on its suspended gang, checkpointed by all `pods`
    trainers on SIGTERM; the high-priority experiment ran; re-admitted on the same Job
    (JobSet), resumed from that checkpoint and succeeded."""
    notes = report.notes

    # Preempted: counted as a preemption, not a restart; the same Job and attempt, Queued.
    at = notes["preempted_status"]
    assert at["phase"] == "Queued", report
    assert (at.get("restarts", 0), at["preemptions"], at["attempt"]) == (0, 1, 0), report
    assert at["jobName"] == f"{NAME}-0", report
    assert notes["job_suspended"] is True
    assert notes["queued_condition"]["status"] == "True", notes["queued_condition"]
    # Every trainer got SIGTERM (the Job's pods deleted), checkpointed at one generation, exit 75.
    assert {code for code, _ in notes["preempted_endings"].values()} == {75}, notes
    reasons = {line.split(": ", 1)[1] for line in report.stopped.values()}
    assert len(report.stopped) == pods, report.stopped
    assert reasons <= {"preempted (SIGTERM)", "a peer was preempted"}, report.stopped
    (stopped_at,) = {int(line.split()[3].rstrip(":")) for line in report.stopped.values()}
    assert stopped_at >= report.disturbed_at >= KILL_AT, report
    assert "timed_out" not in notes, notes.get("timed_out")
    assert notes["queued_status"]["progress"]["lastCheckpoint"] == stopped_at, report

    # The high-priority one ran in the freed quota and succeeded.
    sprint = notes["sprint_status"]
    assert sprint["phase"] == "Succeeded" and sprint["progress"]["generation"] == 10, sprint
    assert (sprint.get("restarts", 0), sprint.get("preemptions", 0)) == (0, 0), sprint
    # Its gang's pods may look a second older than its admission; they count all the same.
    assert notes["sprint_phases"][-2:] == ["Running", "Succeeded"], notes["sprint_phases"]

    # Re-admitted on the same Job: resumed exactly at the SIGTERM checkpoint, then succeeded.
    assert report.resumed_at == stopped_at, report
    status = report.status
    assert status["phase"] == "Succeeded", report
    assert (status.get("restarts", 0), status["preemptions"], status["attempt"]) == (0, 1, 0)
    assert status["jobName"] == f"{NAME}-0" and notes["jobs"] == [f"{NAME}-0"], report
    assert report.watcher.jobs.keys() == {f"{NAME}-0"}, report
    assert all(len(uids) == 1 for uids in report.watcher.jobs.values()), report.watcher.jobs
    assert status["progress"]["generation"] == scenarios.LOW_RUN["maxGenerations"], report
    phases = report.watcher.phases
    assert "Restarting" not in phases and "Failed" not in phases, phases
    i = phases.index("Running")
    assert phases[i:] == ["Running", "Queued", "Running", "Succeeded"] or (
        phases[i : i + 2] == ["Running", "Queued"] and phases[-2:] == ["Running", "Succeeded"]
    ), phases
    assert "Evicted" in report.events and report.events.count("JobCreated") == 1, report.events
    assert counter_delta(report, "evokube_operator_gang_restarts_total", kind="preemption") == 1
    assert counter_delta(report, "evokube_operator_gang_restarts_total", kind="counted") == 0
