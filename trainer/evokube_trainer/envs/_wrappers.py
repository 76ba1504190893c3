"""Stateless wrappers: action mapping, action repeat, reward scale, batching."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from evokube_trainer.envs._base import DelegatingEnv, EnvState, Wrapper, tree_where
from evokube_trainer.envs._spaces import Box, Discrete, Space

SQUASH_MODES = ("clip", "tanh", None)


def squash_action(action: jax.Array, space: Space, mode: str | None = "clip") -> jax.Array:
    """Map policy outputs to env actions. ``action``: ``[..., action_dim]``.

    Box spaces (result ``[..., size]`` in ``[low, high]``):
      - ``"clip"``: clip to ``[-1, 1]``, then map affinely onto ``[low, high]``;
      - ``"tanh"``: ``tanh`` (any real input), then the same affine map;
      - ``None``: the action is already in env units and is only clipped to ``[low, high]``.

    Discrete spaces (result ``[...]`` int32), whatever ``mode``: a float vector of ``n`` scores
    becomes its argmax; integer actions (shape ``[...]``) pass through, clipped into range.
    """
    if mode not in SQUASH_MODES:
        raise ValueError(f"unknown action squash {mode!r}; expected one of {SQUASH_MODES}")
    action = jnp.asarray(action)
    if isinstance(space, Discrete):
        if jnp.issubdtype(action.dtype, jnp.integer):
            return jnp.clip(action, 0, space.n - 1).astype(jnp.int32)
        return jnp.argmax(action, axis=-1).astype(jnp.int32)
    low = jnp.asarray(space.low.ravel())  # [size]
    high = jnp.asarray(space.high.ravel())  # [size]
    action = action.astype(jnp.float32)
    if mode is None:
        return jnp.clip(action, low, high)
    unit = jnp.tanh(action) if mode == "tanh" else jnp.clip(action, -1.0, 1.0)
    return low + 0.5 * (unit + 1.0) * (high - low)


@dataclasses.dataclass(frozen=True)
class ActionTransform(Wrapper):
    """Applies ``squash_action`` to every action before the wrapped (unbatched) env sees it."""

    mode: str | None = "clip"

    def __post_init__(self):
        if self.mode not in SQUASH_MODES:
            raise ValueError(f"unknown action squash {self.mode!r}; expected one of {SQUASH_MODES}")

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        env_action = squash_action(action, self.action_space, self.mode)
        if isinstance(self.action_space, Box):
            env_action = env_action.reshape(self.action_space.shape)
        return self.env.step(state, env_action)


@dataclasses.dataclass(frozen=True)
class ActionRepeat(Wrapper):
    """Repeats each action ``repeat`` times on an unbatched env and sums the rewards.

    Once the env terminates inside the repeat, the remaining sub-steps are skipped (state kept,
    reward 0). Time limits are counted above this wrapper, in agent steps.
    """

    repeat: int = 1

    def __post_init__(self):
        if self.repeat < 1:
            raise ValueError(f"action repeat must be >= 1, got {self.repeat}")

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        first = self.env.step(state, action)

        def sub_step(carry, _):
            current, total = carry
            nxt = self.env.step(current, action)
            ended = current.terminated > 0
            current = tree_where(ended, current, nxt)
            total = total + jnp.where(ended, 0.0, nxt.reward)
            return (current, total), None

        (last, total), _ = jax.lax.scan(
            sub_step, (first, first.reward), None, length=self.repeat - 1
        )
        return last.replace(reward=total)


@dataclasses.dataclass(frozen=True)
class RewardScale(Wrapper):
    """Multiplies ``state.reward`` by ``scale``; ``info["episode_return"]`` stays unscaled."""

    scale: float = 1.0

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        state = self.env.step(state, action)
        return state.replace(reward=state.reward * jnp.float32(self.scale))


@dataclasses.dataclass(frozen=True)
class VmapEnv(DelegatingEnv):
    """``num_envs`` independent copies of an unbatched env, stepped with ``jax.vmap``.

    ``reset`` splits its key into one per copy; ``step`` takes actions ``[num_envs, ...]``.
    """

    num_envs: int  # type: ignore[assignment]

    def __post_init__(self):
        if self.num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {self.num_envs}")
        if self.env.num_envs is not None:
            raise ValueError("VmapEnv wraps an unbatched env")

    def reset(self, key: jax.Array) -> EnvState:
        keys = jax.random.split(key, self.num_envs)
        return jax.vmap(self.env.reset)(keys)

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        return jax.vmap(self.env.step)(state, action)
