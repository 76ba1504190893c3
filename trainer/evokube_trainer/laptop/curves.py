"""Learning curves from history.jsonl: the PNG `evokube run` leaves in its run folder and
`evokube curve` draws for any run, local, in a bucket, or on a cluster.

    evokube curve runs/pendulum                 # a run folder or a history.jsonl
    evokube curve s3://bucket/ml/pendulum       # a checkpoint location or history.jsonl URL
    evokube curve pendulum --namespace ml       # an ERLExperiment, through the kubeconfig

A run of several seeds (spec.seeds: its rows hold `seed/<i>/<metric>`) draws each replica as a
thin line and their mean with its 95% interval as a band.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from evokube_contract import GROUP, HISTORY_FILE, PLURAL, VERSION
from evokube_trainer import metric_names as names
from evokube_trainer.runtime import folders
from evokube_trainer.utils import mean_interval

# The curves drawn, from the metrics of each generation.
CURVES = (
    (names.BEST_FITNESS, "best fitness"),
    (names.MEAN_FITNESS, "mean fitness"),
    (names.EVAL_RETURN, "evaluation return"),
)


class CurveError(Exception):
    """A history that cannot be found or read; the message says what is missing."""


def history_rows(text: str) -> list[dict]:
    """One row per generation, `{"generation": g, **metrics}`, sorted; when a resumed run wrote
    a generation again, its last record wins."""
    rows = {}
    for line in text.splitlines():
        if line.strip():
            record = json.loads(line)
            rows[int(record["generation"])] = record["metrics"]
    return [{"generation": g, **rows[g]} for g in sorted(rows)]


def read_history(path: Path) -> list[dict]:
    """The rows of a local history.jsonl; [] while it does not exist."""
    return history_rows(path.read_text()) if path.exists() else []


def seed_count(rows: list[dict]) -> int:
    """How many replicas the rows' `seed_key` metrics name (1 when none do)."""
    indices = {seed[0] for row in rows for name in row if (seed := names.split_seed_key(name))}
    return max(indices) + 1 if indices else 1


def seed_band(rows: list[dict], key: str, seeds: int) -> list[tuple[int, float, float]]:
    """(generation, mean, 95% half-width) of metric `key` over the replicas, at each generation
    where every replica has a finite value."""
    band = []
    for row in rows:
        values = [row.get(names.seed_key(i, key)) for i in range(seeds)]
        if all(isinstance(v, int | float) and math.isfinite(v) for v in values):
            band.append((row["generation"], *mean_interval(values)))
    return band


def _points(rows: list[dict], key: str) -> list[tuple[int, float]]:
    return [(r["generation"], r[key]) for r in rows if isinstance(r.get(key), int | float)]


def plot_learning_curve(rows: list[dict], title: str, png_path: Path) -> Path:
    """Best and mean fitness and the evaluation return against the generation, 800x450 px;
    with several seeds, each replica's line and their mean with a 95% band."""
    fig, ax = _axes()
    seeds = seed_count(rows)
    for index, (key, label) in enumerate(CURVES):
        color = f"C{index}"
        if seeds == 1:
            points = _points(rows, key)
            if points:
                ax.plot(*zip(*points, strict=True), label=label, color=color)
            continue
        for i in range(seeds):
            points = _points(rows, names.seed_key(i, key))
            if points:
                ax.plot(*zip(*points, strict=True), color=color, alpha=0.3, linewidth=0.8)
        band = seed_band(rows, key, seeds)
        if band:
            generations, means, halves = zip(*band, strict=True)
            lows = [m - h for m, h in zip(means, halves, strict=True)]
            highs = [m + h for m, h in zip(means, halves, strict=True)]
            ax.fill_between(generations, lows, highs, color=color, alpha=0.2)
            ax.plot(generations, means, color=color, label=f"{label} (mean of {seeds} seeds)")
    return _save(fig, ax, "return", title, png_path)


def plot_curves(runs: dict[str, list[dict]], key: str, title: str, png_path: Path) -> Path:
    """One metric of several runs (label -> history rows) against the generation: a sweep's
    children in one figure."""
    fig, ax = _axes()
    for label, rows in runs.items():
        points = _points(rows, key)
        if points:
            ax.plot(*zip(*points, strict=True), label=label)
    return _save(fig, ax, key, title, png_path)


def _axes():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(8, 4.5), dpi=100)


def _save(fig, ax, ylabel: str, title: str, png_path: Path) -> Path:
    import matplotlib.pyplot as plt

    ax.set_xlabel("generation")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(png_path)
    plt.close(fig)
    return png_path


