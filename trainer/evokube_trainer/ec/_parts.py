"""The parts optimizers are composed of: small pure functions over arrays (optax-style).

Schedules, sampling, elite selection and recombination weights, the fitness statistics every
`tell` reports, and the optax-driven ascent of a mean along an estimated fitness gradient
(`SearchGradientState`, `init_ascent`, `ascend`: OpenES and ARS).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

Array = jax.Array
Schedule = Callable[[Array], Array]  # generation [] int32 -> value []
ScheduleLike = float | Schedule  # a constant, or an optax schedule such as optax.linear_schedule
OptimizerFactory = Callable[[ScheduleLike], optax.GradientTransformation]  # e.g. optax.adam


def as_schedule(value: ScheduleLike) -> Schedule:
    """A callable schedule from a constant or an optax schedule."""
    if callable(value):
        return value
    return optax.constant_schedule(value)


def schedule_value(value: ScheduleLike, generation: Array) -> Array:
    """`value` evaluated at `generation`, as a float32 scalar."""
    return jnp.asarray(as_schedule(value)(generation), jnp.float32)


def resolve_num_elites(num_elites: int | None, pop_size: int) -> int:
    """`num_elites`, or half the population when None; checked to lie in [1, pop_size]."""
    count = pop_size // 2 if num_elites is None else num_elites
    if not 1 <= count <= pop_size:
        raise ValueError(f"num_elites must lie in [1, {pop_size}], got {count}")
    return count


def check_mirrored(mirrored: bool, pop_size: int) -> None:
    if mirrored and pop_size % 2:
        raise ValueError(f"mirrored sampling needs an even pop_size, got {pop_size}")


def gaussian_noise(key: Array, pop_size: int, num_dims: int, mirrored: bool) -> Array:
    """Standard normal directions [pop, D].

    Mirrored (antithetic): rows come in pairs, row `2k + 1` exactly `-row 2k`. Pairs rather
    than halves keep each pair together when the population is split over devices by rows, so
    building it moves no data between devices (halves would need two all-gathers of [pop/2, D]).
    """
    if mirrored:
        half = jax.random.normal(key, (pop_size // 2, num_dims), jnp.float32)
        return jnp.stack([half, -half], axis=1).reshape(pop_size, num_dims)
    return jax.random.normal(key, (pop_size, num_dims), jnp.float32)


def gaussian_population(
    key: Array, mean: Array, sigma: Array, pop_size: int, mirrored: bool
) -> Array:
    """`mean` [D] + `sigma` [] * N(0, I): a population [pop, D], in mirrored pairs if asked."""
    return mean + sigma * gaussian_noise(key, pop_size, mean.shape[0], mirrored)


def top_k_indices(fitness: Array, k: int) -> Array:
    """Indices [k] of the `k` fittest members, fittest first."""
    return jax.lax.top_k(fitness, k)[1]


def log_rank_weights(num_elites: int, offset: float = 0.5) -> np.ndarray:
    """Recombination weights [num_elites] ∝ log(num_elites + offset) - log(rank), summing to 1.

    A NumPy constant, so derived constants (e.g. CMA-ES's mu_eff) stay Python floats under jit.

    offset=0.5 gives Hansen's CMA-ES weights when num_elites = pop // 2 (pop even);
    offset=1.0 gives CEM-RL's weights.
    """
    ranks = np.arange(1, num_elites + 1)
    raw = np.log(num_elites + offset) - np.log(ranks)
    return (raw / raw.sum()).astype(np.float32)


def fitness_stats(fitness: Array) -> dict[str, Array]:
    """Summary metrics every optimizer reports, of the raw fitness [pop]."""
    return {
        "fitness_max": jnp.max(fitness),
        "fitness_mean": jnp.mean(fitness),
        "fitness_min": jnp.min(fitness),
        "fitness_std": jnp.std(fitness),
    }


@struct.dataclass
class SearchGradientState:
    """The state of a mean moved by an optax transform (exported as `OpenESState`, `ARSState`)."""

    mean: jax.Array  # [D]
    opt_state: optax.OptState  # the optax state of the mean update
    generation: jax.Array  # [] int32, number of tells so far


def gradient_ascent(
    optimizer: OptimizerFactory, learning_rate: ScheduleLike, weight_decay: float
) -> optax.GradientTransformation:
    """The optax transform that moves a mean along an estimated fitness gradient.

    Weight decay is L2 added to the (negated) gradient before the optimizer, as in Salimans et al.
    The learning-rate schedule is counted by optax itself, one step per `tell`.
    """
    transform = optimizer(learning_rate)
    if weight_decay:
        transform = optax.chain(optax.add_decayed_weights(weight_decay), transform)
    return transform


def init_ascent(transform: optax.GradientTransformation, mean: Array) -> SearchGradientState:
    """The first state of a mean [D] moved by `transform`."""
    return SearchGradientState(
        mean=mean, opt_state=transform.init(mean), generation=jnp.zeros((), jnp.int32)
    )


def ascend(
    transform: optax.GradientTransformation, state: SearchGradientState, grad: Array
) -> SearchGradientState:
    """`state` after one step of `transform` up the fitness gradient `grad` [D] (optax
    minimizes: it is given `-grad`)."""
    updates, opt_state = transform.update(-grad, state.opt_state, state.mean)
    return state.replace(mean=optax.apply_updates(state.mean, updates), opt_state=opt_state)
