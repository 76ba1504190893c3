"""Policy artifacts (`evokube_trainer.policies`): the folder round-trips through a local path and
memory://, a folder whose files disagree is refused, and `act` is the action the training
evaluator takes (normalization included) for an EC actor, a TD3 actor and a SAC actor.

Compilation dominates on CPU: tiny networks and short episodes.
"""

import json
import threading
import time

import fsspec
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evokube_trainer.agents import Actor, SACConfig, TD3Config
from evokube_trainer.envs import normalize_obs
from evokube_trainer.policies import (
    FORMAT,
    PARAMS_FILE,
    PolicyArtifact,
    PolicyReadError,
    network_config,
    read_policy,
    write_policy,
)
from evokube_trainer.workflows import (
    ECConfig,
    EnvConfig,
    ERLConfig,
    ReplayConfig,
    actor_network,
    jit_workflow,
    make_workflow,
)

ENVIRONMENT = {  # a defaulted spec.environment
    "name": "gymnax/Pendulum-v1",
    "episodeLength": 20,
    "episodesPerEvaluation": 1,
    "actionRepeat": 1,
    "rewardScale": 1.0,
    "normalizeObservations": True,
}
ENV = EnvConfig(
    "gymnax/Pendulum-v1", episode_length=20, eval_episodes=3, normalize_observations=True
)
REPLAY = ReplayConfig(capacity=256, batch_size=8, warmup_steps=40, warmup_envs=4)
CONFIGS = {
    "ec": ECConfig(env=ENV, pop_size=4, actor_hidden_sizes=(8,)),
    "td3": ERLConfig(env=ENV, pop_size=4, agent=TD3Config(actor_hidden_sizes=(8,)), replay=REPLAY),
    "sac": ERLConfig(env=ENV, pop_size=4, agent=SACConfig(actor_hidden_sizes=(8,)), replay=REPLAY),
}


def _artifact(name: str) -> tuple[PolicyArtifact, object, object]:
    """The artifact of a workflow's best candidate after one generation, with the workflow and
    its state."""
    config = CONFIGS[name]
    workflow = make_workflow(config)
    fns = jit_workflow(workflow)
    state, _ = fns.step(fns.init(jax.random.PRNGKey(0)))
    flat = workflow.candidates(state)[-1]  # [D]: TD3/SAC: the RL agent's actor
    env = workflow.env
    metadata = {
        "algorithm": name,
        "environment": ENVIRONMENT,
        "evaluationEpisodes": ENV.eval_episodes,
        "network": network_config(actor_network(config, env.obs_dim, env.action_dim)),
        "generation": 1,
        "evalReturn": -1234.5,
        "seed": 0,
    }
    params = jax.device_get(workflow.rollout.unflatten(flat))
    artifact = PolicyArtifact(metadata=metadata, params=params, obs_stats=state.obs_stats)
    return artifact, workflow, (state, flat)


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def trained(request):
    return _artifact(request.param)


def _observations(workflow) -> jnp.ndarray:
    """Real observations `[2E, obs]` of the evaluation env, and the same far out (clipped)."""
    obs = workflow.evaluator.env.reset(jax.random.PRNGKey(7)).obs  # [E, obs]
    return jnp.concatenate([obs, 50.0 * obs])


