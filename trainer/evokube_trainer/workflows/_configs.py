"""Workflow configs: plain frozen dataclasses, one per workflow kind (`_kinds.py`).

Each config names its EC optimizer (`optimizer`, a key of `OPTIMIZERS`) and passes the
optimizer's own hyperparameters through `optimizer_options`; everything else is a field with its
default:

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
from collections.abc import Mapping
from typing import Any

from evokube_trainer.agents import SACConfig, TD3Config
from evokube_trainer.envs import AutoReset, Env, make_env
from evokube_trainer.workflows._optimizers import OPTIMIZERS


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
            known = sorted(OPTIMIZERS)
            raise ValueError(f"unknown optimizer {self.optimizer!r}; expected one of {known}")


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


# A config of any workflow kind (`_kinds.KINDS` holds one entry per kind).
WorkflowConfig = ECConfig | ERLConfig | CEMRLConfig | PBTConfig


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
