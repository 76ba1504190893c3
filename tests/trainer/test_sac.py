"""Tests of SAC: the squashed Gaussian actor, the soft targets, one update (eager and jitted),
the entropy temperature, the shared-critic step CEM-RL uses, and the deterministic policy EC
evolves. The learning run is in test_workflows.py (ERL-GA with SAC agents)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evokube_trainer.agents import (
    SAC,
    GaussianActor,
    ParamFlattener,
    SACConfig,
)
from evokube_trainer.replay import ReplayBuffer
from tests.trainer.agent_helpers import (
    ACTION_DIM,
    BATCH,
    OBS_DIM,
    random_batch,
    trees_allclose,
)

SMALL = {"actor_hidden_sizes": (32, 32), "critic_hidden_sizes": (32, 32)}


def _sac(**overrides) -> SAC:
    return SAC(SACConfig(**{**SMALL, **overrides}), OBS_DIM, ACTION_DIM)


# ---- the actor and the deployable policy ---------------------------------------------------


def test_gaussian_actor_has_two_heads_and_bounded_log_std():
    actor = GaussianActor(ACTION_DIM, (16,), log_std_min=-5.0, log_std_max=2.0)
    params = actor.init(jax.random.key(0), jnp.zeros(OBS_DIM))
    assert set(params["params"]) >= {"mean", "log_std"}
    obs = 1000.0 * jax.random.normal(jax.random.key(1), (64, OBS_DIM))
    mean, log_std = actor.apply(params, obs)
    assert mean.shape == log_std.shape == (64, ACTION_DIM)
    assert jnp.all(log_std >= -5.0) and jnp.all(log_std <= 2.0)


def test_deterministic_policy_is_tanh_of_the_mean_and_in_bounds():
    sac = _sac()
    params = sac.init_actor_params(jax.random.key(0))
    obs = 100.0 * jax.random.normal(jax.random.key(1), (256, OBS_DIM))  # saturating inputs
    action = jax.jit(sac.policy)(params, obs)
    assert action.shape == (256, ACTION_DIM)
    assert jnp.all(jnp.abs(action) <= 1.0)
    mean, _ = sac.distribution(params, obs)
    np.testing.assert_allclose(action, jnp.tanh(mean), rtol=1e-6)


def test_population_member_is_the_whole_actor_and_round_trips():
    """EC evolves both heads; the flat vector unflattens to a working policy."""
    sac = _sac()
    params = sac.init_actor_params(jax.random.key(0))
    flat = ParamFlattener.from_params(params)
    trunk = (OBS_DIM * 32 + 32) + (32 * 32 + 32)
    assert flat.num_dims == trunk + 2 * (32 * ACTION_DIM + ACTION_DIM)  # mean + log-std heads
    obs = jnp.ones((4, OBS_DIM))
    np.testing.assert_array_equal(
        sac.policy(flat.unflatten(flat.flatten(params)), obs), sac.policy(params, obs)
    )


def test_explore_samples_the_policy_and_scale_zero_is_deterministic():
    sac = _sac()
    params = sac.init_actor_params(jax.random.key(0))
    obs = jax.random.normal(jax.random.key(1), (8, OBS_DIM))
    noise = jax.random.normal(jax.random.key(2), (8, ACTION_DIM))
    np.testing.assert_allclose(sac.explore(params, obs, noise, 0.0), sac.policy(params, obs))
    sampled, _ = sac.sample(params, obs, jax.random.key(2))  # same key: same standard normals
    np.testing.assert_allclose(sac.explore(params, obs, noise, 1.0), sampled, rtol=1e-6)
    assert not np.allclose(sampled, sac.policy(params, obs))
    assert sac.exploration_scale == 1.0


def test_log_prob_is_the_change_of_variables_of_the_tanh_gaussian():
    sac = _sac()
    params = sac.init_actor_params(jax.random.key(0))
    obs = jax.random.normal(jax.random.key(1), (32, OBS_DIM))
    key = jax.random.key(2)
    action, log_prob = sac.sample(params, obs, key)
    mean, log_std = sac.distribution(params, obs)
    u = mean + jnp.exp(log_std) * jax.random.normal(key, mean.shape)
    np.testing.assert_allclose(action, jnp.tanh(u), rtol=1e-6)
    std = jnp.exp(log_std)
    gaussian = -0.5 * ((u - mean) / std) ** 2 - jnp.log(std) - 0.5 * math.log(2 * math.pi)
    naive = jnp.sum(gaussian - jnp.log(1.0 - jnp.tanh(u) ** 2), axis=-1)  # fine for moderate u
    np.testing.assert_allclose(log_prob, naive, rtol=1e-4, atol=1e-4)


# ---- critic ------------------------------------------------------------------------------------


def test_soft_target_bootstraps_with_the_entropy_bonus_but_not_on_termination():
    sac = _sac(discount=0.9, init_temperature=0.5)
    state = sac.init(jax.random.key(0))
    batch = random_batch(jax.random.key(1), n=4, terminated=[1.0, 0.0, 0.0, 1.0])
    key = jax.random.key(2)
    y = jax.jit(sac.critic_target)(state.critic, state.actor.params, batch, key)

    next_action, next_log_prob = sac.sample(state.actor.params, batch.next_obs, key)
    q_next = sac.q_values(state.critic.target_params, batch.next_obs, next_action)  # [2, 4]
    soft = jnp.min(q_next, axis=0) - 0.5 * next_log_prob
    np.testing.assert_allclose(y[jnp.array([0, 3])], batch.reward[jnp.array([0, 3])], rtol=1e-6)
    np.testing.assert_allclose(y[1:3], batch.reward[1:3] + 0.9 * soft[1:3], rtol=1e-5)


def test_critic_loss_decreases_on_a_fixed_batch():
    """Repeated critic steps drive the TD loss down on a terminal-only batch (y = reward)."""
    sac = _sac(critic_lr=1e-2)
    state = sac.init(jax.random.key(0))
    batch = random_batch(jax.random.key(1), terminated=jnp.ones(BATCH))
    step = jax.jit(sac.critic_update)
    critic, first = step(state.critic, state.actor.params, batch, jax.random.key(2))
    for i in range(150):
        critic, metrics = step(critic, state.actor.params, batch, jax.random.key(i))
    assert float(metrics["critic_loss"]) < 0.05 * float(first["critic_loss"])


# ---- the full step -------------------------------------------------------------------------


@pytest.mark.parametrize("use_jit", [False, True])
def test_update_steps_every_part_and_soft_updates_the_critic_target(use_jit):
    tau = 0.1
    sac = _sac(tau=tau)
    update = jax.jit(sac.update) if use_jit else sac.update
    state = sac.init(jax.random.key(0))
    for step in range(1, 4 if use_jit else 2):  # eager dispatch is slow: one step only
        prev = state
        state, metrics = update(
            state, random_batch(jax.random.key(step)), jax.random.key(100 + step)
        )
        assert int(state.step) == step
        assert set(metrics) == {
            "critic_loss",
            "q_mean",
            "target_q_mean",
            "actor_loss",
            "entropy",
            "alpha",
            "alpha_loss",
        }
        assert all(m.shape == () and np.isfinite(m) for m in jax.tree.leaves(metrics))
        assert not trees_allclose(state.critic.params, prev.critic.params)
        assert not trees_allclose(state.actor.params, prev.actor.params)
        assert float(state.critic.log_alpha) != float(prev.critic.log_alpha)
        np.testing.assert_allclose(metrics["alpha"], jnp.exp(state.critic.log_alpha), rtol=1e-6)
        assert trees_allclose(
            state.critic.target_params,
            jax.tree.map(
                lambda t, o: tau * o + (1 - tau) * t,
                prev.critic.target_params,
                state.critic.params,
            ),
            rtol=1e-5,
            atol=1e-7,
        )


def test_update_is_critic_then_actor_on_the_new_critic_then_temperature():
    sac = _sac()
    state = sac.init(jax.random.key(0))
    batch, key = random_batch(jax.random.key(1)), jax.random.key(2)
    new, _ = sac.update(state, batch, key)
    critic_key, actor_key = jax.random.split(key)
    critic, _ = sac.critic_update(state.critic, state.actor.params, batch, critic_key)
    actor, log_prob, _ = sac.actor_update(state.actor, critic, batch, actor_key)
    critic, _ = sac.temperature_update(critic, log_prob)
    assert trees_allclose(new.critic.params, critic.params, rtol=1e-6)
    assert trees_allclose(new.actor.params, actor.params, rtol=1e-6)
    np.testing.assert_allclose(new.critic.log_alpha, critic.log_alpha, rtol=1e-6)


@pytest.mark.parametrize(("target_entropy", "direction"), [(5.0, 1.0), (-20.0, -1.0)])
def test_temperature_moves_toward_the_target_entropy(target_entropy, direction):
    """alpha grows while the policy's entropy is below the target and shrinks above it. The
    initial policy's entropy (std ~0.2, two dims) lies between the two targets."""
    sac = _sac(target_entropy=target_entropy, temperature_lr=1e-2)
    state = sac.init(jax.random.key(0))
    batch = random_batch(jax.random.key(1))
    update = jax.jit(sac.update)
    alphas = [float(jnp.exp(state.critic.log_alpha))]
    for i in range(10):
        state, metrics = update(state, batch, jax.random.key(10 + i))
        alphas.append(float(metrics["alpha"]))
        assert -20.0 < float(metrics["entropy"]) < 5.0
    assert np.all(direction * np.diff(alphas) > 0), alphas


