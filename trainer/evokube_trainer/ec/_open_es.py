"""OpenAI-ES (Salimans et al., 2017): a search-gradient estimate fed to an optax optimizer."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from evokube_trainer.ec._base import (
    OptimizerFactory,
    ScheduleLike,
    SearchGradient,
    SearchGradientState,
    fitness_stats,
    schedule_value,
)
from evokube_trainer.ec._shaping import FitnessShaping, centered_rank

OpenESState = SearchGradientState


@dataclasses.dataclass(frozen=True)
class OpenES(SearchGradient):
    """OpenAI-ES.

    grad = sum_i shaped_i * eps_i / (pop * sigma), with eps_i = (x_i - mean) / sigma; the mean
    then takes one `optimizer(learning_rate)` step up that gradient (Adam by default), with
    optional L2 weight decay (Salimans et al. used 0.005). `sigma` and `learning_rate` take a
    constant or an optax schedule of the generation.
    """

    sigma: ScheduleLike = 0.02
    learning_rate: ScheduleLike = 0.01
    optimizer: OptimizerFactory = optax.adam
    weight_decay: float = 0.0
    mirrored: bool = True
    fitness_shaping: FitnessShaping = centered_rank

    def tell(
        self, state: OpenESState, population: jax.Array, fitness: jax.Array
    ) -> tuple[OpenESState, dict[str, jax.Array]]:
        sigma = schedule_value(self.sigma, state.generation)
        noise = (population - state.mean) / sigma  # [pop, D]
        utilities = self.fitness_shaping(fitness)  # [pop]
        grad = utilities @ noise / (self.pop_size * sigma)  # [D]
        metrics = {**fitness_stats(fitness), "sigma": sigma, "grad_norm": jnp.linalg.norm(grad)}
        return self._ascend(state, grad), metrics