def find_history(target: str, namespace: str | None = None) -> tuple[str, str]:
    """(title, text of history.jsonl) for `target`: a bucket URL (a checkpoint location or its
    history.jsonl), a local run folder or history.jsonl, else the name of an ERLExperiment
    read through the kubeconfig (in `namespace`, else the context's)."""
    if "://" in target:
        return _title(target), _read_url(_history_url(target))
    path = Path(target)
    if path.is_dir():
        return path.resolve().name, _read_path(path / HISTORY_FILE, f"run folder {path}")
    if path.is_file():
        return path.resolve().parent.name, path.read_text()
    if "/" in target or target.endswith(".jsonl"):
        raise CurveError(f"{target}: no such file or folder")
    return target, _read_url_or_path(experiment_location(target, namespace), target)


def experiment_location(name: str, namespace: str | None = None) -> str:
    """Where experiment `name` keeps its checkpoints and history: status.checkpointLocation
    (the operator's resolved location), else spec.checkpoint.location."""
    from kubernetes import client, config
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException

    kubeconfig = os.environ.get("KUBECONFIG")  # read now: the client reads it at import
    try:
        if namespace is None:
            _, context = config.list_kube_config_contexts(kubeconfig)
            namespace = context.get("context", {}).get("namespace") or "default"
        api = config.new_client_from_config(kubeconfig)
    except (ConfigException, OSError) as err:
        raise CurveError(f"no kubeconfig to find experiment {name!r} with: {err}") from err
    try:
        obj: Any = client.CustomObjectsApi(api).get_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, name
        )
    except ApiException as err:
        if err.status == 404:
            raise CurveError(f"no ERLExperiment {name!r} in namespace {namespace!r}") from err
        raise CurveError(f"cannot read ERLExperiment {namespace}/{name}: {err.reason}") from err
    except Exception as err:  # connection refused, TLS, DNS: the API server is not reachable
        raise CurveError(f"cannot reach the API server: {err}") from err
    finally:
        api.close()
    location = (obj.get("status") or {}).get("checkpointLocation") or (
        obj["spec"].get("checkpoint") or {}
    ).get("location")
    if not location:
        raise CurveError(
            f"ERLExperiment {namespace}/{name} has no checkpoint location yet "
            "(status.checkpointLocation, spec.checkpoint.location): no history to read"
        )
    return location


def _history_url(url: str) -> str:
    return url if url.endswith(".jsonl") else url.rstrip("/") + "/" + HISTORY_FILE


def _title(url: str) -> str:
    parts = url.rstrip("/").split("/")
    return parts[-2] if parts[-1] == HISTORY_FILE else parts[-1]


def _read_url(url: str) -> str:
    import fsspec

    try:
        with fsspec.open(url, "rt", encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError as err:
        raise CurveError(f"no history yet: {url} does not exist") from err
    except Exception as err:  # credentials, network, an unknown scheme
        raise CurveError(f"cannot read {url}: {type(err).__name__}: {err}") from err


def _read_path(path: Path, what: str) -> str:
    if not path.exists():
        raise CurveError(f"no history yet: {what} has no {HISTORY_FILE}")
    return path.read_text()


def _read_url_or_path(location: str, name: str) -> str:
    if "://" in location:
        return _read_url(_history_url(location))
    folder = Path(location)
    if not folder.is_dir():
        raise CurveError(
            f"experiment {name!r} keeps its history at {location}, a path inside its pods "
            "(a volume), not reachable from this machine: copy it out with `kubectl cp`, "
            "or use a bucket (gs://, s3://) as spec.checkpoint.location"
        )
    return _read_path(folder / HISTORY_FILE, f"checkpoint location {location}")


def draw(target: str, output: Path | None = None, namespace: str | None = None) -> tuple[Path, int]:
    """Draw `target`'s learning curve; returns (PNG path, number of generations)."""
    title, text = find_history(target, namespace)
    try:
        rows = history_rows(text)
    except (ValueError, KeyError) as err:
        raise CurveError(f"{target}: not a history.jsonl ({err})") from err
    if not rows:
        raise CurveError(f"no history yet: {target}'s history.jsonl is empty")
    png = output or Path(f"{title}-learning-curve.png")
    try:
        folders.prepare_file(png)
    except OSError as err:
        raise CurveError(folders.describe(png, err)) from err
    return plot_learning_curve(rows, title, png), len(rows)
