"""Environments: one Env API over gymnax and Brax, with autoreset modes and wrappers.

``make_env("gymnax/CartPole-v1", num_envs=8, episode_length=500)`` returns a batched env whose
``reset(key)`` and ``step(state, action)`` are pure and jittable; see ``EnvState`` for what a
state holds and ``AutoReset`` for the reset modes and the ``info`` keys.

Names. Every env of the installed gymnax and Brax registries, less a few that cannot run here:
``env_names()`` lists them and ``env_spec(name)`` tells one's action type, sizes and time limit,
both read from the committed catalog that ``python -m evokube_trainer.envs.catalog`` generates.

Actions. Policies emit vectors of ``env.action_dim`` floats.
  - Box spaces: by default (``action_squash="clip"``) the vector is read in ``[-1, 1]`` and
    mapped affinely onto the env's bounds, so TD3 and EC actors with a ``tanh`` output layer
    need no knowledge of the env's units; ``"tanh"`` squashes unbounded outputs first.
  - Discrete spaces of ``n`` actions: ``action_dim == n`` and the env takes the **argmax** of
    the vector (scores or logits; ties go to the lowest index). This keeps a deterministic MLP
    actor usable as is by OpenES and TD3 alike: the actor's output layer is sized
    ``action_dim`` whatever the space. Integer actions of shape ``[B]`` are accepted too.
"""

from evokube_trainer.envs._autoreset import AUTORESET_MODES, AutoReset, AutoResetInner
from evokube_trainer.envs._base import Env, EnvState, Wrapper
from evokube_trainer.envs._factory import default_pipeline, make_backend_env, make_env
from evokube_trainer.envs._gymnax import GymnaxEnv
from evokube_trainer.envs._obs_norm import (
    ObservationNorm,
    ObsNormInner,
    RunningStats,
    init_running_stats,
    merge_running_stats,
    normalize_obs,
    reduce_running_stats,
    update_running_stats,
)
from evokube_trainer.envs._spaces import Box, Discrete, Space, action_dim
from evokube_trainer.envs._wrappers import (
    SQUASH_MODES,
    ActionRepeat,
    ActionTransform,
    RewardScale,
    VmapEnv,
    squash_action,
)
from evokube_trainer.envs.catalog import EnvSpec, env_names, env_spec


def __getattr__(name: str):
    # BraxEnv imports Brax and MuJoCo (seconds); load it only when someone asks for it.
    if name == "BraxEnv":
        from evokube_trainer.envs._brax import BraxEnv

        return BraxEnv
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AUTORESET_MODES",
    "SQUASH_MODES",
    "ActionRepeat",
    "ActionTransform",
    "AutoReset",
    "AutoResetInner",
    "Box",
    "BraxEnv",
    "Discrete",
    "Env",
    "EnvSpec",
    "EnvState",
    "GymnaxEnv",
    "ObsNormInner",
    "ObservationNorm",
    "RewardScale",
    "RunningStats",
    "Space",
    "VmapEnv",
    "Wrapper",
    "action_dim",
    "default_pipeline",
    "env_names",
    "env_spec",
    "init_running_stats",
    "make_backend_env",
    "make_env",
    "merge_running_stats",
    "normalize_obs",
    "reduce_running_stats",
    "squash_action",
    "update_running_stats",
]
