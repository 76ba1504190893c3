"""Workflows: one generation loop for EC, ERL, CEM-RL and PBT.

    workflow = make_workflow(CEMRLConfig(env=EnvConfig("gymnax/Pendulum-v1")))
    state = workflow.init(jax.random.PRNGKey(0))
    stop = lambda metrics: metrics["generation"] >= 50
    state = workflow.learn(state, stop=stop, recorders=[ConsoleRecorder()])

`Workflow.step` (one generation), `Workflow.steps` (several in one computation) and
`Workflow.evaluate` are pure; `jit_workflow` jits them and `learn` drives them from the host.
`DeviceLayout` spreads a generation over many devices and processes. States are plain pytrees;
`runtime.checkpoints` saves and restores them with Orbax.

`KINDS` (one entry per workflow kind: its config class, how a spec builds it, its learner) and
`OPTIMIZERS` (one entry per EC optimizer) are the registry that `make_workflow`, the runtime's
spec parser and the CRD generator all read.
"""

from evokube_trainer.workflows._build import actor_network, make_workflow
from evokube_trainer.workflows._configs import (
    CEMRLConfig,
    ECConfig,
    EnvConfig,
    ERLConfig,
    PBTConfig,
    ReplayConfig,
    WorkflowConfig,
    env_from_config,
    episode_length_of,
)
from evokube_trainer.workflows._env_steps import (
    ADDED_STATE_LEAVES,
    ENV_STEPS_WORD,
    add_member_steps,
    env_steps_count,
    upgraded,
)
from evokube_trainer.workflows._kinds import KINDS, WorkflowKind
from evokube_trainer.workflows._layout import DeviceLayout, slice_index
from evokube_trainer.workflows._learners import (
    IndependentAgents,
    Learner,
    SharedCritic,
    SharedCriticState,
)
from evokube_trainer.workflows._optimizers import OPTIMIZERS, Optimizer, make_optimizer
from evokube_trainer.workflows._pbt import PBTState, PopulationBasedTraining
from evokube_trainer.workflows._replicas import replica_seed, replica_values, seed_metrics
from evokube_trainer.workflows._rollout import PopulationRollout, RolloutResult, random_transitions
from evokube_trainer.workflows._spec import (
    PBT_HYPERPARAMETERS,
    to_env_config,
    to_environment_spec,
)
from evokube_trainer.workflows._workflow import (
    CHUNK_CAPACITY,
    EVALUATED,
    PARTS,
    Evaluation,
    JittedWorkflow,
    StopAt,
    Workflow,
    WorkflowState,
    jit_workflow,
)

__all__ = [
    "ADDED_STATE_LEAVES",
    "CHUNK_CAPACITY",
    "ENV_STEPS_WORD",
    "EVALUATED",
    "KINDS",
    "OPTIMIZERS",
    "PARTS",
    "PBT_HYPERPARAMETERS",
    "CEMRLConfig",
    "DeviceLayout",
    "ECConfig",
    "ERLConfig",
    "EnvConfig",
    "Evaluation",
    "IndependentAgents",
    "JittedWorkflow",
    "Learner",
    "Optimizer",
    "PBTConfig",
    "PBTState",
    "PopulationBasedTraining",
    "PopulationRollout",
    "ReplayConfig",
    "RolloutResult",
    "SharedCritic",
    "SharedCriticState",
    "StopAt",
    "Workflow",
    "WorkflowConfig",
    "WorkflowKind",
    "WorkflowState",
    "actor_network",
    "add_member_steps",
    "env_from_config",
    "env_steps_count",
    "episode_length_of",
    "jit_workflow",
    "make_optimizer",
    "make_workflow",
    "random_transitions",
    "replica_seed",
    "replica_values",
    "seed_metrics",
    "slice_index",
    "to_env_config",
    "to_environment_spec",
    "upgraded",
]
