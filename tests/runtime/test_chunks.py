"""How the trainer cuts generations into chunks (one dispatch each) around checkpoints."""

from types import SimpleNamespace

import pytest

from evokube_trainer.runtime.checkpoints import Checkpointer
from evokube_trainer.runtime.trainer import StopFlags, _Generations


def generations(tmp_path, *, interval, next_chunk, max_generations=0):
    loop = _Generations(
        config=SimpleNamespace(max_generations=max_generations),
        metrics=None,
        checkpointer=Checkpointer(tmp_path, interval=interval, keep=2),
        reporter=None,
        flags=StopFlags(),
        env_steps=0,
        replicas=None,
    )
    loop.next_chunk = next_chunk
    return loop


@pytest.mark.parametrize(
    "generation, interval, next_chunk, max_generations, expected",
    [
        (0, 10, 500, 0, 10),  # ends at the next due checkpoint, whatever its time allows
        (13, 10, 500, 0, 7),
        (10, 10, 5, 0, 5),  # none due within it: its full size, no save at its end
        (95, 10, 500, 100, 5),  # never past maxGenerations
        (99, 10, 500, 100, 1),
        (7, 1, 1, 0, 1),  # long generations: one at a time, each saved
        (7, 1, 3, 0, 1),
    ],
)
def test_a_chunk_ends_at_the_next_due_checkpoint_so_a_kill_loses_at_most_one_interval(
    tmp_path, generation, interval, next_chunk, max_generations, expected
):
    loop = generations(
        tmp_path, interval=interval, next_chunk=next_chunk, max_generations=max_generations
    )
    count = loop.chunk(generation)
    assert count == expected
    assert not [g for g in range(generation + 1, generation + count) if g % interval == 0]
