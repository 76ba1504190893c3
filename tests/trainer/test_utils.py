"""Tests of evokube_trainer.utils: deep copy, key splitting, fitness reducers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

from evokube_trainer.utils import (
    episode_returns_to_fitness,
    masked_mean,
    split_keys,
    tree_deep_copy,
)


@struct.dataclass
class _Holder:
    values: jax.Array
    extra: dict


def test_deep_copy_shares_no_mutable_container_or_array():
    original = {
        "np": np.arange(3.0),
        "jax": jnp.arange(2.0),
        "nested": [{"a": np.zeros(2)}, (1, "x")],
        "holder": _Holder(values=jnp.ones(2), extra={"k": [1, 2]}),
        "leafset": {"a", "b"},
    }
    copied = tree_deep_copy(original)

    assert copied is not original
    assert copied["nested"] is not original["nested"]
    assert copied["nested"][0] is not original["nested"][0]
    assert copied["holder"].extra is not original["holder"].extra
    assert copied["holder"].extra["k"] is not original["holder"].extra["k"]

    copied["np"][0] = 99.0
    copied["nested"][0]["a"][1] = 5.0
    copied["nested"].append("new")
    copied["holder"].extra["k"].append(3)
    assert original["np"][0] == 0.0
    assert original["nested"][0]["a"][1] == 0.0
    assert len(original["nested"]) == 2
    assert original["holder"].extra["k"] == [1, 2]

    # JAX arrays get their own buffers: deleting the original leaves the copy alive.
    original["jax"].delete()
    np.testing.assert_array_equal(copied["jax"], [0.0, 1.0])
    # Non-pytree leaves (here a set) are deep-copied too.
    copied["leafset"].add("new")
    assert original["leafset"] == {"a", "b"}


def test_deep_copy_under_jit_is_identity():
    tree = {"a": jnp.arange(3.0), "b": [jnp.ones(2)]}
    out = jax.jit(tree_deep_copy)(tree)
    np.testing.assert_array_equal(out["a"], tree["a"])
    np.testing.assert_array_equal(out["b"][0], tree["b"][0])


def test_split_keys_single_raw_key_matches_jax_split():
    key = jax.random.PRNGKey(3)
    out = split_keys(key, 4)
    assert out.shape == (4, 2)
    np.testing.assert_array_equal(out, jax.random.split(key, 4))


def test_split_keys_batch_of_raw_keys():
    keys = jax.random.split(jax.random.PRNGKey(0), 6).reshape(2, 3, 2)
    out = split_keys(keys, 5)
    assert out.shape == (2, 3, 5, 2)
    np.testing.assert_array_equal(out[1, 2], jax.random.split(keys[1, 2], 5))
    # All produced keys are distinct.
    flat = np.asarray(out).reshape(-1, 2)
    assert len({tuple(row) for row in flat}) == flat.shape[0]


def test_split_keys_typed_keys_and_jit():
    keys = jax.random.split(jax.random.key(1), 3)  # typed [3]
    out = jax.jit(split_keys, static_argnums=1)(keys, 2)
    assert out.shape == (3, 2)
    np.testing.assert_array_equal(
        jax.random.key_data(out[2]), jax.random.key_data(jax.random.split(keys[2], 2))
    )
    single = split_keys(jax.random.key(1), 4)
    assert single.shape == (4,)


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
