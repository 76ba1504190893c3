"""The env catalog of the installed gymnax and Brax, surveyed by building every env once.

The trainer accepts ``gymnax/<id>`` for every id in ``gymnax.registered_envs`` and
``brax/<name>`` for every env in Brax's registry (``brax.envs._envs``: Brax has no public
listing), less the few in ``EXCLUDED``, each with its reason. Whether an env's actions are
discrete or continuous, its observation size and its own time limit come from the env itself:
``survey`` builds each one once, through the adapters the trainer runs (``GymnaxEnv.create``,
``BraxEnv.create``), and records what it sees. ``python -m evokube_trainer.generate`` writes
``envs/catalog.json`` and the CRD's env lists from it; ``tests/trainer/test_catalog.py`` fails
when they differ from what the installed libraries give.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import version
from typing import Any

from evokube_trainer.envs.catalog import FAMILIES, Catalog, EnvSpec

# Registered envs the trainer cannot run, and why. `survey` refuses a stale entry (an env no
# longer registered) and fails on any other env it cannot build, so nothing drops out silently.
EXCLUDED: Mapping[str, str] = {
    "gymnax/MNISTBandit-bsuite": (
        "downloads the MNIST data set over the network when it is built (bsuite's loader); "
        "trainer pods cannot count on network access"
    ),
    "brax/fast": (
        "Brax's unit-test stub: no physics system (no actuators, so no action bounds) and "
        "observations that only count steps"
    ),
}


def registered() -> list[str]:
    """Every env name the installed gymnax and Brax register, excluded ones included."""
    import gymnax
    from brax import envs as brax_envs

    names = [f"gymnax/{env_id}" for env_id in gymnax.registered_envs]
    names += [f"brax/{name}" for name in brax_envs._envs]
    return sorted(names)


def describe(name: str) -> EnvSpec:
    """Builds env ``name`` once, as the trainer does, and reads its spaces and time limit."""
    import jax

    from evokube_trainer.envs._factory import _backend_env
    from evokube_trainer.envs._spaces import Discrete

    env: Any = _backend_env(name, None)
    if name.startswith("gymnax/"):  # the observation's own shape, before the adapter flattens it
        obs = jax.eval_shape(env.env.reset_env, jax.random.key(0), env.params)[0]
    else:
        obs = jax.eval_shape(env.env.reset, jax.random.key(0)).obs
    return EnvSpec(
        name=name,
        actions="discrete" if isinstance(env.action_space, Discrete) else "continuous",
        action_dim=env.action_dim,
        obs_dim=env.obs_dim,
        obs_shape=tuple(int(d) for d in obs.shape),
        episode_length=int(env.default_episode_length),
    )


def survey() -> Catalog:
    """The catalog of the installed libraries. Builds every registered, non-excluded env once
    (about 20 s of CPU, mostly Brax parsing its MJCF models)."""
    names = registered()
    stale = sorted(set(EXCLUDED) - set(names))
    if stale:
        raise RuntimeError(f"EXCLUDED names envs the installed libraries do not register: {stale}")
    envs = {}
    for name in names:
        if name in EXCLUDED:
            continue
        try:
            envs[name] = describe(name)
        except Exception as err:
            raise RuntimeError(
                f"{name} cannot be built ({type(err).__name__}: {err}); fix its adapter or add "
                "it to EXCLUDED in evokube_trainer/envs/survey.py with the reason"
            ) from err
    libraries = {family: version(family) for family in FAMILIES}
    return Catalog(envs=envs, excluded=dict(EXCLUDED), libraries=libraries)