def test_fixed_temperature_stays_put():
    sac = _sac(tune_temperature=False, init_temperature=0.2)
    _, metrics = jax.jit(sac.update)(
        sac.init(jax.random.key(0)), random_batch(jax.random.key(1)), jax.random.key(2)
    )
    np.testing.assert_allclose(metrics["alpha"], 0.2, rtol=1e-6)
    with pytest.raises(ValueError, match="init_temperature"):
        SACConfig(init_temperature=0.0)


def test_update_many_scans_over_replay_samples():
    sac = _sac()
    buf = ReplayBuffer(capacity=64, sample_batch_size=8)
    example = jax.tree.map(lambda x: x[0], random_batch(jax.random.key(0), n=1))
    buffer_state = buf.add(buf.init(example), random_batch(jax.random.key(1), n=40))
    run = jax.jit(lambda s, b, k: sac.update_many(s, b, buf, k, 5))
    state, metrics = run(sac.init(jax.random.key(2)), buffer_state, jax.random.key(3))
    assert int(state.step) == 5
    assert metrics["critic_loss"].shape == ()


def test_shared_update_trains_k_actors_against_one_critic():
    """CEM-RL: one critic (and temperature) for K actors; with one actor the critic step is the
    plain one."""
    sac = _sac()
    k = 3
    critic = sac.init_critic(jax.random.key(0))
    params = jax.vmap(sac.init_actor_params)(jax.random.split(jax.random.key(1), k))
    actors = jax.vmap(sac.actor_state_from_params)(params)
    batches = jax.vmap(random_batch)(jax.random.split(jax.random.key(2), k))  # [K, B, ...]
    key = jax.random.key(3)
    new_critic, new_actors, metrics = jax.jit(sac.shared_update)(
        critic, actors, jnp.int32(0), batches, key
    )
    assert jax.tree.map(jnp.shape, new_critic) == jax.tree.map(jnp.shape, critic)  # no [K] axis
    assert all(m.shape == () for m in jax.tree.leaves(metrics))
    assert float(metrics["actor_updated"]) == 1.0
    for i in range(k):
        assert not trees_allclose(
            jax.tree.map(lambda x, i=i: x[i], new_actors.params),
            jax.tree.map(lambda x, i=i: x[i], actors.params),
        )

    one = jax.tree.map(lambda x: x[:1], (params, batches))
    shared, _ = jax.jit(sac.shared_critic_update)(critic, one[0], one[1], key)
    plain, _ = jax.jit(sac.critic_update)(
        critic,
        jax.tree.map(lambda x: x[0], one[0]),
        jax.tree.map(lambda x: x[0], one[1]),
        jax.random.split(key, 1)[0],
    )
    assert trees_allclose(shared.params, plain.params, rtol=1e-5, atol=1e-7)


def test_vmapped_independent_agents_match_single_agent():
    sac = _sac()
    keys = jax.random.split(jax.random.key(0), 2)
    batches = jax.vmap(random_batch)(jax.random.split(jax.random.key(1), 2))
    update_keys = jax.random.split(jax.random.key(2), 2)
    states, _ = jax.jit(jax.vmap(sac.update))(jax.vmap(sac.init)(keys), batches, update_keys)
    single, _ = jax.jit(sac.update)(
        sac.init(keys[1]), jax.tree.map(lambda x: x[1], batches), update_keys[1]
    )
    assert trees_allclose(jax.tree.map(lambda x: x[1], states), single, rtol=1e-4, atol=1e-6)
