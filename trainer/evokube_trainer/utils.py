"""Small pytree and PRNG-key helpers shared by the workflows.

Everything here is a pure function. `split_keys` and the fitness reducers are jittable;
`tree_deep_copy` is a host-side helper (it also works on traced values, where it is a no-op
rebuild of the containers).
"""

from __future__ import annotations

import copy
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np

__all__ = [
    "episode_returns_to_fitness",
    "is_typed_key",
    "masked_mean",
    "split_keys",
    "tree_deep_copy",
]

Array = jax.Array


def tree_deep_copy(tree: Any, *, copy_jax_arrays: bool = True) -> Any:
    """Returns a copy of `tree` that shares no mutable object with it.

    Containers that JAX knows as pytree nodes (dicts, lists, tuples, dataclasses registered with
    `flax.struct`, ...) are rebuilt, so mutating a dict or list of the copy never touches the
    original. Leaves are copied by kind:

    * NumPy arrays: `np.array(x, copy=True)`.
    * JAX arrays: a fresh device buffer when `copy_jax_arrays` (the default). JAX arrays are
      immutable, but a buffer can still be invalidated by donation (`donate_argnums`); a copy
      keeps a snapshot (for example the best state so far) alive when the original is donated.
    * Tracers, Python numbers, strings, bytes and None: kept (immutable).
    * Anything else that JAX treats as a leaf (a set, an arbitrary object): `copy.deepcopy`.
    """

    def copy_leaf(x: Any) -> Any:
        if isinstance(x, jax.core.Tracer):
            return x
        if isinstance(x, jax.Array):
            return jnp.array(x, copy=True) if copy_jax_arrays else x
        if isinstance(x, np.ndarray):
            return np.array(x, copy=True)
        if isinstance(x, (int, float, complex, bool, str, bytes, np.generic)) or x is None:
            return x
        return copy.deepcopy(x)

    return jax.tree.map(copy_leaf, tree)


def is_typed_key(key: Array) -> bool:
    """True for new-style typed keys (`jax.random.key`), False for raw uint32 `[..., 2]` keys."""
    return jnp.issubdtype(key.dtype, jax.dtypes.prng_key)


def split_keys(key_or_keys: Array, num: int) -> Array:
    """Splits one key or a batch of keys into `num` keys each.

    Raw uint32 keys: `[2] -> [num, 2]` and `[..., 2] -> [..., num, 2]`. Typed keys (from
    `jax.random.key`): `[] -> [num]` and `[...] -> [..., num]`. The batch of a single key is
    treated exactly like `jax.random.split`, so `split_keys(k, n)[i]` for a batch equals
    `jax.random.split(k[i], n)`.
    """
    keys = jnp.asarray(key_or_keys)
    batch_shape = keys.shape if is_typed_key(keys) else keys.shape[:-1]
    if not batch_shape:
        return jax.random.split(keys, num)
    key_shape = keys.shape[len(batch_shape) :]
    flat = keys.reshape((-1, *key_shape))
    split = jax.vmap(lambda k: jax.random.split(k, num))(flat)  # [prod(batch), num, *key]
    return split.reshape((*batch_shape, num, *key_shape))


def masked_mean(values: Array, mask: Array | None = None, axis: int = -1, empty_value=jnp.nan):
    """Mean of `values` over `axis`, counting only entries where `mask` is true.

    Rows with no valid entry get `empty_value` (NaN by default, so an individual that finished
    no episode is visible instead of silently scoring 0).
    """
    values = jnp.asarray(values, jnp.float32)
    if mask is None:
        return jnp.mean(values, axis=axis)
    mask = jnp.asarray(mask, jnp.float32)
    total = jnp.sum(values * mask, axis=axis)
    count = jnp.sum(mask, axis=axis)
    return jnp.where(count > 0, total / jnp.maximum(count, 1.0), empty_value)


def episode_returns_to_fitness(
    episode_returns: Array,
    mask: Array | None = None,
    *,
    reduction: Literal["mean", "min", "max", "median"] = "mean",
    empty_value: float = float("nan"),
) -> Array:
    """Reduces per-episode returns `[pop, K]` to one fitness per individual `[pop]`.

    `mask` `[pop, K]` (optional) marks which episodes finished and count. `reduction="mean"` is
    the usual ERL fitness; `"min"` is a pessimistic alternative for noisy tasks. Rows without any
    counted episode get `empty_value`.
    """
    returns = jnp.asarray(episode_returns, jnp.float32)  # [pop, K]
    if returns.ndim != 2:
        raise ValueError(f"episode_returns must be [pop, K], got shape {returns.shape}")
    if reduction == "mean":
        return masked_mean(returns, mask, axis=-1, empty_value=empty_value)
    valid = jnp.ones_like(returns, bool) if mask is None else jnp.asarray(mask, bool)
    any_valid = jnp.any(valid, axis=-1)
    if reduction == "min":
        out = jnp.min(jnp.where(valid, returns, jnp.inf), axis=-1)
    elif reduction == "max":
        out = jnp.max(jnp.where(valid, returns, -jnp.inf), axis=-1)
    elif reduction == "median":
        out = jnp.nanmedian(jnp.where(valid, returns, jnp.nan), axis=-1)
    else:
        raise ValueError(f"unknown reduction {reduction!r}; use mean, min, max or median")
    return jnp.where(any_valid, out, empty_value)
