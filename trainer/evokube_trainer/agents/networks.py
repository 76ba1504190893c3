"""MLP actors and critics (flax linen) and the glue that lets EC evolve actors.

Networks are linen modules used only through their pure `init`/`apply`, so parameters are plain
pytrees that live in the caller's state. `ParamFlattener` bridges them to the EC side: it turns
one actor's parameter pytree into a flat float32 vector `[D]` and back (built on
`jax.flatten_util.ravel_pytree`); EC optimizers only ever see the flat vectors, and callers vmap
it over a population.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, cast

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree

__all__ = [
    "MLP",
    "Actor",
    "GaussianActor",
    "ParamFlattener",
    "TwinCritic",
    "deterministic_policy",
]

Array = jax.Array
Params = Any


class MLP(nn.Module):
    """Dense layers with an activation (and optional LayerNorm) after every hidden layer."""

    hidden_sizes: Sequence[int]
    output_size: int
    activation: Callable[[Array], Array] = nn.relu
    layer_norm: bool = False

    @nn.compact
    def __call__(self, x: Array) -> Array:
        for size in self.hidden_sizes:
            x = nn.Dense(size)(x)
            if self.layer_norm:
                x = nn.LayerNorm()(x)
            x = self.activation(x)
        return nn.Dense(self.output_size)(x)


class Actor(nn.Module):
    """Deterministic policy: obs `[..., obs_dim]` -> action `[..., action_dim]` in [-1, 1]."""

    action_dim: int
    hidden_sizes: Sequence[int] = (256, 256)
    activation: Callable[[Array], Array] = nn.relu

    @nn.compact
    def __call__(self, obs: Array) -> Array:
        x = MLP(self.hidden_sizes, self.action_dim, self.activation)(obs)
        return jnp.tanh(x)


class GaussianActor(nn.Module):
    """Stochastic policy for SAC: obs `[..., obs_dim]` -> (mean, log_std), each
    `[..., action_dim]`, of a Gaussian over pre-tanh actions.

    A shared MLP trunk feeds two linear heads. `log_std` is squashed smoothly into
    [log_std_min, log_std_max] (tanh rescaling, as in CleanRL's SAC) rather than clipped, so its
    gradient never vanishes at the bounds. The deterministic policy is `tanh(mean)`.
    """

    action_dim: int
    hidden_sizes: Sequence[int] = (256, 256)
    activation: Callable[[Array], Array] = nn.relu
    log_std_min: float = -5.0
    log_std_max: float = 2.0

    @nn.compact
    def __call__(self, obs: Array) -> tuple[Array, Array]:
        x = obs
        for size in self.hidden_sizes:
            x = self.activation(nn.Dense(size)(x))
        mean = nn.Dense(self.action_dim, name="mean")(x)
        log_std = jnp.tanh(nn.Dense(self.action_dim, name="log_std")(x))  # [-1, 1]
        log_std = self.log_std_min + 0.5 * (self.log_std_max - self.log_std_min) * (log_std + 1.0)
        return mean, log_std


def deterministic_policy(network: Actor | GaussianActor, params: Params, obs: Array) -> Array:
    """The action a deployed actor takes for obs `[..., obs_dim]`: an `Actor`'s output, or
    `tanh(mean)` of a `GaussianActor`. Training's evaluation and exported policies share it."""
    if isinstance(network, GaussianActor):
        mean, _ = network.apply(params, obs)
        return jnp.tanh(mean)
    return cast(Array, network.apply(params, obs))


class TwinCritic(nn.Module):
    """`num_critics` independent Q networks evaluated together.

    (obs `[..., obs_dim]`, action `[..., action_dim]`) -> Q `[num_critics, ...]`. The heads share
    no parameters: `nn.vmap` stacks each head's parameters along a leading axis, which runs all
    heads as one batched matmul instead of `num_critics` small ones.
    """

    hidden_sizes: Sequence[int] = (256, 256)
    layer_norm: bool = False
    num_critics: int = 2
    activation: Callable[[Array], Array] = nn.relu

    @nn.compact
    def __call__(self, obs: Array, action: Array) -> Array:
        heads = nn.vmap(
            MLP,
            variable_axes={"params": 0},
            split_rngs={"params": True},
            in_axes=None,
            out_axes=0,
            axis_size=self.num_critics,
        )
        x = jnp.concatenate([obs, action], axis=-1)
        q = heads(self.hidden_sizes, 1, self.activation, self.layer_norm)(x)
        return q[..., 0]  # [num_critics, ...]


@dataclasses.dataclass(frozen=True)
class ParamFlattener:
    """Converts between a parameter pytree and a flat float32 vector `[num_dims]`.

    Build it once from example parameters (`ParamFlattener.from_params(params)`); the tree
    structure, shapes and dtypes are fixed from then on.
    """

    num_dims: int
    unravel: Callable[[Array], Params]

    @classmethod
    def from_params(cls, params: Params) -> ParamFlattener:
        flat, unravel = ravel_pytree(params)
        return cls(num_dims=int(flat.shape[0]), unravel=unravel)

    def flatten(self, params: Params) -> Array:
        """params -> `[D]`."""
        return ravel_pytree(params)[0]

    def unflatten(self, flat: Array) -> Params:
        """`[D]` -> params."""
        if flat.shape != (self.num_dims,):
            raise ValueError(
                f"expected a flat vector of shape ({self.num_dims},), got {flat.shape}"
            )
        return self.unravel(flat)
