"""Workflow kinds: one entry per kind of generation loop, and nothing else switches on the kind.

An entry holds what differs between kinds:

* `config`: its config class (`_configs.py`);
* `from_spec(spec, common)`: that config from a defaulted, valid ERLExperiment spec, given the
  fields the runtime's spec parser builds for every kind (`env`, `pop_size` and, where an EC
  optimizer evolves the population, `optimizer` and `optimizer_options`);
* `learner(config, parts)`: its RL learner, from the parts `make_workflow` builds for every RL
  kind (None: evolution alone, no agent, no replay buffer);
* the spec.algorithm fields only it reads (`num_agents`, `section`), from which the CRD's rules
  are generated (`python -m evokube_trainer.generate`).

The algorithm registry (`runtime/algorithms.py`) names a kind for every `spec.algorithm.name`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from evokube_trainer.agents import Agent, ParamFlattener
from evokube_trainer.replay import ReplayBuffer
from evokube_trainer.workflows._configs import (
    CEMRLConfig,
    ECConfig,
    ERLConfig,
    PBTConfig,
    WorkflowConfig,
)
from evokube_trainer.workflows._layout import DeviceLayout
from evokube_trainer.workflows._learners import IndependentAgents, Learner, SharedCritic
from evokube_trainer.workflows._pbt import PopulationBasedTraining
from evokube_trainer.workflows._spec import learner_fields, pbt_fields


@dataclasses.dataclass(frozen=True)
class LearnerParts:
    """What `make_workflow` builds for every RL kind and hands to the kind's `learner`."""

    agent: Agent
    buffer: ReplayBuffer
    flattener: ParamFlattener  # of one actor's parameters
    steps_per_rollout: int  # agent steps of one member's evaluation (its K episodes)
    learning_starts: int
    layout: DeviceLayout | None

    def num_updates(self, config: ERLConfig | CEMRLConfig | PBTConfig, rollouts: int) -> int:
        """Gradient steps per generation: the config's, else one per agent step of the
        `rollouts` a generation samples when no episode ends early (ERL's ratio)."""
        return config.updates_per_generation or rollouts * self.steps_per_rollout


@dataclasses.dataclass(frozen=True)
class WorkflowKind:
    """One kind of workflow (see the module docstring).

    `evolves`: an EC optimizer evolves the population (pbt: no; its algorithms name no
    distribution). `num_agents`: spec.algorithm.rl.numAgents (K) is required, else refused.
    `section`: a spec.algorithm section only this kind reads (refused for the others).
    """

    name: str
    summary: str
    config: type
    from_spec: Callable[[Mapping[str, Any], Mapping[str, Any]], WorkflowConfig]
    learner: Callable[[Any, LearnerParts], Learner] | None = None
    evolves: bool = True
    num_agents: bool = False
    section: str | None = None

    @property
    def learns(self) -> bool:
        """Whether it trains RL agents: reads spec.algorithm.rl (required), continuous actions
        only."""
        return self.learner is not None


def _ec_config(spec: Mapping[str, Any], common: Mapping[str, Any]) -> ECConfig:
    return ECConfig(**common, actor_hidden_sizes=tuple(spec["policy"]["hiddenLayers"]))


def _erl_config(spec: Mapping[str, Any], common: Mapping[str, Any]) -> ERLConfig:
    rl = spec["algorithm"]["rl"]
    return ERLConfig(
        **common,
        **learner_fields(spec),
        num_agents=rl["numAgents"],
        injection_interval=rl["injectionInterval"],
    )


def _cem_rl_config(spec: Mapping[str, Any], common: Mapping[str, Any]) -> CEMRLConfig:
    num_actors = spec["algorithm"]["rl"]["numAgents"]
    return CEMRLConfig(**common, **learner_fields(spec), num_actors=num_actors)


def _pbt_config(spec: Mapping[str, Any], common: Mapping[str, Any]) -> PBTConfig:
    pbt = pbt_fields(spec["algorithm"].get("pbt", {}))
    return PBTConfig(**common, **learner_fields(spec), **pbt)


def _independent_agents(
    parts: LearnerParts, num_agents: int, num_updates: int, injection_interval: int
) -> IndependentAgents:
    return IndependentAgents(
        agent=parts.agent,
        buffer=parts.buffer,
        flatten=parts.flattener.flatten,
        num_agents=num_agents,
        num_updates=num_updates,
        injection_interval=injection_interval,
        learning_starts=parts.learning_starts,
    )


def _erl_learner(config: ERLConfig, parts: LearnerParts) -> IndependentAgents:
    # The K agents' episodes are sampled beside the population's.
    num_updates = parts.num_updates(config, config.pop_size + config.num_agents)
    return _independent_agents(parts, config.num_agents, num_updates, config.injection_interval)


def _cem_rl_learner(config: CEMRLConfig, parts: LearnerParts) -> SharedCritic:
    num_actors = config.pop_size // 2 if config.num_actors is None else config.num_actors
    if not 1 <= num_actors <= config.pop_size:
        raise ValueError(f"num_actors must lie in [1, {config.pop_size}], got {num_actors}")
    return SharedCritic(
        agent=parts.agent,
        buffer=parts.buffer,
        flatten=parts.flattener.flatten,
        unflatten=parts.flattener.unflatten,
        num_dims=parts.flattener.num_dims,
        num_actors=num_actors,
        num_updates=parts.num_updates(config, config.pop_size),
        learning_starts=parts.learning_starts,
    )


def _pbt_learner(config: PBTConfig, parts: LearnerParts) -> PopulationBasedTraining:
    layout = parts.layout
    if layout is not None and config.pop_size % layout.num_devices:
        raise ValueError(f"PBT's pop_size must divide by the {layout.num_devices} devices")
    # Every member is an agent, and there is no population to inject into.
    num_updates = parts.num_updates(config, config.pop_size)
    members = _independent_agents(parts, config.pop_size, num_updates, injection_interval=1)
    return PopulationBasedTraining.searching(
        members,
        config.ranges,
        interval=config.interval,
        exploit_fraction=config.exploit_fraction,
        perturb_factors=tuple(config.perturb_factors),
    )


EC = WorkflowKind(
    "ec", "evolution alone, of a deterministic MLP actor per member", ECConfig, _ec_config
)
ERL = WorkflowKind(
    "erl",
    "an EC population plus K (rl.numAgents) independent RL learners, actor and critic each, whose "
    "actors replace the K worst members every rl.injectionInterval generations",
    ERLConfig,
    _erl_config,
    _erl_learner,
    num_agents=True,
)
CEM_RL = WorkflowKind(
    "cem-rl",
    "an EC population whose first K (rl.numAgents) members are trained against one shared "
    "critic before each evaluation",
    CEMRLConfig,
    _cem_rl_config,
    _cem_rl_learner,
    num_agents=True,
)
PBT = WorkflowKind(
    "pbt",
    "population.size RL learners, each with its own hyperparameters, and no EC population",
    PBTConfig,
    _pbt_config,
    _pbt_learner,
    evolves=False,
    section="pbt",
)
KINDS: Mapping[str, WorkflowKind] = {kind.name: kind for kind in (EC, ERL, CEM_RL, PBT)}


def kind_of(config: WorkflowConfig) -> WorkflowKind:
    """The kind whose config class `config` is."""
    for kind in KINDS.values():
        if isinstance(config, kind.config):
            return kind
    raise TypeError(f"no workflow kind for config type {type(config).__name__}")
