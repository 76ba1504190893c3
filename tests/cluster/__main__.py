"""Start or stop the evokube test control plane by hand.

    python -m tests.cluster up      # builds binaries once, starts, prints how to use it
    python -m tests.cluster down    # stops it; leaves no process behind
    python -m tests.cluster status

The cluster lives in $EVOKUBE_CLUSTER_DIR (default ~/.cache/evokube/dev-cluster).
Tests reuse it instead of starting their own when EVOKUBE_TEST_CLUSTER names it.
Programs that are not tests (benchmarks/operator_scale.py) drive it through this command
line, `up --json` telling them where it is, rather than importing the tests.
"""

import argparse
import json
import os
import sys
from pathlib import Path

from tests.cluster.controlplane import ClusterError, ControlPlane
from tests.cluster.jobset import JobSet

DEFAULT_DIR = Path.home() / ".cache" / "evokube" / "dev-cluster"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.cluster",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument(
        "--dir", type=Path, default=Path(os.environ.get("EVOKUBE_CLUSTER_DIR", DEFAULT_DIR))
    )
    parser.add_argument(
        "--controller-manager-qps",
        type=int,
        help="up: kube-controller-manager's client rate limit (its default: 20/s, burst 30)",
    )
    parser.add_argument(
        "--pool-size",
        action="append",
        default=[],
        metavar="POOL=N",
        help="up: N fake nodes in nodes.yaml's POOL instead of its count (repeatable)",
    )
    parser.add_argument(
        "--copy-pool",
        action="append",
        default=[],
        metavar="NEW=POOL",
        help="up: one more node pool NEW shaped like nodes.yaml's POOL (repeatable)",
    )
    parser.add_argument(
        "--jobset",
        action="store_true",
        help="up: also start the JobSet controller (tests/cluster/jobset.py)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="up: print one JSON object (kubeconfig, kubectl, server, pids) instead",
    )
    args = parser.parse_args(argv)
    sizes = {pool: int(n) for pool, _, n in (s.partition("=") for s in args.pool_size)}
    copies = dict(s.partition("=")[::2] for s in args.copy_pool)
    plane = ControlPlane(
        args.dir,
        controller_manager_qps=args.controller_manager_qps,
        pool_sizes=sizes,
        pool_copies=copies,
    )
    if args.command == "down":
        plane.stop()
        print(f"stopped the cluster in {args.dir}")
        return 0
    if args.command == "status":
        running = plane.is_running()
        print(f"cluster in {args.dir}: {'running' if running else 'not running'}")
        return 0 if running else 1
    try:
        plane.start()
        if args.jobset:
            # Its pid joins the cluster's in state.json: `down` ends it too.
            JobSet(plane).start()
    except ClusterError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    kubectl = plane.binaries.path("kubectl")
    helm = plane.binaries.path("helm")
    if args.json:
        where = {"kubeconfig": str(plane.kubeconfig), "kubectl": kubectl}
        print(json.dumps({**where, "server": plane.state.server, "pids": plane.state.pids}))
        return 0
    print(f"cluster up: {plane.state.server} (logs in {args.dir / 'logs'})")
    print("point kubectl and helm at it with:")
    print(f"  export KUBECONFIG={plane.kubeconfig}")
    print(f"  export PATH={Path(kubectl).parent}:{Path(helm).parent}:$PATH")
    print(f"let the tests reuse it with:\n  export EVOKUBE_TEST_CLUSTER={args.dir}")
    print("stop it with:\n  python -m tests.cluster down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
