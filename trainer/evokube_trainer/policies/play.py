"""Playing an exported policy: evaluation episodes, and one episode recorded for a person.

`evaluate_policy` plays episodes as training's evaluation does: the trainer's own
`PopulationRollout` (a population of one member) on the env the policy was trained on
(`artifact.env_config`: episode length, action repeat, backend), one jitted computation (a vmap
over episodes, a `lax.scan` over steps), deterministic actions (`artifact.act`, normalization
included).

`render_policy` records one such episode and hands its states to the viewer the env's library
ships: Brax's HTML viewer (`brax.io.html`), or gymnax's `Visualizer` (a matplotlib animation:
a GIF through Pillow, or an MP4 through ffmpeg where ffmpeg is installed).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path
from typing import Any

import fsspec
import jax
import jax.numpy as jnp
import numpy as np

from evokube_trainer.agents import ParamFlattener
from evokube_trainer.envs import AutoResetInner, EnvState
from evokube_trainer.policies.artifact import METADATA_FILE, PolicyArtifact
from evokube_trainer.workflows import PopulationRollout, env_from_config, episode_length_of

__all__ = [
    "GYMNAX_VISUALIZED",
    "PlaybackError",
    "evaluate_policy",
    "find_policy",
    "render_policy",
]

Array = jax.Array

# The envs gymnax's `Visualizer` draws (gymnax 1.0.1, `gymnax/visualize/visualizer.py`, which
# keeps its list inline); for any other it draws empty axes.
GYMNAX_VISUALIZED = frozenset(
    {
        "Acrobot-v1",
        "CartPole-v1",
        "Pendulum-v1",
        "MountainCar-v0",
        "MountainCarContinuous-v0",
        "Catch-bsuite",
        "Asterix-MinAtar",
        "Breakout-MinAtar",
        "Freeway-MinAtar",
        "Seaquest-MinAtar",
        "SpaceInvaders-MinAtar",
        "Pong-misc",
        "PointRobot-misc",
        "MetaMaze-misc",
        "FourRooms-misc",
    }
)


class PlaybackError(Exception):
    """A policy cannot be found, played or rendered as asked; the message says why."""


def find_policy(url: str) -> str:
    """The policy folder `url` names: `url` itself when it holds a `policy.json`, else its
    `policies/best` (`url` a run folder or a checkpoint location, a path or a bucket URL)."""
    best = f"{url.rstrip('/')}/policies/best"
    for folder in (url, best):
        fs, root = fsspec.core.url_to_fs(folder)
        if fs.exists(f"{root}/{METADATA_FILE}"):
            return folder
    raise PlaybackError(f"{url}: no policy there (no {METADATA_FILE} in it or in {best})")


def _act_as(artifact: PolicyArtifact, params: Any, obs: Array) -> Array:
    """`artifact.act` with `params` in place of its own (the rollout's member)."""
    return dataclasses.replace(artifact, params=params).act(obs)


def _rollout(artifact: PolicyArtifact, episodes: int) -> tuple[PopulationRollout, Array]:
    """The trainer's rollout of `episodes` episodes at once on the policy's env, and the policy
    as its population of one: flat parameters `[1, D]`."""
    if episodes < 1:
        raise PlaybackError(f"episodes must be at least 1, got {episodes}")
    env = env_from_config(artifact.env_config, episodes, "disabled")
    flattener = ParamFlattener.from_params(artifact.params)
    policy = functools.partial(_act_as, artifact)
    rollout = PopulationRollout(env, policy, flattener.unflatten, episode_length_of(env))
    return rollout, flattener.flatten(artifact.params)[None]


def evaluate_policy(artifact: PolicyArtifact, episodes: int = 10, seed: int = 0) -> np.ndarray:
    """Returns `[episodes]` of the policy's deterministic episodes, undiscounted and unscaled,
    as training's evaluation reports them. The episodes start from `PRNGKey(seed)`: the same
    seed gives the same returns."""
    rollout, params = _rollout(artifact, episodes)
    result = jax.jit(rollout.run)(params, jnp.zeros((1,), jnp.float32), jax.random.PRNGKey(seed))
    return np.asarray(result.episode_returns[0])  # [episodes]


def _record(artifact: PolicyArtifact, seed: int) -> tuple[PopulationRollout, Any, np.ndarray]:
    """One episode: the backend env's states it went through (leaves `[T', ...]` host arrays,
    the reset state first, the state that ended it last) and the return so far at each."""
    rollout, params = _rollout(artifact, 1)
    run = jax.jit(functools.partial(rollout.run, record_states=True))
    states: EnvState = run(params, jnp.zeros((1,), jnp.float32), jax.random.PRNGKey(seed)).states
    played = int(np.sum(np.asarray(states.info["frozen"][:, 0, 0]) == 0))
    inner = states.inner  # the wrappers' states down to the backend's own
    while isinstance(inner, AutoResetInner):
        inner = inner.env.inner
    backend = jax.tree.map(lambda x: np.asarray(x[:played, 0, 0]), inner)  # [T', ...]
    returns = np.asarray(states.info["episode_return"][:played, 0, 0])  # [T']
    return rollout, backend, returns


def _frames(trajectory: Any) -> list[Any]:
    """Leaves `[T, ...]` -> a list of T pytrees, as the viewers take them."""
    length = len(jax.tree.leaves(trajectory)[0])
    return [jax.tree.map(lambda x, t=t: x[t], trajectory) for t in range(length)]


def render_policy(artifact: PolicyArtifact, path: str | os.PathLike, seed: int = 0) -> Path:
    """Writes one deterministic episode (started from `PRNGKey(seed)`) to `path` for a person
    to watch: a Brax env as Brax's HTML viewer (`.html`; the page loads the viewer's script
    from a CDN), a gymnax env as an animation (`.gif`; `.mp4` needs ffmpeg). Returns the path.
    """
    if "://" in str(path):
        raise PlaybackError(f"render writes a local file, not {path}; copy it up afterwards")
    path = Path(path)
    name = artifact.env_config.name
    family, _, env_id = name.partition("/")
    suffix = path.suffix.lower()
    if family == "brax" and suffix != ".html":
        raise PlaybackError(f"{name} renders as Brax's HTML viewer: name the file *.html")
    if family == "gymnax":
        if env_id not in GYMNAX_VISUALIZED:
            supported = ", ".join(f"gymnax/{n}" for n in sorted(GYMNAX_VISUALIZED))
            raise PlaybackError(f"gymnax's Visualizer cannot draw {name}; it draws {supported}")
        if suffix not in (".gif", ".mp4"):
            raise PlaybackError(f"{name} renders as an animation: name the file *.gif or *.mp4")
        if suffix == ".mp4" and not _ffmpeg_available():
            raise PlaybackError("writing .mp4 needs ffmpeg on the PATH; write a .gif instead")
    rollout, backend, returns = _record(artifact, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    if family == "brax":
        from brax.io import html

        brax_env = rollout.env.unwrapped.env  # type: ignore[attr-defined]
        path.write_text(html.render(brax_env.sys, _frames(backend.pipeline_state)))
    else:
        from gymnax.visualize import Visualizer

        gymnax_env = rollout.env.unwrapped
        _headless_pygame()
        visualizer = Visualizer(
            gymnax_env.env,  # type: ignore[attr-defined]
            gymnax_env.params,  # type: ignore[attr-defined]
            _frames(backend.env_state),
            returns,
        )
        try:
            visualizer.animate(str(path))
        except ModuleNotFoundError as err:  # Gymnasium's renderer and pygame: evokube[render]
            raise PlaybackError(
                f"drawing {name} needs {err.name}: pip install 'evokube[render]'"
            ) from err
    return path


def _ffmpeg_available() -> bool:
    from matplotlib import animation

    return bool(animation.writers.is_available("ffmpeg"))


def _headless_pygame() -> None:
    """gymnax draws classic-control envs through Gymnasium's pygame renderer, which starts
    pygame afresh for every frame; unless told otherwise, pygame opens a display and an audio
    device it never uses, printing errors for each frame on a headless machine. Only an image
    is drawn, so dummy drivers lose nothing."""
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
