"""The two ways CMA-ES stores, factors and applies its covariance C: the full matrix (CMA-ES) or
its diagonal (sep-CMA-ES). Stateless and hashable; the optimizer's state holds (cov, basis,
scale), where `scale` [D] is the square roots of C's eigenvalues."""

from __future__ import annotations

import abc

import jax
import jax.numpy as jnp

Array = jax.Array
_MIN_EIGENVALUE = 1e-20


class Covariance(abc.ABC):
    """One representation of C: the only place where full and separable CMA-ES differ."""

    @abc.abstractmethod
    def rates(self, c_1: float, c_mu: float, num_dims: int) -> tuple[float, float]:
        """The rank-one and rank-mu learning rates, from Hansen's defaults."""

    @abc.abstractmethod
    def initial(self, num_dims: int) -> tuple[Array, Array | None]:
        """C = I: (cov, basis)."""

    @abc.abstractmethod
    def color(self, basis: Array | None, scale: Array, z: Array) -> Array:
        """z [pop, D] ~ N(0, I) -> y ~ N(0, C)."""

    @abc.abstractmethod
    def whiten(self, basis: Array | None, scale: Array, y: Array) -> Array:
        """C^{-1/2} y for y [D]."""

    @abc.abstractmethod
    def terms(self, p_c: Array, steps: Array, weights: Array) -> tuple[Array, Array]:
        """Rank-one p_c p_c^T and rank-mu sum_i w_i y_i y_i^T terms, for steps [mu, D]."""

    @abc.abstractmethod
    def factor(self, cov: Array) -> tuple[Array, Array | None, Array]:
        """(cov, basis, scale) of an updated `cov`, repaired to stay positive definite."""


class FullCovariance(Covariance):
    """C [D, D], eigendecomposed with `jnp.linalg.eigh` every tell: fine for small networks (D up
    to a few thousand), traced, no host trips. `basis` [D, D] holds the eigenvectors (columns)."""

    def rates(self, c_1: float, c_mu: float, num_dims: int) -> tuple[float, float]:
        return c_1, c_mu

    def initial(self, num_dims: int) -> tuple[Array, Array | None]:
        eye = jnp.eye(num_dims, dtype=jnp.float32)
        return eye, eye

    def color(self, basis: Array | None, scale: Array, z: Array) -> Array:
        assert basis is not None
        return (z * scale) @ basis.T  # y = B diag(scale) z

    def whiten(self, basis: Array | None, scale: Array, y: Array) -> Array:
        assert basis is not None
        return basis @ ((basis.T @ y) / scale)

    def terms(self, p_c: Array, steps: Array, weights: Array) -> tuple[Array, Array]:
        return jnp.outer(p_c, p_c), (steps * weights[:, None]).T @ steps

    def factor(self, cov: Array) -> tuple[Array, Array | None, Array]:
        cov = 0.5 * (cov + cov.T)
        eigenvalues, basis = jnp.linalg.eigh(cov)
        return cov, basis, jnp.sqrt(jnp.maximum(eigenvalues, _MIN_EIGENVALUE))


class DiagonalCovariance(Covariance):
    """diag(C) [D] (Ros & Hansen, 2008): O(pop * D) memory and time, so it scales to full policy
    networks; the learning rates are raised by (D + 2) / 3 since there are D entries to learn,
    not D^2. No basis (None)."""

    def rates(self, c_1: float, c_mu: float, num_dims: int) -> tuple[float, float]:
        boost = (num_dims + 2) / 3
        c_1 = min(1.0, c_1 * boost)
        return c_1, min(1.0 - c_1, c_mu * boost)

    def initial(self, num_dims: int) -> tuple[Array, Array | None]:
        return jnp.ones((num_dims,), jnp.float32), None

    def color(self, basis: Array | None, scale: Array, z: Array) -> Array:
        return z * scale

    def whiten(self, basis: Array | None, scale: Array, y: Array) -> Array:
        return y / scale

    def terms(self, p_c: Array, steps: Array, weights: Array) -> tuple[Array, Array]:
        return p_c * p_c, weights @ (steps * steps)

    def factor(self, cov: Array) -> tuple[Array, Array | None, Array]:
        cov = jnp.maximum(cov, _MIN_EIGENVALUE)
        return cov, None, jnp.sqrt(cov)


FULL = FullCovariance()
DIAGONAL = DiagonalCovariance()
