"""ERLSweeps end to end: kubectl apply on the real control plane, kwok playing the hosts.

A child's trainer is played as the other operator tests play it: its per-seed outcome is
patched into status.progress.seeds (as process 0 would write it) and its pod ends with exit
code 0 (`evokube.test/exit-code`), so the child Succeeds.
"""

import json

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

import evokube_sweeps as sweeps
from evokube_contract import sweep as contract
from evokube_operator.cluster.kube import ApiError, Kube, refused_write
from evokube_operator.handlers import SERVED_CHECK_SECONDS
from evokube_operator.plans import sweep_plan
from evokube_operator.plans.sweep_plan import SweepObservation, plan_sweep
from tests.operator.conftest import (
    GROUP,
    PLURAL,
    REPO,
    VERSION,
    experiment_manifest,
    sweep_manifest,
)
from tests.operator.factories import NOW
from tests.operator.test_sweep_plan import largest_sweep

pytestmark = pytest.mark.cluster

SEEDS = 3
SIZES = [16, 32, 64]
LEARNING_RATES = [0.01, 0.03]


def grid_sweep(namespace: str, name: str = "grid", max_parallel: int = 2, parameters=None):
    """A 3 x 2 grid (population size x learning rate), 3 seeds each."""
    grid = [
        {"path": "spec.population.size", "values": SIZES},
        {"path": "spec.algorithm.ec.learningRate", "values": LEARNING_RATES},
    ]
    return sweep_manifest(name, namespace, parameters or grid, max_parallel, seeds=SEEDS)


def sweep_status(k8s, namespace, name="grid") -> dict:
    found = k8s.custom.get_namespaced_custom_object(
        GROUP, VERSION, namespace, contract.SWEEP_PLURAL, name
    )
    return found.get("status") or {}


def children(k8s, namespace, name="grid") -> list[dict]:
    return k8s.custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, label_selector=f"{contract.SWEEP_LABEL}={name}"
    )["items"]


def sweep_events(k8s, namespace, name="grid") -> list[str]:
    items = k8s.core.list_namespaced_event(
        namespace,
        field_selector=f"involvedObject.name={name},involvedObject.kind={contract.SWEEP_KIND}",
    ).items
    return [e.reason for e in items]


def fitness(index: int, seed: int) -> float:
    """Child `index`'s played outcome: the later the child, the better; seeds differ a little."""
    return -100.0 + 10.0 * index + seed


def finish(k8s, namespace, child: dict) -> None:
    index = int(child["metadata"]["labels"][contract.SWEEP_INDEX_LABEL])
    seeds = [
        {"seed": s, "bestFitness": fitness(index, s), "fitness": fitness(index, s) - 1}
        for s in range(SEEDS)
    ]
    k8s.succeed(namespace, child["metadata"]["name"], seeds)


def moved(k8s, namespace, before: list[dict]) -> bool:
    """A child created, or one running, since `before` was listed."""
    now = children(k8s, namespace)
    return len(now) != len(before) or any(
        (c.get("status") or {}).get("phase") == "Running" for c in now
    )


def unfinished(kids: list[dict]) -> list[dict]:
    return [c for c in kids if (c.get("status") or {}).get("phase") not in ("Succeeded", "Failed")]


