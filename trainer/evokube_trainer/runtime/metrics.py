"""Prometheus metrics of one trainer process.

Names carry the `evokube_` prefix and base units; counters end in `_total`;
the labels (experiment, namespace, process, and a small fixed `stat`/`loss`
set, and `seed`: at most 64 replicas) stay low-cardinality. With several seeds
(spec.seeds) the run's families report the replicas' mean, and the `evokube_seed_*`
families each replica, with the 95% interval of their mean beside it. Every
process serves its own endpoint, so a PodMonitor sees the whole gang.
"""

from __future__ import annotations

import platform
import socket
import threading
from collections.abc import Mapping, Sequence
from wsgiref.simple_server import WSGIRequestHandler

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    make_wsgi_app,
    start_http_server,
)
from prometheus_client.exposition import ThreadingWSGIServer

from evokube_trainer import metric_names as names
from evokube_trainer.utils import mean_interval

# Prometheus `stat` label -> the workflow metric it reports.
FITNESS_KEYS = {
    "best": names.BEST_FITNESS,
    "mean": names.MEAN_FITNESS,
    "min": names.MIN_FITNESS,
    "max": names.BEST_FITNESS,
    "std": names.FITNESS_STD,
}
# Generations take from milliseconds (tiny gymnax runs) to minutes (large Brax populations).
DURATION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class TrainerMetrics:
    """The metric families, bound to one process's labels."""

    def __init__(self, experiment: str, namespace: str, process: int, registry=None):
        self.registry = registry or CollectorRegistry()
        base = ("experiment", "namespace", "process")
        self._labels = {"experiment": experiment, "namespace": namespace, "process": str(process)}
        r = self.registry
        self.generation = Gauge("evokube_generation", "Generations completed.", base, registry=r)
        self.env_steps = Counter(
            "evokube_env_steps",
            "Environment steps taken by the whole population.",
            base,
            registry=r,
        )
        self.fitness = Gauge(
            "evokube_population_fitness",
            "Fitness of the last evaluated population.",
            (*base, "stat"),
            registry=r,
        )
        self.eval_return = Gauge(
            "evokube_eval_return",
            "Mean episode return of the deployable policy.",
            base,
            registry=r,
        )
        self.rl_loss = Gauge(
            "evokube_rl_loss",
            "Mean RL loss over the generation's updates.",
            (*base, "loss"),
            registry=r,
        )
        self.generation_seconds = Histogram(
            "evokube_generation_duration_seconds",
            "Wall time of one generation.",
            base,
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.checkpoint_time = Gauge(
            "evokube_checkpoint_last_success_timestamp_seconds",
            "Unix time of the newest complete checkpoint.",
            base,
            registry=r,
        )
        self.seed_fitness = Gauge(
            "evokube_seed_fitness",
            "One replica's fitness (spec.seeds): best in the last generation, or best so far.",
            (*base, "seed", "stat"),
            registry=r,
        )
        self.seed_eval_return = Gauge(
            "evokube_seed_eval_return",
            "Mean episode return of one replica's deployable policy (spec.seeds).",
            (*base, "seed"),
            registry=r,
        )
        self.seeds_interval = Gauge(
            "evokube_seeds_interval",
            "Half-width of the 95% Student-t interval of the replicas' mean (0 for one seed).",
            (*base, "metric"),
            registry=r,
        )
        self.build = Info("evokube_build", "Versions this trainer runs with.", registry=r)
        self.run = Info("evokube_run", "What this process trains.", base, registry=r)

    def describe_run(self, **info: object) -> None:
        import jax

        from evokube_trainer import __version__

        self.build.info(
            {
                "version": __version__,
                "jax_version": jax.__version__,
                "python_version": platform.python_version(),
            }
        )
        self.run.labels(**self._labels).info({k: str(v) for k, v in info.items()})

    def record_generation(
        self, metrics: Mapping[str, float], duration_s: float, new_env_steps: float
    ) -> None:
        """Record one generation's metrics dict (as Workflow.step returns it)."""
        labels = self._labels
        self.generation.labels(**labels).set(metrics[names.GENERATION])
        if new_env_steps > 0:
            self.env_steps.labels(**labels).inc(new_env_steps)
        for stat, key in FITNESS_KEYS.items():
            if key in metrics:
                self.fitness.labels(**labels, stat=stat).set(metrics[key])
        if names.EVAL_RETURN in metrics:
            self.eval_return.labels(**labels).set(metrics[names.EVAL_RETURN])
        for key, value in metrics.items():
            if key.endswith("_loss"):
                loss = key.rsplit("/", 1)[-1].removesuffix("_loss")
                self.rl_loss.labels(**labels, loss=loss).set(value)
        self.generation_seconds.labels(**labels).observe(duration_s)

    def record_seeds(self, entries: Sequence[Mapping[str, float]]) -> None:
        """Each replica's `status.progress.seeds` entry, and the interval of their mean of
        `fitness` (as metric `fitness`) and of `evalReturn` (`eval_return`)."""
        labels = self._labels
        for entry in entries:
            seed = str(entry["seed"])
            for stat, key in (("best", "fitness"), ("best_so_far", "bestFitness")):
                if key in entry:
                    self.seed_fitness.labels(**labels, seed=seed, stat=stat).set(entry[key])
            if "evalReturn" in entry:
                self.seed_eval_return.labels(**labels, seed=seed).set(entry["evalReturn"])
        for metric, key in (("fitness", "fitness"), ("eval_return", "evalReturn")):
            values = [entry[key] for entry in entries if key in entry]
            if len(values) == len(entries):
                self.seeds_interval.labels(**labels, metric=metric).set(mean_interval(values)[1])

    def record_checkpoint(self, unix_time: float) -> None:
        self.checkpoint_time.labels(**self._labels).set(unix_time)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        """Serve /metrics on `port` from a daemon thread."""
        start_http_server(port, addr=addr, registry=self.registry)

    def serve_on(self, fd: int) -> None:
        """Serve /metrics from a daemon thread on the listening socket `fd` this process
        inherited (`evokube run` binds it, so no other run can take the port meanwhile)."""
        server = ThreadingWSGIServer(("", 0), _QuietHandler, bind_and_activate=False)
        server.socket.close()
        server.socket = socket.socket(fileno=fd)
        server.server_address = server.socket.getsockname()
        server.server_name, server.server_port = server.server_address[:2]
        server.setup_environ()
        server.set_app(make_wsgi_app(self.registry))
        threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args):
        """Scrapes are not news: the standard handler writes a line for each to stderr."""
