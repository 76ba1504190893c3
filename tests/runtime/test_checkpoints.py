"""Orbax checkpoints: newest first, corrupt ones skipped, pruned to `keep`, resumed into a
new layout or refused with a reason."""

import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evokube_trainer.replay import ReplayBuffer, ReplayState, resize_newest
from evokube_trainer.runtime import exitcodes
from evokube_trainer.runtime.checkpoints import (
    Checkpointer,
    IncompatibleCheckpoint,
    UnreadableCheckpoints,
)
from evokube_trainer.workflows._workflow import WorkflowState


def state(value):
    return {"mean": jnp.full((4,), value, jnp.float32), "generation": jnp.int32(value)}


def test_keeps_the_newest_and_resumes_from_it(tmp_path):
    checkpointer = Checkpointer(tmp_path, interval=2, keep=2)
    assert [g for g in range(1, 7) if checkpointer.due(g)] == [2, 4, 6]
    for generation in (2, 4, 6):
        checkpointer.save(generation, state(generation))
    assert checkpointer.steps() == [4, 6]
    restored, generation = checkpointer.restore_latest(state(0))
    assert generation == 6
    np.testing.assert_array_equal(restored["mean"], np.full(4, 6.0))


def test_a_background_save_keeps_the_state_it_was_given_though_the_next_step_donates_it(tmp_path):
    """The trainer saves without waiting, then runs the next chunk with the state donated:
    the checkpoint must hold the values saved, not what the donated buffers hold next."""
    step = jax.jit(lambda s: jax.tree.map(lambda x: x * 3 + 1, s), donate_argnums=0)
    big = {"buffer": jnp.arange(4_000_000, dtype=jnp.float32), "generation": jnp.int32(2)}
    expected = jax.device_get(big)
    checkpointer = Checkpointer(tmp_path, interval=2, keep=2)
    checkpointer.save(2, big, wait=False)
    big = step(big)  # donates the saved arrays while their files may still be written
    big = step(big)
    assert checkpointer.writing() in (2, None)  # listed only once complete
    assert checkpointer.steps() in ([], [2])
    checkpointer.wait()
    assert checkpointer.writing() is None and checkpointer.steps() == [2]
    template = jax.tree.map(jnp.zeros_like, expected)
    restored, generation = Checkpointer(tmp_path, interval=2, keep=2).restore_latest(template)
    assert generation == 2
    np.testing.assert_array_equal(restored["buffer"], expected["buffer"])
    checkpointer.close()


def test_a_corrupt_checkpoint_is_skipped_with_a_warning(tmp_path, caplog):
    checkpointer = Checkpointer(tmp_path, interval=1, keep=3)
    checkpointer.save(1, state(1))
    checkpointer.save(2, state(2))
    for root, _, files in os.walk(tmp_path / "2"):
        for name in files:
            with open(os.path.join(root, name), "wb") as f:
                f.write(b"not a checkpoint")
    with caplog.at_level(logging.WARNING):
        restored, generation = Checkpointer(tmp_path, interval=1, keep=3).restore_latest(state(0))
    assert generation == 1 and int(restored["generation"]) == 1
    assert "skipping checkpoint 2" in caplog.text


def test_an_unfinished_write_is_not_a_checkpoint(tmp_path):
    checkpointer = Checkpointer(tmp_path, interval=1, keep=3)
    checkpointer.save(1, state(1))
    # What a process killed mid-save leaves: Orbax's temporary folder, never renamed.
    (tmp_path / "2.orbax-checkpoint-tmp-1234").mkdir()
    assert Checkpointer(tmp_path, interval=1, keep=3).restore_latest(state(0))[1] == 1


def test_bad_settings_are_refused(tmp_path):
    with pytest.raises(ValueError):
        Checkpointer(tmp_path, interval=0, keep=1)


# ---- resuming into another layout ----------------------------------------------------------


def buffer_state(capacity, items, generation=3):
    """A workflow state whose replay buffer got `items` transitions (values 1..items) added."""
    buffer = ReplayBuffer(capacity, 1)
    replay = buffer.init(jnp.zeros((2,), jnp.float32))
    values = jnp.arange(1, items + 1, dtype=jnp.float32)
    replay = buffer.add(replay, jnp.stack([values, -values], axis=1))
    return WorkflowState(
        generation=jnp.int32(generation),
        env_steps=jnp.int32(10 * generation),
        env_steps_high=jnp.int32(0),
        key=jnp.zeros((2,), jnp.uint32),
        ec={"mean": jnp.full((4,), 0.5, jnp.float32)},
        replay=replay,
    )


