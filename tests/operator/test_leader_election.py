"""Two operator replicas on the real control plane: one Lease, one leader, clean failovers.

Each test runs two `evokube-operator` processes (POD_NAME op-a and op-b),
watching every namespace as the chart's account, that elect a leader through
a Lease of their own, at test speed (FAST_LEASE); the session's operator is
stopped meanwhile so that nobody else acts.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from dataclasses import dataclass, field

import pytest
from kubernetes import client, watch

from tests.cluster.controlplane import wait_until
from tests.operator.conftest import (
    FAST_LEASE,
    OPERATOR_NAMESPACE,
    K8s,
    OperatorProcess,
    experiment_manifest,
    release_gangs,
)

pytestmark = pytest.mark.cluster

TWO_HOSTS = {"type": "cpu", "hosts": 2}
WRITES = ("POST", "PUT", "PATCH", "DELETE")


@dataclass
class Pair:
    processes: dict[str, OperatorProcess]  # by POD_NAME
    coordination: client.CoordinationV1Api
    lease_name: str

    def lease(self) -> client.V1Lease | None:
        try:
            return self.coordination.read_namespaced_lease(self.lease_name, OPERATOR_NAMESPACE)
        except client.ApiException as err:
            if err.status == 404:
                return None
            raise

    def holder(self) -> str:
        lease = self.lease()
        return (lease and lease.spec.holder_identity) or ""

    def leader(self, timeout: float = 15) -> OperatorProcess:
        """The process whose identity (POD_NAME-suffix) holds the Lease, and says it leads."""

        def leading():
            holder = self.holder()
            for name, process in self.processes.items():
                if holder.startswith(f"{name}-") and process.metric("evokube_operator_leader"):
                    return process
            return None

        return wait_until(leading, timeout, f"a leader of Lease {self.lease_name}", interval=0.1)

    def follower(self, leader: OperatorProcess) -> OperatorProcess:
        (other,) = [p for p in self.processes.values() if p is not leader]
        return other


def start_pair(api, operator_kubeconfig, tmp_path, *election: str) -> Pair:
    lease_name = f"test-{uuid.uuid4().hex[:8]}"
    args = (
        f"--leader-election-namespace={OPERATOR_NAMESPACE}",
        f"--leader-election-lease-name={lease_name}",
        *(election or FAST_LEASE),
    )
    processes = {
        name: OperatorProcess(operator_kubeconfig, tmp_path, args, env={"POD_NAME": name})
        for name in ("op-a", "op-b")
    }
    for process in processes.values():
        process.start()
    return Pair(processes, client.CoordinationV1Api(api), lease_name)


@pytest.fixture
def pair_of(cluster, api, crd, operator, operator_kubeconfig, namespace, tmp_path):
    """Start two replicas (with these leader-election flags); the session's operator pauses."""
    operator.stop()
    started: list[Pair] = []

    def start(*election: str) -> Pair:
        pair = start_pair(api, operator_kubeconfig, tmp_path, *election)
        started.append(pair)
        return pair

    yield start
    for pair in started:
        k8s = K8s(cluster, api, None)
        release_gangs(k8s, namespace)
        for process in pair.processes.values():
            process.stop()
    operator.start()


def test_two_replicas_one_leads_the_other_stands_by_and_kopf_writes_nothing(
    pair_of, api, cluster, namespace
):
    pair = pair_of()
    leader = pair.leader()
    follower = pair.follower(leader)
    assert leader.get("/readyz") == (200, "ok: leader\n")
    assert follower.get("/readyz") == (200, "ok: follower\n")
    assert follower.metric("evokube_operator_leader") == 0

    k8s = K8s(cluster, api, leader)
    k8s.apply(experiment_manifest("duo", namespace, accelerator=TWO_HOSTS, maxRestarts=3))
    k8s.wait_running_gang(namespace, "duo", 2)
    k8s.patch_spec(namespace, "duo", {"maxRestarts": 5})  # an update both replicas see
    pod = k8s.running_pods(namespace, "duo", "duo-0")[0]
    k8s.exit_pod(namespace, pod.metadata.name, 75)
    k8s.wait(lambda: k8s.status(namespace, "duo").get("jobName") == "duo-1", "the restart")
    k8s.wait_running_gang(namespace, "duo", 2)

    # Still one leader, the same one, and both replicas up through many renewals.
    assert all(p.alive() for p in pair.processes.values())
    assert pair.leader() is leader
    # The follower reconciled and wrote nothing; Kopf wrote nothing to the experiment.
    assert follower.metric_sum("evokube_operator_reconciles_total") == 0
    for verb in WRITES:
        assert not [
            line
            for line in follower.get("/metrics")[1].splitlines()
            if line.startswith("evokube_operator_api_requests_total")
            and f'verb="{verb}"' in line
            and 'kind="Lease"' not in line
        ], f"the follower sent {verb}"
    meta = k8s.experiment(namespace, "duo")["metadata"]
    assert not meta.get("finalizers")
    assert not [k for k in meta.get("annotations") or {} if "kopf" in k or "evokube.io/" in k]
    assert k8s.status(namespace, "duo")["restarts"] == 1
    for process in pair.processes.values():  # nor did Kopf try (the account may not patch)
        refused = [
            line
            for line in process.log_path.read_text().splitlines()
            if "orbidden" in line and "erlexperiments" in line
        ]
        assert not refused, process.log_tail()


