"""Separable cross-entropy method as used by CEM-RL (Pourchot & Sigaud, 2019)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from evokube_trainer.ec._base import EvoOptimizer
from evokube_trainer.ec._parts import (
    check_mirrored,
    gaussian_noise,
    log_rank_weights,
    resolve_num_elites,
    top_k_indices,
)


@struct.dataclass
class SepCEMState:
    mean: jax.Array  # [D]
    cov: jax.Array  # [D] diagonal covariance (variances, not standard deviations)
    damp: jax.Array  # [] extra variance added each tell, decaying towards damp_limit
    elite: jax.Array  # [D] best member of the last population told
    generation: jax.Array  # [] int32


@dataclasses.dataclass(frozen=True)
class SepCEM(EvoOptimizer):
    """sep-CEM with CEM-RL's update, on whatever population `tell` receives.

    CEM-RL trains half the offspring with TD3 and writes them back before `tell`; the update
    therefore reads `population`, never the samples of `ask`:

        damp <- tau * damp + (1 - tau) * damp_limit
        z_i  = x_(i) - mean_old over the `num_elites` best (pop // 2 when None)
        mean <- sum_i w_i x_(i),   w_i ∝ log((num_elites + 1) / i)
        cov  <- sum_i w_i z_i**2 / num_elites + damp

    The `1 / num_elites` factor is CEM-RL's. `init_cov` is CEM-RL's `sigma_init` (a variance).
    With `elitism`, the last member asked is the previous best instead of a fresh sample.
    """

    num_elites: int | None = None
    init_cov: float = 1e-3
    damp: float = 1e-3
    damp_limit: float = 1e-5
    tau: float = 0.95
    mirrored: bool = False
    elitism: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        resolve_num_elites(self.num_elites, self.pop_size)
        check_mirrored(self.mirrored, self.pop_size)

    def init(self, key: jax.Array, mean: jax.Array) -> SepCEMState:
        del key
        mean = self._check_mean(mean)
        return SepCEMState(
            mean=mean,
            cov=jnp.full((self.num_dims,), self.init_cov, jnp.float32),
            damp=jnp.asarray(self.damp, jnp.float32),
            elite=mean,
            generation=jnp.zeros((), jnp.int32),
        )

    def ask(self, state: SepCEMState, key: jax.Array) -> tuple[jax.Array, SepCEMState]:
        noise = gaussian_noise(key, self.pop_size, self.num_dims, self.mirrored)
        population = state.mean + noise * jnp.sqrt(state.cov)
        if self.elitism:
            population = population.at[-1].set(state.elite)
        return population, state

    def _tell(
        self, state: SepCEMState, population: jax.Array, fitness: jax.Array
    ) -> tuple[SepCEMState, dict[str, jax.Array]]:
        count = resolve_num_elites(self.num_elites, self.pop_size)
        weights = log_rank_weights(count, offset=1.0)  # [mu]
        order = top_k_indices(fitness, count)  # [mu]
        elites = population[order]  # [mu, D]
        damp = self.tau * state.damp + (1.0 - self.tau) * self.damp_limit
        deviations = elites - state.mean  # [mu, D]
        cov = weights @ (deviations * deviations) / count + damp
        state = state.replace(mean=weights @ elites, cov=cov, damp=damp, elite=elites[0])
        return state, {"cov_mean": cov.mean(), "damp": damp}