def test_a_grid_sweep_runs_to_completion_within_max_parallel_and_survives_a_restart(
    k8s, cluster, namespace, operator
):
    k8s.apply(grid_sweep(namespace))
    most, uids, restarted = 0, {}, False
    while True:
        kids = children(k8s, namespace)
        for kid in kids:  # a child is created once: its uid never changes
            assert (
                uids.setdefault(kid["metadata"]["name"], kid["metadata"]["uid"])
                == (kid["metadata"]["uid"])
            )
        most = max(most, len(unfinished(kids)))
        assert len(unfinished(kids)) <= 2, [c["metadata"]["name"] for c in kids]
        if len(kids) == 6 and not unfinished(kids):
            break
        if len(uids) >= 4 and not restarted:  # an operator restart mid-sweep adopts
            # Killed between a child's create and its Event, the Event is lost (Events are
            # best-effort). With maxParallel children unfinished the operator creates none until
            # this test finishes one, so it is killed once every child has its Event.
            k8s.wait(
                lambda: (
                    len(unfinished(now := children(k8s, namespace))) == 2
                    and sweep_events(k8s, namespace).count("ChildCreated") == len(now)
                ),
                "each child's ChildCreated Event before the restart",
                60,
            )
            operator.kill()
            operator.start()
            restarted = True
        running = [c for c in kids if (c.get("status") or {}).get("phase") == "Running"]
        if running:
            finish(k8s, namespace, running[0])
            k8s.wait_phase(namespace, running[0]["metadata"]["name"], "Succeeded", timeout=60)
        else:
            k8s.wait(lambda n=kids: moved(k8s, namespace, n), "a child to be created or run", 60)
    assert most == 2 and restarted
    assert sorted(uids) == sorted(sweeps.child_name("grid", i) for i in range(6))

    status = k8s.wait(
        lambda: (s := sweep_status(k8s, namespace)).get("phase") == "Succeeded" and s,
        "the sweep to succeed",
    )
    assert status["children"] == 6 and status["counts"] == {"Succeeded": 6}
    configurations = status["configurations"]
    assert [c["name"] for c in configurations] == [f"grid-{i}" for i in range(6)]
    assert configurations[1]["assignment"] == {
        "spec.population.size": 16,
        "spec.algorithm.ec.learningRate": 0.03,
    }
    best = configurations[5]["best"]
    assert best.get("n") == SEEDS, status
    assert best["mean"] == pytest.approx(fitness(5, 1))
    assert best["interval"] == pytest.approx(4.30265 * 1.0 / 3**0.5, rel=1e-4)  # t(2), sd 1
    assert configurations[5]["final"]["mean"] == pytest.approx(fitness(5, 1) - 1)
    assert status["bestConfiguration"]["name"] == "grid-5"
    child = k8s.experiment(namespace, "grid-0")
    assert child["metadata"]["labels"]["team"] == "a"
    (owner,) = child["metadata"]["ownerReferences"]
    assert owner["kind"] == contract.SWEEP_KIND and owner["controller"]

    # The printer columns, as a user sees them (a phase no child is in: blank).
    header, line = cluster.kubectl("get", "erls", "grid", "-n", namespace).stdout.splitlines()
    columns = header.split()
    starts = [header.index(c) for c in columns] + [len(line)]
    row = {c: line[a:b].strip() for c, a, b in zip(columns, starts, starts[1:], strict=False)}
    assert row == {**row, "PHASE": "Succeeded", "CHILDREN": "6", "RUNNING": "", "SUCCEEDED": "6"}
    assert (row["FAILED"], row["BEST"]) == ("", "grid-5")
    # Events: each child created once (the restart adopted), then the end.
    k8s.wait(lambda: "Completed" in sweep_events(k8s, namespace), "the Completed Event")
    assert sweep_events(k8s, namespace).count("ChildCreated") == 6
    # Metrics labelled by sweep.
    labels = {"namespace": namespace, "sweep": "grid"}
    k8s.wait(
        lambda: (
            operator.metric("evokube_operator_sweep_children", phase="Succeeded", **labels) == 6
        ),
        "the sweep's children gauge",
    )
    assert operator.metric("evokube_operator_sweep_best_fitness", **labels) == pytest.approx(
        fitness(5, 1)
    )

    # Deleting the sweep deletes its children (the garbage collector, foreground).
    cluster.kubectl(
        "delete", "erls", "grid", "-n", namespace, "--cascade=foreground", "--timeout=60s"
    )
    k8s.wait(lambda: not children(k8s, namespace), "the children to be garbage-collected")


def test_a_child_the_api_server_refuses_makes_the_sweep_invalid_and_creates_none(k8s, namespace):
    bad = [{"path": "spec.population.size", "values": [16, 0]}]  # the CRD's minimum is 2
    k8s.apply(grid_sweep(namespace, name="bad", parameters=bad))
    status = k8s.wait(
        lambda: (s := sweep_status(k8s, namespace, "bad")).get("phase") == "Invalid" and s,
        "the sweep to be Invalid",
    )
    (invalid,) = [c for c in status["conditions"] if c["type"] == "Invalid"]
    assert invalid["reason"] == "CreationRefused"
    assert "bad-1" in invalid["message"] and "spec.population.size" in invalid["message"]
    assert children(k8s, namespace, "bad") == []
    k8s.wait(lambda: "CreationRefused" in sweep_events(k8s, namespace, "bad"), "the Event")


