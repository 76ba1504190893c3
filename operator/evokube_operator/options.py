"""How the operator was started (command line), and how it reaches the API server."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from kubernetes import config as kube_config
from kubernetes.client import Configuration

from evokube_operator import api
from evokube_operator.cluster.leader import LeaderElection
from evokube_operator.desired.builders import NetworkAccess
from evokube_operator.rules.startup import DEFAULT_TIMEOUTS, Timeouts


@dataclass(frozen=True)
class Options:
    kubeconfig: str | None = None
    context: str | None = None
    namespaces: tuple[str, ...] = ()  # empty: every namespace
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 8080  # 0: no metrics or probe server
    workers: int = 8
    resync_seconds: float = 300.0
    watch_timeout_seconds: float = 300.0
    leader_election: LeaderElection | None = field(default_factory=LeaderElection)  # None: alone
    network_policy: bool = True  # a NetworkPolicy per experiment
    metrics_from: tuple[dict, ...] = ()  # NetworkPolicyPeers that may scrape trainer metrics
    start_timeouts: Timeouts = DEFAULT_TIMEOUTS  # of image pulls, of unschedulable pods
    # gs:// or s3:// URL; an experiment without checkpoint.location gets <it>/<ns>/<name>
    default_checkpoint_location: str | None = None
    trainer_token: str = api.TOKEN_HOST_0  # api.TRAINER_TOKEN_MODES: who holds an API token

    @property
    def network_access(self) -> NetworkAccess | None:
        """What the experiments' NetworkPolicies admit; None: no NetworkPolicy."""
        return NetworkAccess(self.metrics_from) if self.network_policy else None


def client_configuration(options: Options) -> Configuration:
    """The API server and credentials: --kubeconfig, else in-cluster, else $KUBECONFIG."""
    configuration = Configuration()
    if options.kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        kube_config.load_incluster_config(client_configuration=configuration)
    else:
        kube_config.load_kube_config(
            config_file=options.kubeconfig,
            context=options.context,
            client_configuration=configuration,
        )
    return configuration
