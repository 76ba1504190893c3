"""Networks and the TD3 learner used by the ERL workflows."""

from evokube_trainer.agents.networks import MLP, Actor, ParamFlattener, TwinCritic
from evokube_trainer.agents.td3 import (
    TD3,
    ActorState,
    CriticState,
    TD3Config,
    TD3State,
    soft_update,
)
from evokube_trainer.replay import Transition

__all__ = [
    "MLP",
    "TD3",
    "Actor",
    "ActorState",
    "CriticState",
    "ParamFlattener",
    "TD3Config",
    "TD3State",
    "Transition",
    "TwinCritic",
    "soft_update",
]
