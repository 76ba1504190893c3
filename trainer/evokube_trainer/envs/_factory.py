"""``make_env``: a backend env plus the standard wrapper stack, batched."""

from __future__ import annotations

import functools

from evokube_trainer.envs._autoreset import AutoReset
from evokube_trainer.envs._base import Env
from evokube_trainer.envs._gymnax import GymnaxEnv
from evokube_trainer.envs._obs_norm import ObservationNorm
from evokube_trainer.envs._wrappers import ActionRepeat, ActionTransform, RewardScale, VmapEnv
from evokube_trainer.envs.catalog import env_spec


def make_backend_env(name: str, *, backend: str | None = None, **env_kwargs) -> Env:
    """The bare, unbatched env for ``"gymnax/<id>"`` or ``"brax/<name>"``: no time limit, no
    resets, native actions. ``name`` must be in the env catalog (``catalog.env_names()``): every
    env of the installed gymnax and Brax registries but the excluded ones.

    Envs are immutable, so one is built once per process and arguments, then shared: a
    workflow makes three (rollouts, evaluation, warm-up), and building a Brax env parses its
    MJCF model and traces a reset (about a second each on 2 CPUs).
    """
    env_spec(name)  # ValueError for a name the catalog does not accept, with the reason
    arguments = tuple(sorted(env_kwargs.items()))
    try:
        hash(arguments)
    except TypeError:  # unhashable arguments: build it afresh
        return _backend_env(name, backend, **env_kwargs)
    return _cached_backend_env(name, backend, arguments)


@functools.cache
def _cached_backend_env(name: str, backend: str | None, env_kwargs: tuple) -> Env:
    return _backend_env(name, backend, **dict(env_kwargs))


def _backend_env(name: str, backend: str | None, **env_kwargs) -> Env:
    family, _, env_id = name.partition("/")
    if family == "gymnax" and env_id:
        if backend is not None:
            raise ValueError(f"gymnax envs have no physics backend, got backend={backend!r}")
        return GymnaxEnv.create(env_id, **env_kwargs)
    if family == "brax" and env_id:
        from evokube_trainer.envs._brax import BraxEnv  # imports MuJoCo: only when asked for

        return BraxEnv.create(env_id, backend=backend, **env_kwargs)
    raise ValueError(f"env name must look like 'gymnax/<id>' or 'brax/<name>', got {name!r}")


def default_pipeline(name: str) -> str | None:
    """The physics pipeline env `name` runs when the spec names none: Brax's own default for
    ``"brax/<name>"`` (the same on every platform), None for an env without pipelines."""
    family, _, env_id = name.partition("/")
    if family != "brax":
        return None
    from evokube_trainer.envs import _brax  # imports MuJoCo: only when asked for

    return _brax.default_pipeline(env_id)


def make_env(
    name: str,
    *,
    num_envs: int,
    episode_length: int | None = None,
    autoreset: str = "same_step",
    backend: str | None = None,
    action_repeat: int = 1,
    reward_scale: float = 1.0,
    obs_norm: bool = False,
    obs_norm_update: bool = True,
    action_squash: str | None = "clip",
    **env_kwargs,
) -> Env:
    """Builds ``num_envs`` batched copies of env ``name`` (``"gymnax/Pendulum-v1"``,
    ``"brax/halfcheetah"``, ...).

    Args:
      num_envs: batch size ``B``; ``step`` takes actions ``[B, action_dim]`` (or ``[B]`` ints for
        a discrete env) and returns states whose fields lead with ``B``.
      episode_length: time limit in agent steps; ``None`` takes the env's own (gymnax
        ``max_steps_in_episode``, 1000 for Brax).
      autoreset: ``"same_step"``, ``"next_step"``, ``"fast"`` or ``"disabled"`` (see
        ``AutoReset``).
      backend: Brax physics pipeline (``"generalized"``, ``"positional"``, ``"spring"``,
        ``"mjx"``); ``None`` keeps the env's default. Must be ``None`` for gymnax.
      action_repeat: env sub-steps per agent step; rewards are summed.
      reward_scale: factor on ``state.reward`` (episode-return metrics stay unscaled).
      obs_norm: normalize observations with running stats kept in the state
        (``ObservationNorm``); ``obs_norm_update=False`` keeps the stats fixed.
      action_squash: how policy outputs map to Box actions: ``"clip"`` (``[-1, 1]`` scaled to
        the bounds), ``"tanh"`` or ``None`` (env units); see ``squash_action``.
      **env_kwargs: passed to the gymnax or Brax env constructor.

    Wrapper order, inside out: backend env, ActionTransform, ActionRepeat, AutoReset, VmapEnv,
    RewardScale, ObservationNorm.
    """
    env = make_backend_env(name, backend=backend, **env_kwargs)
    if episode_length is None:
        episode_length = env.default_episode_length  # type: ignore[attr-defined]
    env = ActionTransform(env, mode=action_squash)
    if action_repeat != 1:
        env = ActionRepeat(env, repeat=action_repeat)
    env = AutoReset(env, episode_length=episode_length, mode=autoreset)
    env = VmapEnv(env, num_envs=num_envs)
    if reward_scale != 1.0:
        env = RewardScale(env, scale=reward_scale)
    if obs_norm:
        env = ObservationNorm(env, update_stats=obs_norm_update)
    return env