def test_act_is_the_evaluators_deterministic_action(trained, tmp_path):
    artifact, workflow, (state, flat) = trained
    assert state.obs_stats is not None and float(state.obs_stats.count) > 0
    obs = _observations(workflow)
    params = workflow.evaluator.unflatten(flat)
    normalized = normalize_obs(state.obs_stats, obs)
    noise = jax.random.normal(jax.random.PRNGKey(1), (obs.shape[0], workflow.env.action_dim))
    expected = workflow.evaluator.act(params, normalized, noise, jnp.zeros(()))  # scale 0

    write_policy(str(tmp_path / "policy"), artifact)
    loaded = read_policy(str(tmp_path / "policy"))
    for policy in (artifact, loaded):
        np.testing.assert_allclose(policy.act(obs), expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(jax.jit(policy.act)(obs), expected, rtol=1e-5, atol=1e-6)
    assert float(jnp.max(jnp.abs(expected))) > 1e-3  # a real policy, not zeros


@pytest.mark.parametrize("where", ["local", "memory"])
def test_round_trip(trained, tmp_path, where):
    artifact, _, _ = trained
    url = str(tmp_path / "best") if where == "local" else f"memory://round-trip/{id(tmp_path)}"
    write_policy(url, artifact)
    loaded = read_policy(url)

    assert loaded.metadata["format"] == FORMAT
    assert {k: loaded.metadata[k] for k in artifact.metadata} == artifact.metadata
    assert loaded.metadata["normalizeObservations"] is True
    assert jax.tree.structure(loaded.params) == jax.tree.structure(artifact.params)
    leaves = zip(jax.tree.leaves(loaded.params), jax.tree.leaves(artifact.params), strict=True)
    for got, want in leaves:
        assert isinstance(got, np.ndarray)
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(loaded.obs_stats.mean, artifact.obs_stats.mean)
    np.testing.assert_array_equal(loaded.obs_stats.count, artifact.obs_stats.count)
    np.testing.assert_allclose(loaded.obs_stats.var, artifact.obs_stats.var, rtol=1e-6)
    assert loaded.env_config == ENV
    assert type(loaded.network) is type(artifact.network)


def test_the_files_are_plain_json_and_numpy(trained, tmp_path):
    artifact, _, _ = trained
    write_policy(str(tmp_path), artifact)
    metadata = json.loads((tmp_path / "policy.json").read_text())
    assert metadata["network"]["hiddenSizes"] == [8]
    assert metadata["paramsFile"]["bytes"] == (tmp_path / PARAMS_FILE).stat().st_size
    with np.load(tmp_path / PARAMS_FILE) as npz:
        names = set(npz.files)
    assert {"obs_mean", "obs_var", "obs_count"} <= names
    assert all(n.startswith("params/") for n in names - {"obs_mean", "obs_var", "obs_count"})
    assert sorted(p.name for p in tmp_path.iterdir()) == [PARAMS_FILE, "policy.json"]


def test_without_normalization(tmp_path):
    artifact, workflow, (_, flat) = _artifact("ec")
    plain = PolicyArtifact(
        metadata={**artifact.metadata, "environment": {**ENVIRONMENT}},
        params=artifact.params,
        obs_stats=None,
    )
    write_policy(str(tmp_path), plain)
    loaded = read_policy(str(tmp_path))
    assert loaded.obs_stats is None and loaded.metadata["normalizeObservations"] is False
    with np.load(tmp_path / PARAMS_FILE) as npz:
        assert "obs_mean" not in npz.files
    obs = _observations(workflow)
    expected = workflow.evaluator.policy(workflow.evaluator.unflatten(flat), obs)
    np.testing.assert_allclose(loaded.act(obs), expected, rtol=1e-5, atol=1e-6)


def test_a_folder_whose_files_disagree_is_refused(trained):
    artifact, _, _ = trained
    url = "memory://disagree/policy"
    write_policy(url, artifact)
    fs, root = fsspec.core.url_to_fs(url)
    fs.pipe_file(f"{root}/{PARAMS_FILE}", fs.cat_file(f"{root}/{PARAMS_FILE}") + b"\0")
    with pytest.raises(PolicyReadError, match="does not match"):
        read_policy(url, attempts=2, retry_s=0.0)
    write_policy(url, artifact)  # the writer finishes: the folder reads again
    assert read_policy(url).metadata["generation"] == 1


def test_an_incomplete_folder_is_refused(tmp_path):
    with pytest.raises(PolicyReadError, match="no complete policy"):
        read_policy(str(tmp_path))
    (tmp_path / "policy.json").write_text(json.dumps({"format": "something/v9"}))
    (tmp_path / PARAMS_FILE).write_bytes(b"")
    with pytest.raises(PolicyReadError, match="format"):
        read_policy(str(tmp_path))


def test_a_reader_never_sees_a_folder_half_replaced(tmp_path):
    """One thread replaces the folder over and over with two policies (every 20 ms; the
    trainer does at most once per evaluation); every read gets one of them whole: its params
    are the ones its policy.json describes."""
    network = Actor(action_dim=1, hidden_sizes=(64, 64))
    policies = {
        generation: PolicyArtifact(
            metadata={"generation": generation, "network": network_config(network)},
            params=jax.device_get(network.init(jax.random.PRNGKey(generation), jnp.zeros(3))),
            obs_stats=None,
        )
        for generation in (1, 2)
    }
    url = str(tmp_path / "best")
    write_policy(url, policies[1])
    done = threading.Event()

    def writer():
        for count in range(100):
            write_policy(url, policies[1 + count % 2])
            time.sleep(0.02)
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    reads = 0
    while not done.is_set():
        loaded = read_policy(url, retry_s=0.05)
        want = policies[loaded.metadata["generation"]].params
        for got, expected in zip(
            jax.tree.leaves(loaded.params), jax.tree.leaves(want), strict=True
        ):
            np.testing.assert_array_equal(got, expected)
        reads += 1
    thread.join()
    assert reads > 10
