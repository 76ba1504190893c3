"""OpenAI-ES (Salimans et al., 2017): a search-gradient estimate fed to an optax optimizer."""

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
)
from evokube_trainer.ec._shaping import FitnessShaping, centered_rank

OpenESState = SearchGradientState


@dataclasses.dataclass(frozen=True)
class OpenES(EvoOptimizer):
    """OpenAI-ES.

    grad = sum_i shaped_i * eps_i / (pop * sigma), with eps_i = (x_i - mean) / sigma; the mean
    then takes one `optimizer(learning_rate)` step up that gradient (Adam by default), with
    optional L2 weight decay (Salimans et al. used 0.005). `sigma` and `learning_rate` take a
    constant or an optax schedule of the generation. Fitness is shaped by centred ranks.
    """

    sigma: ScheduleLike = 0.02
    learning_rate: ScheduleLike = 0.01
    optimizer: OptimizerFactory = optax.adam
    weight_decay: float = 0.0
    mirrored: bool = True
    fitness_shaping: FitnessShaping = dataclasses.field(default=centered_rank, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        check_mirrored(self.mirrored, self.pop_size)

    def _ascent(self) -> optax.GradientTransformation:
        return gradient_ascent(self.optimizer, self.learning_rate, self.weight_decay)

    def init(self, key: jax.Array, mean: jax.Array) -> OpenESState:
        del key
        return init_ascent(self._ascent(), self._check_mean(mean))

    def ask(self, state: OpenESState, key: jax.Array) -> tuple[jax.Array, OpenESState]:
        sigma = schedule_value(self.sigma, state.generation)
        return gaussian_population(key, state.mean, sigma, self.pop_size, self.mirrored), state

    def _tell(
        self, state: OpenESState, population: jax.Array, fitness: jax.Array
    ) -> tuple[OpenESState, dict[str, jax.Array]]:
        sigma = schedule_value(self.sigma, state.generation)
        noise = (population - state.mean) / sigma  # [pop, D]
        grad = fitness @ noise / (self.pop_size * sigma)  # [D]
        metrics = {"sigma": sigma, "grad_norm": jnp.linalg.norm(grad)}
        return ascend(self._ascent(), state, grad), metrics
