"""Running observation statistics and the wrapper that normalizes observations with them."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from evokube_trainer.envs._base import EnvState, Wrapper


@struct.dataclass
class RunningStats:
    """Count, mean and summed squared deviations (Welford/Chan) of a stream of vectors."""

    count: jax.Array  # [] float32 number of vectors seen
    mean: jax.Array  # [dim] float32
    m2: jax.Array  # [dim] float32, sum over vectors of (x - mean)**2

    @property
    def var(self) -> jax.Array:
        """Population variance ``[dim]``; 1 before any data."""
        return jnp.where(self.count > 0, self.m2 / jnp.maximum(self.count, 1.0), 1.0)


def init_running_stats(dim: int) -> RunningStats:
    return RunningStats(
        count=jnp.zeros((), jnp.float32),
        mean=jnp.zeros((dim,), jnp.float32),
        m2=jnp.zeros((dim,), jnp.float32),
    )


def reduce_running_stats(stats: RunningStats) -> RunningStats:
    """Pools stats stacked on a leading axis (e.g. one per population member) into one.

    ``stats``: count ``[K]``, mean and m2 ``[K, dim]``. Uses the exact pooled formulas, so the
    result equals the stats of all underlying vectors together.
    """
    count = jnp.sum(stats.count)  # []
    weight = (stats.count / jnp.maximum(count, 1.0))[:, None]  # [K, 1]
    mean = jnp.sum(weight * stats.mean, axis=0)  # [dim]
    spread = stats.count[:, None] * jnp.square(stats.mean - mean)  # [K, dim]
    m2 = jnp.sum(stats.m2 + spread, axis=0)  # [dim]
    return RunningStats(count=count, mean=mean, m2=m2)


def merge_running_stats(a: RunningStats, b: RunningStats) -> RunningStats:
    """Stats of the union of the data behind ``a`` and ``b``."""
    return reduce_running_stats(jax.tree.map(lambda x, y: jnp.stack([x, y]), a, b))


def update_running_stats(
    stats: RunningStats, batch: jax.Array, mask: jax.Array | None = None
) -> RunningStats:
    """Adds ``batch`` ``[N, dim]`` (rows with ``mask`` ``[N]`` == 0 are skipped)."""
    batch = batch.astype(jnp.float32)
    mask = jnp.ones(batch.shape[:1], jnp.float32) if mask is None else mask.astype(jnp.float32)
    count = jnp.sum(mask)  # []
    mean = jnp.sum(mask[:, None] * batch, axis=0) / jnp.maximum(count, 1.0)  # [dim]
    m2 = jnp.sum(mask[:, None] * jnp.square(batch - mean), axis=0)  # [dim]
    return merge_running_stats(stats, RunningStats(count=count, mean=mean, m2=m2))


def normalize_obs(
    stats: RunningStats, obs: jax.Array, clip: float | None = 10.0, eps: float = 1e-8
) -> jax.Array:
    """``(obs - mean) / sqrt(var + eps)``, optionally clipped to ``[-clip, clip]``; any batch
    shape ``[..., dim]``. Stats of no data (count 0) leave ``obs`` unchanged, unclipped."""
    out = (obs - stats.mean) / jnp.sqrt(stats.var + eps)
    out = out if clip is None else jnp.clip(out, -clip, clip)
    return jnp.where(stats.count > 0, out, obs)


@struct.dataclass
class ObsNormInner:
    env: EnvState  # the wrapped env's state, raw observations
    stats: RunningStats


@dataclasses.dataclass(frozen=True)
class ObservationNorm(Wrapper):
    """Normalizes ``obs`` and ``info["final_obs"]`` with running statistics kept in the state.

    Meant to sit outermost on a batched env: one set of stats is shared by all ``num_envs``
    copies, so a population evaluated in one batched env shares it too. Stats are updated with
    each new raw observation before normalizing (envs whose ``info["frozen"]`` is set are left
    out) unless ``update_stats`` is False. To carry stats across resets or between workers, read
    them with ``get_stats``, pool them with ``merge_running_stats``/``reduce_running_stats``, and
    pass them back through ``reset(key, stats)`` or ``set_stats``.
    """

    update_stats: bool = True
    clip: float | None = 10.0

    def reset(self, key: jax.Array, stats: RunningStats | None = None) -> EnvState:
        state = self.env.reset(key)
        if stats is None:
            stats = init_running_stats(self.obs_dim)
        return self._wrap(state, self._updated(stats, state))

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        inner: ObsNormInner = state.inner
        nxt = self.env.step(inner.env, action)
        return self._wrap(nxt, self._updated(inner.stats, nxt))

    def get_stats(self, state: EnvState) -> RunningStats:
        return state.inner.stats

    def set_stats(self, state: EnvState, stats: RunningStats) -> EnvState:
        """``state`` with its stats replaced and its observations renormalized."""
        return self._wrap(state.inner.env, stats)

    def normalize(self, stats: RunningStats, obs: jax.Array) -> jax.Array:
        """The normalization this env applies, for use outside it (e.g. a deployed policy)."""
        return normalize_obs(stats, obs, self.clip)

    def _updated(self, stats: RunningStats, state: EnvState) -> RunningStats:
        if not self.update_stats:
            return stats
        obs = state.obs.reshape(-1, self.obs_dim)  # [B, obs_dim]
        frozen = state.info.get("frozen")
        mask = None if frozen is None else 1.0 - frozen.reshape(-1)  # [B]
        return update_running_stats(stats, obs, mask)

    def _wrap(self, state: EnvState, stats: RunningStats) -> EnvState:
        info = dict(state.info)
        if "final_obs" in info:
            info["final_obs"] = self.normalize(stats, info["final_obs"])
        return state.replace(
            inner=ObsNormInner(env=state, stats=stats),
            obs=self.normalize(stats, state.obs),
            info=info,
        )
