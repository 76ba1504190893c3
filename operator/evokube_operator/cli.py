"""`evokube-operator`: run the ERLExperiment operator against any cluster.

    evokube-operator                                  # in a pod: its ServiceAccount
    evokube-operator --kubeconfig ~/.kube/config      # from a laptop, every namespace
    evokube-operator --kubeconfig K --namespace team-a --namespace team-b --metrics-port 9090

Run as many replicas as you like: they elect a leader through a Lease
(--leader-election-*), only the leader reconciles, the others watch and take
over when it stops or dies (docs/operator.md, "Leader election").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import re
import sys

import kopf

from evokube_operator import api
from evokube_operator.cluster.leader import LeaderElection, own_namespace
from evokube_operator.options import Options
from evokube_operator.rules.startup import DEFAULT_TIMEOUTS, Timeouts

# The URL half of the CRD's pattern for spec.checkpoint.location.
_BUCKET_URL = re.compile(
    r"(gs://[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9]|s3://[a-z0-9][-a-z0-9.]{1,61}[a-z0-9])"
    r"(/[-A-Za-z0-9_.+@=,]+)*"
)


def _bucket_url(text: str) -> str:
    """--default-checkpoint-location: a URL spec.checkpoint.location would accept."""
    if not _BUCKET_URL.fullmatch(text) or re.search(r"/[.][.]?(/|$)", text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a gs://bucket[/path] or s3://bucket[/path] URL"
        )
    return text


def _network_peers(text: str) -> tuple[dict, ...]:
    """--metrics-from: a JSON list of objects (the API server checks each peer's fields)."""
    try:
        peers = json.loads(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not JSON: {err}") from None
    if not isinstance(peers, list) or not all(isinstance(p, dict) and p for p in peers):
        raise argparse.ArgumentTypeError("must be a JSON list of NetworkPolicyPeer objects")
    return tuple(peers)


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
    parser.add_argument(
        "--image-pull-timeout-seconds",
        type=float,
        default=DEFAULT_TIMEOUTS.image_pull,
        metavar="S",
        help="an experiment whose trainer image has not pulled S seconds after its pod started "
        f"fails (reason ImagePullBackOff; default {DEFAULT_TIMEOUTS.image_pull:g})",
    )
    parser.add_argument(
        "--unschedulable-timeout-seconds",
        type=float,
        default=DEFAULT_TIMEOUTS.unschedulable,
        metavar="S",
        help="a trainer pod unschedulable for S seconds makes its experiment Blocked "
        f"(reason Unschedulable; default {DEFAULT_TIMEOUTS.unschedulable:g})",
    )
    parser.add_argument(
        "--network-policy",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="give each experiment a NetworkPolicy: only its own gang and --metrics-from "
        "may reach its pods (default: on)",
    )
    parser.add_argument(
        "--metrics-from",
        type=_network_peers,
        default=(),
        metavar="JSON",
        help="a JSON list of NetworkPolicyPeers allowed to scrape the trainers' metrics port "
        '(e.g. \'[{"namespaceSelector": {"matchLabels": '
        '{"kubernetes.io/metadata.name": "monitoring"}}}]\'); default: none',
    )
    parser.add_argument(
        "--default-checkpoint-location",
        type=_bucket_url,
        default=None,
        metavar="URL",
        help="gs://bucket[/path] or s3://bucket[/path]: an experiment without "
        "spec.checkpoint.location checkpoints to URL/<namespace>/<name> (default: an emptyDir, "
        "which a gang restart loses)",
    )
    parser.add_argument(
        "--trainer-token",
        choices=api.TRAINER_TOKEN_MODES,
        default=api.TOKEN_HOST_0,
        help="which trainer hosts get an API token to report status.progress and status.result: "
        "host-0 (an admission policy mounts it, Kubernetes 1.36+), every-host (the Job mounts "
        "it; an admission policy refuses the other hosts' writes), none (not reported; "
        "each Job's experiment gets a Warning Event). The chart picks one (default host-0)",
    )
    defaults = LeaderElection()
    parser.add_argument(
        "--leader-elect",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="reconcile only while holding the Lease (default: on; off: act at once, alone)",
    )
    parser.add_argument(
        "--leader-election-namespace",
        metavar="NS",
        help="the Lease's namespace (default: $POD_NAMESPACE, else the in-cluster account's,"
        f" else {defaults.namespace})",
    )
    parser.add_argument(
        "--leader-election-lease-name",
        default=defaults.name,
        metavar="NAME",
        help=f"the Lease's name (default {defaults.name})",
    )
    for flag, default, meaning in (
        ("lease-duration", defaults.lease_duration, "a silent leader is replaced after"),
        ("renew-deadline", defaults.renew_deadline, "the leader stops if not renewed within"),
        ("retry-period", defaults.retry_period, "renew, or look for a missing leader, every"),
    ):
        parser.add_argument(
            f"--leader-election-{flag}",
            type=float,
            default=default,
            metavar="S",
            help=f"{meaning} S seconds (default {default:g})",
        )
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    parser.add_argument("--debug", action="store_true", help="log everything, Kopf's too")
    args = parser.parse_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    if not 0 <= args.metrics_port <= 65535:
        parser.error("--metrics-port must be between 0 and 65535")
    for flag in ("image_pull_timeout_seconds", "unschedulable_timeout_seconds"):
        if getattr(args, flag) < 0:
            parser.error(f"--{flag.replace('_', '-')} must not be negative")
    election = None
    if args.leader_elect:
        try:
            election = LeaderElection(
                namespace=args.leader_election_namespace or own_namespace(),
                name=args.leader_election_lease_name,
                lease_duration=args.leader_election_lease_duration,
                renew_deadline=args.leader_election_renew_deadline,
                retry_period=args.leader_election_retry_period,
            )
        except ValueError as err:
            parser.error(str(err))
    options = Options(
        kubeconfig=args.kubeconfig,
        context=args.context,
        namespaces=tuple(args.namespaces),
        metrics_host=args.metrics_address,
        metrics_port=args.metrics_port,
        workers=args.workers,
        resync_seconds=args.resync_seconds,
        watch_timeout_seconds=args.watch_timeout_seconds,
        network_policy=args.network_policy,
        metrics_from=args.metrics_from,
        leader_election=election,
        default_checkpoint_location=args.default_checkpoint_location,
        trainer_token=args.trainer_token,
        start_timeouts=Timeouts(
            image_pull=args.image_pull_timeout_seconds,
            unschedulable=args.unschedulable_timeout_seconds,
        ),
    )
    return options, args


def main(argv: list[str] | None = None) -> int:
    options, args = parse_args(argv)
    kopf.configure(verbose=args.verbose, debug=args.debug)
    if not args.verbose and not args.debug:
        logging.getLogger("kopf").setLevel(logging.WARNING)
        logging.getLogger("evokube_operator").setLevel(logging.INFO)
    if options.trainer_token == api.TOKEN_NONE:
        logging.getLogger("evokube_operator").warning("--trainer-token=none: %s", api.NO_TOKEN)
    from evokube_operator import handlers  # noqa: F401  (registers the handlers)

    while True:
        # The handlers set `rewatch` and the flag when a kind the watches depend on comes or
        # goes (handlers.rewatch_when_served_changes): Kopf stops, and starts again here. An
        # asyncio.Event, bound to the loop kopf.run makes: a threading one would leave a thread
        # waiting on it that a SIGTERM's shutdown then waits for.
        stop = asyncio.Event()
        memo = kopf.Memo(options=options, stop_flag=stop, rewatch=False)
        kopf.run(
            standalone=True,
            clusterwide=not options.namespaces,
            namespaces=list(options.namespaces),
            memo=memo,
            stop_flag=stop,
        )
        if not memo.rewatch:
            return 0
        logging.getLogger("evokube_operator").warning("watching what the cluster serves now")


if __name__ == "__main__":
    sys.exit(main())
