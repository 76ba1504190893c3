"""Episode returns -> fitness: pure, jittable reducers shared by the workflows; and the mean
with its 95% interval over replicas (seeds) that status, metrics and curves report."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import jax
import jax.numpy as jnp

from evokube_sweeps import interval

__all__ = [
    "episode_returns_to_fitness",
    "masked_mean",
    "mean_interval",
]

Array = jax.Array


def masked_mean(values: Array, mask: Array | None = None, axis: int = -1, empty_value=jnp.nan):
    """Mean of `values` over `axis`, counting only entries where `mask` is true.

    Rows with no valid entry get `empty_value` (NaN by default, so an individual that finished
    no episode is visible instead of silently scoring 0).
    """
    values = jnp.asarray(values, jnp.float32)
    if mask is None:
        return jnp.mean(values, axis=axis)
    mask = jnp.asarray(mask, jnp.float32)
    total = jnp.sum(values * mask, axis=axis)
    count = jnp.sum(mask, axis=axis)
    return jnp.where(count > 0, total / jnp.maximum(count, 1.0), empty_value)


def episode_returns_to_fitness(
    episode_returns: Array,
    mask: Array | None = None,
    *,
    reduction: Literal["mean", "min", "max", "median"] = "mean",
    empty_value: float = float("nan"),
) -> Array:
    """Reduces per-episode returns `[pop, K]` to one fitness per individual `[pop]`.

    `mask` `[pop, K]` (optional) marks which episodes finished and count. `reduction="mean"` is
    the usual ERL fitness; `"min"` is a pessimistic alternative for noisy tasks. Rows without any
    counted episode get `empty_value`.
    """
    returns = jnp.asarray(episode_returns, jnp.float32)  # [pop, K]
    if returns.ndim != 2:
        raise ValueError(f"episode_returns must be [pop, K], got shape {returns.shape}")
    if reduction == "mean":
        return masked_mean(returns, mask, axis=-1, empty_value=empty_value)
    valid = jnp.ones_like(returns, bool) if mask is None else jnp.asarray(mask, bool)
    any_valid = jnp.any(valid, axis=-1)
    if reduction == "min":
        out = jnp.min(jnp.where(valid, returns, jnp.inf), axis=-1)
    elif reduction == "max":
        out = jnp.max(jnp.where(valid, returns, -jnp.inf), axis=-1)
    elif reduction == "median":
        out = jnp.nanmedian(jnp.where(valid, returns, jnp.nan), axis=-1)
    else:
        raise ValueError(f"unknown reduction {reduction!r}; use mean, min, max or median")
    return jnp.where(any_valid, out, empty_value)


def mean_interval(values: Sequence[float]) -> tuple[float, float]:
    """The mean of `values` (one per replica) and the half-width of its 95% interval,
    Student-t with n - 1 degrees of freedom (0 for one value): the sweep summary's own
    (`evokube_sweeps.interval`), so a run's band and its sweep's table agree."""
    summary = interval(list(values))
    return summary["mean"], summary["interval"]
