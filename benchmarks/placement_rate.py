"""Placement rate of multislice TPU work: JobSet's exclusive topology against evokube's
per-pod affinity terms, on the kwok test control plane with the real scheduler.

    .venv/bin/python -m benchmarks.placement_rate
    .venv/bin/python -m benchmarks.placement_rate --slices 4 --hosts 16 --repeats 3 \
        --controller-manager-qps 100

The script starts a fresh test control plane (through `python -m tests.cluster up`:
benchmarks do not import the tests) with the real JobSet controller and `--slices` TPU node
pools of `--hosts` nodes each (v5e hosts of 4 chips), then times two ways of placing
`--slices` slices of `--hosts` pods, each slice on a node pool of its own:

- jobset: one JobSet of one replicated Job with `--slices` replicas of `--hosts` pods, the
  annotation alpha.jobset.sigs.k8s.io/exclusive-topology naming the node pool label. JobSet's
  webhooks give each Job's leader pod the pool affinity terms and pin its followers to the
  leader's pool with a node selector once it is scheduled.
- affinity: what evokube does today, `--slices` Indexed Jobs whose every pod carries the
  required pod affinity and anti-affinity terms of evokube_operator.reading.placement.

Each trial runs in a new namespace, from the first create call until every pod is Running
(kwok marks a pod Running as soon as it is bound); it then checks that every slice sits in
one pool and no two slices share one, and deletes the namespace and waits for its pods to
go. The ways alternate trial by trial, so that the load of a shared machine falls on both.
Printed: a row per trial and the median pods/s of each way.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks._common import load, print_header, print_row, wait_until
from benchmarks.operator_scale import Cluster
from evokube_operator.reading.placement import GANG_LABEL, gang_key, pod_affinity

NODE_POOL_LABEL = "cloud.google.com/gke-nodepool"
EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"
TPU_HOST = {"google.com/tpu": "4", "cpu": "1", "memory": "1Gi"}
WAYS = ("jobset", "affinity")


def pools(slices: int) -> list[str]:
    """The TPU pools: nodes.yaml's two, then copies of its first."""
    return ["tpu", "tpu-b", *(f"tpu-{chr(ord('c') + i)}" for i in range(slices - 2))]


def host_pod(labels: dict[str, str] | None = None, affinity: dict | None = None) -> dict:
    """The pod template of one TPU host."""
    spec: dict = {
        "restartPolicy": "Never",
        "containers": [
            {
                "name": "main",
                "image": "registry.local/evokube/sleep:1",
                "resources": {"requests": TPU_HOST, "limits": TPU_HOST},
            }
        ],
        "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}],
    }
    if affinity:
        spec["affinity"] = affinity
    return {"metadata": {"labels": labels or {}}, "spec": spec}


def indexed_job(hosts: int, template: dict, name: str | None = None) -> dict:
    """An Indexed Job spec (wrapped as a Job when named) of `hosts` pods all at once."""
    spec = {
        "parallelism": hosts,
        "completions": hosts,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "template": template,
    }
    if name is None:
        return spec
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name}, "spec": spec}


def jobset(slices: int, hosts: int) -> dict:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": "ms", "annotations": {EXCLUSIVE_TOPOLOGY: NODE_POOL_LABEL}},
        "spec": {
            "replicatedJobs": [
                {
                    "name": "slice",
                    "replicas": slices,
                    "template": {"spec": indexed_job(hosts, host_pod())},
                }
            ]
        },
    }


def affinity_jobs(namespace: str, slices: int, hosts: int) -> list[dict]:
    """One Indexed Job a slice, every pod with evokube's exclusive-placement terms."""
    jobs = []
    for s in range(slices):
        name = f"ms-slice-{s}"
        gang = gang_key(namespace, name)
        affinity = pod_affinity(None, gang, NODE_POOL_LABEL)
        jobs.append(indexed_job(hosts, host_pod({GANG_LABEL: gang}, affinity), name))
    return jobs


def trial(api, way: str, namespace: str, slices: int, hosts: int, timeout: float) -> dict:
    """Create one way's objects in a new namespace; time until all pods exist and all run;
    check the placement; delete the namespace and wait for its pods to go."""
    from kubernetes import client

    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    wait_until(lambda: core.list_namespaced_service_account(namespace).items, 30, "default SA")
    total = slices * hosts
    began = time.monotonic()
    if way == "jobset":
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets", jobset(slices, hosts)
        )
    else:
        for job in affinity_jobs(namespace, slices, hosts):
            client.BatchV1Api(api).create_namespaced_job(namespace, job)
    created = None
    while True:
        pods = core.list_namespaced_pod(namespace).items
        now = time.monotonic() - began
        if created is None and len(pods) >= total:
            created = now
        running = [p for p in pods if p.status.phase == "Running"]
        if len(running) == total:
            break
        if now > timeout:
            raise RuntimeError(f"{way}: {len(running)}/{total} pods Running after {timeout:.0f}s")
        time.sleep(0.1)
    nodes = {n.metadata.name: n.metadata.labels[NODE_POOL_LABEL] for n in core.list_node().items}
    by_slice: dict[str, set[str]] = {}
    for pod in running:
        by_slice.setdefault(pod.metadata.labels["job-name"], set()).add(nodes[pod.spec.node_name])
    placed = [next(iter(p)) for p in by_slice.values() if len(p) == 1]
    exclusive = len(by_slice) == slices and len(set(placed)) == slices
    core.delete_namespace(namespace)
    wait_until(
        lambda: not core.list_namespaced_pod(namespace).items, 300, f"{namespace}'s pods gone"
    )
    return {"created_s": created, "running_s": now, "exclusive": exclusive}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slices", type=int, default=4)
    parser.add_argument("--hosts", type=int, default=16, help="pods a slice = nodes a pool")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300)
    parser.add_argument(
        "--controller-manager-qps",
        type=int,
        help="kube-controller-manager's client rate limit (its default: 20/s); the Job "
        "controller creates every pod through it",
    )
    args = parser.parse_args(argv)
    names = pools(args.slices)
    up = ["--jobset", "--pool-size", "cpu=0", "--pool-size", "gpu=0"]
    up += [a for p in names[2:] for a in ("--copy-pool", f"{p}=tpu")]
    up += [a for p in names for a in ("--pool-size", f"{p}={args.hosts}")]
    if args.controller_manager_qps:
        up += ["--controller-manager-qps", str(args.controller_manager_qps)]
    total = args.slices * args.hosts
    with tempfile.TemporaryDirectory(prefix="placement-rate-") as workdir:
        cluster = Cluster(Path(workdir), *up)
        api = cluster.api_client()
        try:
            print(f"{args.slices} slices x {args.hosts} hosts ({total} pods) on {len(names)} pools")
            print_header(
                "trial", "way", "all created (s)", "all Running (s)", "pods/s", "exclusive", "load"
            )
            rates: dict[str, list[float]] = {way: [] for way in WAYS}
            for i in range(args.repeats):
                for way in WAYS:
                    r = trial(api, way, f"{way}-{i}", args.slices, args.hosts, args.timeout)
                    rates[way].append(total / r["running_s"])
                    print_row(
                        i,
                        way,
                        f"{r['created_s']:.2f}",
                        f"{r['running_s']:.2f}",
                        f"{rates[way][-1]:.1f}",
                        r["exclusive"],
                        f"{load():.1f}",
                    )
            print()
            print_header("way", "median pods/s", "trials")
            for way in WAYS:
                print_row(way, f"{statistics.median(rates[way]):.1f}", len(rates[way]))
        finally:
            api.close()
            cluster.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
