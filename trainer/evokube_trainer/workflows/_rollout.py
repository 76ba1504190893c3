"""Rollouts of whole populations of actors, and random warm-up data.

`PopulationRollout.run` plays `K` fixed-length episodes for each of `N` flat parameter vectors
at once: the population axis is a `vmap` over the batched env (`K` copies in "disabled"
autoreset mode, so each copy plays exactly one episode and then freezes), and time is a
`lax.scan` of `episode_length` steps. Nothing loops over individuals in Python.

Shapes: `N` members, `K` episodes per member, `T` steps per episode.

Exploration: each member has a scale (`noise_std`, 0 for the population's deterministic
policies); every step draws standard normal noise `[N, K, act]` and a member acts
`explore(params, obs, noise, scale)`: the agent's own exploration (TD3: additive Gaussian noise
of std `scale`; SAC: a sample of its stochastic actor), or additive noise on `policy` when the
rollout has no `explore`. `noise_std=None` means every member acts with `policy` alone: no noise
is drawn (on a TPU the per-step draw was a quarter of a Pendulum rollout's time).

Observation normalization: given `obs_stats`, every policy call sees
`normalize_obs(obs_stats, obs)` while the env, the transitions and the recorded statistics keep
the raw observations; `collect_obs_stats` also returns, per member, the running statistics of
the raw observations it acted on (the workflow pools them into its next generation's stats).

Recording: `record_states` also returns every env state acted on (`policies.play` renders
one episode from them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from evokube_trainer.agents.base import additive_noise
from evokube_trainer.envs import (
    Env,
    EnvState,
    RunningStats,
    init_running_stats,
    normalize_obs,
    update_running_stats,
)
from evokube_trainer.replay import Transition

Array = jax.Array
Params = Any
PolicyFn = Callable[[Params, Array], Array]  # (params, obs [..., obs_dim]) -> action [..., act]
# (params, obs [..., obs_dim], noise [..., act] ~ N(0, 1), scale []) -> action [..., act]
ExploreFn = Callable[[Params, Array, Array, Array], Array]


@struct.dataclass
class RolloutResult:
    episode_returns: Array  # [N, K] undiscounted, unscaled return of each episode
    episode_lengths: Array  # [N, K] int32 agent steps until the episode ended
    # [N] int32 agent steps each member actually took (frozen envs excluded); at most T * K
    # (< 2**30 within the CRD's bounds), summed into the two-word count by `add_member_steps`
    env_steps: Array
    transitions: Transition | None  # leaves [T, N, K, ...] when collected, else None
    valid: Array | None  # [T, N, K] float32 1 where a transition really happened
    # per member, the raw observations it acted on (count [N], mean and m2 [N, obs_dim]) when
    # collected, else None
    obs_stats: RunningStats | None = None
    # the states acted on, leaves [T, N, K, ...], when recorded, else None: step t's state
    # before its action (the reset state first); info["frozen"] marks those after the episode
    states: EnvState | None = None


def transition_from_step(obs: Array, action: Array, nxt: EnvState) -> Transition:
    """The transition `obs --action--> nxt`, with the true next obs (before any reset)."""
    return Transition(
        obs=obs,
        action=action,
        reward=nxt.reward,
        next_obs=nxt.info["final_obs"],
        terminated=nxt.terminated,
        truncated=nxt.truncated,
    )


def flatten_leading(tree: Any, num_axes: int) -> Any:
    """Merges the first `num_axes` axes of every leaf into one."""
    return jax.tree.map(lambda x: x.reshape((-1, *x.shape[num_axes:])), tree)


def members_call(fn: Callable[..., Array], member_major: bool = False) -> Callable[..., Array]:
    """`fn`, a function over members (every argument leads with the population axis `[N, ...]`,
    its result `[N, ...]`), that vmapped once more (the seeds axis of `Workflow.seeds`) folds
    that outer axis into the population: it calls `fn` once on `[S * N, ...]` instead of
    batching it to `[S, N, ...]`. On a TPU the per-member matmuls of a policy batched `[S, N]`
    ran as multiply-reduce fusions 50x slower than the same members in one batch
    (`benchmarks/seeds_bench.py --profile`). The fold is seed-major, a free reshape; with
    `member_major` (a population sharded over devices) it is `[N * S]`, so that every device
    keeps its members, at the cost of a transpose each call (on one TPU chip the transposed
    layout kept the matmuls as slow as before). The values are the same either way."""

    @jax.custom_batching.custom_vmap
    def call(*args):
        return fn(*args)

    @call.def_vmap
    def folded(axis_size: int, in_batched, *args):
        def fold(x: Array, batched: bool) -> Array:
            x = x if batched else jnp.broadcast_to(x, (axis_size, *x.shape))
            x = jnp.swapaxes(x, 0, 1) if member_major else x
            return x.reshape((-1, *x.shape[2:]))

        def unfold(y: Array) -> Array:  # -> [S, N, ...]
            if member_major:
                return jnp.swapaxes(y.reshape((-1, axis_size, *y.shape[1:])), 0, 1)
            return y.reshape((axis_size, -1, *y.shape[1:]))

        out = fn(*jax.tree.map(fold, list(args), list(in_batched)))
        return jax.tree.map(unfold, out), jax.tree.map(lambda _: True, out)

    return call


@dataclasses.dataclass(frozen=True)
class PopulationRollout:
    """Plays `env.num_envs` episodes (K) for every member of a population of actors.

    `env` must be batched with autoreset "disabled" and a time limit of `episode_length`, so
    after `episode_length` steps every episode has ended and its return is final.
    `unflatten` maps one flat vector `[D]` to the policy's parameters. `explore` is the
    agent's exploratory action (see the module docstring); None: `additive_noise` on `policy`.
    `members_sharded`: the population is split over devices (see `members_call`).
    """

    env: Env
    policy: PolicyFn
    unflatten: Callable[[Array], Params]
    episode_length: int
    explore: ExploreFn | None = None
    members_sharded: bool = False

    def act(self, params: Params, obs: Array, noise: Array, scale: Array) -> Array:
        """One member's actions `[K, act]` for obs `[K, obs]`; scale 0: the deterministic policy."""
        if self.explore is None:
            return additive_noise(self.policy(params, obs), noise, scale)
        return self.explore(params, obs, noise, scale)

    def run(
        self,
        flat_params: Array,
        noise_std: Array | None,
        key: Array,
        *,
        collect_transitions: bool = False,
        obs_stats: RunningStats | None = None,
        collect_obs_stats: bool = False,
        record_states: bool = False,
    ) -> RolloutResult:
        """`flat_params` `[N, D]`; `noise_std` `[N]` exploration scale per member (0 for the
        deterministic policy; see `act`), or None when every member acts deterministically.
        `obs_stats`: the (frozen) statistics the policy's observations are normalized with;
        None feeds raw observations. `collect_obs_stats`: also return each member's statistics
        of the raw observations it acted on.
        `record_states`: also return the env states acted on (`RolloutResult.states`)."""
        num_members = flat_params.shape[0]
        params = jax.vmap(self.unflatten)(flat_params)  # leaves [N, ...]
        reset_key, noise_key = jax.random.split(key)
        env_state = jax.vmap(self.env.reset)(jax.random.split(reset_key, num_members))  # [N, K]
        seen = None
        if collect_obs_stats:
            empty = init_running_stats(self.env.obs_dim)
            seen = jax.tree.map(lambda x: jnp.broadcast_to(x, (num_members, *x.shape)), empty)

        policy = members_call(jax.vmap(self.policy), self.members_sharded)
        act = members_call(jax.vmap(self.act), self.members_sharded)

        def one_step(carry, step_key: Array):
            state, seen = carry
            obs = state.obs  # [N, K, obs] raw
            policy_obs = obs if obs_stats is None else normalize_obs(obs_stats, obs)
            if noise_std is None:
                action = policy(params, policy_obs)  # [N, K, act]
            else:
                noise = jax.random.normal(step_key, (*obs.shape[:-1], self.env.action_dim))
                action = act(params, policy_obs, noise, noise_std)
            nxt = jax.vmap(self.env.step)(state, action)
            valid = 1.0 - nxt.info["frozen"]  # [N, K]: obs was acted on in a live episode
            if seen is not None:
                seen = jax.vmap(update_running_stats)(seen, obs, valid)
            transition = transition_from_step(obs, action, nxt) if collect_transitions else None
            return (nxt, seen), (transition, valid, state if record_states else None)

        step_keys = jax.random.split(noise_key, self.episode_length)
        (final, seen), (transitions, valid, states) = jax.lax.scan(
            one_step, (env_state, seen), step_keys
        )
        return RolloutResult(
            episode_returns=final.info["episode_return"],  # [N, K]
            episode_lengths=final.info["episode_length"],  # [N, K]
            env_steps=jnp.sum(valid.astype(jnp.int32), axis=(0, 2)),  # [N], exact in int32
            transitions=transitions,  # [T, N, K, ...] or None
            valid=valid if collect_transitions else None,  # [T, N, K]
            obs_stats=seen,  # [N] or None
            states=states,  # [T, N, K] or None
        )


def random_transitions(env: Env, num_steps: int, key: Array) -> Transition:
    """`num_steps` steps of uniform random actions in [-1, 1] on the batched env `env` (which
    should reset itself, e.g. autoreset "same_step"). Returns leaves `[num_steps * B, ...]`."""
    reset_key, action_key = jax.random.split(key)
    state = env.reset(reset_key)  # [B]
    action_shape = (env.num_envs, env.action_dim)

    def one_step(state: EnvState, step_key: Array):
        action = jax.random.uniform(step_key, action_shape, jnp.float32, -1.0, 1.0)  # [B, act]
        nxt = env.step(state, action)
        return nxt, transition_from_step(state.obs, action, nxt)

    _, transitions = jax.lax.scan(one_step, state, jax.random.split(action_key, num_steps))
    return flatten_leading(transitions, 2)  # [num_steps * B, ...]
