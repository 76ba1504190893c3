"""Algorithm configs (plain frozen dataclasses) and `make_workflow`, which builds the static
`Workflow` from one. The runtime maps an ERLExperiment manifest onto these fields.

Each config names its EC optimizer (`optimizer`, see `OPTIMIZERS`) and passes the optimizer's
own hyperparameters through `optimizer_options`; everything else is a field with its default:

* `ECConfig`     pure evolution of a deterministic MLP actor (OpenES, CMA-ES, GA, ...).
* `ERLConfig`    ERL: an optimizer (the GA by default; OpenES gives ERL-ES, SepCEM ERL-EDA)
                 plus K independent RL agents injected every `injection_interval` generations.
* `CEMRLConfig`  CEM-RL: SepCEM plus K actors trained against one shared critic.
* `PBTConfig`    PBT: `pop_size` RL agents with their own hyperparameters, no EC optimizer.

ERL, CEM-RL and PBT take their RL agent's config as `agent`: `TD3Config` (the default) or
`SACConfig`; its `actor_hidden_sizes` is the architecture the population evolves.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, cast

import jax
import jax.numpy as jnp

from evokube_trainer.agents import (
    SAC,
    TD3,
    Actor,
    GaussianActor,
    ParamFlattener,
    SACConfig,
    TD3Config,
    deterministic_policy,
)
from evokube_trainer.ec import ARS, CMAES, GA, EvoOptimizer, OpenES, SepCEM, SepCMAES, VanillaES
from evokube_trainer.envs import AutoReset, Box, Env, make_env
from evokube_trainer.replay import ReplayBuffer
from evokube_trainer.workflows._layout import DeviceLayout
from evokube_trainer.workflows._learners import IndependentAgents, SharedCritic
from evokube_trainer.workflows._pbt import PopulationBasedTraining
from evokube_trainer.workflows._rollout import PopulationRollout
from evokube_trainer.workflows._workflow import Workflow

Array = jax.Array

OPTIMIZERS: Mapping[str, type[EvoOptimizer]] = {
    "open_es": OpenES,
    "vanilla_es": VanillaES,
    "ars": ARS,
    "sep_cem": SepCEM,
    "cma_es": CMAES,
    "sep_cma_es": SepCMAES,
    "ga": GA,
}


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    """The task and how candidates are scored on it."""

    name: str = "gymnax/Pendulum-v1"  # "gymnax/<id>" or "brax/<name>"
    episode_length: int | None = None  # agent steps per episode; None: the env's own limit
    episodes_per_member: int = 1  # K: fitness = reduction of K episode returns
    eval_episodes: int = 10  # episodes `Workflow.evaluate` plays with the deployable policy
    action_repeat: int = 1
    reward_scale: float = 1.0  # scales the rewards stored for the critic; fitness is unscaled
    backend: str | None = None  # Brax physics pipeline; None for the env's default
    # Policies (and critics) see observations normalized by running statistics pooled over the
    # population each generation; see `Workflow`. Off by default: states keep their layout.
    normalize_observations: bool = False

    def __post_init__(self):
        if self.episodes_per_member < 1 or self.eval_episodes < 1:
            raise ValueError("episodes_per_member and eval_episodes must be >= 1")


@dataclasses.dataclass(frozen=True)
class ReplayConfig:
    """The shared replay buffer and the random-policy warm-up that pre-fills it."""

    capacity: int = 1_000_000
    batch_size: int = 256
    warmup_steps: int = 10_000  # random transitions added by `init` (rounded up to warmup_envs)
    warmup_envs: int = 10  # parallel envs playing the warm-up
    learning_starts: int | None = None  # buffer size before gradient steps; None: batch_size


@dataclasses.dataclass(frozen=True)
class _PopulationConfig:
    env: EnvConfig = EnvConfig()
    pop_size: int = 10
    optimizer: str = "open_es"
    optimizer_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    fitness_reduction: str = "mean"  # "mean", "min", "max" or "median" over the K episodes

    def __post_init__(self):
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {self.optimizer!r}; expected one of {OPTIMIZERS}")


@dataclasses.dataclass(frozen=True)
class ECConfig(_PopulationConfig):
    """Pure evolution of a deterministic MLP actor."""

    pop_size: int = 64
    actor_hidden_sizes: tuple[int, ...] = (64, 64)


AgentConfig = TD3Config | SACConfig


def _check_agent(config: ERLConfig | CEMRLConfig | PBTConfig) -> None:
    if not isinstance(config.agent, AgentConfig):
        raise TypeError(f"agent must be a TD3Config or SACConfig, got {type(config.agent)}")


@dataclasses.dataclass(frozen=True)
class ERLConfig(_PopulationConfig):
    """ERL (Khadka & Tumer, 2018). The actor architecture is `agent.actor_hidden_sizes`.

    `updates_per_generation`: gradient steps per agent and generation; None takes the number
    of agent steps one generation samples when no episode ends early (ERL's ratio of one
    update per new transition).
    """

    optimizer: str = "ga"
    num_agents: int = 1  # K independent RL agents, each with its own critic
    agent: AgentConfig = dataclasses.field(default_factory=TD3Config)
    updates_per_generation: int | None = None
    injection_interval: int = 1  # RL actors replace the worst members every this many gens
    replay: ReplayConfig = ReplayConfig()

    def __post_init__(self):
        super().__post_init__()
        _check_agent(self)


@dataclasses.dataclass(frozen=True)
class CEMRLConfig(_PopulationConfig):
    """CEM-RL (Pourchot & Sigaud, 2019). The actor architecture is `agent.actor_hidden_sizes`.

    `num_actors`: members trained by the agent each generation (the first ones; half the
    population when None). `updates_per_generation`: shared-critic steps per generation; None
    as in ERL.
    """

    optimizer: str = "sep_cem"
    num_actors: int | None = None
    agent: AgentConfig = dataclasses.field(default_factory=TD3Config)
    updates_per_generation: int | None = None
    replay: ReplayConfig = ReplayConfig()

    def __post_init__(self):
        super().__post_init__()
        _check_agent(self)


@dataclasses.dataclass(frozen=True)
class PBTConfig:
    """Population-based training (`_pbt.py`): `pop_size` agents, each with its own
    hyperparameters. `ranges`: name -> (min, max) for any of `agent`'s PBT hyperparameters
    (`Agent.hyperparameters`); the others keep `agent`'s value. `updates_per_generation` as in
    ERL, per member."""

    env: EnvConfig = EnvConfig()
    pop_size: int = 8
    fitness_reduction: str = "mean"
    agent: AgentConfig = dataclasses.field(default_factory=TD3Config)
    updates_per_generation: int | None = None
    replay: ReplayConfig = ReplayConfig()
    interval: int = 5  # generations between exploit/explore steps
    exploit_fraction: float = 0.25
    perturb_factors: tuple[float, ...] = (0.8, 1.25)
    ranges: Mapping[str, tuple[float, float]] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        _check_agent(self)


def make_optimizer(
    name: str, pop_size: int, num_dims: int, options: Mapping[str, Any] | None = None
) -> EvoOptimizer:
    """The optimizer registered as `name`, over `num_dims` parameters."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; expected one of {sorted(OPTIMIZERS)}")
    return OPTIMIZERS[name](pop_size=pop_size, num_dims=num_dims, **dict(options or {}))


