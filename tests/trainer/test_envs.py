"""Tests for evokube_trainer.envs: autoreset modes, done flags, wrappers and both backends.

Rollouts are cached per configuration (``_rollout``) so each env is compiled once per session.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evokube_trainer.envs import (
    Box,
    Discrete,
    GymnaxEnv,
    ObservationNorm,
    init_running_stats,
    make_backend_env,
    make_env,
    merge_running_stats,
    normalize_obs,
    reduce_running_stats,
    squash_action,
    update_running_stats,
)
from evokube_trainer.envs._brax import default_pipeline

B = 3  # envs per batch in most tests
CARTPOLE_X_LIMIT = 2.4
CARTPOLE_THETA_LIMIT = 12 * 2 * np.pi / 360  # radians, as in gymnax


def _actions(policy: str, env, key: jax.Array, num_envs: int) -> jax.Array:
    shape = (num_envs, env.action_dim)
    if policy == "left":  # discrete: scores favour action 0 (CartPole: push left)
        return jnp.zeros(shape).at[:, 0].set(1.0)
    if policy == "zero":
        return jnp.zeros(shape)
    if policy == "half":
        return jnp.full(shape, 0.5)
    if policy == "random":
        return jax.random.uniform(key, shape, minval=-1.0, maxval=1.0)
    raise ValueError(policy)


@functools.cache
def _rollout(name: str, steps: int, policy: str, seed: int = 0, **make_kwargs):
    """(env, first state, stacked states of ``steps`` steps) as numpy, compiled once per config."""
    num_envs = make_kwargs.pop("num_envs", B)
    env = make_env(name, num_envs=num_envs, **make_kwargs)

    def run(key):
        reset_key, action_key = jax.random.split(key)
        first = env.reset(reset_key)

        def body(state, t):
            action = _actions(policy, env, jax.random.fold_in(action_key, t), num_envs)
            state = env.step(state, action)
            return state, state

        _, states = jax.lax.scan(body, first, jnp.arange(steps))
        return first, states

    first, states = jax.device_get(jax.jit(run)(jax.random.key(seed)))
    return env, first, states


def _done(states) -> np.ndarray:
    return (states.terminated + states.truncated) > 0  # [T, B]


def _first_done(states) -> np.ndarray:
    done = _done(states)
    assert done.any(axis=0).all(), "every env should finish an episode in the window"
    return done.argmax(axis=0)  # [B]


def _is_cartpole_terminal(obs: np.ndarray) -> np.ndarray:
    return (np.abs(obs[..., 0]) > CARTPOLE_X_LIMIT) | (np.abs(obs[..., 2]) > CARTPOLE_THETA_LIMIT)


def _gymnax_inner(state):
    """The gymnax env state under VmapEnv -> AutoReset -> ActionTransform -> GymnaxEnv."""
    return state.inner.env.inner.env_state


# --- construction ---------------------------------------------------------------------------


def test_make_env_reports_spaces_and_batch():
    cartpole = make_env("gymnax/CartPole-v1", num_envs=4, episode_length=10)
    assert cartpole.action_space == Discrete(2)
    assert (cartpole.obs_dim, cartpole.action_dim, cartpole.num_envs) == (4, 2, 4)
    assert isinstance(cartpole.unwrapped, GymnaxEnv)
    pendulum = make_env("gymnax/Pendulum-v1", num_envs=2)
    assert pendulum.action_space == Box(-2.0, 2.0, (1,))
    assert (pendulum.obs_dim, pendulum.action_dim) == (3, 1)
    assert pendulum.env.episode_length == 200  # gymnax's own limit when none is given
    hash(pendulum)  # static and hashable: safe to close over in jitted functions


@pytest.mark.parametrize(
    "name, kwargs",
    [
        ("Pendulum-v1", {}),
        ("mujoco/halfcheetah", {}),
        ("gymnax/Pendulum-v1", {"backend": "positional"}),
        ("gymnax/Pendulum-v1", {"autoreset": "sometimes"}),
        ("gymnax/Pendulum-v1", {"action_squash": "sigmoid"}),
        ("gymnax/Pendulum-v1", {"episode_length": 0}),
    ],
)
def test_make_env_rejects_bad_arguments(name, kwargs):
    with pytest.raises(ValueError):
        make_env(name, num_envs=2, **kwargs)


@pytest.mark.parametrize(
    "name",
    [
        "Pendulum-v1",
        "CartPole-v1",
        "MountainCarContinuous-v0",
        "Acrobot-v1",
        "Breakout-MinAtar",  # image observations [10, 10, 4], flattened
        "Reacher-misc",
    ],
)
def test_gymnax_env_resets_and_steps_under_jit(name):
    env, first, states = _rollout(f"gymnax/{name}", 4, "random", num_envs=2, episode_length=8)
    assert first.obs.shape == (2, env.obs_dim) and first.obs.dtype == np.float32
    assert states.obs.shape == (4, 2, env.obs_dim)
    for field in (states.reward, states.terminated, states.truncated):
        assert field.shape == (4, 2) and field.dtype == np.float32
    assert np.isfinite(states.obs).all() and np.isfinite(states.reward).all()
    assert not np.allclose(states.obs[-1], first.obs)  # the envs moved
    np.testing.assert_array_equal(states.info["steps"][:, 0], [1, 2, 3, 4])


# --- autoreset modes ------------------------------------------------------------------------


def test_same_step_reset_keeps_final_obs():
    _, first, states = _rollout("gymnax/CartPole-v1", 30, "left", autoreset="same_step")
    done = _done(states)
    assert done.sum() >= B  # pushing left topples the pole within ~10 steps
    final, obs = states.info["final_obs"], states.obs
    # On done steps the final obs is the terminal one; obs is already a fresh reset (|.| <= .05).
    assert _is_cartpole_terminal(final[done]).all()
    assert (np.abs(obs[done]) <= 0.05).all()
    assert not np.isclose(final[done], obs[done]).all(axis=-1).any()
    np.testing.assert_array_equal(final[~done], obs[~done])
    # Counters restart after the reset; episode metrics report the finished episode.
    assert (states.info["steps"][done] == 0).all()
    first_end = _first_done(states)
    np.testing.assert_array_equal(
        states.info["episode_length"][first_end, np.arange(B)], first_end + 1
    )
    # CartPole pays 1 per step, so each finished episode's return equals its length.
    np.testing.assert_allclose(
        states.info["episode_return"][done], states.info["episode_length"][done]
    )
    assert first.info["steps"].sum() == 0


def test_same_step_final_obs_is_the_continued_episode():
    # Pendulum is deterministic given its start: the same-step env's final obs at the time limit
    # must equal the obs a one-episode env reaches at that step.
    _, _, same = _rollout("gymnax/Pendulum-v1", 6, "zero", episode_length=5)
    _, _, once = _rollout("gymnax/Pendulum-v1", 6, "zero", episode_length=5, autoreset="disabled")
    np.testing.assert_allclose(same.info["final_obs"][4], once.obs[4], rtol=1e-6)
    np.testing.assert_allclose(same.obs[:4], once.obs[:4], rtol=1e-6)
    assert not np.allclose(same.obs[4], once.obs[4])  # reset to a new start


def test_next_step_flags_exactly_the_step_after_done():
    _, _, states = _rollout("gymnax/CartPole-v1", 30, "left", autoreset="next_step")
    done = _done(states)
    reset_step = states.info["reset_step"] > 0
    assert done.any(axis=0).all()
    np.testing.assert_array_equal(reset_step[0], False)
    np.testing.assert_array_equal(reset_step[1:], done[:-1])
    # The done step still shows the real terminal obs; the reset step starts afresh.
    assert _is_cartpole_terminal(states.obs[done]).all()
    assert (np.abs(states.obs[reset_step]) <= 0.05).all()
    assert (states.reward[reset_step] == 0).all() and not done[reset_step].any()
    assert (states.info["steps"][reset_step] == 0).all()
    assert (states.info["episode_return"][reset_step] == 0).all()


def test_fast_reset_restores_the_cached_first_state():
    _, first, states = _rollout("gymnax/CartPole-v1", 30, "left", autoreset="fast")
    done = _done(states)
    t, b = np.nonzero(done)
    assert len(t) > B  # several episodes per env
    np.testing.assert_array_equal(states.obs[t, b], first.obs[b])
    assert _is_cartpole_terminal(states.info["final_obs"][t, b]).all()
    # Same start, deterministic dynamics, same actions: all episodes of an env are identical.
    for env_index in range(B):
        lengths = states.info["episode_length"][done[:, env_index], env_index]
        assert len(set(lengths.tolist())) == 1


def test_disabled_runs_exactly_one_episode():
    _, _, states = _rollout("gymnax/CartPole-v1", 30, "left", autoreset="disabled")
    end = _first_done(states)
    for b in range(B):
        d = end[b]
        after = slice(d + 1, None)
        assert d + 1 < len(states.reward)
        assert (states.reward[after, b] == 0).all()
        assert (states.obs[after, b] == states.obs[d, b]).all()
        assert (states.terminated[after, b] == 1).all()
        assert (states.info["frozen"][after, b] == 1).all()
        assert (states.info["frozen"][: d + 1, b] == 0).all()
        # The frozen return is the episode's return (fitness for EC).
        returns = states.info["episode_return"][:, b]
        np.testing.assert_allclose(returns[after], states.reward[: d + 1, b].sum())
        np.testing.assert_array_equal(states.info["episode_length"][after, b], d + 1)


# --- done flags -----------------------------------------------------------------------------


def test_cartpole_terminates_early_without_truncating():
    _, _, states = _rollout("gymnax/CartPole-v1", 30, "left", autoreset="same_step")
    assert states.terminated.sum() >= B
    assert states.truncated.sum() == 0  # episode_length is 200 > 30
    assert (states.terminated * states.truncated == 0).all()


def test_pendulum_only_truncates_at_the_time_limit():
    _, _, states = _rollout("gymnax/Pendulum-v1", 12, "random", episode_length=5)
    assert states.terminated.sum() == 0
    expected = np.zeros((12, B), np.float32)
    expected[[4, 9]] = 1.0
    np.testing.assert_array_equal(states.truncated, expected)


# --- wrappers -------------------------------------------------------------------------------


def test_squash_action_maps_to_box_bounds():
    box = Box([-2.0, 0.0], [2.0, 1.0], (2,))
    unit = jnp.array([[-1.0, -1.0], [0.0, 0.0], [1.0, 1.0], [5.0, -5.0]])
    clipped = squash_action(unit, box, "clip")
    np.testing.assert_allclose(clipped, [[-2, 0], [0, 0.5], [2, 1], [2, 0]])
    squashed = squash_action(jnp.array([[-20.0, 0.0], [20.0, 20.0]]), box, "tanh")
    np.testing.assert_allclose(squashed, [[-2, 0.5], [2, 1]], atol=1e-6)
    native = squash_action(jnp.array([[1.5, 3.0]]), box, None)
    np.testing.assert_allclose(native, [[1.5, 1.0]])
    scores = jnp.array([[0.1, 0.7, -0.2], [0.9, 0.0, 0.0]])
    np.testing.assert_array_equal(squash_action(scores, Discrete(3)), [1, 0])
    np.testing.assert_array_equal(squash_action(jnp.array([2, 7]), Discrete(3)), [2, 2])


def test_env_applies_action_squash():
    # Pendulum torque bounds are [-2, 2]: a policy output of 0.5 is a torque of 1.0.
    _, _, clip = _rollout("gymnax/Pendulum-v1", 2, "half", episode_length=5)
    np.testing.assert_allclose(_gymnax_inner(clip).last_u, 1.0)
    _, _, native = _rollout("gymnax/Pendulum-v1", 2, "half", episode_length=5, action_squash=None)
    np.testing.assert_allclose(_gymnax_inner(native).last_u, 0.5)


def test_action_repeat_sums_rewards():
    _, _, single = _rollout("gymnax/Pendulum-v1", 6, "half", episode_length=20)
    _, _, double = _rollout("gymnax/Pendulum-v1", 3, "half", episode_length=20, action_repeat=2)
    np.testing.assert_allclose(double.reward, single.reward[0::2] + single.reward[1::2], rtol=1e-5)
    np.testing.assert_allclose(double.obs, single.obs[1::2], rtol=1e-5)
    np.testing.assert_array_equal(double.info["steps"][:, 0], [1, 2, 3])


def test_action_repeat_stops_at_termination():
    # CartPole pays 1 per sub-step; the last agent step only pays for the sub-steps it ran.
    _, _, single = _rollout("gymnax/CartPole-v1", 30, "left", autoreset="disabled")
    _, _, triple = _rollout("gymnax/CartPole-v1", 10, "left", autoreset="disabled", action_repeat=3)
    base_length = _first_done(single) + 1  # [B] sub-steps to termination
    end = _first_done(triple)
    np.testing.assert_array_equal(end + 1, -(-base_length // 3))  # ceil
    for b in range(B):
        assert (triple.reward[: end[b], b] == 3).all()
        assert triple.reward[end[b], b] == base_length[b] - 3 * end[b]
        np.testing.assert_allclose(triple.obs[end[b], b], single.obs[base_length[b] - 1, b])


def test_reward_scale_scales_rewards_not_returns():
    _, _, plain = _rollout("gymnax/Pendulum-v1", 4, "random", episode_length=10)
    _, _, scaled = _rollout("gymnax/Pendulum-v1", 4, "random", episode_length=10, reward_scale=0.1)
    np.testing.assert_allclose(scaled.reward, 0.1 * plain.reward, rtol=1e-5)
    np.testing.assert_allclose(scaled.info["episode_return"], plain.info["episode_return"])


# --- observation normalization --------------------------------------------------------------


def test_running_stats_match_numpy():
    data = np.random.default_rng(0).normal(3.0, 2.0, (40, 5)).astype(np.float32)
    mask = np.arange(40) % 4 != 0
    stats = init_running_stats(5)
    for chunk, chunk_mask in zip(np.split(data, 4), np.split(mask, 4), strict=True):
        stats = update_running_stats(stats, jnp.asarray(chunk), jnp.asarray(chunk_mask))
    kept = data[mask]
    assert stats.count == len(kept)
    np.testing.assert_allclose(stats.mean, kept.mean(0), rtol=1e-5)
    np.testing.assert_allclose(stats.var, kept.var(0), rtol=1e-4)
    # Pooling per-member stats (e.g. over a population axis) equals the stats of all data.
    parts = [
        update_running_stats(init_running_stats(5), jnp.asarray(p)) for p in (data[:10], data[10:])
    ]
    pooled = reduce_running_stats(jax.tree.map(lambda *x: jnp.stack(x), *parts))
    merged = merge_running_stats(*parts)
    for s in (pooled, merged):
        np.testing.assert_allclose(s.mean, data.mean(0), rtol=1e-5)
        np.testing.assert_allclose(s.var, data.var(0), rtol=1e-4)
    normalized = normalize_obs(pooled, jnp.asarray(data))
    np.testing.assert_allclose(normalized.mean(0), 0.0, atol=1e-5)
    np.testing.assert_allclose(normalized.std(0), 1.0, rtol=1e-4)


def test_obs_norm_converges_to_zero_mean_unit_variance():
    env, first, states = _rollout(
        "gymnax/Pendulum-v1", 150, "random", num_envs=8, episode_length=50, obs_norm=True
    )
    assert isinstance(env, ObservationNorm)
    raw = np.concatenate([first.inner.env.obs[None], states.inner.env.obs])  # [T+1, B, obs]
    stats = env.get_stats(jax.tree.map(lambda x: x[-1], states))
    assert stats.count == raw.shape[0] * raw.shape[1]
    np.testing.assert_allclose(stats.mean, raw.reshape(-1, 3).mean(0), atol=1e-4)
    np.testing.assert_allclose(stats.var, raw.reshape(-1, 3).var(0), rtol=1e-3)
    late = states.obs[75:].reshape(-1, 3)  # what the policy saw in the second half
    np.testing.assert_allclose(late.mean(0), 0.0, atol=0.2)
    np.testing.assert_allclose(late.std(0), 1.0, atol=0.2)
    # final_obs goes through the same normalization.
    done = _done(states)
    raw_final = states.inner.env.info["final_obs"][done]
    assert np.abs(states.info["final_obs"][done] - raw_final).max() > 0.1


def test_obs_norm_frozen_stats_and_carry_over():
    env, _first, states = _rollout(
        "gymnax/Pendulum-v1", 3, "random", episode_length=10, obs_norm=True, obs_norm_update=False
    )
    assert (states.inner.stats.count == 0).all()
    np.testing.assert_allclose(states.obs, states.inner.env.obs)  # identity before any data
    # Stats handed to reset/set_stats are used as given (frozen) to normalize.
    stats = update_running_stats(init_running_stats(3), jnp.asarray(np.eye(3) * 4.0))
    restarted = jax.jit(env.reset)(jax.random.key(1), stats)
    np.testing.assert_allclose(restarted.obs, env.normalize(stats, restarted.inner.env.obs))
    assert env.get_stats(restarted).count == 3
    moved = env.set_stats(restarted, init_running_stats(3))
    np.testing.assert_allclose(moved.obs, restarted.inner.env.obs)


def test_obs_norm_skips_frozen_envs():
    _env, _first, states = _rollout(
        "gymnax/CartPole-v1", 20, "left", autoreset="disabled", obs_norm=True
    )
    active = 1.0 - states.inner.env.info["frozen"]  # [T, B]
    expected = B + np.cumsum(active.sum(axis=1))
    np.testing.assert_array_equal(states.inner.stats.count, expected)
    assert active.min() == 0  # some envs did freeze


# --- Brax -----------------------------------------------------------------------------------


def test_a_brax_env_without_a_backend_runs_braxs_own_default_on_every_platform():
    # Brax's default for every env of the catalog, read from its classes without building one.
    for name in ("halfcheetah", "hopper", "swimmer", "humanoid"):
        assert default_pipeline(name) == "generalized"
    assert jax.default_backend() == "cpu"  # the CPU once picked spring: no longer
    assert make_backend_env("brax/hopper").backend == "generalized"
    assert make_backend_env("brax/hopper", backend="spring").backend == "spring"
    # A pipeline an env lacks is refused, never replaced by another.
    with pytest.raises(ValueError, match="Unsupported backend: spring"):
        make_backend_env("brax/swimmer", backend="spring")
    with pytest.raises(ValueError, match="unknown Brax backend"):
        make_backend_env("brax/hopper", backend="warp")


def test_brax_halfcheetah_positional_resets_and_steps_under_jit():
    env, first, states = _rollout(
        "brax/halfcheetah", 4, "half", num_envs=2, episode_length=3, backend="positional"
    )
    assert env.unwrapped.backend == "positional"
    assert env.action_space == Box(-1.0, 1.0, (6,)) and env.obs_dim == 17
    assert first.obs.shape == (2, 17) and states.obs.shape == (4, 2, 17)
    assert np.isfinite(states.obs).all() and np.isfinite(states.reward).all()
    assert (states.reward != 0).all()
    np.testing.assert_array_equal(states.truncated[:, 0], [0, 0, 1, 0])
    assert states.terminated.sum() == 0
    assert not np.allclose(states.info["final_obs"][2], states.obs[2])  # same-step reset
    np.testing.assert_array_equal(states.info["steps"][:, 0], [1, 2, 0, 1])


def test_brax_mjx_and_generalized_backends_run_and_agree():
    # The smallest Brax env, one copy, two steps and a frozen third: about 30 s of CPU, mostly
    # compiling (mjx more than generalized). Zero force from the same start: both pipelines
    # integrate the same model, so they must agree closely.
    runs = {}
    for backend in ("mjx", "generalized"):
        env, first, states = _rollout(
            "brax/inverted_pendulum",
            3,
            "zero",
            num_envs=1,
            episode_length=2,
            autoreset="disabled",
            backend=backend,
        )
        assert env.unwrapped.backend == backend
        assert env.action_space == Box(-3.0, 3.0, (1,)) and env.obs_dim == 4
        assert np.isfinite(states.obs).all()
        np.testing.assert_array_equal(states.reward[:, 0], [1, 1, 0])  # alive, alive, frozen
        np.testing.assert_array_equal(states.truncated[:, 0], [0, 1, 1])
        assert not np.allclose(states.obs[0], first.obs)  # the physics moved it
        runs[backend] = states.obs
    np.testing.assert_allclose(runs["mjx"], runs["generalized"], atol=1e-3)


def test_eager_step_matches_jit():
    env = make_env("gymnax/CartPole-v1", num_envs=2, episode_length=5, autoreset="next_step")
    action = jnp.array([[0.3, -0.2], [-1.0, 1.0]])
    key = jax.random.key(3)
    eager = env.step(env.reset(key), action)
    jitted = jax.jit(env.step)(jax.jit(env.reset)(key), action)

    def plain(x):  # typed PRNG keys -> their raw uint32 data
        is_key = jnp.issubdtype(x.dtype, jax.dtypes.prng_key)
        return np.asarray(jax.random.key_data(x) if is_key else x, np.float64)

    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), strict=True):
        np.testing.assert_allclose(plain(a), plain(b), rtol=1e-6)


def test_a_backend_env_is_built_once_per_arguments_and_shared():
    first = make_backend_env("gymnax/Pendulum-v1")
    assert make_backend_env("gymnax/Pendulum-v1") is first
    assert make_backend_env("brax/halfcheetah") is make_backend_env("brax/halfcheetah")
    other = make_backend_env("brax/halfcheetah", backend="positional")
    assert other is not make_backend_env("brax/halfcheetah")
    assert other.backend == "positional"
