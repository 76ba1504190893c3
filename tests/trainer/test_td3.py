"""Tests of the agents package: networks, TD3 semantics, and a small learning run."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evokube_trainer.agents import (
    TD3,
    Actor,
    ParamFlattener,
    TD3Config,
    Transition,
    TwinCritic,
    soft_update,
)
from evokube_trainer.replay import ReplayBuffer
from tests.trainer.agent_helpers import (
    ACTION_DIM,
    BATCH,
    OBS_DIM,
    random_batch,
    trees_allclose,
    trees_equal,
)

SMALL = {"actor_hidden_sizes": (32, 32), "critic_hidden_sizes": (32, 32)}


def _td3(**overrides) -> TD3:
    return TD3(TD3Config(**{**SMALL, **overrides}), OBS_DIM, ACTION_DIM)


# ---- networks ----------------------------------------------------------------------------------


def test_actor_output_is_bounded_and_critic_heads_are_independent():
    key = jax.random.key(0)
    actor = Actor(ACTION_DIM, (16,))
    params = actor.init(key, jnp.zeros(OBS_DIM))
    out = actor.apply(params, 100.0 * jax.random.normal(key, (7, OBS_DIM)))
    assert out.shape == (7, ACTION_DIM)
    assert jnp.all(jnp.abs(out) <= 1.0)

    critic = TwinCritic((16,), layer_norm=True)
    cparams = critic.init(key, jnp.zeros(OBS_DIM), jnp.zeros(ACTION_DIM))
    q = critic.apply(cparams, jnp.ones((5, OBS_DIM)), jnp.ones((5, ACTION_DIM)))
    assert q.shape == (2, 5)
    assert not np.allclose(q[0], q[1])  # separately initialised heads
    leaves = jax.tree_util.tree_flatten_with_path(cparams)[0]
    assert any("LayerNorm" in jax.tree_util.keystr(p) for p, _ in leaves)
    assert all(leaf.shape[0] == 2 for _, leaf in leaves)  # stacked per head


def test_param_flattener_round_trips():
    td3 = _td3()
    params = td3.init_actor_params(jax.random.key(0))
    flat = ParamFlattener.from_params(params)
    expected_dims = (OBS_DIM * 32 + 32) + (32 * 32 + 32) + (32 * ACTION_DIM + ACTION_DIM)
    assert flat.num_dims == expected_dims

    vec = flat.flatten(params)
    assert vec.shape == (expected_dims,) and vec.dtype == jnp.float32
    assert trees_equal(flat.unflatten(vec), params)

    with pytest.raises(ValueError, match="flat vector"):
        flat.unflatten(jnp.zeros(3))


# ---- TD3 pieces --------------------------------------------------------------------------------


def test_target_policy_smoothing_noise_is_clipped():
    td3 = _td3(policy_noise=10.0, noise_clip=0.3)
    state = td3.init(jax.random.key(0))
    next_obs = jax.random.normal(jax.random.key(1), (512, OBS_DIM))
    base = td3.policy(state.actor.target_params, next_obs)
    target = td3.target_action(state.actor.target_params, next_obs, jax.random.key(2))
    assert jnp.all(jnp.abs(target) <= 1.0)
    diff = target - base
    assert jnp.all(jnp.abs(diff) <= 0.3 + 1e-6)
    # With std 10 nearly every draw hits the clip: |noise| == 0.3 where [-1, 1] does not bind.
    interior = jnp.abs(base) < 0.7
    assert jnp.mean(jnp.isclose(jnp.abs(diff), 0.3, atol=1e-5)[interior]) > 0.95
    # Both signs occur.
    assert jnp.any(diff > 0.29) and jnp.any(diff < -0.29)

    quiet = _td3(policy_noise=0.0)
    np.testing.assert_allclose(
        quiet.target_action(state.actor.target_params, next_obs, jax.random.key(2)), base
    )


def test_critic_target_bootstraps_on_truncation_but_not_termination():
    td3 = _td3(discount=0.9)
    state = td3.init(jax.random.key(0))
    terminated = jnp.array([1.0, 0.0, 0.0, 1.0])
    truncated = jnp.array([0.0, 1.0, 0.0, 1.0])
    batch = random_batch(jax.random.key(1), n=4, terminated=terminated, truncated=truncated)
    key = jax.random.key(2)
    y = jax.jit(td3.critic_target)(
        state.critic.target_params, state.actor.target_params, batch, key
    )

    next_action = td3.target_action(state.actor.target_params, batch.next_obs, key)
    q_next = td3.q_values(state.critic.target_params, batch.next_obs, next_action)  # [2, 4]
    min_q = jnp.minimum(q_next[0], q_next[1])
    assert not np.allclose(min_q, 0.0)
    # Terminated rows (also when truncated at the same time): reward only.
    np.testing.assert_allclose(y[jnp.array([0, 3])], batch.reward[jnp.array([0, 3])], rtol=1e-6)
    # Truncated and ordinary rows: bootstrap from the min of the twin target critics.
    np.testing.assert_allclose(y[1:3], batch.reward[1:3] + 0.9 * min_q[1:3], rtol=1e-5)


def test_soft_update_math():
    target = {"w": jnp.array([0.0, 10.0]), "b": jnp.array(4.0)}
    online = {"w": jnp.array([1.0, 20.0]), "b": jnp.array(0.0)}
    out = soft_update(target, online, 0.25)
    np.testing.assert_allclose(out["w"], [0.25, 12.5])
    np.testing.assert_allclose(out["b"], 3.0)


@pytest.mark.parametrize("use_jit", [False, True])
def test_actor_and_targets_update_only_every_interval(use_jit):
    tau = 0.1
    td3 = _td3(actor_update_interval=3, tau=tau)
    update = jax.jit(td3.update) if use_jit else td3.update
    state = td3.init(jax.random.key(0))
    for step in range(1, 7 if use_jit else 4):  # eager dispatch is slow: one cycle only
        prev = state
        state, metrics = update(
            state, random_batch(jax.random.key(step)), jax.random.key(100 + step)
        )
        assert int(state.step) == step
        assert not trees_allclose(state.critic.params, prev.critic.params)  # critic: every step
        assert set(metrics) >= {"critic_loss", "actor_loss", "q_mean", "actor_updated"}
        assert all(np.isfinite(v) for v in jax.tree.leaves(metrics))
        if step % 3:
            assert float(metrics["actor_updated"]) == 0.0
            assert trees_equal(state.actor.params, prev.actor.params)
            assert trees_equal(state.actor.opt_state, prev.actor.opt_state)
            assert trees_equal(state.actor.target_params, prev.actor.target_params)
            assert trees_equal(state.critic.target_params, prev.critic.target_params)
        else:
            assert float(metrics["actor_updated"]) == 1.0
            assert not trees_allclose(state.actor.params, prev.actor.params)
            # Polyak step on both targets, towards the freshly updated online params.
            assert trees_allclose(
                state.actor.target_params,
                jax.tree.map(
                    lambda t, o: tau * o + (1 - tau) * t,
                    prev.actor.target_params,
                    state.actor.params,
                ),
                rtol=1e-5,
                atol=1e-7,
            )
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


def test_update_is_one_critic_step_then_actor_step_on_the_new_critic():
    td3 = _td3(actor_update_interval=1)
    state = td3.init(jax.random.key(0))
    batch, key = random_batch(jax.random.key(1)), jax.random.key(2)
    new, _ = td3.update(state, batch, key)
    critic, _ = td3.critic_update(state.critic, state.actor.target_params, batch, key)
    actor, _ = td3.actor_update(state.actor, critic.params, batch)
    assert trees_allclose(new.critic.params, critic.params, rtol=1e-6)
    assert trees_allclose(new.actor.params, actor.params, rtol=1e-6)


def test_actor_loss_uses_first_or_min_critic():
    state = _td3().init(jax.random.key(0))
    obs = random_batch(jax.random.key(1)).obs
    first, smallest = _td3(actor_loss_q="first"), _td3(actor_loss_q="min")
    q = first.q_values(state.critic.params, obs, first.policy(state.actor.params, obs))
    np.testing.assert_allclose(
        first.actor_loss(state.actor.params, state.critic.params, obs), -jnp.mean(q[0]), rtol=1e-6
    )
    np.testing.assert_allclose(
        smallest.actor_loss(state.actor.params, state.critic.params, obs),
        -jnp.mean(jnp.min(q, axis=0)),
        rtol=1e-6,
    )
    with pytest.raises(ValueError, match="actor_loss_q"):
        TD3Config(actor_loss_q="mean")


def test_critic_learns_a_fixed_target():
    """Repeated critic steps drive the TD loss down on a terminal-only batch (y = reward)."""
    td3 = _td3(critic_lr=1e-2)
    state = td3.init(jax.random.key(0))
    batch = random_batch(jax.random.key(1), terminated=jnp.ones(BATCH))
    step = jax.jit(td3.critic_update)
    critic, first = step(state.critic, state.actor.target_params, batch, jax.random.key(2))
    for i in range(150):
        critic, metrics = step(critic, state.actor.target_params, batch, jax.random.key(i))
    assert float(metrics["critic_loss"]) < 0.05 * float(first["critic_loss"])


def test_vmapped_independent_agents_match_single_agent():
    td3 = _td3()
    keys = jax.random.split(jax.random.key(0), 3)
    states = jax.vmap(td3.init)(keys)
    batches = jax.vmap(random_batch)(jax.random.split(jax.random.key(1), 3))
    update_keys = jax.random.split(jax.random.key(2), 3)
    update = jax.jit(jax.vmap(td3.update))
    new_states, metrics = update(states, batches, update_keys)
    new_states, metrics = update(new_states, batches, update_keys)
    assert metrics["critic_loss"].shape == (3,)
    np.testing.assert_array_equal(new_states.step, [2, 2, 2])

    single = td3.init(keys[1])
    batch1 = jax.tree.map(lambda x: x[1], batches)
    single_update = jax.jit(td3.update)
    single, _ = single_update(single, batch1, update_keys[1])
    single, _ = single_update(single, batch1, update_keys[1])
    assert trees_allclose(jax.tree.map(lambda x: x[1], new_states), single, rtol=1e-4, atol=1e-6)


def test_shared_critic_update_averages_over_actors():
    """CEM-RL: one critic trained against K actor targets, each actor against that critic."""
    td3 = _td3()
    k = 3
    critic = td3.init_critic(jax.random.key(0))
    actors = jax.vmap(td3.init_actor)(jax.random.split(jax.random.key(1), k))
    batches = jax.vmap(random_batch)(jax.random.split(jax.random.key(2), k))  # [K, B, ...]
    key = jax.random.key(3)

    new_critic, metrics = jax.jit(td3.shared_critic_update)(
        critic, actors.target_params, batches, key
    )

    @jax.jit
    def loss_for_actor(i, sub):
        batch_i = jax.tree.map(lambda x: x[i], batches)
        actor_i = jax.tree.map(lambda x: x[i], actors.target_params)
        y = td3.critic_target(critic.target_params, actor_i, batch_i, sub)
        return td3.critic_loss(critic.params, y, batch_i)[0]

    per_actor = [loss_for_actor(i, sub) for i, sub in enumerate(jax.random.split(key, k))]
    np.testing.assert_allclose(metrics["critic_loss"], np.mean(per_actor), rtol=1e-5)
    assert not trees_allclose(new_critic.params, critic.params)

    # With a single actor it is exactly the plain critic step.
    one = jax.tree.map(lambda x: x[:1], (actors.target_params, batches))
    shared_one, _ = jax.jit(td3.shared_critic_update)(critic, one[0], one[1], key)
    plain, _ = jax.jit(td3.critic_update)(
        critic,
        jax.tree.map(lambda x: x[0], one[0]),
        jax.tree.map(lambda x: x[0], one[1]),
        jax.random.split(key, 1)[0],
    )
    assert trees_allclose(shared_one.params, plain.params, rtol=1e-5, atol=1e-7)

    # Every actor steps against the shared critic.
    new_actors, actor_metrics = jax.jit(jax.vmap(td3.actor_update, in_axes=(0, None, 0)))(
        actors, new_critic.params, batches
    )
    assert actor_metrics["actor_loss"].shape == (k,)
    for i in range(k):
        assert not trees_allclose(
            jax.tree.map(lambda x, i=i: x[i], new_actors.params),
            jax.tree.map(lambda x, i=i: x[i], actors.params),
        )


def test_actor_state_from_flat_params():
    td3 = _td3()
    params = td3.init_actor_params(jax.random.key(0))
    flat = ParamFlattener.from_params(params)
    actor = td3.actor_state_from_params(flat.unflatten(flat.flatten(params) + 1.0))
    assert trees_equal(actor.params, actor.target_params)
    assert trees_allclose(flat.flatten(actor.params), flat.flatten(params) + 1.0)


def test_update_many_scans_over_replay_samples():
    td3 = _td3(actor_update_interval=2)
    buf = ReplayBuffer(capacity=64, sample_batch_size=8)
    example = jax.tree.map(lambda x: x[0], random_batch(jax.random.key(0), n=1))
    buffer_state = buf.add(buf.init(example), random_batch(jax.random.key(1), n=40))
    state = td3.init(jax.random.key(2))
    run = jax.jit(lambda s, b, k: td3.update_many(s, b, buf, k, 10))
    state, metrics = run(state, buffer_state, jax.random.key(3))
    assert int(state.step) == 10
    np.testing.assert_allclose(metrics["actor_updated"], 0.5)
    assert metrics["critic_loss"].shape == ()


# ---- learning ----------------------------------------------------------------------------------


def _pendulum_learning_run(seed: int = 0, **config):
    """TD3 on gymnax Pendulum-v1 with a jitted loop; returns [(env_steps, eval_return), ...].

    16 envs, one gradient step per env step, 1024 random warm-up steps then 13 chunks of 800
    env steps, each followed by a deterministic evaluation over 32 episodes. Measured with seeds
    0-3: final returns -136, -168, -147, -169 (random policy ~ -1500 at the first evaluation).
    """
    from evokube_trainer.envs import make_env

    num_envs, episode_length = 16, 200
    warmup_iters, chunk_iters, num_chunks = 64, 50, 13  # 1024 + 10400 env steps
    updates_per_iter = num_envs  # one gradient step per env step
    env = make_env("gymnax/Pendulum-v1", num_envs=num_envs, episode_length=episode_length)
    eval_env = make_env("gymnax/Pendulum-v1", num_envs=32, episode_length=episode_length)
    # Small nets for CPU speed; critic LayerNorm and discount 0.98 (the usual Pendulum setting,
    # e.g. rl-baselines3-zoo) make the curve much steadier across seeds than the defaults.
    settings = {
        "actor_hidden_sizes": (128, 128),
        "critic_hidden_sizes": (128, 128),
        "critic_layer_norm": True,
        "discount": 0.98,
        **config,
    }
    td3 = TD3(TD3Config(**settings), env.obs_dim, env.action_dim)
    buf = ReplayBuffer(capacity=50_000, sample_batch_size=256)

    def collect(carry, key, random_actions):
        agent, buffer_state, env_state = carry
        action_key, update_key = jax.random.split(key)
        if random_actions:
            action = jax.random.uniform(
                action_key, (num_envs, env.action_dim), minval=-1.0, maxval=1.0
            )
        else:
            action = td3.policy(agent.actor.params, env_state.obs)
            noise = td3.config.exploration_noise * jax.random.normal(action_key, action.shape)
            action = jnp.clip(action + noise, -1.0, 1.0)
        next_state = env.step(env_state, action)
        transition = Transition(
            obs=env_state.obs,
            action=action,
            reward=next_state.reward,
            next_obs=next_state.info["final_obs"],
            terminated=next_state.terminated,
            truncated=next_state.truncated,
        )
        buffer_state = buf.add(buffer_state, transition)
        metrics = {}
        if not random_actions:
            agent, metrics = td3.update_many(agent, buffer_state, buf, update_key, updates_per_iter)
        return (agent, buffer_state, next_state), metrics

    @jax.jit
    def init(key):
        agent_key, env_key = jax.random.split(key)
        env_state = env.reset(env_key)
        example = Transition.zeros(env.obs_dim, env.action_dim)
        return td3.init(agent_key), buf.init(example), env_state

    @jax.jit
    def warmup(carry, key):
        keys = jax.random.split(key, warmup_iters)
        return jax.lax.scan(lambda c, k: collect(c, k, True), carry, keys)[0]

    @jax.jit
    def train_chunk(carry, key):
        keys = jax.random.split(key, chunk_iters)
        return jax.lax.scan(lambda c, k: collect(c, k, False), carry, keys)

    @jax.jit
    def evaluate(actor_params, key):
        def body(env_state, _):
            env_state = eval_env.step(env_state, td3.policy(actor_params, env_state.obs))
            return env_state, env_state.reward

        _, rewards = jax.lax.scan(body, eval_env.reset(key), None, length=episode_length)
        return jnp.mean(jnp.sum(rewards, axis=0))  # mean return over 32 episodes

    key = jax.random.key(seed)
    init_key, warmup_key, eval_key, train_key = jax.random.split(key, 4)
    carry = warmup(init(init_key), warmup_key)
    env_steps = warmup_iters * num_envs
    curve = [(env_steps, float(evaluate(carry[0].actor.params, eval_key)))]
    for chunk in range(num_chunks):
        carry, metrics = train_chunk(carry, jax.random.fold_in(train_key, chunk))
        env_steps += chunk_iters * num_envs
        curve.append((env_steps, float(evaluate(carry[0].actor.params, eval_key))))
    assert np.all(np.isfinite(metrics["critic_loss"]))
    return curve


def test_td3_learns_pendulum():
    start = time.perf_counter()
    curve = _pendulum_learning_run(seed=0)
    elapsed = time.perf_counter() - start
    print(f"pendulum TD3 curve (env steps, mean eval return): {curve} in {elapsed:.0f}s")
    assert curve[0][1] < -900  # the untrained actor is bad, as a random policy (~ -1200)
    assert curve[-1][1] > -400, curve


def test_vmapped_update_many_steps_the_actors_on_a_static_schedule():
    """With the actor interval dividing the update count, `update_many` decides the actor steps
    at trace time (`scan_updates`): no `lax.cond`, which under the vmap of K agents or of seeds
    computed the actor step every time. The numbers are the step-count schedule's."""
    td3 = _td3(actor_update_interval=2)
    buf = ReplayBuffer(capacity=64, sample_batch_size=8)
    example = jax.tree.map(lambda x: x[0], random_batch(jax.random.key(0), n=1))
    buffer_state = buf.add(buf.init(example), random_batch(jax.random.key(1), n=40))
    states = jax.vmap(td3.init)(jax.random.split(jax.random.key(2), 3))
    keys = jax.random.split(jax.random.key(3), 3)

    def static(state, key):
        return td3.update_many(state, buffer_state, buf, key, 10)

    def by_step_count(state, key):  # every step decided by `update` from the step count
        def body(state, step_key):
            sample_key, update_key = jax.random.split(step_key)
            return td3.update(state, buf.sample(buffer_state, sample_key), update_key)

        state, metrics = jax.lax.scan(body, state, jax.random.split(key, 10))
        return state, jax.tree.map(lambda x: jnp.mean(x, axis=0), metrics)

    one, key = jax.tree.map(lambda x: x[0], states), keys[0]
    assert "cond" not in str(jax.make_jaxpr(static)(one, key))  # nothing for vmap to select
    assert "cond" in str(jax.make_jaxpr(by_step_count)(one, key))
    expected, got = jax.vmap(by_step_count)(states, keys), jax.jit(jax.vmap(static))(states, keys)
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(got), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    odd = jax.make_jaxpr(lambda s, k: td3.update_many(s, buffer_state, buf, k, 9))
    assert "cond" in str(odd(one, key))  # 2 does not divide 9: decided from the step count
