"""Shared by the agent tests (test_td3.py, test_sac.py): random transition batches of a small
task and comparisons of parameter pytrees."""

import jax
import jax.numpy as jnp
import numpy as np

from evokube_trainer.replay import Transition

OBS_DIM, ACTION_DIM, BATCH = 3, 2, 16


def random_batch(key, n=BATCH, terminated=None, truncated=None) -> Transition:
    """`n` random transitions; `terminated` and `truncated` default to all zeros."""
    k1, k2, k3, k4 = jax.random.split(key, 4)
    zeros = jnp.zeros(n)
    return Transition(
        obs=jax.random.normal(k1, (n, OBS_DIM)),
        action=jax.random.uniform(k2, (n, ACTION_DIM), minval=-1.0, maxval=1.0),
        reward=jax.random.normal(k3, (n,)),
        next_obs=jax.random.normal(k4, (n, OBS_DIM)),
        terminated=zeros if terminated is None else jnp.asarray(terminated, jnp.float32),
        truncated=zeros if truncated is None else jnp.asarray(truncated, jnp.float32),
    )


def trees_allclose(a, b, **kw) -> bool:
    return all(
        np.allclose(x, y, **kw) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def trees_equal(a, b) -> bool:
    return all(
        np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )
