"""CMA-ES (Hansen's tutorial, arXiv:1604.00772) with full or diagonal (sep-CMA-ES) covariance.

Both variants run the same update, composed of the parts in `_cma_parts.py`; they differ only in
their covariance representation (`_covariance.py`: `FULL` or `DIAGONAL`).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from evokube_trainer.ec._base import EvoOptimizer
from evokube_trainer.ec._cma_parts import (
    CMAConstants,
    adapt_covariance,
    adapt_step_size,
    cma_constants,
    evolve_paths,
)
from evokube_trainer.ec._covariance import DIAGONAL, FULL, Covariance
from evokube_trainer.ec._parts import log_rank_weights, resolve_num_elites, top_k_indices


@struct.dataclass
class CMAESState:
    mean: jax.Array  # [D]
    sigma: jax.Array  # [] global step size
    p_sigma: jax.Array  # [D] conjugate evolution path (step-size control)
    p_c: jax.Array  # [D] evolution path (rank-one update)
    cov: jax.Array  # [D, D] full covariance, or [D] its diagonal (SepCMAES)
    basis: jax.Array | None  # [D, D] eigenvectors of cov (columns); None for SepCMAES
    scale: jax.Array  # [D] square roots of the eigenvalues (of the diagonal for SepCMAES)
    generation: jax.Array  # [] int32


@dataclasses.dataclass(frozen=True)
class CMAES(EvoOptimizer):
    """CMA-ES with full covariance; Hansen's default learning rates, positive weights only.

    `num_elites` is mu (pop // 2 when None), `init_sigma` the initial step size. (Hansen's default
    population is 4 + floor(3 ln D); the manifest sets `population.size`.)
    """

    covariance: ClassVar[Covariance] = FULL
    num_elites: int | None = None
    init_sigma: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        resolve_num_elites(self.num_elites, self.pop_size)

    def _constants(self) -> CMAConstants:
        weights = log_rank_weights(resolve_num_elites(self.num_elites, self.pop_size))
        return cma_constants(weights, self.num_dims, self.covariance)

    def init(self, key: jax.Array, mean: jax.Array) -> CMAESState:
        del key
        cov, basis = self.covariance.initial(self.num_dims)
        zeros = jnp.zeros((self.num_dims,), jnp.float32)
        return CMAESState(
            mean=self._check_mean(mean),
            sigma=jnp.asarray(self.init_sigma, jnp.float32),
            p_sigma=zeros,
            p_c=zeros,
            cov=cov,
            basis=basis,
            scale=jnp.ones((self.num_dims,), jnp.float32),
            generation=jnp.zeros((), jnp.int32),
        )

    def ask(self, state: CMAESState, key: jax.Array) -> tuple[jax.Array, CMAESState]:
        z = jax.random.normal(key, (self.pop_size, self.num_dims), jnp.float32)
        return state.mean + state.sigma * self.covariance.color(state.basis, state.scale, z), state

    def _tell(
        self, state: CMAESState, population: jax.Array, fitness: jax.Array
    ) -> tuple[CMAESState, dict[str, jax.Array]]:
        c = self._constants()
        steps = (population - state.mean) / state.sigma  # [pop, D]
        steps = steps[top_k_indices(fitness, c.weights.shape[0])]  # [mu, D], best first
        step = c.weights @ steps  # [D]
        whitened = self.covariance.whiten(state.basis, state.scale, step)  # [D]
        generations = (state.generation + 1).astype(jnp.float32)
        p_sigma, p_c, h_sigma = evolve_paths(
            c, state.p_sigma, state.p_c, step, whitened, generations
        )
        cov, basis, scale = adapt_covariance(c, self.covariance, state.cov, p_c, steps, h_sigma)
        sigma = adapt_step_size(c, state.sigma, p_sigma)
        state = state.replace(
            mean=state.mean + state.sigma * step,
            sigma=sigma,
            p_sigma=p_sigma,
            p_c=p_c,
            cov=cov,
            basis=basis,
            scale=scale,
        )
        return state, {"sigma": sigma, "axis_ratio": scale.max() / scale.min()}


@dataclasses.dataclass(frozen=True)
class SepCMAES(CMAES):
    """sep-CMA-ES (Ros & Hansen, 2008): CMA-ES over a diagonal covariance, O(pop * D) memory
    and time, so it scales to full policy networks (`DiagonalCovariance`)."""

    covariance: ClassVar[Covariance] = DIAGONAL
