"""How the trainer cuts generations into chunks (one dispatch each) around checkpoints."""

from types import SimpleNamespace

import pytest

from evokube_trainer.runtime.checkpoints import Checkpointer
from evokube_trainer.runtime.trainer import StopFlags, _Generations


def generations(tmp_path, *, interval, next_chunk, writing=None, max_generations=0):
    loop = _Generations(
        config=SimpleNamespace(max_generations=max_generations),
        metrics=None,
        checkpointer=Checkpointer(tmp_path, interval=interval, keep=2),
        reporter=None,
        flags=StopFlags(),
        env_steps=0,
        replicas=None,
    )
    loop.next_chunk, loop.writing = next_chunk, writing
    return loop


@pytest.mark.parametrize(
    "generation, interval, next_chunk, writing, max_generations, expected",
    [
        (0, 10, 500, None, 0, 10),  # no save in flight: ends at the next due checkpoint
        (13, 10, 500, None, 0, 7),
        (10, 10, 500, 10, 0, 500),  # a save in flight: runs its size, ends on a due one
        (10, 10, 497, 10, 0, 490),
        (10, 10, 5, 10, 0, 5),  # none due within it: its full size, no save at its end
        (10, 10, 500, 10, 100, 90),  # never past maxGenerations
        (99, 10, 500, 90, 100, 1),
        (7, 1, 1, 6, 0, 1),  # long generations: one at a time, each saved
        (7, 1, 3, 6, 0, 3),
    ],
)
def test_a_chunk_ends_at_a_due_checkpoint_and_spans_intervals_while_a_save_is_written(
    tmp_path, generation, interval, next_chunk, writing, max_generations, expected
):
    loop = generations(
        tmp_path,
        interval=interval,
        next_chunk=next_chunk,
        writing=writing,
        max_generations=max_generations,
    )
    count = loop.chunk(generation)
    assert count == expected
    end = generation + count
    crossed = [g for g in range(generation + 1, end) if g % interval == 0]
    if writing is None:
        assert not crossed  # every due checkpoint is saved
    else:
        assert end % interval == 0 or not crossed  # at most one save, at its end
