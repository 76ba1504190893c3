"""Evaluation picks the best candidate policy: the optimizer's best or, in ERL, an agent."""

import jax
import jax.numpy as jnp
import pytest

from evokube_trainer.agents import TD3Config
from evokube_trainer.workflows import (
    CEMRLConfig,
    ECConfig,
    EnvConfig,
    ERLConfig,
    ReplayConfig,
    make_workflow,
)

PENDULUM = "gymnax/Pendulum-v1"
# ---- evaluation picks among the candidates --------------------------------------------------


def test_ec_has_one_candidate_and_erl_adds_its_agents():
    env = EnvConfig(PENDULUM, episode_length=10, eval_episodes=2)
    small = TD3Config(actor_hidden_sizes=(8,), critic_hidden_sizes=(8,))
    replay = ReplayConfig(capacity=256, batch_size=8, warmup_steps=16, warmup_envs=2)
    ec = make_workflow(ECConfig(env=env, pop_size=4, actor_hidden_sizes=(8,)))
    erl = make_workflow(
        ERLConfig(
            env=env, pop_size=4, optimizer="open_es", num_agents=3, agent=small, replay=replay
        )
    )
    cemrl = make_workflow(CEMRLConfig(env=env, pop_size=4, agent=small, replay=replay))
    for workflow, count in ((ec, 1), (erl, 4), (cemrl, 1)):
        state = jax.jit(workflow.init)(jax.random.PRNGKey(0))
        candidates = workflow.candidates(state)  # [C, D]
        assert candidates.shape[0] == count
        assert jnp.array_equal(candidates[0], workflow.optimizer.best(state.ec))
    state = jax.jit(erl.init)(jax.random.PRNGKey(0))
    agents, _ = erl.learner.actors(state.learner)
    assert jnp.array_equal(erl.candidates(state)[1:], agents)


def test_evaluation_reports_the_candidate_with_the_best_mean_return():
    env = EnvConfig(PENDULUM, episode_length=20, eval_episodes=3)
    small = TD3Config(actor_hidden_sizes=(8,), critic_hidden_sizes=(8,))
    replay = ReplayConfig(capacity=256, batch_size=8, warmup_steps=16, warmup_envs=2)
    workflow = make_workflow(
        ERLConfig(
            env=env, pop_size=4, optimizer="sep_cem", num_agents=2, agent=small, replay=replay
        )
    )
    state = jax.jit(workflow.init)(jax.random.PRNGKey(1))
    metrics, policy = jax.jit(workflow.evaluate)(state)
    key = jax.random.fold_in(state.key, 0x5EED)
    candidates = workflow.candidates(state)
    result = workflow.evaluator.run(candidates, jnp.zeros((3,)), key)
    means = jnp.mean(result.episode_returns, axis=1)  # [C]
    assert int(metrics["eval/candidate"]) == int(jnp.argmax(means))
    assert float(metrics["eval/return_mean"]) == pytest.approx(float(jnp.max(means)), rel=1e-6)
    assert jnp.array_equal(policy, candidates[jnp.argmax(means)])  # what an export holds
