"""Tests of evokube_trainer.utils: the fitness reducers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evokube_trainer.utils import episode_returns_to_fitness, masked_mean


def test_fitness_is_mean_over_episodes():
    returns = jnp.array([[1.0, 3.0], [-2.0, -4.0], [10.0, 0.0]])  # [pop=3, K=2]
    fitness = jax.jit(episode_returns_to_fitness)(returns)
    assert fitness.shape == (3,)
    np.testing.assert_allclose(fitness, [2.0, -3.0, 5.0])


def test_fitness_with_mask_and_other_reductions():
    returns = jnp.array([[1.0, 3.0, 100.0], [-2.0, -4.0, 7.0], [5.0, 6.0, 7.0]])
    mask = jnp.array([[1, 1, 0], [1, 0, 0], [0, 0, 0]], bool)
    np.testing.assert_allclose(
        episode_returns_to_fitness(returns, mask)[:2], [2.0, -2.0], rtol=1e-6
    )
    assert jnp.isnan(episode_returns_to_fitness(returns, mask)[2])
    np.testing.assert_allclose(episode_returns_to_fitness(returns, mask, empty_value=-1e9)[2], -1e9)
    np.testing.assert_allclose(
        episode_returns_to_fitness(returns, mask, reduction="min", empty_value=0.0),
        [1.0, -2.0, 0.0],
    )
    np.testing.assert_allclose(
        episode_returns_to_fitness(returns, reduction="max"), [100.0, 7.0, 7.0]
    )
    np.testing.assert_allclose(
        episode_returns_to_fitness(returns, reduction="median"), [3.0, -2.0, 6.0]
    )
    with pytest.raises(ValueError, match="pop, K"):
        episode_returns_to_fitness(jnp.zeros(3))
    with pytest.raises(ValueError, match="unknown reduction"):
        episode_returns_to_fitness(returns, reduction="mode")


def test_masked_mean_without_mask():
    np.testing.assert_allclose(masked_mean(jnp.array([[1.0, 2.0], [3.0, 5.0]])), [1.5, 4.0])