@dataclass
class Watcher:
    """Background samples while failovers happen: Lease holders, who says it leads, Jobs."""

    pair: Pair
    batch: client.BatchV1Api
    namespace: str
    holders: list[str] = field(default_factory=list)
    two_leaders: list[str] = field(default_factory=list)
    job_uids: dict[str, set[str]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for target in (self._sample, self._watch_jobs):
            thread = threading.Thread(target=target, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(10)

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            leading = [
                name
                for name, p in self.pair.processes.items()
                if p.metric("evokube_operator_leader") == 1
            ]
            if len(leading) > 1:
                self.two_leaders.append(",".join(leading))
            holder = self.pair.holder()
            if not self.holders or self.holders[-1] != holder:
                self.holders.append(holder)

    def _watch_jobs(self) -> None:
        while not self._stop.is_set():
            stream = watch.Watch().stream(
                self.batch.list_namespaced_job, self.namespace, timeout_seconds=2
            )
            for event in stream:
                job = event["object"]
                self.job_uids.setdefault(job.metadata.name, set()).add(job.metadata.uid)


def gang_running(k8s: K8s, namespace: str, name: str, attempt: int) -> bool:
    status = k8s.status(namespace, name)
    job = f"{name}-{attempt}"
    return (
        status.get("phase") == "Running"
        and status.get("jobName") == job
        and len(k8s.running_pods(namespace, name, job)) == 2
    )


def owned_leftovers(k8s: K8s, namespace: str) -> list[str]:
    """Objects of the operator's whose owner is not an existing experiment."""
    experiments = k8s.custom.list_namespaced_custom_object(
        "evokube.io", "v1alpha1", namespace, "erlexperiments"
    )["items"]
    uids = {e["metadata"]["uid"] for e in experiments}
    out = k8s.cluster.kubectl(
        "get",
        "jobs,services,serviceaccounts,configmaps,roles,rolebindings,networkpolicies",
        "-n",
        namespace,
        "-l",
        "evokube.io/experiment",
        "-o",
        "jsonpath={range .items[*]}{.kind}/{.metadata.name}"
        " {.metadata.ownerReferences[*].uid}\n{end}",
    ).stdout
    leftovers = []
    for line in out.splitlines():
        name, _, owners = line.partition(" ")
        if not set(owners.split()) & uids:
            leftovers.append(name)
    return leftovers


KILLS = 12


def test_killing_the_leader_mid_reconcile_12_times_converges(pair_of, api, cluster, namespace):
    """SIGKILL the leader 12 times in a row, each time just after some gang failed; the
    killed replica comes back as a follower. Every failure counts once, every attempt gets
    one Job, nothing is left without an owner, and never do two replicas lead at once."""
    pair = pair_of()
    k8s = K8s(cluster, api, pair.leader())
    restarting = ("alpha", "beta")
    for name in restarting:
        k8s.apply(experiment_manifest(name, namespace, accelerator=TWO_HOSTS, maxRestarts=50))
    k8s.apply(experiment_manifest("gamma", namespace, accelerator=TWO_HOSTS))
    for name in (*restarting, "gamma"):
        k8s.wait_running_gang(namespace, name, 2)
    failures = dict.fromkeys(restarting, 0)
    watcher = Watcher(pair, client.BatchV1Api(api), namespace)
    watcher.start()
    rng = random.Random(12)
    leaders: list[str] = []  # the Lease's holder at each kill, then the last one
    try:
        for kill in range(KILLS):
            for process in pair.processes.values():  # stepped down on an overloaded machine
                if not process.alive():
                    assert "lost the Lease" in process.log_path.read_text(), process.log_tail()
                    process.start()
            leader = pair.leader()
            leaders.append(pair.holder())
            k8s.operator = leader
            for name in restarting:  # a real gang failure, once its current gang runs
                if gang_running(k8s, namespace, name, failures[name]):
                    job = f"{name}-{failures[name]}"
                    pod = rng.choice(k8s.running_pods(namespace, name, job))
                    k8s.exit_pod(namespace, pod.metadata.name, 75)
                    failures[name] += 1
            if kill == 5:
                k8s.apply(experiment_manifest("delta", namespace, accelerator=TWO_HOSTS))
            if kill == 10:
                cluster.kubectl("delete", "erlx", "gamma", "-n", namespace, "--wait=false")
            time.sleep(rng.uniform(0.0, 1.0))  # the new leader is catching up: mid-reconcile
            leader.kill()
            leader.start()  # back as a follower
            assert pair.leader() is not leader
        k8s.operator = pair.leader()
        leaders.append(pair.holder())
        for name in restarting:
            k8s.wait(
                lambda name=name: gang_running(k8s, namespace, name, failures[name]),
                f"{name} to run attempt {failures[name]}",
                timeout=60,
            )
        k8s.wait_running_gang(namespace, "delta", 2)
        k8s.wait(lambda: not owned_leftovers(k8s, namespace), "no object without an owner")
    finally:
        watcher.stop()

    assert sum(failures.values()) >= 10, failures  # the loop really restarted gangs
    for name in restarting:
        status = k8s.status(namespace, name)
        assert status["restarts"] == failures[name], (name, status, failures)
        assert status.get("preemptions", 0) == 0
        k8s.wait(
            lambda name=name: (
                [j.metadata.name for j in k8s.jobs(namespace, name)] == [f"{name}-{failures[name]}"]
            ),
            f"only the current Job of {name}",
        )
        attempts = {job: uids for job, uids in watcher.job_uids.items() if job.startswith(name)}
        assert sorted(attempts) == sorted(f"{name}-{i}" for i in range(failures[name] + 1))
        assert all(len(uids) == 1 for uids in attempts.values()), attempts  # one Job each
    assert not k8s.jobs(namespace, "gamma") and not k8s.pods(namespace, "gamma")
    assert watcher.two_leaders == []
    assert "" not in watcher.holders  # SIGKILL never releases: the Lease always had a holder
    # A new holder after every kill, read where the loop killed it: the watcher samples every
    # 0.2 s and can miss a leader the loop killed sooner.
    assert len(set(leaders)) == KILLS + 1, leaders
    # And the gangs still end as they should.
    for pod in k8s.running_pods(namespace, "alpha", f"alpha-{failures['alpha']}"):
        k8s.exit_pod(namespace, pod.metadata.name, 0)
    pod = k8s.running_pods(namespace, "beta", f"beta-{failures['beta']}")[0]
    k8s.exit_pod(namespace, pod.metadata.name, 78)
    k8s.wait_phase(namespace, "alpha", "Succeeded")
    k8s.wait_phase(namespace, "beta", "Failed")
    assert k8s.status(namespace, "beta")["restarts"] == failures["beta"]


def test_a_graceful_stop_hands_the_lease_over_at_once(pair_of, api, cluster, namespace):
    """With a 15 s lease, only the release explains a takeover within about a retry period."""
    pair = pair_of(
        "--leader-election-lease-duration=15",
        "--leader-election-renew-deadline=10",
        "--leader-election-retry-period=0.5",
    )
    leader = pair.leader()
    follower = pair.follower(leader)
    leader.stop()
    assert leader.proc.returncode == 0, leader.log_tail()
    stopped = time.monotonic()
    assert "released Lease" in leader.log_path.read_text()
    assert pair.leader(timeout=5) is follower
    assert time.monotonic() - stopped < 2.5
    # The new leader acts.
    k8s = K8s(cluster, api, follower)
    k8s.apply(experiment_manifest("after", namespace, accelerator=TWO_HOSTS))
    k8s.wait_running_gang(namespace, "after", 2)


def test_a_leader_that_sees_another_holder_exits_at_once_and_the_follower_takes_over(
    pair_of, api, cluster, namespace
):
    """Someone else in the Lease (as after a partition): the leader stops acting by exiting
    non-zero, for Kubernetes to restart it as a follower."""
    pair = pair_of()
    leader = pair.leader()
    follower = pair.follower(leader)
    pair.coordination.patch_namespaced_lease(
        pair.lease_name, OPERATOR_NAMESPACE, {"spec": {"holderIdentity": "intruder"}}
    )
    wait_until(lambda: not leader.alive(), 5, "the leader to exit", interval=0.1)
    assert leader.proc.returncode == 1
    assert "lost the Lease" in leader.log_path.read_text()
    assert pair.leader(timeout=10) is follower  # once the intruder's Lease expires
    k8s = K8s(cluster, api, follower)
    k8s.apply(experiment_manifest("next", namespace, accelerator=TWO_HOSTS))
    k8s.wait_running_gang(namespace, "next", 2)
