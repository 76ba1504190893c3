"""`make_workflow`: the static `Workflow` of a config, of any kind (`_kinds.py`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from evokube_trainer.agents import (
    SAC,
    TD3,
    Actor,
    GaussianActor,
    ParamFlattener,
    SACConfig,
    deterministic_policy,
)
from evokube_trainer.envs import Box
from evokube_trainer.replay import ReplayBuffer
from evokube_trainer.workflows._configs import (
    WorkflowConfig,
    env_from_config,
    episode_length_of,
)
from evokube_trainer.workflows._kinds import LearnerParts, kind_of
from evokube_trainer.workflows._layout import DeviceLayout
from evokube_trainer.workflows._optimizers import make_optimizer
from evokube_trainer.workflows._rollout import PopulationRollout
from evokube_trainer.workflows._workflow import Workflow

Array = jax.Array

# Platforms whose replicas' replay batches are gathered one buffer at a time
# (`ReplayBuffer.replicas_in_turn`), measured by `benchmarks/replay_gather_bench.py`: on a TPU
# v5e, 8 replicas' draw of one field took 7.0 ms in turn against 13.2 ms batched (and the 8-seed
# CEM-RL program ran 16% faster); on the CPU, their transitions' draw 57 ms against 41 ms, so it
# stays batched there. GPUs are unmeasured and keep the batched gather.
REPLICAS_IN_TURN_PLATFORMS = ("tpu",)


@dataclasses.dataclass(frozen=True)
class _Actor:
    """Initialization and deterministic action of one actor network (a hashable stand-in for
    closures)."""

    network: Actor
    obs_dim: int

    def init(self, key: Array) -> Any:
        return self.network.init(key, jnp.zeros((self.obs_dim,), jnp.float32))

    def policy(self, params: Any, obs: Array) -> Array:
        return deterministic_policy(self.network, params, obs)


def make_agent(config: WorkflowConfig, obs_dim: int, action_dim: int) -> TD3 | SAC | None:
    """The RL agent of a config whose kind learns (TD3 or SAC); None for pure EC."""
    if not kind_of(config).learns:
        return None
    agent_config = config.agent
    return (SAC if isinstance(agent_config, SACConfig) else TD3)(agent_config, obs_dim, action_dim)


def actor_network(config: WorkflowConfig, obs_dim: int, action_dim: int) -> Actor | GaussianActor:
    """The network of the actors `config`'s population evolves (what a policy export holds):
    EC's deterministic `Actor`, or the RL agent's actor (TD3: `Actor`, SAC: `GaussianActor`).
    Its deterministic action is `agents.deterministic_policy`."""
    agent = make_agent(config, obs_dim, action_dim)
    if agent is None:
        return Actor(action_dim, tuple(config.actor_hidden_sizes))
    return agent.actor_network


def make_workflow(
    config: WorkflowConfig, layout: DeviceLayout | None = None, seeds: int = 1
) -> Workflow:
    """Builds the static workflow for `config`, training `seeds` independent replicas as one
    computation (`Workflow.seeds`). Envs are created here (Brax: seconds each).

    With a `layout` over several devices, the replay capacity is rounded up to a multiple of
    the device count so that every device holds an equal shard.
    """
    kind = kind_of(config)
    env_config = config.env
    fitness_env = env_from_config(env_config, env_config.episodes_per_member, "disabled")
    eval_env = env_from_config(env_config, env_config.eval_episodes, "disabled")
    episode_length = episode_length_of(fitness_env)
    obs_dim, action_dim = fitness_env.obs_dim, fitness_env.action_dim

    agent = make_agent(config, obs_dim, action_dim)
    if agent is None:
        actor = _Actor(actor_network(config, obs_dim, action_dim), obs_dim)
        init_params, policy, explore = actor.init, actor.policy, None
    else:
        if not isinstance(fitness_env.action_space, Box):
            name, env_name = type(agent).__name__, env_config.name
            raise ValueError(f"{name} needs continuous actions; {env_name} has discrete ones")
        init_params, policy, explore = agent.init_actor_params, agent.policy, agent.explore

    flattener = ParamFlattener.from_params(init_params(jax.random.PRNGKey(0)))
    optimizer = None
    if kind.evolves:
        optimizer = make_optimizer(
            config.optimizer, config.pop_size, flattener.num_dims, config.optimizer_options
        )
    sharded = layout is not None
    fitness_rollout = PopulationRollout(
        fitness_env, policy, flattener.unflatten, episode_length, explore, sharded
    )
    evaluator = PopulationRollout(
        eval_env, policy, flattener.unflatten, episode_length, members_sharded=sharded
    )
    common = dict(
        optimizer=optimizer,
        rollout=fitness_rollout,
        evaluator=evaluator,
        init_params=init_params,
        flatten=flattener.flatten,
        fitness_reduction=config.fitness_reduction,
        layout=layout,
        normalize_observations=env_config.normalize_observations,
        seeds=seeds,
    )
    if agent is None:
        return Workflow(**common)

    replay = config.replay
    capacity = replay.capacity
    if layout is not None:
        capacity = -(-capacity // layout.num_devices) * layout.num_devices
    # A buffer split over devices keeps the batched gather (in turn: collectives per replica).
    in_turn = layout is None and jax.default_backend() in REPLICAS_IN_TURN_PLATFORMS
    buffer = ReplayBuffer(capacity, replay.batch_size, replicas_in_turn=in_turn)
    learning_starts = (
        replay.batch_size if replay.learning_starts is None else replay.learning_starts
    )
    parts = LearnerParts(
        agent=agent,
        buffer=buffer,
        flattener=flattener,
        steps_per_rollout=env_config.episodes_per_member * episode_length,
        learning_starts=learning_starts,
        layout=layout,
    )
    warmup_env = (
        env_from_config(env_config, replay.warmup_envs, "same_step")
        if replay.warmup_steps
        else None
    )
    return Workflow(
        **common,
        learner=kind.learner(config, parts),
        buffer=buffer,
        warmup_env=warmup_env,
        warmup_steps_per_env=math.ceil(replay.warmup_steps / replay.warmup_envs),
    )
