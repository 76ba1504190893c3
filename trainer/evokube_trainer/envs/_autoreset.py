"""Episode bookkeeping: time limit, reset policy and per-episode metrics."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from evokube_trainer.envs._base import EnvState, Wrapper, as_flag, tree_where

AUTORESET_MODES = ("same_step", "next_step", "fast", "disabled")


@struct.dataclass
class AutoResetInner:
    env: EnvState  # the wrapped env's state
    key: jax.Array  # key for the next reset
    steps: jax.Array  # [] int32 agent steps taken in the current episode
    episode_return: jax.Array  # [] float32 reward summed over the current episode
    first: EnvState | None  # the wrapped env's state right after ``reset`` ("fast" mode only)


@dataclasses.dataclass(frozen=True)
class AutoReset(Wrapper):
    """Adds a time limit and a reset policy to an unbatched env.

    ``episode_length`` is counted in agent steps (calls to ``step``); reaching it sets
    ``truncated`` unless the same step also terminated (termination wins: no bootstrap).

    Modes, for the step ``t`` that ends an episode (``terminated or truncated``):
      - ``"same_step"``: step ``t`` already returns the first obs of a new episode (fresh reset
        with a new key); the real last obs is in ``info["final_obs"]``. The reset is computed
        on every step and selected where needed (no branching under jit).
      - ``"fast"``: like ``same_step``, but the new episode restarts from the state cached at
        ``reset`` (no reset computation; the env's own RNG stream is replayed too).
      - ``"next_step"``: step ``t`` returns the real last obs; step ``t+1`` ignores the action
        and returns a fresh reset with reward 0, no done flags and ``info["reset_step"] = 1``,
        so that learners can mask the transition ``obs_t -> obs_{t+1}``.
      - ``"disabled"``: one episode per env. Every later step returns step ``t``'s state
        unchanged except ``reward = 0`` and ``info["frozen"] = 1`` (done flags stay set).

    ``info`` always holds, per env:
      - ``final_obs`` ``[obs_dim]``: the obs the transition really reached (differs from
        ``obs`` only on a ``same_step``/``fast`` reset);
      - ``reset_step`` ``[]`` float32: 1 on a ``next_step`` reset step;
      - ``frozen`` ``[]`` float32: 1 once a ``disabled`` env has finished its episode;
      - ``episode_return`` ``[]`` float32: unscaled return of the episode this transition
        belongs to, up to and including it (the full return on its last step);
      - ``episode_length`` ``[]`` int32: that episode's length so far, in agent steps;
      - ``steps`` ``[]`` int32: the step counter of the returned state (0 right after a reset).
    """

    episode_length: int = 1000
    mode: str = "same_step"

    def __post_init__(self):
        if self.mode not in AUTORESET_MODES:
            raise ValueError(f"unknown autoreset {self.mode!r}; expected one of {AUTORESET_MODES}")
        if self.episode_length < 1:
            raise ValueError(f"episode_length must be >= 1, got {self.episode_length}")

    def reset(self, key: jax.Array) -> EnvState:
        key, reset_key = jax.random.split(key)
        env_state = self.env.reset(reset_key)
        zero_int = jnp.zeros((), jnp.int32)
        inner = AutoResetInner(
            env=env_state,
            key=key,
            steps=zero_int,
            episode_return=jnp.zeros((), jnp.float32),
            first=env_state if self.mode == "fast" else None,
        )
        return self._fresh(inner, env_state)

    def step(self, state: EnvState, action: jax.Array) -> EnvState:
        inner: AutoResetInner = state.inner
        if self.mode == "disabled":  # never resets: no key to draw (a TPU pays per split)
            key = reset_key = inner.key
        else:
            key, reset_key = jax.random.split(inner.key)
        nxt = self.env.step(inner.env, action)
        steps = inner.steps + 1
        episode_return = inner.episode_return + nxt.reward
        terminated = as_flag(nxt.terminated > 0)
        truncated = as_flag((steps >= self.episode_length) & (terminated == 0))
        done = (terminated + truncated) > 0
        info = dict(
            final_obs=nxt.obs,
            reset_step=jnp.zeros((), jnp.float32),
            frozen=jnp.zeros((), jnp.float32),
            episode_return=episode_return,
            episode_length=steps,
            steps=steps,
        )
        stepped = EnvState(
            inner=AutoResetInner(
                env=nxt, key=key, steps=steps, episode_return=episode_return, first=inner.first
            ),
            obs=nxt.obs,
            reward=nxt.reward,
            terminated=terminated,
            truncated=truncated,
            info=info,
        )
        if self.mode in ("same_step", "fast"):
            restart = inner.first if self.mode == "fast" else self.env.reset(reset_key)
            new_inner = stepped.inner.replace(
                env=tree_where(done, restart, nxt),
                steps=jnp.where(done, 0, steps),
                episode_return=jnp.where(done, 0.0, episode_return),
            )
            return stepped.replace(
                inner=new_inner,
                obs=jnp.where(done, restart.obs, nxt.obs),
                info={**info, "steps": new_inner.steps},
            )
        was_done = (state.terminated + state.truncated) > 0  # the previous step ended it
        if self.mode == "next_step":
            fresh = self._fresh(inner.replace(key=key), self.env.reset(reset_key))
            fresh = fresh.replace(info={**fresh.info, "reset_step": jnp.ones((), jnp.float32)})
            return tree_where(was_done, fresh, stepped)
        # "disabled"
        frozen = state.replace(
            reward=jnp.zeros_like(state.reward),
            info={**state.info, "frozen": jnp.ones((), jnp.float32)},
        )
        return tree_where(was_done, frozen, stepped)

    def _fresh(self, inner: AutoResetInner, env_state: EnvState) -> EnvState:
        """The state that starts an episode from ``env_state``."""
        zero = jnp.zeros((), jnp.float32)
        zero_int = jnp.zeros((), jnp.int32)
        return EnvState(
            inner=inner.replace(env=env_state, steps=zero_int, episode_return=zero),
            obs=env_state.obs,
            reward=zero,
            terminated=zero,
            truncated=zero,
            info=dict(
                final_obs=env_state.obs,
                reset_step=zero,
                frozen=zero,
                episode_return=zero,
                episode_length=zero_int,
                steps=zero_int,
            ),
        )
