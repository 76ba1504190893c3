"""The RL update loop draws its replay batches ahead (`agents.base.scan_sampled_updates`): one
gather from the buffer per chunk of steps instead of one per step, each step's batch still the
rows its own key draws, in chunks bounded in bytes."""

import jax
import jax.flatten_util
import jax.numpy as jnp
import numpy as np
import pytest

from evokube_trainer.agents.base import draw_ahead_steps, scan_sampled_updates
from evokube_trainer.replay import ReplayBuffer
from tests.trainer.agent_helpers import ACTION_DIM, OBS_DIM, random_batch

CAPACITY = 64
# One step's batch: 8 transitions of obs, action, reward, next_obs and two flags, float32.
STEP_BYTES = 8 * 4 * (2 * OBS_DIM + ACTION_DIM + 3)


@pytest.mark.parametrize(
    ("count", "period", "fit", "steps"),
    [
        (128, 2, 1000, 128),  # everything fits: one chunk
        (128, 2, 10, 8),  # whole blocks of 2 dividing 128, at most 10 steps
        (128, 1, 10, 8),
        (12, 2, 7, 6),  # 6 = 3 blocks of 2; 4 (2 blocks) also fits, 6 is the most
        (12, 3, 7, 6),
        (9, 2, 4, 3),  # 2 does not divide 9: single steps, the largest divisor of 9 that fits
        (128, 2, 0, 2),  # nothing fits: one block still
        (7, 1, 0, 1),
        (0, 2, 10, 0),  # no steps (a learner never asks; the scan of none still runs)
    ],
)
def test_draw_ahead_steps_are_the_most_whole_blocks_that_divide_the_steps_and_fit(
    count, period, fit, steps
):
    assert draw_ahead_steps(count, period, fit) == steps


def _buffer():
    buf = ReplayBuffer(capacity=CAPACITY, sample_batch_size=8)
    example = jax.tree.map(lambda x: x[0], random_batch(jax.random.key(0), n=1))
    return buf, buf.add(buf.init(example), random_batch(jax.random.key(1), n=40))


def _recording_update(carry, key, batch, actor_step):
    """Counts the steps and keeps what each saw: its key, its batch and its actor flag."""
    flag = jnp.asarray(-1 if actor_step is None else int(actor_step))
    return carry + 1, {"key": jax.random.key_data(key), "obs": batch.obs, "actor_step": flag}


def _scan_drawing_in_the_loop(buf, buffer_state, keys, period):
    """The reference: each step draws its own batch inside the loop (as before this change),
    with the actor flags `scan_sampled_updates` gives."""

    def body(carry, indexed):
        i, key = indexed
        batch = buf.sample(buffer_state, jax.random.split(key)[0])
        divides = period > 1 and keys.shape[0] % period == 0
        flag = jnp.where((i + 1) % period == 0, 1, 0) if divides else jnp.asarray(-1)
        return carry + 1, {"key": jax.random.key_data(key), "obs": batch.obs, "actor_step": flag}

    return jax.lax.scan(body, jnp.zeros((), jnp.int32), (jnp.arange(keys.shape[0]), keys))


@pytest.mark.parametrize(
    ("count", "period", "max_bytes"),
    [
        (12, 2, 2**20),
        (12, 2, 5 * STEP_BYTES),
        (12, 1, 3 * STEP_BYTES),
        (9, 2, 3 * STEP_BYTES),
        (0, 2, STEP_BYTES),
    ],
    ids=["one-chunk", "chunks-of-4", "chunks-of-3-period-1", "period-not-dividing", "no-steps"],
)
def test_each_step_sees_the_batch_its_key_draws_whatever_the_chunks(count, period, max_bytes):
    buf, buffer_state = _buffer()
    keys = jax.random.split(jax.random.key(3), count)

    def draw(key):
        return buf.sample(buffer_state, jax.random.split(key)[0])

    expected = jax.jit(_scan_drawing_in_the_loop, static_argnums=(0, 3))(
        buf, buffer_state, keys, period
    )
    got = jax.jit(
        lambda keys: scan_sampled_updates(
            _recording_update, jnp.zeros((), jnp.int32), keys, period, draw, max_bytes
        )
    )(keys)
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_seeds_vmapped_over_the_buffer_draw_their_own_rows():
    """Under the seeds' vmap every replica gathers from its own buffer, as in the loop."""
    buf, one = _buffer()
    states = jax.tree.map(lambda a, b: jnp.stack([a, b]), one, _buffer_with(buf, seed=7))
    keys = jax.random.split(jax.random.key(3), 2 * 8).reshape(2, 8)

    def run(buffer_state, keys):
        def draw(key):
            return buf.sample(buffer_state, jax.random.split(key)[0])

        return scan_sampled_updates(
            _recording_update, jnp.zeros((), jnp.int32), keys, 2, draw, 2**20
        )

    expected = jax.vmap(lambda s, k: _scan_drawing_in_the_loop(buf, s, k, 2))(states, keys)
    got = jax.jit(jax.vmap(run))(states, keys)
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(got), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def _buffer_with(buf, seed):
    example = jax.tree.map(lambda x: x[0], random_batch(jax.random.key(0), n=1))
    return buf.add(buf.init(example), random_batch(jax.random.key(seed), n=40))


