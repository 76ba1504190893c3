"""The env-step count, on the device in two int32 words (jax runs without x64).

`WorkflowState.env_steps` holds the count below ENV_STEPS_WORD and `env_steps_high` the whole
ENV_STEPS_WORDs; the device's maxEnvSteps threshold (`StopAt`) is in the same two words, and the
host reads the count as one int64. docs/trainer-design.md, "Env steps in two words".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from evokube_trainer import metric_names as names

Array = jax.Array

# Env steps are counted on the device in two int32 words (jax runs without x64, and one chip
# passes 2**31 agent steps within the hour: Brax at 0.7M steps/s, 8 seeds of a small ES at
# 60M each): `WorkflowState.env_steps` holds the count below ENV_STEPS_WORD and
# `env_steps_high` the whole ENV_STEPS_WORDs. A generation's steps are summed into it exactly
# from each member's count (`add_member_steps`), so a generation of a million members may take
# more than 2**31 steps.
_WORD_BITS = 30
ENV_STEPS_WORD = 1 << _WORD_BITS


def add_env_steps(high: Array, low: Array, new: Array) -> tuple[Array, Array]:
    """The two-word env-step count `(high, low)` plus `new` steps (`new` < 2**30)."""
    low = low + new  # < 2**31: both terms are below 2**30
    return high + low // ENV_STEPS_WORD, low % ENV_STEPS_WORD


# `add_member_steps` sums members' counts (each < 2**30) in three limbs of this many bits, so
# that each limb's sum over up to 2**21 members stays below 2**31.
_LIMB_BITS = 10


def add_member_steps(high: Array, low: Array, member_steps: Array) -> tuple[Array, Array]:
    """The two-word count `(high, low)` plus the sum of `member_steps` (`[N]` int32, each
    < 2**30, N <= 2**21), exact in int32: a million members' steps overflow one int32 sum."""
    mask = (1 << _LIMB_BITS) - 1
    for limb in range(3):  # steps = sum over limbs of part * 2**(10 * limb)
        part = jnp.sum((member_steps >> (_LIMB_BITS * limb)) & mask)  # < 2**31
        # part * 2**shift, split into whole words and the rest below a word
        shift = _LIMB_BITS * limb
        whole, rest = part >> (_WORD_BITS - shift), part & ((1 << (_WORD_BITS - shift)) - 1)
        high, low = add_env_steps(high + whole, low, rest << shift)
    return high, low


def env_steps_reached(high: Array, low: Array, at_high: Array, at_low: Array) -> Array:
    """Whether the two-word count `(high, low)` has reached the two-word threshold
    `(at_high, at_low)` (a negative `at_high`: never)."""
    reached = (high > at_high) | ((high == at_high) & (low >= at_low))
    return reached & (at_high >= 0)


# Leaves WorkflowState gained after checkpoints of it were first written: such a checkpoint
# restores without them (`Checkpointer.restore_latest(added=...)`), then `upgraded` fills them.
ADDED_STATE_LEAVES = ("env_steps_high",)


def upgraded(state: Any) -> Any:
    """A WorkflowState restored from an older checkpoint (`ADDED_STATE_LEAVES` None) made whole: its
    one-word env-step count split into two words. That count was an int32 that wrapped past
    2**31; read as uint32 it is exact below 2**32."""
    if state.env_steps_high is not None:
        return state
    count = state.env_steps.astype(jnp.uint32)
    return state.replace(
        env_steps_high=(count // ENV_STEPS_WORD).astype(jnp.int32),
        env_steps=(count % ENV_STEPS_WORD).astype(jnp.int32),
    )


def env_steps_count(state: Any) -> np.ndarray:
    """A WorkflowState's env steps on the host, as int64 (`[]`, or `[seeds]` with several)."""
    return joined(*jax.device_get((state.env_steps_high, state.env_steps)))


def counted_env_steps(rows: Mapping[str, Any]) -> dict[str, Any]:
    """Host metric rows with `env_steps` the whole count (int64) and its high word dropped."""
    rows = dict(rows)
    rows[names.ENV_STEPS] = joined(rows.pop("env_steps_high"), rows[names.ENV_STEPS])
    return rows


def joined(high: Any, low: Any) -> np.ndarray:
    """The two words of host env-step counts (any shape) as one int64 count."""
    return np.asarray(high, np.int64) * ENV_STEPS_WORD + np.asarray(low, np.int64)