def episode_length_of(env: Env) -> int:
    """The time limit of a `make_env` env (found on its `AutoReset` wrapper)."""
    layer = env
    while not isinstance(layer, AutoReset):
        if not hasattr(layer, "env"):
            raise ValueError(f"{type(env).__name__} has no AutoReset wrapper")
        layer = layer.env
    return layer.episode_length


def env_from_config(env_config: EnvConfig, num_envs: int, autoreset: str) -> Env:
    """The batched env of `env_config` as the workflows build it (exported policies are played
    on the same one)."""
    return make_env(
        env_config.name,
        num_envs=num_envs,
        episode_length=env_config.episode_length,
        autoreset=autoreset,
        backend=env_config.backend,
        action_repeat=env_config.action_repeat,
        reward_scale=env_config.reward_scale,
    )


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


def make_agent(
    config: ECConfig | ERLConfig | CEMRLConfig | PBTConfig, obs_dim: int, action_dim: int
) -> TD3 | SAC | None:
    """The RL agent of an ERL, CEM-RL or PBT config (TD3 or SAC); None for pure EC."""
    if isinstance(config, ECConfig):
        return None
    if isinstance(config, ERLConfig | CEMRLConfig | PBTConfig):
        if isinstance(config.agent, SACConfig):
            return SAC(config.agent, obs_dim, action_dim)
        return TD3(config.agent, obs_dim, action_dim)
    raise TypeError(f"no workflow for config type {type(config).__name__}")


def actor_network(
    config: ECConfig | ERLConfig | CEMRLConfig | PBTConfig, obs_dim: int, action_dim: int
) -> Actor | GaussianActor:
    """The network of the actors `config`'s population evolves (what a policy export holds):
    EC's deterministic `Actor`, or the RL agent's actor (TD3: `Actor`, SAC: `GaussianActor`).
    Its deterministic action is `agents.deterministic_policy`."""
    agent = make_agent(config, obs_dim, action_dim)
    if agent is None:
        return Actor(action_dim, tuple(cast(ECConfig, config).actor_hidden_sizes))
    return agent.actor_network


