"""Networks and the RL agents (TD3, SAC) used by the ERL workflows."""

from evokube_trainer.agents.base import Agent, soft_update
from evokube_trainer.agents.networks import (
    MLP,
    Actor,
    GaussianActor,
    ParamFlattener,
    TwinCritic,
    deterministic_policy,
)
from evokube_trainer.agents.sac import SAC, SACActorState, SACConfig, SACState, SoftCriticState
from evokube_trainer.agents.td3 import (
    TD3,
    ActorState,
    CriticState,
    TD3Config,
    TD3State,
)
from evokube_trainer.replay import Transition

__all__ = [
    "MLP",
    "SAC",
    "TD3",
    "Actor",
    "ActorState",
    "Agent",
    "CriticState",
    "GaussianActor",
    "ParamFlattener",
    "SACActorState",
    "SACConfig",
    "SACState",
    "SoftCriticState",
    "TD3Config",
    "TD3State",
    "Transition",
    "TwinCritic",
    "deterministic_policy",
    "soft_update",
]
