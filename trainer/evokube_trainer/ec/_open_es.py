"""OpenAI-ES (Salimans et al., 2017): a search-gradient estimate fed to an optax optimizer."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from flax import struct

from evokube_trainer.ec._base import (
    EvoOptimizer,
    OptimizerFactory,
    ScheduleLike,
    ascent_step,
    check_mirrored,
    fitness_stats,
    gaussian_noise,
    gradient_ascent,
    schedule_value,
)
from evokube_trainer.ec._shaping import FitnessShaping, centered_rank


@struct.dataclass
class OpenESState:
    mean: jax.Array  # [D]
    opt_state: optax.OptState  # the optax state of the mean update
    generation: jax.Array  # [] int32, number of tells so far


@dataclasses.dataclass(frozen=True)
class OpenES(EvoOptimizer):
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

    def __post_init__(self) -> None:
        super().__post_init__()
        check_mirrored(self.mirrored, self.pop_size)

    def _transform(self) -> optax.GradientTransformation:
        return gradient_ascent(self.optimizer, self.learning_rate, self.weight_decay)

    def init(self, key: jax.Array, mean: jax.Array) -> OpenESState:
        del key
        mean = self._check_mean(mean)
        return OpenESState(
            mean=mean,
            opt_state=self._transform().init(mean),
            generation=jnp.zeros((), jnp.int32),
        )

    def ask(self, state: OpenESState, key: jax.Array) -> tuple[jax.Array, OpenESState]:
        sigma = schedule_value(self.sigma, state.generation)
        noise = gaussian_noise(key, self.pop_size, self.num_dims, self.mirrored)
        return state.mean + sigma * noise, state

    def tell(
        self, state: OpenESState, population: jax.Array, fitness: jax.Array
    ) -> tuple[OpenESState, dict[str, jax.Array]]:
        sigma = schedule_value(self.sigma, state.generation)
        noise = (population - state.mean) / sigma  # [pop, D]
        utilities = self.fitness_shaping(fitness)  # [pop]
        grad = utilities @ noise / (self.pop_size * sigma)  # [D]
        mean, opt_state = ascent_step(self._transform(), state.opt_state, state.mean, grad)
        metrics = {**fitness_stats(fitness), "sigma": sigma, "grad_norm": jnp.linalg.norm(grad)}
        state = state.replace(mean=mean, opt_state=opt_state, generation=state.generation + 1)
        return state, metrics
