"""Shared by the policy-export tests (trainer, runtime, e2e): play an exported policy."""

import jax
import numpy as np

from evokube_trainer.envs import make_env
from evokube_trainer.policies import PolicyArtifact
from evokube_trainer.workflows import episode_length_of


def play(artifact: PolicyArtifact, episodes: int, seed: int = 0) -> np.ndarray:
    """Returns `[episodes]` of the artifact's deterministic policy, on its environment rebuilt
    from its metadata alone (as a laptop would), one episode per env copy."""
    config = artifact.env_config
    env = make_env(
        config.name,
        num_envs=episodes,
        episode_length=config.episode_length,
        autoreset="disabled",
        backend=config.backend,
        action_repeat=config.action_repeat,
    )

    @jax.jit
    def run(key):
        def one_step(state, _):
            return env.step(state, artifact.act(state.obs)), None

        final, _ = jax.lax.scan(one_step, env.reset(key), None, episode_length_of(env))
        return final.info["episode_return"]  # [episodes]

    return np.asarray(run(jax.random.PRNGKey(seed)))
