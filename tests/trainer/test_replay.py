"""Tests of the jittable circular replay buffer."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evokube_trainer.replay import ReplayBuffer, Transition


def _example():
    return Transition.zeros(obs_dim=3, action_dim=1)


def _batch(ids):
    """A batch whose every leaf encodes the item id, so rows can be traced back."""
    ids = jnp.asarray(ids, jnp.float32)
    n = ids.shape[0]
    return Transition(
        obs=jnp.repeat(ids[:, None], 3, axis=1),
        action=ids[:, None],
        reward=ids,
        next_obs=jnp.repeat(ids[:, None], 3, axis=1) + 0.5,
        terminated=jnp.zeros(n),
        truncated=jnp.zeros(n),
    )


@pytest.mark.parametrize("use_jit", [False, True])
def test_add_wraps_around_and_overwrites_oldest(use_jit):
    buf = ReplayBuffer(capacity=5, sample_batch_size=4)
    add = jax.jit(buf.add) if use_jit else buf.add
    state = buf.init(_example())
    assert state.data.obs.shape == (5, 3)
    assert state.data.reward.shape == (5,)
    assert int(state.size) == 0

    state = add(state, _batch([1, 2, 3]))
    assert (int(state.size), int(state.insert_pos)) == (3, 3)
    state = add(state, _batch([4, 5, 6, 7]))
    assert (int(state.size), int(state.insert_pos)) == (5, 2)
    np.testing.assert_array_equal(state.data.reward, [6, 7, 3, 4, 5])
    np.testing.assert_array_equal(state.data.obs[:, 0], [6, 7, 3, 4, 5])
    np.testing.assert_array_equal(state.data.next_obs[:, 2], [6.5, 7.5, 3.5, 4.5, 5.5])


def test_batch_larger_than_capacity_keeps_newest():
    buf = ReplayBuffer(capacity=4, sample_batch_size=2)
    state = buf.init(_example())
    state = buf.add(state, _batch([1, 2]))
    state = jax.jit(buf.add)(state, _batch(list(range(10, 20))))  # 10 items into 4 slots
    # Same result as inserting 1..2 and then 10..19 one at a time.
    expected = np.zeros(4)
    pos = 0
    for item in [1, 2, *range(10, 20)]:
        expected[pos] = item
        pos = (pos + 1) % 4
    np.testing.assert_array_equal(state.data.reward, expected)
    assert (int(state.size), int(state.insert_pos)) == (4, pos)


@pytest.mark.parametrize("use_jit", [False, True])
def test_masked_rows_are_skipped(use_jit):
    buf = ReplayBuffer(capacity=6, sample_batch_size=2)
    add = jax.jit(buf.add) if use_jit else buf.add
    state = buf.init(_example())
    state = add(state, _batch([1, 2, 3, 4]), jnp.array([True, False, True, False]))
    assert (int(state.size), int(state.insert_pos)) == (2, 2)
    np.testing.assert_array_equal(state.data.reward, [1, 3, 0, 0, 0, 0])

    state = add(state, _batch([5, 6, 7, 8, 9, 10]), jnp.array([1, 1, 0, 1, 1, 1]))
    # Kept: 5, 6, 8, 9, 10 -> slots 2, 3, 4, 5, 0.
    np.testing.assert_array_equal(state.data.reward, [10, 3, 5, 6, 8, 9])
    assert (int(state.size), int(state.insert_pos)) == (6, 1)

    state = add(state, _batch([11, 12]), jnp.zeros(2, bool))
    np.testing.assert_array_equal(state.data.reward, [10, 3, 5, 6, 8, 9])
    assert (int(state.size), int(state.insert_pos)) == (6, 1)


def test_sampling_is_uniform_over_filled_part_only():
    buf = ReplayBuffer(capacity=100, sample_batch_size=4000)
    state = buf.init(_example())
    state = buf.add(state, _batch(jnp.arange(1, 11)))  # 10 of 100 slots filled, ids 1..10
    batch = jax.jit(buf.sample)(state, jax.random.key(0))
    assert batch.obs.shape == (4000, 3)
    assert batch.reward.shape == (4000,)
    ids = np.asarray(batch.reward)
    assert ids.min() >= 1  # never the empty (zero) slots
    counts = np.bincount(ids.astype(int), minlength=11)[1:]
    assert np.all(counts > 0)
    # 400 expected per id; a chi-square bound far beyond any sane fluctuation.
    chi2 = np.sum((counts - 400.0) ** 2 / 400.0)
    assert chi2 < 40.0, counts
    # Rows stay consistent across leaves.
    np.testing.assert_array_equal(batch.obs[:, 1], batch.reward)
    np.testing.assert_array_equal(batch.next_obs[:, 0], batch.reward + 0.5)


def test_can_sample():
    buf = ReplayBuffer(capacity=10, sample_batch_size=3)
    state = buf.init(_example())
    assert not bool(buf.can_sample(state))
    state = buf.add(state, _batch([1, 2, 3]))
    assert bool(buf.can_sample(state))
    assert not bool(buf.can_sample(state, min_size=4))


def test_works_with_dict_pytrees_and_scan():
    buf = ReplayBuffer(capacity=8, sample_batch_size=2)
    state = buf.init({"x": jnp.zeros((2,), jnp.float32), "id": jnp.zeros((), jnp.int32)})

    def step(state, i):
        batch = {
            "x": jnp.full((3, 2), i, jnp.float32),
            "id": jnp.arange(3, dtype=jnp.int32) + 3 * i,
        }
        return buf.add(state, batch, mask=jnp.array([True, True, i % 2 == 0])), None

    state, _ = jax.lax.scan(step, state, jnp.arange(4))
    # Kept per step: 3, 2, 3, 2 rows -> ids 0,1,2 | 3,4 | 6,7,8 | 9,10 -> 10 rows in 8 slots.
    assert int(state.size) == 8
    assert int(state.insert_pos) == 10 % 8
    np.testing.assert_array_equal(state.data["id"], [9, 10, 2, 3, 4, 6, 7, 8])
    assert state.data["id"].dtype == jnp.int32


def test_vmap_over_independent_buffers():
    buf = ReplayBuffer(capacity=4, sample_batch_size=2)
    states = jax.vmap(lambda _: buf.init(_example()))(jnp.arange(3))
    batches = jax.vmap(lambda k: _batch(jnp.arange(2) + 10 * k))(jnp.arange(3))
    masks = jnp.array([[1, 1], [1, 0], [0, 0]], bool)
    states = jax.vmap(buf.add)(states, batches, masks)
    np.testing.assert_array_equal(states.size, [2, 1, 0])
    np.testing.assert_array_equal(states.data.reward[1], [10, 0, 0, 0])


def test_shape_error_names_the_leaf():
    buf = ReplayBuffer(capacity=4, sample_batch_size=2)
    state = buf.init(_example())
    bad = _batch([1, 2]).replace(next_obs=jnp.zeros((2, 4)))
    with pytest.raises(ValueError) as excinfo:
        buf.add(state, bad)
    assert str(excinfo.value) == (
        "transition leaf 'next_obs': expected trailing shape (3,), got (4,)"
    )
    # The check also runs at trace time under jit.
    with pytest.raises(ValueError, match="'next_obs'"):
        jax.jit(buf.add)(state, bad)


def test_missing_batch_dimension_names_the_leaf():
    buf = ReplayBuffer(capacity=4, sample_batch_size=2)
    state = buf.init(_example())
    bad = _batch([1, 2]).replace(reward=jnp.float32(1.0))
    with pytest.raises(ValueError, match=r"transition leaf 'reward': .*leading batch dimension"):
        buf.add(state, bad)


def test_dtype_error_names_the_leaf():
    buf = ReplayBuffer(capacity=4, sample_batch_size=2)
    state = buf.init(_example())
    bad = _batch([1, 2]).replace(terminated=jnp.zeros(2, bool))
    with pytest.raises(
        ValueError, match="transition leaf 'terminated': expected dtype float32, got bool"
    ):
        buf.add(state, bad)


def test_inconsistent_batch_dimension_names_the_leaf():
    buf = ReplayBuffer(capacity=4, sample_batch_size=2)
    state = buf.init(_example())
    bad = _batch([1, 2]).replace(action=jnp.zeros((3, 1)))
    with pytest.raises(ValueError, match="transition leaf 'action': batch dimension 3 differs"):
        buf.add(state, bad)


def test_structure_and_mask_errors():
    buf = ReplayBuffer(capacity=4, sample_batch_size=2)
    state = buf.init({"a": jnp.zeros(2)})
    with pytest.raises(ValueError, match="structure"):
        buf.add(state, {"b": jnp.zeros((1, 2))})
    with pytest.raises(ValueError, match=r"mask: expected shape \(1,\)"):
        buf.add(state, {"a": jnp.zeros((1, 2))}, mask=jnp.ones(2, bool))
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(capacity=0, sample_batch_size=1)


def _replicas_add_then_sample(buf):
    """Three replicas' buffers vmapped as `Workflow.seeds` vmaps them: each gets a different
    masked add (one wraps around), then draws 4 steps x 2 agents of batches (nested vmaps over
    keys, the buffer shared, as CEM-RL's draw-ahead does)."""
    state = jax.vmap(lambda _: buf.init(_example()))(jnp.arange(3))
    ids = jnp.arange(3 * 7).reshape(3, 7) + 1
    batch = jax.vmap(_batch)(ids)
    mask = jnp.array([[1, 1, 0, 1, 1, 1, 1], [1, 0, 0, 0, 1, 0, 0], [1] * 7], bool)
    state = jax.jit(jax.vmap(buf.add))(state, batch, mask)

    def draw(replay, key):
        keys = jax.random.split(key, 4)
        agents = lambda k: jax.vmap(buf.sample, in_axes=(None, 0))(replay, jax.random.split(k, 2))
        return jax.vmap(agents)(keys)  # [4, 2, B, ...]

    keys = jax.random.split(jax.random.key(3), 3)
    return state, jax.jit(jax.vmap(draw))(state, keys)


def test_replicas_in_turn_store_and_draw_the_same_rows_as_the_batched_buffer():
    batched, in_turn = (ReplayBuffer(5, 3, replicas_in_turn=flag) for flag in (False, True))
    state_b, rows_b = _replicas_add_then_sample(batched)
    state_t, rows_t = _replicas_add_then_sample(in_turn)
    want_leaves = jax.tree.leaves((state_b, rows_b))
    for want, got in zip(want_leaves, jax.tree.leaves((state_t, rows_t)), strict=True):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(state_t.size, [5, 2, 5])
    # Replica 0 kept 6 of 7 rows in 5 slots: the newest 5, the sixth wrapped to slot 0.
    np.testing.assert_array_equal(state_t.data.reward[0], [7, 2, 4, 5, 6])
    assert rows_t.obs.shape == (3, 4, 2, 3, 3)
    # Every drawn row is one its own replica stored (ids are unique across replicas).
    for r in range(3):
        stored = set(np.asarray(state_t.data.reward[r, : int(state_t.size[r])]).tolist())
        assert set(np.asarray(rows_t.reward[r]).ravel().tolist()) <= stored


def _batched_over_buffers(buf) -> dict[str, list[bool]]:
    """For the replicas' add and draw: each gather's and scatter's batching over the replicas'
    buffers (StableHLO's operand / input batching dims)."""
    state = jax.vmap(lambda _: buf.init(_example()))(jnp.arange(3))
    batch = jax.vmap(_batch)(jnp.ones((3, 4)))
    keys = jax.random.split(jax.random.key(0), 3)

    def add_and_draw(replay, batch, key):
        replay = buf.add(replay, batch)
        return jax.vmap(buf.sample, in_axes=(None, 0))(replay, jax.random.split(key, 2))

    text = jax.jit(jax.vmap(add_and_draw)).lower(state, batch, keys).as_text()
    return {
        op: ["batching_dims = [0]" in line for line in text.splitlines() if op in line]
        for op in ("stablehlo.gather", "stablehlo.scatter")
    }


def test_replicas_in_turn_gather_from_one_buffer_at_a_time():
    plain = _batched_over_buffers(ReplayBuffer(8, 2))
    assert plain["stablehlo.gather"] and all(plain["stablehlo.gather"])
    in_turn = _batched_over_buffers(ReplayBuffer(8, 2, replicas_in_turn=True))
    assert in_turn["stablehlo.gather"] and not any(in_turn["stablehlo.gather"])
    # The add stays one scatter over every buffer (in turn, the TPU copied each buffer).
    assert in_turn["stablehlo.scatter"] and all(in_turn["stablehlo.scatter"])
