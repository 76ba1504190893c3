"""The parts CMA-ES is composed of (Hansen's tutorial, arXiv:1604.00772).

`cma_constants` gives the learning rates of one population size; `evolve_paths`,
`adapt_covariance` and `adapt_step_size` are the updates of one tell, for either covariance
representation of `_covariance.py`. The updates read their constants with plain arithmetic, so
the constants may be Python floats (compile-time, one population size) or traced scalars (a
population size chosen at run time).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from evokube_trainer.ec._covariance import Covariance

Array = jax.Array


class CMAConstants(NamedTuple):
    weights: Array  # [mu] positive recombination weights, summing to 1
    c_sigma: float  # learning rate of the conjugate path p_sigma
    d_sigma: float  # step-size damping
    c_c: float  # learning rate of the path p_c
    c_1: float  # rank-one learning rate
    c_mu: float  # rank-mu learning rate
    chi_n: float  # E||N(0, I)||
    sigma_gain: float  # sqrt(c_sigma (2 - c_sigma) mu_eff): what a step adds to p_sigma
    c_gain: float  # sqrt(c_c (2 - c_c) mu_eff): what a step adds to p_c


def cma_constants(weights: np.ndarray, num_dims: int, covariance: Covariance) -> CMAConstants:
    """Hansen's default learning rates for recombination `weights` [mu] in `num_dims`; Python
    floats, so they stay compile-time constants under jit."""
    n = num_dims
    mu_eff = float(1.0 / np.sum(weights.astype(np.float64) ** 2))
    c_sigma = (mu_eff + 2) / (n + mu_eff + 5)
    d_sigma = 1 + 2 * max(0.0, math.sqrt((mu_eff - 1) / (n + 1)) - 1) + c_sigma
    c_c = (4 + mu_eff / n) / (n + 4 + 2 * mu_eff / n)
    c_1 = 2 / ((n + 1.3) ** 2 + mu_eff)
    c_mu = min(1 - c_1, 2 * (mu_eff - 2 + 1 / mu_eff) / ((n + 2) ** 2 + mu_eff))
    c_1, c_mu = covariance.rates(c_1, c_mu, n)
    chi_n = math.sqrt(n) * (1 - 1 / (4 * n) + 1 / (21 * n**2))
    sigma_gain = math.sqrt(c_sigma * (2 - c_sigma) * mu_eff)
    c_gain = math.sqrt(c_c * (2 - c_c) * mu_eff)
    return CMAConstants(
        jnp.asarray(weights), c_sigma, d_sigma, c_c, c_1, c_mu, chi_n, sigma_gain, c_gain
    )


def evolve_paths(
    c: CMAConstants, p_sigma: Array, p_c: Array, step: Array, whitened: Array, generations: Array
) -> tuple[Array, Array, Array]:
    """The paths p_sigma [D] and p_c [D] after the mean moved by `step` [D] (`whitened`:
    C^{-1/2} step) in the run's `generations`-th tell, and h_sigma [] (0 stalls p_c while
    p_sigma is long, so a too-small sigma does not blow up C)."""
    p_sigma = (1 - c.c_sigma) * p_sigma + c.sigma_gain * whitened
    stall_correction = jnp.sqrt(1 - (1 - c.c_sigma) ** (2 * generations))
    threshold = (1.4 + 2 / (step.shape[0] + 1)) * c.chi_n
    h_sigma = (jnp.linalg.norm(p_sigma) / stall_correction < threshold).astype(jnp.float32)
    p_c = (1 - c.c_c) * p_c + h_sigma * c.c_gain * step
    return p_sigma, p_c, h_sigma


def adapt_covariance(
    c: CMAConstants,
    covariance: Covariance,
    cov: Array,
    p_c: Array,
    steps: Array,
    h_sigma: Array,
) -> tuple[Array, Array | None, Array]:
    """C after the rank-one (p_c) and rank-mu (`steps` [mu, D], best first) updates, factored:
    (cov, basis, scale)."""
    rank_one, rank_mu = covariance.terms(p_c, steps, c.weights)
    lost_variance = (1 - h_sigma) * c.c_c * (2 - c.c_c)  # compensates a stalled p_c
    cov = (1 + c.c_1 * lost_variance - c.c_1 - c.c_mu) * cov + c.c_1 * rank_one + c.c_mu * rank_mu
    return covariance.factor(cov)


def adapt_step_size(c: CMAConstants, sigma: Array, p_sigma: Array) -> Array:
    """Cumulative step-size adaptation: sigma grows while p_sigma is longer than a random walk's
    (chi_n), shrinks while shorter."""
    return sigma * jnp.exp(c.c_sigma / c.d_sigma * (jnp.linalg.norm(p_sigma) / c.chi_n - 1))
