"""End to end, multislice: a 2-slice x 2-host TPU experiment runs as one JobSet.

The real JobSet controller (v0.11.1) runs on the stack's control plane, and the pod
runner plays kubelet for two TPU node pools of 2 hosts each (Stack.add_tpu_slices): the
scheduler and JobSet's exclusive-topology webhooks place the slices, the four trainer
processes form one jax.distributed group.
"""

import pytest

from evokube_contract import (
    ENV_COORDINATOR,
    ENV_MEGASCALE_COORDINATOR,
    ENV_MEGASCALE_NUM_SLICES,
    ENV_MEGASCALE_PORT,
    ENV_MEGASCALE_SLICE_ID,
    ENV_NUM_PROCESSES,
    ENV_PROCESS_ID,
    ENV_TPU_WORKER_HOSTNAMES,
    ENV_TPU_WORKER_ID,
)
from tests.e2e import scenarios
from tests.e2e.scenarios import KILL_AT, SLICES, TPU_POOLS, Timeline
from tests.e2e.test_e2e import (
    NAME,
    check_kueue_preemption,
    check_one_job_per_attempt,
    check_progress_rose,
    counter_delta,
)

pytestmark = pytest.mark.cluster


JOBSET = True  # conftest's stack starts JobSet's controller before the operator


def check_env(gang: dict, jobset: str) -> None:
    """Every pod's environment, as its process got it, per slice and host."""
    service = NAME
    for (s, h), facts in gang.items():
        env = facts["env"]
        assert facts["name"].startswith(f"{jobset}-slice-{s}-{h}-"), facts["name"]
        assert env[ENV_MEGASCALE_NUM_SLICES] == str(SLICES)
        assert env[ENV_MEGASCALE_SLICE_ID] == str(s)
        assert env[ENV_MEGASCALE_COORDINATOR] == f"{jobset}-slice-0-0.{service}"
        assert env[ENV_MEGASCALE_PORT] == "8477"
        assert env[ENV_NUM_PROCESSES] == "4"
        assert env[ENV_PROCESS_ID] == env[ENV_TPU_WORKER_ID] == str(h)
        assert env[ENV_TPU_WORKER_HOSTNAMES] == ",".join(
            f"{jobset}-slice-{s}-{i}.{service}" for i in range(2)
        )
        # host 0 of slice 0's coordinator port, which the runner stands in for on loopback
        assert env[ENV_COORDINATOR].startswith("127.0.0.1:")
    assert len({f["env"][ENV_COORDINATOR] for f in gang.values()}) == 1
    # Each slice one whole pool of its own, never split.
    pools = {s: {f["pool"] for (t, _), f in gang.items() if t == s} for s in range(SLICES)}
    assert all(len(p) == 1 for p in pools.values()), pools
    assert {p for (p,) in pools.values()} == set(TPU_POOLS), pools


def test_a_killed_host_restarts_the_whole_jobset_which_resumes_from_its_checkpoint(
    stack, e2e_namespace
):
    report = scenarios.multislice_killed_trainer(stack, e2e_namespace, Timeline())
    status = report.status

    assert status["phase"] == "Succeeded", report
    assert (status["hosts"], status["slices"]) == (4, 2), status
    assert (status["restarts"], status.get("preemptions", 0)) == (1, 0), report
    assert status["jobName"] == f"{NAME}-1"
    assert report.watcher.phases == ["Pending", "Running", "Restarting", "Running", "Succeeded"]
    progress = status["progress"]
    assert progress["bestFitness"] >= report.target, report
    assert progress["lastCheckpoint"] == progress["generation"], report
    check_progress_rose(report)
    check_env(report.notes["gang"], f"{NAME}-0")
    check_env(report.notes["resumed_gang"], f"{NAME}-1")
    # One JobSet per attempt: JobSet restarted nothing itself (failurePolicy.maxRestarts 0).
    check_one_job_per_attempt(report, 2)
    victim = report.notes["gang"][(1, 1)]["name"]
    assert report.endings[victim] == (137, False), report.endings
    assert "RetriableFailure" in report.events and report.events[-1] == "Completed"
    # Resumed from the newest periodic checkpoint: at most one interval is computed again.
    assert report.disturbed_at >= KILL_AT
    assert report.resumed_at > 0 and report.resumed_at % report.interval == 0, report
    assert 0 <= report.disturbed_at - report.resumed_at <= report.interval, report
    # All four processes served metrics mid-run as one group of four.
    for process, samples in report.mid_run.items():
        run_info = [dict(k[1]) for k in samples if k[0] == "evokube_run_info"]
        assert run_info and run_info[0]["processes"] == "4", (process, run_info)
    assert counter_delta(report, "evokube_operator_gang_restarts_total", kind="counted") == 1


def test_kueue_admits_preempts_and_resumes_a_multislice_gang_as_one_workload(stack, e2e_namespace):
    """The real Kueue with its JobSet integration on this stack's cluster: quota for one
    2 x 2 gang of TPU hosts; a high-priority multislice experiment preempts the running one."""
    report = scenarios.multislice_kueue_preemption(stack, e2e_namespace, Timeline())

    # While the low-priority gang ran: one Workload, for its JobSet (none per slice).
    (workload,) = report.notes["workloads"]
    assert workload.startswith(f"jobset-{NAME}-0-"), workload
    check_kueue_preemption(report, pods=SLICES * 2)
    assert report.status["slices"] == SLICES
