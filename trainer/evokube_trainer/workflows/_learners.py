"""The gradient side of ERL: how RL learners plug into the one generation loop.

A learner is a static object with four pure methods, called by `Workflow.step` in this order:

    state, population, m = learner.improve(state, replay_state, population, key, obs_stats)
        # gradient steps from the shared replay buffer; may rewrite members (CEM-RL)
    actors, noise_std = learner.actors(state)
        # [k, D] extra actors rolled out next to the population, with their exploration scale
    state, population, fitness, m = learner.merge(
        state, generation, population, fitness, actor_fitness, key)
        # after evaluation, before `tell`: e.g. inject RL actors in place of the worst members,
        # or (PBT) let the worst members copy the best ones

Two learners cover the published algorithms, each for any RL agent (`agents.base.Agent`: TD3
or SAC; the agent's actor is what the population evolves):

* `IndependentAgents` (ERL, Khadka & Tumer 2018): K independent agents (actor AND critic each),
  stacked along a leading `[K]` axis and updated with `vmap`; their exploratory rollouts feed
  the buffer and, every `injection_interval` generations, they replace the K worst members.
* `SharedCritic` (CEM-RL, Pourchot & Sigaud 2019): ONE critic; the first K members of every
  population are trained against it and written back before evaluation.

`PopulationBasedTraining` (PBT, Jaderberg et al. 2017; `_pbt.py`) reuses `IndependentAgents`
with per-member hyperparameters and no EC population at all.

The replay buffer holds raw observations. With observation normalization on, `improve` gets the
workflow's statistics (frozen for the generation) and normalizes `obs` and `next_obs` of every
sampled batch before the losses see them (`normalized_batch`), as EvoRL's TD3 agent does in its
losses: stats that change never invalidate stored transitions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
from flax import struct

from evokube_trainer import metric_names as names
from evokube_trainer.agents import Agent
from evokube_trainer.agents.base import DRAW_AHEAD_BYTES, scan_sampled_updates
from evokube_trainer.ec import replace_worst
from evokube_trainer.envs import RunningStats, normalize_obs
from evokube_trainer.replay import ReplayBuffer, ReplayState, Transition

Array = jax.Array
Metrics = dict[str, Array]


class Learner(Protocol):
    """What `Workflow` needs from a learner (see the module docstring)."""

    def init(self, key: Array) -> Any: ...

    def improve(
        self,
        state: Any,
        replay: ReplayState,
        population: Array,
        key: Array,
        obs_stats: RunningStats | None = None,
    ) -> tuple[Any, Array, Metrics]: ...

    def actors(self, state: Any) -> tuple[Array, Array]: ...

    def merge(
        self,
        state: Any,
        generation: Array,
        population: Array,
        fitness: Array,
        actor_fitness: Array,
        key: Array,
    ) -> tuple[Any, Array, Array, Metrics]: ...


def _when_ready(ready: Array, train: Callable[[Any], tuple[Any, Metrics]], state: Any):
    """`train(state)` if `ready` (a traced bool), else `state` unchanged and zero metrics."""

    def skip(state):
        _, metric_shapes = jax.eval_shape(train, state)
        return state, jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes)

    return jax.lax.cond(ready, train, skip, state)


def _prefixed(metrics: Metrics, prefix: str = "rl/") -> Metrics:
    return {prefix + name: value for name, value in metrics.items()}


def normalized_batch(batch: Transition, obs_stats: RunningStats | None) -> Transition:
    """`batch` (any batch shape) with `obs` and `next_obs` normalized; as is when stats are None."""
    if obs_stats is None:
        return batch
    return batch.replace(
        obs=normalize_obs(obs_stats, batch.obs), next_obs=normalize_obs(obs_stats, batch.next_obs)
    )


@dataclasses.dataclass(frozen=True)
class IndependentAgents:
    """K independent RL agents learning from one shared buffer (ERL).

    `num_updates` gradient steps per agent and generation (the agent's own schedule inside,
    e.g. TD3's delayed actor updates); agents start learning once the buffer holds
    `learning_starts` transitions.
    """

    agent: Agent
    buffer: ReplayBuffer
    flatten: Callable[[Any], Array]  # actor params -> [D]
    num_agents: int
    num_updates: int
    injection_interval: int
    learning_starts: int

    def __post_init__(self):
        if self.num_agents < 1:
            raise ValueError(f"num_agents must be >= 1, got {self.num_agents}")
        if self.injection_interval < 1:
            raise ValueError(f"injection_interval must be >= 1, got {self.injection_interval}")

    def init(self, key: Array) -> Any:
        """K agents with their own actor and critic, leaves `[K, ...]`."""
        return jax.vmap(self.agent.init)(jax.random.split(key, self.num_agents))

    def improve(
        self,
        state: Any,
        replay: ReplayState,
        population: Array,
        key: Array,
        obs_stats: RunningStats | None = None,
    ) -> tuple[Any, Array, Metrics]:
        prepare = None if obs_stats is None else (lambda batch: normalized_batch(batch, obs_stats))

        def train(state):
            def one_agent(agent_state, agent_key: Array):
                return self.agent.update_many(
                    agent_state,
                    replay,
                    self.buffer,
                    agent_key,
                    self.num_updates,
                    prepare,
                    DRAW_AHEAD_BYTES // self.num_agents,  # the K agents run vmapped
                )

            state, metrics = jax.vmap(one_agent)(state, jax.random.split(key, self.num_agents))
            return state, jax.tree.map(jnp.mean, metrics)  # mean over the K agents

        ready = self.buffer.can_sample(replay, self.learning_starts)
        state, metrics = _when_ready(ready, train, state)
        return state, population, _prefixed(metrics)

    def actors(self, state: Any) -> tuple[Array, Array]:
        flat = jax.vmap(self.flatten)(state.actor.params)  # [K, D]
        scale = jnp.full((self.num_agents,), self.agent.exploration_scale, jnp.float32)
        return flat, scale

    def merge(
        self,
        state: Any,
        generation: Array,
        population: Array,
        fitness: Array,
        actor_fitness: Array,
        key: Array,
    ) -> tuple[Any, Array, Array, Metrics]:
        """Every `injection_interval` generations the K actors replace the K worst members,
        taking the fitness of their own (exploratory) rollouts with them."""
        del key
        inject = (generation + 1) % self.injection_interval == 0
        actors, _ = self.actors(state)
        injected, slots = replace_worst(population, fitness, actors)  # slots [K]
        population = jnp.where(inject, injected, population)
        fitness = jnp.where(inject, fitness.at[slots].set(actor_fitness), fitness)
        metrics = {
            names.ACTOR_RETURN_MEAN: jnp.mean(actor_fitness),
            "rl/actor_return_max": jnp.max(actor_fitness),
            "rl/injected": inject.astype(jnp.float32),
        }
        return state, population, fitness, metrics


@struct.dataclass
class SharedCriticState:
    critic: Any  # the agent's critic side (`agent.init_critic`), params leaves [num_critics, ...]
    step: Array  # [] int32 critic gradient steps so far (drives TD3's delayed actor updates)


@dataclasses.dataclass(frozen=True)
class SharedCritic:
    """CEM-RL: the first `num_actors` members of each population are trained against one
    shared critic, then written back in place before evaluation.

    Each generation, `num_updates` times: every actor gets its own replay batch and
    `agent.shared_update` takes one step of the critic side on the mean of the per-actor losses
    and of the actors against it (TD3: the actors every `actor_update_interval` steps, with the
    soft target updates; SAC: every step, with the shared temperature). Actors start from the
    sampled parameters with fresh optimizer state (and TD3 targets) each generation.
    """

    agent: Agent
    buffer: ReplayBuffer
    flatten: Callable[[Any], Array]  # actor params -> [D]
    unflatten: Callable[[Array], Any]  # [D] -> actor params
    num_dims: int  # D
    num_actors: int
    num_updates: int
    learning_starts: int

    def __post_init__(self):
        if self.num_actors < 1:
            raise ValueError(f"num_actors must be >= 1, got {self.num_actors}")

    def init(self, key: Array) -> SharedCriticState:
        return SharedCriticState(critic=self.agent.init_critic(key), step=jnp.zeros((), jnp.int32))

    def improve(
        self,
        state: SharedCriticState,
        replay: ReplayState,
        population: Array,
        key: Array,
        obs_stats: RunningStats | None = None,
    ) -> tuple[SharedCriticState, Array, Metrics]:
        agent, k = self.agent, self.num_actors
        params = jax.vmap(self.unflatten)(population[:k])  # leaves [K, ...]
        actors = jax.vmap(agent.actor_state_from_params)(params)

        def draw(step_key):
            sample_key, _ = jax.random.split(step_key)
            sample_keys = jax.random.split(sample_key, k)
            batches = jax.vmap(self.buffer.sample, in_axes=(None, 0))(replay, sample_keys)  # [K, B]
            return normalized_batch(batches, obs_stats)

        def one_update(carry, step_key, batches, actor_step):
            critic, actors, step = carry
            _, update_key = jax.random.split(step_key)
            critic, actors, metrics = agent.shared_update(
                critic, actors, step, batches, update_key, actor_step
            )
            return (critic, actors, step + 1), metrics

        def train(carry):
            keys = jax.random.split(key, self.num_updates)
            carry, metrics = scan_sampled_updates(one_update, carry, keys, agent.actor_period, draw)
            updated = metrics.pop("actor_updated")  # [U] 0/1
            summary = jax.tree.map(jnp.mean, metrics)
            # The actor loss averaged over the steps that really updated the actors.
            summary["actor_loss"] = jnp.sum(metrics["actor_loss"] * updated) / jnp.maximum(
                jnp.sum(updated), 1.0
            )
            return carry, summary

        ready = self.buffer.can_sample(replay, self.learning_starts)
        (critic, actors, step), metrics = _when_ready(
            ready, train, (state.critic, actors, state.step)
        )
        trained = jax.vmap(self.flatten)(actors.params)  # [K, D]
        population = population.at[:k].set(trained)
        return SharedCriticState(critic=critic, step=step), population, _prefixed(metrics)

    def actors(self, state: SharedCriticState) -> tuple[Array, Array]:
        del state  # no extra actors: the trained ones are population members
        return jnp.zeros((0, self.num_dims), jnp.float32), jnp.zeros((0,), jnp.float32)

    def merge(
        self,
        state: SharedCriticState,
        generation: Array,
        population: Array,
        fitness: Array,
        actor_fitness: Array,
        key: Array,
    ) -> tuple[SharedCriticState, Array, Array, Metrics]:
        del generation, actor_fitness, key
        metrics = {"rl/trained_fitness_mean": jnp.mean(fitness[: self.num_actors])}
        if fitness.shape[0] > self.num_actors:
            metrics["rl/sampled_fitness_mean"] = jnp.mean(fitness[self.num_actors :])
        return state, population, fitness, metrics