def _buffer_gather_depths(jaxpr, depth=0):
    """The scan depth of every gather reading a `[CAPACITY, ...]` operand (the buffer)."""
    depths = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "gather" and eqn.invars[0].aval.shape[:1] == (CAPACITY,):
            depths.append(depth)
        inner = depth + (eqn.primitive.name == "scan")
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            depths += _buffer_gather_depths(sub, inner)
    return depths


@pytest.mark.parametrize(("max_bytes", "depth"), [(2**20, 0), (2 * STEP_BYTES, 1)])
def test_the_buffer_is_read_outside_the_update_loop(max_bytes, depth):
    """One chunk: the gathers run before the update scan; several: in the scan over chunks
    only, never per update step (where they were before)."""
    buf, buffer_state = _buffer()
    keys = jax.random.split(jax.random.key(3), 8)

    def draw(key):
        return buf.sample(buffer_state, jax.random.split(key)[0])

    jaxpr = jax.make_jaxpr(
        lambda keys: scan_sampled_updates(
            _recording_update, jnp.zeros((), jnp.int32), keys, 2, draw, max_bytes
        )
    )(keys)
    depths = _buffer_gather_depths(jaxpr.jaxpr)
    assert depths and set(depths) == {depth}, depths


def test_td3_and_the_shared_critic_read_the_buffer_outside_their_update_loops():
    """The learners' update loops (ERL's `update_many`, CEM-RL's shared critic) draw their
    batches ahead: no gather from the buffer runs per update step."""
    from evokube_trainer.agents import TD3, TD3Config
    from evokube_trainer.workflows._learners import SharedCritic

    td3 = TD3(TD3Config(actor_hidden_sizes=(8,), critic_hidden_sizes=(8,)), OBS_DIM, ACTION_DIM)
    buf, buffer_state = _buffer()
    state = td3.init(jax.random.key(2))
    update_many = jax.make_jaxpr(lambda s, k: td3.update_many(s, buffer_state, buf, k, 8))
    assert set(_buffer_gather_depths(update_many(state, jax.random.key(3)).jaxpr)) == {0}

    params = td3.init_actor_params(jax.random.key(4))
    flat, unravel = jax.flatten_util.ravel_pytree(params)
    shared = SharedCritic(
        td3,
        buf,
        lambda p: jax.flatten_util.ravel_pytree(p)[0],
        unravel,
        flat.shape[0],
        num_actors=2,
        num_updates=8,
        learning_starts=8,
    )
    population = jnp.stack([flat] * 3)  # [3, D]
    improve = jax.make_jaxpr(
        lambda k: shared.improve(shared.init(jax.random.key(5)), buffer_state, population, k)
    )
    assert set(_buffer_gather_depths(improve(jax.random.key(6)).jaxpr)) == {0}


@pytest.mark.parametrize(("num_agents", "depth"), [(1, 0), (4, 1)])
def test_erl_agents_share_one_learners_draw_ahead_budget(monkeypatch, num_agents, depth):
    """ERL's (and PBT's) K agents run vmapped, so each draws ahead a K-th of the budget: with
    room for 8 steps' batches, one agent draws its 8 steps at once, each of 4 agents 2 at a
    time (a scan over chunks), and memory does not grow K-fold."""
    from evokube_trainer.agents import TD3, TD3Config
    from evokube_trainer.workflows import _learners

    td3 = TD3(TD3Config(actor_hidden_sizes=(8,), critic_hidden_sizes=(8,)), OBS_DIM, ACTION_DIM)
    buf, buffer_state = _buffer()
    monkeypatch.setattr(_learners, "DRAW_AHEAD_BYTES", 8 * STEP_BYTES)  # 8 steps of one agent
    learner = _learners.IndependentAgents(
        td3,
        buf,
        lambda p: jax.flatten_util.ravel_pytree(p)[0],
        num_agents=num_agents,
        num_updates=8,
        injection_interval=1,
        learning_starts=8,
    )
    state = learner.init(jax.random.key(2))
    population = jnp.zeros((num_agents + 1, 3))
    improve = jax.make_jaxpr(lambda k: learner.improve(state, buffer_state, population, k))
    assert set(_buffer_gather_depths(improve(jax.random.key(6)).jaxpr)) == {depth}
