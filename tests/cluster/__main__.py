"""Start or stop the evokube test control plane by hand.

    python -m tests.cluster up      # builds binaries once, starts, prints how to use it
    python -m tests.cluster down    # stops it; leaves no process behind
    python -m tests.cluster status

The cluster lives in $EVOKUBE_CLUSTER_DIR (default ~/.cache/evokube/dev-cluster).
Tests reuse it instead of starting their own when EVOKUBE_TEST_CLUSTER names it.
"""

import argparse
import os
import sys
from pathlib import Path

from tests.cluster.controlplane import ClusterError, ControlPlane

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
    args = parser.parse_args(argv)
    plane = ControlPlane(args.dir)
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
    except ClusterError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    kubectl = plane.binaries.path("kubectl")
    helm = plane.binaries.path("helm")
    print(f"cluster up: {plane.state.server} (logs in {args.dir / 'logs'})")
    print("point kubectl and helm at it with:")
    print(f"  export KUBECONFIG={plane.kubeconfig}")
    print(f"  export PATH={Path(kubectl).parent}:{Path(helm).parent}:$PATH")
    print(f"let the tests reuse it with:\n  export EVOKUBE_TEST_CLUSTER={args.dir}")
    print("stop it with:\n  python -m tests.cluster down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
