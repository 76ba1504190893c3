"""The Env API: an explicit state pytree and a static env object that steps it."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from evokube_trainer.envs._spaces import Space, action_dim


@struct.dataclass
class EnvState:
    """Everything an env returns; shapes shown for a batched env of ``B`` copies.

    An unbatched env has the same fields without the leading ``B``.
    """

    inner: Any  # backend / wrapped-env state, opaque to callers
    obs: jax.Array  # [B, obs_dim] float32
    reward: jax.Array  # [B] float32, reward of the transition that produced ``obs``
    terminated: jax.Array  # [B] float32 0/1: the episode truly ended, do not bootstrap
    truncated: jax.Array  # [B] float32 0/1: time limit hit, bootstrap from info["final_obs"]
    info: dict  # str -> [B, ...] arrays; see ``AutoReset`` for the keys it guarantees


class Env:
    """Static env logic: ``reset(key) -> EnvState`` and ``step(state, action) -> EnvState``.

    Concrete envs are frozen dataclasses (hashable, safe to close over in jitted functions) and
    expose ``obs_dim: int``, ``action_space: Box | Discrete`` and ``num_envs: int | None`` (None
    for a single, unbatched env). Neither method may branch in Python on traced values.
    """

    obs_dim: int
    action_space: Space
    num_envs: int | None

    def reset(self, key: jax.Array) -> EnvState:
        raise NotImplementedError

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        raise NotImplementedError

    @property
    def action_dim(self) -> int:
        """Length of the action vector ``step`` expects (per env)."""
        return action_dim(self.action_space)

    @property
    def unwrapped(self) -> Env:
        return self


@dataclasses.dataclass(frozen=True)
class DelegatingEnv(Env):
    """An env built on ``env`` that keeps its ``obs_dim``, ``action_space`` and unwrapped env.

    The common base of ``Wrapper`` (which also keeps ``num_envs``) and ``VmapEnv`` (which has
    ``num_envs`` as its own field: a subclass cannot turn an inherited property into a field).
    """

    env: Env

    @property
    def obs_dim(self) -> int:  # type: ignore[override]
        return self.env.obs_dim

    @property
    def action_space(self) -> Space:  # type: ignore[override]
        return self.env.action_space

    @property
    def unwrapped(self) -> Env:
        return self.env.unwrapped


@dataclasses.dataclass(frozen=True)
class Wrapper(DelegatingEnv):
    """An env that delegates to ``env`` and changes part of its behaviour."""

    @property
    def num_envs(self) -> int | None:  # type: ignore[override]
        return self.env.num_envs

    def reset(self, key: jax.Array) -> EnvState:
        return self.env.reset(key)

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        return self.env.step(state, action)


def tree_where(cond: jax.Array, on_true: Any, on_false: Any) -> Any:
    """Leafwise ``jnp.where`` of two pytrees with the same structure.

    ``cond`` has the batch shape (``[]`` per env) and is broadcast over each leaf's trailing axes.
    """

    def pick(a, b):
        a = jnp.asarray(a)
        c = jnp.reshape(cond, cond.shape + (1,) * (a.ndim - cond.ndim))
        return jnp.where(c, a, b)

    return jax.tree.map(pick, on_true, on_false)


def strong_types(tree: Any) -> Any:
    """Every leaf as a JAX array of fixed (not weak) dtype, so that states built from Python
    scalars in ``reset`` have the same types as states coming out of ``step``."""
    return jax.tree.map(lambda x: jax.lax.convert_element_type(x, jnp.asarray(x).dtype), tree)


def as_flag(x: jax.Array) -> jax.Array:
    """A boolean/number array as float32 0/1."""
    return jnp.asarray(x).astype(jnp.float32)
