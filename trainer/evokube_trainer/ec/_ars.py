"""Augmented Random Search (Mania et al., 2018), V1 (observation normalization is env-side)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from evokube_trainer.ec._base import EvoOptimizer
from evokube_trainer.ec._parts import (
    OptimizerFactory,
    ScheduleLike,
    SearchGradientState,
    ascend,
    check_mirrored,
    gaussian_population,
    gradient_ascent,
    init_ascent,
    schedule_value,
    top_k_indices,
)

ARSState = SearchGradientState


@dataclasses.dataclass(frozen=True)
class ARS(EvoOptimizer):
    """ARS over `pop_size // 2` mirrored directions delta_k.

    The population holds each `mean + sigma * delta_k` (even rows) next to its
    `mean - sigma * delta_k` (odd rows), as `gaussian_noise` lays out mirrored pairs.
    Directions are ranked by max(r+, r-); the top `num_top_directions` (b, all when None) give
    grad = sum_k (r+_k - r-_k) delta_k / (b * sigma_R), sigma_R the std of the 2b returns used.
    With the default `optax.sgd` the mean moves by `learning_rate * grad`, as in the paper.
    """

    sigma: ScheduleLike = 0.03
    learning_rate: ScheduleLike = 0.02
    num_top_directions: int | None = None
    optimizer: OptimizerFactory = optax.sgd
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        super().__post_init__()
        check_mirrored(True, self.pop_size)
        top = self._num_top()
        if not 1 <= top <= self.pop_size // 2:
            raise ValueError(f"num_top_directions must lie in [1, {self.pop_size // 2}], got {top}")

    def _num_top(self) -> int:
        if self.num_top_directions is None:
            return self.pop_size // 2
        return self.num_top_directions

    def _ascent(self) -> optax.GradientTransformation:
        return gradient_ascent(self.optimizer, self.learning_rate, self.weight_decay)

    def init(self, key: jax.Array, mean: jax.Array) -> ARSState:
        del key
        return init_ascent(self._ascent(), self._check_mean(mean))

    def ask(self, state: ARSState, key: jax.Array) -> tuple[jax.Array, ARSState]:
        sigma = schedule_value(self.sigma, state.generation)
        return gaussian_population(key, state.mean, sigma, self.pop_size, mirrored=True), state

    def _tell(
        self, state: ARSState, population: jax.Array, fitness: jax.Array
    ) -> tuple[ARSState, dict[str, jax.Array]]:
        sigma = schedule_value(self.sigma, state.generation)
        deltas = (population[0::2] - state.mean) / sigma  # [N, D]
        r_plus, r_minus = fitness[0::2], fitness[1::2]  # [N], [N]
        top = top_k_indices(jnp.maximum(r_plus, r_minus), self._num_top())  # [b]
        used = jnp.concatenate([r_plus[top], r_minus[top]])  # [2b]
        std = jnp.std(used)
        std = jnp.where(std > 0, std, 1.0)
        grad = (r_plus[top] - r_minus[top]) @ deltas[top] / (self._num_top() * std)  # [D]
        metrics = {"sigma": sigma, "returns_std": std, "grad_norm": jnp.linalg.norm(grad)}
        return ascend(self._ascent(), state, grad), metrics
