"""CMA-ES (Hansen's tutorial, arXiv:1604.00772) with full or diagonal (sep-CMA-ES) covariance.

Both variants share the update; they differ only in how the covariance is stored, factored and
applied (four small methods). The full variant eigendecomposes C with `jnp.linalg.eigh` inside
`tell` every generation: fine for small networks (D up to a few thousand), traced, no host trips.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from evokube_trainer.ec._base import EvoOptimizer
from evokube_trainer.ec._parts import log_rank_weights, resolve_num_elites, top_k_indices

_MIN_EIGENVALUE = 1e-20


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


class _Constants(NamedTuple):
    weights: jax.Array  # [mu] positive recombination weights, summing to 1
    mu_eff: float
    c_sigma: float
    d_sigma: float
    c_c: float
    c_1: float
    c_mu: float
    chi_n: float  # E||N(0, I)||


@dataclasses.dataclass(frozen=True)
class CMAES(EvoOptimizer):
    """CMA-ES with full covariance; Hansen's default learning rates, positive weights only.

    `num_elites` is mu (pop // 2 when None), `init_sigma` the initial step size. (Hansen's default
    population is 4 + floor(3 ln D); the manifest sets `population.size`.)
    """

    num_elites: int | None = None
    init_sigma: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        resolve_num_elites(self.num_elites, self.pop_size)

    def _constants(self) -> _Constants:
        n = self.num_dims
        weights = log_rank_weights(resolve_num_elites(self.num_elites, self.pop_size))
        mu_eff = float(1.0 / np.sum(weights.astype(np.float64) ** 2))  # a Python float under jit
        c_sigma = (mu_eff + 2) / (n + mu_eff + 5)
        d_sigma = 1 + 2 * max(0.0, math.sqrt((mu_eff - 1) / (n + 1)) - 1) + c_sigma
        c_c = (4 + mu_eff / n) / (n + 4 + 2 * mu_eff / n)
        c_1 = 2 / ((n + 1.3) ** 2 + mu_eff)
        c_mu = min(1 - c_1, 2 * (mu_eff - 2 + 1 / mu_eff) / ((n + 2) ** 2 + mu_eff))
        c_1, c_mu = self._covariance_rates(c_1, c_mu)
        chi_n = math.sqrt(n) * (1 - 1 / (4 * n) + 1 / (21 * n**2))
        return _Constants(jnp.asarray(weights), mu_eff, c_sigma, d_sigma, c_c, c_1, c_mu, chi_n)

    # The four places where the covariance representation matters.

    def _covariance_rates(self, c_1: float, c_mu: float) -> tuple[float, float]:
        return c_1, c_mu

    def _initial_covariance(self) -> tuple[jax.Array, jax.Array | None]:
        eye = jnp.eye(self.num_dims, dtype=jnp.float32)
        return eye, eye

    def _color(self, state: CMAESState, z: jax.Array) -> jax.Array:
        """z [pop, D] ~ N(0, I) -> y ~ N(0, C): y = B diag(scale) z."""
        assert state.basis is not None
        return (z * state.scale) @ state.basis.T

    def _whiten(self, state: CMAESState, y: jax.Array) -> jax.Array:
        """C^{-1/2} y for y [D]."""
        assert state.basis is not None
        return state.basis @ ((state.basis.T @ y) / state.scale)

    def _covariance_terms(
        self, p_c: jax.Array, steps: jax.Array, weights: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """Rank-one p_c p_c^T and rank-mu sum_i w_i y_i y_i^T terms, for steps [mu, D]."""
        return jnp.outer(p_c, p_c), (steps * weights[:, None]).T @ steps

    def _factor(self, cov: jax.Array) -> tuple[jax.Array, jax.Array | None, jax.Array]:
        cov = 0.5 * (cov + cov.T)
        eigenvalues, basis = jnp.linalg.eigh(cov)
        return cov, basis, jnp.sqrt(jnp.maximum(eigenvalues, _MIN_EIGENVALUE))

    # The shared algorithm.

    def init(self, key: jax.Array, mean: jax.Array) -> CMAESState:
        del key
        cov, basis = self._initial_covariance()
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
        return state.mean + state.sigma * self._color(state, z), state

    def _tell(
        self, state: CMAESState, population: jax.Array, fitness: jax.Array
    ) -> tuple[CMAESState, dict[str, jax.Array]]:
        c = self._constants()
        steps = (population - state.mean) / state.sigma  # [pop, D]
        steps = steps[top_k_indices(fitness, c.weights.shape[0])]  # [mu, D], best first
        step = c.weights @ steps  # [D]
        mean = state.mean + state.sigma * step

        p_sigma = (1 - c.c_sigma) * state.p_sigma + math.sqrt(
            c.c_sigma * (2 - c.c_sigma) * c.mu_eff
        ) * self._whiten(state, step)
        p_sigma_norm = jnp.linalg.norm(p_sigma)
        generations = (state.generation + 1).astype(jnp.float32)
        stall_correction = jnp.sqrt(1 - (1 - c.c_sigma) ** (2 * generations))
        threshold = (1.4 + 2 / (self.num_dims + 1)) * c.chi_n
        h_sigma = (p_sigma_norm / stall_correction < threshold).astype(jnp.float32)
        p_c = (1 - c.c_c) * state.p_c + h_sigma * math.sqrt(c.c_c * (2 - c.c_c) * c.mu_eff) * step

        rank_one, rank_mu = self._covariance_terms(p_c, steps, c.weights)
        lost_variance = (1 - h_sigma) * c.c_c * (2 - c.c_c)  # compensates a stalled p_c
        cov = (
            (1 + c.c_1 * lost_variance - c.c_1 - c.c_mu) * state.cov
            + c.c_1 * rank_one
            + c.c_mu * rank_mu
        )
        cov, basis, scale = self._factor(cov)
        sigma = state.sigma * jnp.exp(c.c_sigma / c.d_sigma * (p_sigma_norm / c.chi_n - 1))

        state = state.replace(
            mean=mean,
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
    """sep-CMA-ES (Ros & Hansen, 2008): diagonal covariance, learning rates times (D + 2) / 3.

    Memory and time are O(pop * D), so it scales to full policy networks.
    """

    def _covariance_rates(self, c_1: float, c_mu: float) -> tuple[float, float]:
        boost = (self.num_dims + 2) / 3
        c_1 = min(1.0, c_1 * boost)
        return c_1, min(1.0 - c_1, c_mu * boost)

    def _initial_covariance(self) -> tuple[jax.Array, jax.Array | None]:
        return jnp.ones((self.num_dims,), jnp.float32), None

    def _color(self, state: CMAESState, z: jax.Array) -> jax.Array:
        return z * state.scale

    def _whiten(self, state: CMAESState, y: jax.Array) -> jax.Array:
        return y / state.scale

    def _covariance_terms(
        self, p_c: jax.Array, steps: jax.Array, weights: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        return p_c * p_c, weights @ (steps * steps)

    def _factor(self, cov: jax.Array) -> tuple[jax.Array, jax.Array | None, jax.Array]:
        cov = jnp.maximum(cov, _MIN_EIGENVALUE)
        return cov, None, jnp.sqrt(cov)
