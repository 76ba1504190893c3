"""Replicas trained as one program (spec.seeds): their root seeds and their host metrics, the
replicas' mean plus each one's own value under `metric_names.seed_key`."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from evokube_trainer import metric_names as names


def replica_seed(seed: int, replica: int) -> int:
    """Replica `replica`'s root seed: `seed + replica`, wrapped into the 32 bits a JAX key keeps
    (spec.seed may be 2^32-1)."""
    return (seed + replica) % 2**32


def replica_values(metrics: Mapping[str, float], name: str, seeds: int) -> list[float | None]:
    """Each replica's value of `name` in `seed_metrics`' host metrics (None where absent)."""
    if seeds == 1:
        return [metrics.get(name)]
    return [metrics.get(names.seed_key(i, name)) for i in range(seeds)]


def seed_metrics(values: Mapping[str, Any], seeds: int) -> dict[str, float]:
    """Host metrics of one generation from its device values. One seed: the scalars as they
    are. Several: each `[seeds]` value becomes the replicas' mean (`generation` and
    `env_steps`: the most, an integer), and each of `metric_names.PER_SEED` is also given per
    replica, as `seed_key(i, name)`."""
    if seeds == 1:
        return {name: _scalar(value) for name, value in values.items()}
    metrics: dict[str, float] = {}
    for name, value in values.items():
        value = np.asarray(value)
        most = name in (names.GENERATION, names.ENV_STEPS)
        metrics[name] = int(np.max(value)) if most else float(np.mean(value))
        if name in names.PER_SEED:
            metrics.update({names.seed_key(i, name): _scalar(v) for i, v in enumerate(value)})
    return metrics


def _scalar(value: Any) -> float:
    value = np.asarray(value)
    if value.size != 1:
        raise ValueError(f"metrics must be scalars, got shape {value.shape}")
    number = float(value.reshape(()))
    return int(number) if value.dtype.kind in "iu" and math.isfinite(number) else number
