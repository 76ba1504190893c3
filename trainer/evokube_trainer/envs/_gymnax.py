"""Adapter from a gymnax environment to the Env API (one env, no resets, no time limit)."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import sys
import types
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from evokube_trainer.envs._base import Env, EnvState, as_flag, strong_types
from evokube_trainer.envs._spaces import Box, Discrete, Space


def _load_on_first_use(*names: str) -> None:
    """Stand-in modules that import the real one when an attribute is first read.

    gymnax imports seaborn and matplotlib.pyplot at module level for rendering, which the
    trainer never does; importing them cost over 2 s of the trainer's start-up on 2 CPUs
    (`python -X importtime`). Whoever renders still gets the real modules, loaded then.
    (importlib's LazyLoader does not help: the import statement itself reads `__spec__`.)
    """
    for name in names:
        if name in sys.modules or importlib.util.find_spec(name) is None:
            continue
        stand_in = _stand_in(name)
        sys.modules[name] = stand_in
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(sys.modules[parent], child, stand_in)


def _stand_in(name: str) -> types.ModuleType:
    stand_in = types.ModuleType(name, f"{name}, imported on first use")

    def real_attribute(attr: str) -> Any:
        if sys.modules.get(name) is stand_in:
            del sys.modules[name]
        return getattr(importlib.import_module(name), attr)

    stand_in.__getattr__ = real_attribute  # type: ignore[method-assign]
    return stand_in


def _gymnax() -> types.ModuleType:
    """gymnax, imported on the first gymnax env: importing it runs a jitted computation (its
    FrozenLake module), which opens JAX's default device. A trainer that starts the chip in
    the background (`distributed.open_devices_in_background`) would otherwise wait for it in
    its imports, so the imports and the chip's start-up (5.5-8.6 s on a TPU v5e) could not
    overlap; and a Brax workload needs no gymnax at all."""
    _load_on_first_use("seaborn", "matplotlib.pyplot")
    import gymnax

    return gymnax


@struct.dataclass
class GymnaxInner:
    env_state: Any  # the gymnax EnvState
    key: jax.Array  # [2] key for the env's own stochastic transitions


def _convert_space(space: Any) -> Space:
    from gymnax.environments import spaces as gymnax_spaces

    if isinstance(space, gymnax_spaces.Discrete):
        return Discrete(int(space.n))
    if isinstance(space, gymnax_spaces.Box):
        return Box(np.asarray(space.low), np.asarray(space.high), tuple(space.shape))
    raise ValueError(f"unsupported gymnax action space {space!r}")


@dataclasses.dataclass(frozen=True)
class GymnaxEnv(Env):
    """One gymnax env driven through ``reset_env``/``step_env``.

    gymnax's own ``step`` resets inside the call and applies the env's default time limit; this
    adapter bypasses both, so it reports only the env's true termination. ``AutoReset`` adds the
    time limit and the reset policy. Observations are flattened to ``[obs_dim]`` float32.

    Discrete actions are integer scalars here; ``ActionTransform`` turns score vectors into them.
    """

    env: Any  # gymnax.environments.environment.Environment
    params: Any  # its EnvParams (a hashable flax struct)
    obs_dim: int
    action_space: Space
    num_envs: None = None

    @classmethod
    def create(cls, env_id: str, **env_kwargs) -> GymnaxEnv:
        env, params = _gymnax().make(env_id, **env_kwargs)
        obs_shape = jax.eval_shape(env.reset_env, jax.random.key(0), params)[0].shape
        return cls(
            env=env,
            params=params,
            obs_dim=int(np.prod(obs_shape)),
            action_space=_convert_space(env.action_space(params)),
        )

    @property
    def default_episode_length(self) -> int:
        return int(self.params.max_steps_in_episode)

    def reset(self, key: jax.Array) -> EnvState:
        key, reset_key = jax.random.split(key)
        obs, env_state = self.env.reset_env(reset_key, self.params)
        zero = jnp.zeros((), jnp.float32)
        return EnvState(
            inner=GymnaxInner(env_state=strong_types(env_state), key=key),
            obs=self._flat(obs),
            reward=zero,
            terminated=zero,
            truncated=zero,
            info={},
        )

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        key, step_key = jax.random.split(state.inner.key)
        obs, env_state, reward, terminated, _ = self.env.step_env(
            step_key, state.inner.env_state, action, self.params
        )
        return EnvState(
            inner=GymnaxInner(env_state=env_state, key=key),
            obs=self._flat(obs),
            reward=jnp.asarray(reward, jnp.float32).reshape(()),
            terminated=as_flag(terminated).reshape(()),
            truncated=jnp.zeros((), jnp.float32),
            info={},
        )

    def _flat(self, obs: jax.Array) -> jax.Array:
        return jnp.asarray(obs, jnp.float32).reshape(self.obs_dim)  # [obs_dim]
