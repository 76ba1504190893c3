"""The names of the metrics a generation reports, spelled once: the workflow writes them, and
Prometheus, status, history, the console, curves and sweeps read them. With several seeds, the
PER_SEED ones are reported per replica too, under `seed_key(i, name)`."""

from __future__ import annotations

import re
from typing import Final

GENERATION: Final = "generation"  # generations completed
ENV_STEPS: Final = "env_steps"  # agent steps sampled so far, warm-up included
BEST_FITNESS: Final = "ec/fitness_max"  # the generation's best fitness
MEAN_FITNESS: Final = "ec/fitness_mean"
MIN_FITNESS: Final = "ec/fitness_min"
FITNESS_STD: Final = "ec/fitness_std"
EVAL_RETURN: Final = "eval/return_mean"  # the evaluated candidate's mean return
ACTOR_RETURN_MEAN: Final = "rl/actor_return_mean"  # the RL actors' fitness this generation
CRITIC_LOSS: Final = "rl/critic_loss"  # the agents' `critic_loss` under the learner's "rl/"
STEP_SECONDS: Final = "time/step_s"  # wall-clock seconds of the generation, on the host
GENERATIONS_PER_S: Final = "time/generations_per_s"
ENV_STEPS_PER_S: Final = "time/env_steps_per_s"  # every replica's steps
PER_SEED: Final = (BEST_FITNESS, MEAN_FITNESS, EVAL_RETURN, ENV_STEPS)

_SEED_KEY: Final = re.compile(r"seed/(\d+)/(.+)")


def seed_key(index: int, name: str) -> str:
    """Replica `index`'s value of metric `name`: `seed/<index>/<name>`."""
    return f"seed/{index}/{name}"


def split_seed_key(key: str) -> tuple[int, str] | None:
    """(index, name) of a `seed_key`; None for any other metric."""
    match = _SEED_KEY.fullmatch(key)
    return (int(match.group(1)), match.group(2)) if match else None
