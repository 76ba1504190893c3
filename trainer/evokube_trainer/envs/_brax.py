"""Adapter from a Brax environment to the Env API (one env, no resets, no time limit)."""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from brax import envs as brax_envs

from evokube_trainer.envs._base import Env, EnvState, as_flag
from evokube_trainer.envs._spaces import Box

BRAX_BACKENDS = ("generalized", "positional", "spring", "mjx")


def default_pipeline(name: str) -> str | None:
    """The pipeline Brax itself runs env `name` on when none is named (its class's `backend`
    default: `generalized` for every env of brax 0.14), read without building the env; what
    `brax.envs.get_environment` and EvoRL run, on every platform. None: an env without one."""
    parameter = inspect.signature(brax_envs._envs[name].__init__).parameters.get("backend")
    return None if parameter is None else parameter.default


def _backend(name: str | None) -> dict[str, str]:
    return {} if name is None else {"backend": name}


@dataclasses.dataclass(frozen=True)
class BraxEnv(Env):
    """One unwrapped Brax env (``reset(rng)``/``step(state, action)``).

    The action space is the actuators' control range (``sys.actuator.ctrl_range``, e.g.
    ``[-0.4, 0.4]`` for humanoid); unlimited actuators are given ``[-1, 1]``. Brax's ``done`` is
    reported as termination; the time limit belongs to ``AutoReset``.
    """

    env: Any  # brax.envs.base.Env, unwrapped
    obs_dim: int
    action_space: Box
    num_envs: None = None

    @classmethod
    def create(cls, name: str, backend: str | None = None, **env_kwargs) -> BraxEnv:
        """`backend` None: Brax's own default for the env (`default_pipeline`), the same
        physics on every platform; the pipeline a run really uses is `backend` afterwards."""
        if backend is not None and backend not in BRAX_BACKENDS:
            raise ValueError(f"unknown Brax backend {backend!r}; expected one of {BRAX_BACKENDS}")
        env = brax_envs.get_environment(name, **env_kwargs, **_backend(backend))
        obs = jax.eval_shape(env.reset, jax.random.key(0)).obs
        if not hasattr(obs, "shape"):
            raise ValueError(f"Brax env {name!r} has dict observations, which are not supported")
        ctrl_range = np.asarray(env.sys.actuator.ctrl_range, np.float32)  # [act, 2]
        limited = np.all(np.isfinite(ctrl_range), axis=-1)
        low = np.where(limited, ctrl_range[:, 0], -1.0)
        high = np.where(limited, ctrl_range[:, 1], 1.0)
        return cls(
            env=env,
            obs_dim=int(np.prod(obs.shape)),
            action_space=Box(low, high, (env.action_size,)),
        )

    @property
    def backend(self) -> str:
        return self.env.backend

    @property
    def default_episode_length(self) -> int:
        return 1000

    def reset(self, key: jax.Array) -> EnvState:
        brax_state = self.env.reset(key)
        return self._wrap(brax_state, jnp.zeros((), jnp.float32))

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        brax_state = self.env.step(state.inner, action)
        return self._wrap(brax_state, jnp.asarray(brax_state.reward, jnp.float32))

    def _wrap(self, brax_state: Any, reward: jax.Array) -> EnvState:
        return EnvState(
            inner=brax_state,
            obs=jnp.asarray(brax_state.obs, jnp.float32).reshape(self.obs_dim),  # [obs_dim]
            reward=reward.reshape(()),
            terminated=as_flag(brax_state.done).reshape(()),
            truncated=jnp.zeros((), jnp.float32),
            info={},
        )