def make_workflow(
    config: ECConfig | ERLConfig | CEMRLConfig | PBTConfig, layout: DeviceLayout | None = None
) -> Workflow:
    """Builds the static workflow for `config`. Envs are created here (Brax: seconds each).

    With a `layout` over several devices, the replay capacity is rounded up to a multiple of
    the device count so that every device holds an equal shard.
    """
    env_config = config.env
    fitness_env = env_from_config(env_config, env_config.episodes_per_member, "disabled")
    eval_env = env_from_config(env_config, env_config.eval_episodes, "disabled")
    episode_length = episode_length_of(fitness_env)
    obs_dim, action_dim = fitness_env.obs_dim, fitness_env.action_dim

    agent = make_agent(config, obs_dim, action_dim)
    if agent is None:
        actor = _Actor(cast(Actor, actor_network(config, obs_dim, action_dim)), obs_dim)
        init_params, policy, explore = actor.init, actor.policy, None
    else:
        if not isinstance(fitness_env.action_space, Box):
            name, env_name = type(agent).__name__, env_config.name
            raise ValueError(f"{name} needs continuous actions; {env_name} has discrete ones")
        init_params, policy, explore = agent.init_actor_params, agent.policy, agent.explore

    flattener = ParamFlattener.from_params(init_params(jax.random.PRNGKey(0)))
    optimizer = None
    if not isinstance(config, PBTConfig):
        optimizer = make_optimizer(
            config.optimizer, config.pop_size, flattener.num_dims, config.optimizer_options
        )
    fitness_rollout = PopulationRollout(
        fitness_env, policy, flattener.unflatten, episode_length, explore
    )
    evaluator = PopulationRollout(eval_env, policy, flattener.unflatten, episode_length)
    common = dict(
        optimizer=optimizer,
        rollout=fitness_rollout,
        evaluator=evaluator,
        init_params=init_params,
        flatten=flattener.flatten,
        fitness_reduction=config.fitness_reduction,
        layout=layout,
        normalize_observations=env_config.normalize_observations,
    )
    if agent is None:
        return Workflow(**common)
    assert not isinstance(config, ECConfig)

    replay = config.replay
    capacity = replay.capacity
    if layout is not None:
        capacity = -(-capacity // layout.num_devices) * layout.num_devices
    buffer = ReplayBuffer(capacity, replay.batch_size)
    learning_starts = (
        replay.batch_size if replay.learning_starts is None else replay.learning_starts
    )
    if isinstance(config, ERLConfig):
        num_rollouts = config.pop_size + config.num_agents
    else:
        num_rollouts = config.pop_size
    steps_per_generation = num_rollouts * env_config.episodes_per_member * episode_length
    num_updates = config.updates_per_generation or steps_per_generation
    learner: IndependentAgents | SharedCritic | PopulationBasedTraining
    if isinstance(config, ERLConfig | PBTConfig):
        if isinstance(config, ERLConfig):
            num_agents, injection_interval = config.num_agents, config.injection_interval
        else:  # PBT: every member is an agent, and there is no population to inject into
            num_agents, injection_interval = config.pop_size, 1
        learner = IndependentAgents(
            agent=agent,
            buffer=buffer,
            flatten=flattener.flatten,
            num_agents=num_agents,
            num_updates=num_updates,
            injection_interval=injection_interval,
            learning_starts=learning_starts,
        )
        if isinstance(config, PBTConfig):
            if layout is not None and config.pop_size % layout.num_devices:
                raise ValueError(f"PBT's pop_size must divide by the {layout.num_devices} devices")
            learner = PopulationBasedTraining.searching(
                learner,
                config.ranges,
                interval=config.interval,
                exploit_fraction=config.exploit_fraction,
                perturb_factors=tuple(config.perturb_factors),
            )
    else:
        num_actors = config.pop_size // 2 if config.num_actors is None else config.num_actors
        if not 1 <= num_actors <= config.pop_size:
            raise ValueError(f"num_actors must lie in [1, {config.pop_size}], got {num_actors}")
        learner = SharedCritic(
            agent=agent,
            buffer=buffer,
            flatten=flattener.flatten,
            unflatten=flattener.unflatten,
            num_dims=flattener.num_dims,
            num_actors=num_actors,
            num_updates=num_updates,
            learning_starts=learning_starts,
        )
    warmup_env = (
        env_from_config(env_config, replay.warmup_envs, "same_step")
        if replay.warmup_steps
        else None
    )
    return Workflow(
        **common,
        learner=learner,
        buffer=buffer,
        warmup_env=warmup_env,
        warmup_steps_per_env=math.ceil(replay.warmup_steps / replay.warmup_envs),
    )
