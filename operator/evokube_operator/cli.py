"""`evokube-operator`: run the ERLExperiment operator against any cluster.

    evokube-operator                                  # in a pod: its ServiceAccount
    evokube-operator --kubeconfig ~/.kube/config      # from a laptop, every namespace
    evokube-operator --kubeconfig K --namespace team-a --namespace team-b --metrics-port 9090

Run exactly one replica per cluster (or per set of namespaces): Kopf has no
leader election, and two operators would both act on the same experiments.
"""

from __future__ import annotations

import argparse
import logging
import sys

import kopf

from evokube_operator.options import Options


def parse_args(argv: list[str] | None = None) -> tuple[Options, argparse.Namespace]:
    parser = argparse.ArgumentParser(
        prog="evokube-operator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--kubeconfig",
        help="kubeconfig file (default: the in-cluster ServiceAccount, else $KUBECONFIG)",
    )
    parser.add_argument("--context", help="kubeconfig context (default: its current context)")
    parser.add_argument(
        "-n",
        "--namespace",
        action="append",
        default=[],
        dest="namespaces",
        metavar="NS",
        help="watch this namespace (repeatable; globs like team-* work); default: all",
    )
    parser.add_argument(
        "--metrics-port",
        type=int,
        default=8080,
        help="port of /metrics, /healthz and /readyz (0 turns them off; default 8080)",
    )
    parser.add_argument("--metrics-address", default="0.0.0.0", help="default 0.0.0.0")
    parser.add_argument(
        "--workers", type=int, default=8, help="experiments reconciled at once (default 8)"
    )
    parser.add_argument(
        "--resync-seconds",
        type=float,
        default=300.0,
        help="look at every experiment this often even without events (0: never; default 300)",
    )
    parser.add_argument(
        "--watch-timeout-seconds",
        type=float,
        default=300.0,
        help="restart each watch this often (default 300)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    parser.add_argument("--debug", action="store_true", help="log everything, Kopf's too")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if not 0 <= args.metrics_port <= 65535:
        parser.error("--metrics-port must be between 0 and 65535")
    options = Options(
        kubeconfig=args.kubeconfig,
        context=args.context,
        namespaces=tuple(args.namespaces),
        metrics_host=args.metrics_address,
        metrics_port=args.metrics_port,
        workers=args.workers,
        resync_seconds=args.resync_seconds,
        watch_timeout_seconds=args.watch_timeout_seconds,
    )
    return options, args


def main(argv: list[str] | None = None) -> int:
    options, args = parse_args(argv)
    kopf.configure(verbose=args.verbose, debug=args.debug)
    if not args.verbose and not args.debug:
        logging.getLogger("kopf").setLevel(logging.WARNING)
        logging.getLogger("evokube_operator").setLevel(logging.INFO)
    from evokube_operator import handlers  # noqa: F401  (registers the handlers)

    kopf.run(
        standalone=True,
        clusterwide=not options.namespaces,
        namespaces=list(options.namespaces),
        memo=kopf.Memo(options=options),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
