"""How the trainer cuts generations into chunks (one dispatch each) around checkpoints."""

import pytest

from evokube_trainer.runtime.checkpoints import Checkpointer
from evokube_trainer.runtime.config import GENERATION_LIMIT, RunConfig
from evokube_trainer.runtime.trainer import (
    CONTINUE,
    STOP_DONE,
    StopFlags,
    _Generations,
    local_stop_code,
)


def run_config(max_generations: int, interval: int = 10) -> RunConfig:
    """A run's settings with only what stopping and chunking read (0: no maxGenerations)."""
    return RunConfig(
        "hop", "ns", 0, None, max_generations or None, None, None, None, 1, interval, 2
    )


def generations(tmp_path, *, interval, next_chunk, max_generations=0):
    loop = _Generations(
        config=run_config(max_generations, interval),
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
        # Without maxGenerations, never past the int32 generation counter's limit.
        (GENERATION_LIMIT - 3, 10**9, 500, 0, 3),
        (GENERATION_LIMIT - 3, 10**9, 500, GENERATION_LIMIT, 3),
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


def test_a_run_without_max_generations_ends_at_the_generation_counters_limit():
    # The device counts generations in int32: a run stopped only by time or steps ends (Succeeded,
    # saying why) at GENERATION_LIMIT rather than wrap; the CRD's maxGenerations allows as much.
    started = 0.0
    config = run_config(0)
    below = {"generation": GENERATION_LIMIT - 1, "env_steps": 0}
    assert local_stop_code(config, below, started, StopFlags())[0] == CONTINUE
    code, why = local_stop_code(
        config, {**below, "generation": GENERATION_LIMIT}, started, StopFlags()
    )
    assert code == STOP_DONE and "the most a run counts" in why
    assert GENERATION_LIMIT < 2**31 - 64  # room for a chunk past it
    code, why = local_stop_code(run_config(5), {**below, "generation": 5}, started, StopFlags())
    assert (code, why) == (STOP_DONE, "reached maxGenerations=5")
