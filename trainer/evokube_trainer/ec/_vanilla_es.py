"""Canonical (vanilla) ES: the new mean is a rank-weighted recombination of the elites.

Chrabaszcz et al., 2018 ("Back to basics"), as in EvoRL's VanillaES.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from evokube_trainer.ec._base import EvoOptimizer
from evokube_trainer.ec._parts import (
    ScheduleLike,
    check_mirrored,
    gaussian_population,
    log_rank_weights,
    resolve_num_elites,
    schedule_value,
    top_k_indices,
)


@struct.dataclass
class VanillaESState:
    mean: jax.Array  # [D]
    generation: jax.Array  # [] int32


@dataclasses.dataclass(frozen=True)
class VanillaES(EvoOptimizer):
    """mean <- sum_i w_i x_(i) over the `num_elites` best members (pop // 2 when None).

    `elite_weighting="log"` uses w_i ∝ log(num_elites + 0.5) - log(i); "equal" a plain average.
    `sigma` is fixed or an optax schedule of the generation (e.g. optax.exponential_decay).
    """

    num_elites: int | None = None
    sigma: ScheduleLike = 0.02
    elite_weighting: Literal["log", "equal"] = "log"
    mirrored: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_mirrored(self.mirrored, self.pop_size)
        resolve_num_elites(self.num_elites, self.pop_size)
        if self.elite_weighting not in ("log", "equal"):
            raise ValueError(f"elite_weighting must be 'log' or 'equal': {self.elite_weighting}")

    def _weights(self) -> np.ndarray:
        count = resolve_num_elites(self.num_elites, self.pop_size)
        if self.elite_weighting == "equal":
            return np.full((count,), 1.0 / count, np.float32)
        return log_rank_weights(count)

    def init(self, key: jax.Array, mean: jax.Array) -> VanillaESState:
        del key
        return VanillaESState(mean=self._check_mean(mean), generation=jnp.zeros((), jnp.int32))

    def ask(self, state: VanillaESState, key: jax.Array) -> tuple[jax.Array, VanillaESState]:
        sigma = schedule_value(self.sigma, state.generation)
        return gaussian_population(key, state.mean, sigma, self.pop_size, self.mirrored), state

    def _tell(
        self, state: VanillaESState, population: jax.Array, fitness: jax.Array
    ) -> tuple[VanillaESState, dict[str, jax.Array]]:
        weights = self._weights()  # [mu]
        elites = population[top_k_indices(fitness, weights.shape[0])]  # [mu, D]
        mean = weights @ elites  # [D]
        metrics = {
            "sigma": schedule_value(self.sigma, state.generation),
            "mean_shift": jnp.linalg.norm(mean - state.mean),
        }
        return state.replace(mean=mean), metrics