def stored(replay):
    """The buffer's items, oldest first."""
    data, size, pos = np.asarray(replay.data)[:, 0], int(replay.size), int(replay.insert_pos)
    order = np.arange(size) if size < len(data) else (pos + np.arange(size)) % len(data)
    return data[order].tolist()


@pytest.mark.parametrize(
    ("capacity", "items", "new_capacity", "kept"),
    [
        (6, 4, 9, [1, 2, 3, 4]),  # never wrapped, grows: all kept
        (6, 9, 9, [4, 5, 6, 7, 8, 9]),  # wrapped, grows: all kept, oldest first at slot 0
        (6, 9, 4, [6, 7, 8, 9]),  # wrapped, shrinks: the newest kept
        (6, 3, 2, [2, 3]),  # never wrapped, shrinks: the newest kept
    ],
)
def test_resize_keeps_the_newest_transitions_in_order(capacity, items, new_capacity, kept):
    replay = buffer_state(capacity, items).replay
    data, insert_pos, size = resize_newest(
        jax.device_get(replay.data), int(replay.insert_pos), int(replay.size), new_capacity
    )
    resized = ReplayState(data=data, insert_pos=np.int32(insert_pos), size=np.int32(size))
    assert data.shape == (new_capacity, 2)
    assert stored(resized) == kept
    # Laid out as `add` leaves a buffer: filled prefix, the next write after the newest.
    assert size == len(kept) and insert_pos == len(kept) % new_capacity
    assert not data[size:].any()


def test_a_changed_replay_capacity_is_resumed_with_the_newest_transitions(tmp_path, caplog):
    checkpointer = Checkpointer(tmp_path, interval=1, keep=2)
    checkpointer.save(3, buffer_state(6, 9), {"spec": {"population": {"size": 8}}})
    template = jax.eval_shape(lambda: buffer_state(4, 0))
    with caplog.at_level(logging.WARNING):
        restored, generation = Checkpointer(tmp_path, interval=1, keep=2).restore_latest(template)
    assert generation == 3 and int(restored.generation) == 3
    assert stored(jax.device_get(restored.replay)) == [6, 7, 8, 9]
    np.testing.assert_array_equal(restored.ec["mean"], np.full(4, 0.5))
    assert "replay capacity 6 -> 4; kept the newest 4 transitions" in caplog.text


def test_an_incompatible_checkpoint_is_refused_naming_it_and_kept(tmp_path):
    checkpointer = Checkpointer(tmp_path, interval=1, keep=2)
    before = {"spec": {"policy": {"hiddenLayers": [16, 16]}}, "devices": 1}
    checkpointer.save(4, state(4), before)
    after = {"spec": {"policy": {"hiddenLayers": [32, 32]}}, "devices": 1}
    wider = {"mean": jnp.zeros((8,), jnp.float32), "generation": jnp.int32(0)}
    with pytest.raises(IncompatibleCheckpoint) as refused:
        Checkpointer(tmp_path, interval=1, keep=2).restore_latest(wider, after)
    reason = str(refused.value)
    assert f"checkpoint 4 at {tmp_path / '4'} cannot be restored" in reason
    assert "mean is [4] float32 there, [8] float32 now" in reason
    assert "spec.policy.hiddenLayers: [16, 16] -> [32, 32]" in reason
    assert "\n" not in reason and len(reason) < 450  # the status shows the last 500 characters
    assert isinstance(refused.value, exitcodes.PermanentError)
    assert Checkpointer(tmp_path, interval=1, keep=2).steps() == [4]  # nothing deleted


def test_when_no_checkpoint_can_be_read_the_run_does_not_start_afresh(tmp_path):
    checkpointer = Checkpointer(tmp_path, interval=1, keep=3)
    checkpointer.save(1, state(1))
    for root, _, files in os.walk(tmp_path / "1"):
        for name in files:
            with open(os.path.join(root, name), "wb") as f:
                f.write(b"not a checkpoint")
    with pytest.raises(UnreadableCheckpoints, match=r"no checkpoint in .* can be read"):
        Checkpointer(tmp_path, interval=1, keep=3).restore_latest(state(0))


def test_a_skipped_unreadable_step_is_replaced_not_kept(tmp_path):
    checkpointer = Checkpointer(tmp_path, interval=1, keep=3)
    checkpointer.save(1, state(1))
    checkpointer.save(2, state(2))
    (tmp_path / "2" / "state" / "_METADATA").write_bytes(b"garbage")
    resumed = Checkpointer(tmp_path, interval=1, keep=3)
    assert resumed.restore_latest(state(0))[1] == 1
    resumed.save(2, state(20))
    restored, generation = Checkpointer(tmp_path, interval=1, keep=3).restore_latest(state(0))
    assert generation == 2 and int(restored["generation"]) == 20
