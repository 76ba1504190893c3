"""Fitness shaping: maps raw fitness [pop] to utilities [pop], higher still better.

Any callable with this signature can be passed where an optimizer takes `fitness_shaping`.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

FitnessShaping = Callable[[jax.Array], jax.Array]


def raw_fitness(fitness: jax.Array) -> jax.Array:
    """Fitness unchanged (as float32)."""
    return jnp.asarray(fitness, jnp.float32)


def centered_rank(fitness: jax.Array) -> jax.Array:
    """Ranks scaled to [-0.5, 0.5]: the worst gets -0.5, the best 0.5 (Salimans et al., 2017)."""
    size = fitness.shape[0]
    ranks = jnp.argsort(jnp.argsort(fitness))
    return ranks.astype(jnp.float32) / max(size - 1, 1) - 0.5


def z_score(fitness: jax.Array, eps: float = 1e-8) -> jax.Array:
    """Fitness minus its mean, over its standard deviation."""
    fitness = jnp.asarray(fitness, jnp.float32)
    return (fitness - fitness.mean()) / (fitness.std() + eps)
