"""Orbax checkpoints: newest first, corrupt ones skipped, pruned to `keep`."""

import logging
import os

import jax.numpy as jnp
import numpy as np
import pytest

from evokube_trainer.runtime.checkpoints import Checkpointer


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