def test_a_namesake_blocks_the_sweep_and_is_left_alone(k8s, namespace):
    k8s.apply(experiment_manifest("taken-0", namespace, suspend=True))
    k8s.apply(grid_sweep(namespace, name="taken", max_parallel=1))

    def blocked():
        conditions = sweep_status(k8s, namespace, "taken").get("conditions") or []
        return next((c for c in conditions if c["type"] == "Blocked"), None)

    condition = k8s.wait(blocked, "the sweep to be Blocked")
    assert condition["reason"] == "NameConflict" and "ERLExperiment/taken-0" in condition["message"]
    assert "ownerReferences" not in k8s.experiment(namespace, "taken-0")["metadata"]
    with pytest.raises(ApiException):
        k8s.experiment(namespace, "taken-1")


def test_without_the_sweep_crd_the_operator_warns_once_and_runs_experiments(k8s, namespace):
    """A cluster that installed only the ERLExperiment CRD; the session's CRD put back after."""
    name = f"{contract.SWEEP_PLURAL}.{GROUP}"
    sweeps = str(REPO / "crds" / f"{name}.yaml")
    k8s.cluster.kubectl("delete", "crd", name, "--wait")
    try:
        k8s.wait(lambda: not Kube(k8s.api_client).serves(contract.SWEEP_KIND), "no ERLSweeps")
        k8s.operator.stop()
        k8s.operator.start()
        pid = k8s.operator.proc.pid
        k8s.apply(experiment_manifest("alone", namespace))
        k8s.wait_phase(namespace, "alone", "Running")
        log = k8s.operator.log_path.read_text()
        assert log.count(f"{contract.SWEEP_PLURAL} is not served") == 1, log
        assert k8s.operator.alive()
        # The CRD installed now: the operator starts its watches again in the same process
        # and reconciles sweeps, with nobody restarting it.
        k8s.cluster.kubectl("apply", "--server-side", "-f", sweeps)
        k8s.wait(
            lambda: (
                "ERLSweep is now served: starting the watches again"
                in k8s.operator.log_path.read_text()
            ),
            "the operator to notice the CRD",
            timeout=SERVED_CHECK_SECONDS + 30,
        )
        k8s.apply(grid_sweep(namespace, max_parallel=1))
        k8s.wait(
            lambda: sweep_status(k8s, namespace).get("phase") == "Running",
            "the sweep reconciled",
            timeout=60,
        )
        assert k8s.operator.alive() and k8s.operator.proc.pid == pid
    finally:
        k8s.cluster.kubectl("apply", "--server-side", "-f", sweeps)
        k8s.wait(lambda: Kube(k8s.api_client).serves(contract.SWEEP_KIND), "ERLSweeps", 60)
        k8s.operator.stop()  # the later tests' operator watches sweeps again
        k8s.operator.start()


def test_the_api_server_takes_the_largest_sweeps_status_and_refuses_it_uncut(
    cluster, crd, api, namespace, monkeypatch
):
    """The status of 256 children with the largest assignments the CRDs allow is written;
    uncut, the API server (its 3 MiB a request) and etcd (1.5 MiB a write) refuse it, and
    the operator recognizes both refusals as ones that retrying does not cure."""
    parameters = largest_sweep()[0]["spec"]["parameters"]
    manifest = sweep_manifest("grid", namespace, parameters, 1)
    custom = client.CustomObjectsApi(api)
    created = custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, contract.SWEEP_PLURAL, manifest
    )
    _, kids = largest_sweep(owner=created["metadata"]["uid"])
    kube = Kube(cluster.api_client())

    def write(children) -> tuple[int, dict]:
        """The planned status's size and the sweep as the API server stored it. The session's
        operator may reconcile this sweep too: a write it moved the resourceVersion under is
        made again on the newer one."""
        plan = plan_sweep(SweepObservation(created, tuple(children), NOW))
        for _ in range(10):
            version = kube.get(contract.SWEEP_KIND, namespace, "grid")["metadata"]
            try:
                stored = kube.patch_status(
                    namespace,
                    "grid",
                    plan.status,
                    version["resourceVersion"],
                    kind=contract.SWEEP_KIND,
                )
            except ApiError as err:
                if err.status != 409:
                    raise
                continue
            return len(json.dumps(plan.status)), stored
        raise AssertionError("the sweep's status kept changing")

    size, stored = write(kids)
    assert size < 600_000
    assert len(stored["status"]["configurations"]) == contract.MAX_CHILDREN
    monkeypatch.setattr(sweep_plan, "STATUS_VALUE_CHARS", 1 << 30)  # nothing cut
    for children in (kids, kids[:40]):  # 15 MB: past the request limit; 2.3 MB: etcd's
        with pytest.raises(ApiError) as refused:
            write(children)
        assert refused_write(refused.value), refused.value
