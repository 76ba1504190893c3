"""Operator memory with the largest sweeps a tenant can apply (issue 37).

    .venv/bin/python -m benchmarks.sweep_scale --sweeps 1 4 --max-parallel 4

For each K the script starts a fresh test control plane (as benchmarks/operator_scale.py does),
installs the CRDs, starts `evokube-operator` and applies K ERLSweeps at once, each of 256 children
(one parameter, spec.seed, of 256 values) whose template is an experiment near the largest the
CRD admits (benchmarks/largest_experiment.py, about 220 KiB of spec, one host). The operator
dry-runs every child of a sweep before it creates the first, then keeps `--max-parallel`
children a sweep. Reported per K: seconds from the apply to each sweep's first child (the
slowest sweep), the operator's RSS at start, its peak until every sweep has its children and
its status, and after every sweep is deleted (its children with it) and the operator is quiet.
The chart's memory limit for the operator is 512 MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from benchmarks._common import load, print_header, print_row, wait_until
from benchmarks.largest_experiment import largest_experiment
from benchmarks.operator_scale import Cluster, Operator, ProcSampler, prepare, wait_quiet
from evokube_contract import API_VERSION, PLURAL
from evokube_contract.sweep import MAX_CHILDREN, SWEEP_KIND, SWEEP_LABEL, SWEEP_PLURAL

NAMESPACE = "sweeps"
IMAGE = "ghcr.io/evokube/trainer-cpu:0.1.0"
CHART_LIMIT_MIB = 512


def sweep(name: str, max_parallel: int) -> dict:
    template = largest_experiment("unused", NAMESPACE, IMAGE, hosts=1)
    return {
        "apiVersion": API_VERSION,
        "kind": SWEEP_KIND,
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "template": {"spec": template["spec"]},
            "parameters": [{"path": "spec.seed", "values": list(range(MAX_CHILDREN))}],
            "maxParallel": max_parallel,
        },
    }


def children_of(plane: Cluster, name: str) -> int:
    listed = plane.kubectl(
        "get", PLURAL, "-n", NAMESPACE, "-l", f"{SWEEP_LABEL}={name}", "-o", "name"
    )
    return len(listed.stdout.split())


def sweep_status(plane: Cluster, name: str) -> dict:
    found = plane.kubectl("get", SWEEP_PLURAL, name, "-n", NAMESPACE, "-o", "json")
    return json.loads(found.stdout).get("status") or {}


def run_sweeps(k: int, args: argparse.Namespace) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix=f"evokube-sweeps-{k}-"))
    plane = Cluster(workdir, f"--pool-size=cpu={-(-k * args.max_parallel // 110) + 1}")
    operator = None
    try:
        prepare(plane, NAMESPACE, largest=True)
        launcher = Operator(plane, workdir / "operator.log")
        operator = launcher.start()
        wait_until(launcher.ready, 60, f"the operator to become ready (log: {launcher.log_path})")
        sampler = ProcSampler(operator.pid)
        rss_start = sampler.rss()
        sampler.start()
        names = [f"largest-{i}" for i in range(k)]
        manifests = workdir / "sweeps.yaml"
        manifests.write_text("\n---\n".join(json.dumps(sweep(n, args.max_parallel)) for n in names))
        applied = time.monotonic()
        plane.kubectl("apply", "--server-side", "-f", str(manifests))
        first_child: dict[str, float] = {}

        def all_started() -> bool:
            time.sleep(1.0)
            for name in names:
                if name not in first_child and children_of(plane, name):
                    first_child[name] = time.monotonic() - applied
            return len(first_child) == k and all(
                sweep_status(plane, n).get("children") == MAX_CHILDREN
                and children_of(plane, n) == args.max_parallel
                for n in names
            )

        wait_until(all_started, args.timeout, "every sweep's first children and status")
        wait_quiet(launcher.url, 15.0)
        rss_loaded = sampler.rss()
        plane.kubectl("delete", SWEEP_PLURAL, "--all", "-n", NAMESPACE, "--wait=false")

        def gone() -> bool:
            time.sleep(2.0)
            left = plane.kubectl("get", f"{SWEEP_PLURAL},{PLURAL}", "-n", NAMESPACE, "-o", "name")
            return not left.stdout.strip()

        wait_until(gone, 600, "the sweeps and their children to be deleted")
        wait_quiet(launcher.url, 15.0)
        sampler.stop()
        return {
            "sweeps": k,
            "children": k * MAX_CHILDREN,
            "max_parallel": args.max_parallel,
            "first_child_s": max(first_child.values()),
            "rss_start_mib": rss_start / 2**20,
            "rss_peak_mib": sampler.peak_rss / 2**20,
            "rss_loaded_mib": rss_loaded / 2**20,
            "rss_deleted_mib": sampler.rss() / 2**20,
            "load": f"{load():.1f}",
        }
    finally:
        if operator is not None:
            operator.terminate()
            operator.wait(30)
        plane.stop()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sweeps", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--max-parallel", type=int, default=4, help="children a sweep runs")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds to wait per K")
    args = parser.parse_args(argv)
    print(f"# {os.cpu_count()} CPUs; load average at start {load():.2f}", flush=True)
    rows = []
    for k in args.sweeps:
        row = run_sweeps(k, args)
        rows.append(row)
        print("# " + json.dumps(row), flush=True)
    print_header(
        "sweeps (children)",
        "maxParallel",
        "apply -> first child s (slowest sweep)",
        "operator RSS MiB: start / peak / loaded / after delete",
        f"peak under the chart's {CHART_LIMIT_MIB} MiB",
        "load",
    )
    for r in rows:
        print_row(
            f"{r['sweeps']} ({r['children']})",
            r["max_parallel"],
            f"{r['first_child_s']:.0f}",
            f"{r['rss_start_mib']:.0f} / {r['rss_peak_mib']:.0f} / {r['rss_loaded_mib']:.0f}"
            f" / {r['rss_deleted_mib']:.0f}",
            "yes" if r["rss_peak_mib"] < CHART_LIMIT_MIB else "NO",
            r["load"],
        )


if __name__ == "__main__":
    main()
