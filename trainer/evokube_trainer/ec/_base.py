"""What every optimizer shares: the interface, sampling, schedules, recombination weights and the
optax-driven gradient-ascent step on the mean, plus the common preamble of the isotropic-Gaussian
optimizers (`GaussianSearch`: VanillaES, OpenES, ARS) and of those among them that move the mean by
an optax transform (`SearchGradient` and its `SearchGradientState`: OpenES, ARS).

Conventions: fitness is MAXIMIZED; a population is `[pop, D]` float32; every `tell` recomputes
what it needs from the population it is given (never from what `ask` sampled), so a caller may
edit individuals between `ask` and `tell`.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

Array = jax.Array
Schedule = Callable[[Array], Array]  # generation [] int32 -> value []
ScheduleLike = float | Schedule  # a constant, or an optax schedule such as optax.linear_schedule
OptimizerFactory = Callable[[ScheduleLike], optax.GradientTransformation]  # e.g. optax.adam


@dataclasses.dataclass(frozen=True)
class EvoOptimizer(abc.ABC):
    """Ask/tell optimizer over flat parameter vectors; static and hashable.

    Subclasses are frozen dataclasses holding structure and hyperparameters; all changing values
    live in the state pytree, so `jax.jit(opt.tell)` and `lax.scan` over ask/tell just work.
    """

    pop_size: int
    num_dims: int

    def __post_init__(self) -> None:
        if self.pop_size < 2:
            raise ValueError(f"pop_size must be at least 2, got {self.pop_size}")
        if self.num_dims < 1:
            raise ValueError(f"num_dims must be positive, got {self.num_dims}")

    @abc.abstractmethod
    def init(self, key: Array, mean: Array) -> Any:
        """The first state, centred on `mean` [D]."""

    @abc.abstractmethod
    def ask(self, state: Any, key: Array) -> tuple[Array, Any]:
        """A population [pop, D] to evaluate, and the state (unchanged by most optimizers)."""

    @abc.abstractmethod
    def tell(self, state: Any, population: Array, fitness: Array) -> tuple[Any, dict[str, Array]]:
        """Update from `population` [pop, D] and its `fitness` [pop] (higher is better)."""

    def best(self, state: Any) -> Array:
        """The parameters to deploy/evaluate [D]: the search distribution's mean by default."""
        return state.mean

    def _check_mean(self, mean: Array) -> Array:
        mean = jnp.asarray(mean, jnp.float32)
        if mean.shape != (self.num_dims,):
            raise ValueError(f"mean must have shape ({self.num_dims},), got {mean.shape}")
        return mean


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
    """Summary metrics every optimizer reports."""
    return {
        "fitness_max": jnp.max(fitness),
        "fitness_mean": jnp.mean(fitness),
        "fitness_min": jnp.min(fitness),
        "fitness_std": jnp.std(fitness),
    }


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


def ascent_step(
    transform: optax.GradientTransformation,
    opt_state: optax.OptState,
    mean: Array,
    grad: Array,
) -> tuple[Array, optax.OptState]:
    """One step of `transform` up the fitness gradient `grad` [D] (optax minimizes: negate)."""
    updates, opt_state = transform.update(-grad, opt_state, mean)
    return optax.apply_updates(mean, updates), opt_state


class GaussianSearch(EvoOptimizer):
    """Samples `mean + sigma * eps`, eps ~ N(0, I) in mirrored pairs when `mirrored`, around a state
    with `mean` [D] and `generation` [] (`sigma` is a constant or a schedule of the generation).

    Deliberately not a dataclass itself: each subclass declares `sigma` and `mirrored` as its own
    fields (or `mirrored` as a plain class constant), so its field order and constructor are its
    own.
    """

    sigma: ScheduleLike
    mirrored: bool

    def __post_init__(self) -> None:
        super().__post_init__()
        check_mirrored(self.mirrored, self.pop_size)

    def ask(self, state: Any, key: Array) -> tuple[Array, Any]:
        sigma = schedule_value(self.sigma, state.generation)
        noise = gaussian_noise(key, self.pop_size, self.num_dims, self.mirrored)
        return state.mean + sigma * noise, state


@struct.dataclass
class SearchGradientState:
    """State of a `SearchGradient` optimizer (exported as `OpenESState` and `ARSState`)."""

    mean: jax.Array  # [D]
    opt_state: optax.OptState  # the optax state of the mean update
    generation: jax.Array  # [] int32, number of tells so far


class SearchGradient(GaussianSearch):
    """A `GaussianSearch` whose `tell` estimates a fitness gradient and moves the mean one step of
    `optimizer(learning_rate)` up it (`_ascend`), with optional L2 `weight_decay`.

    Not a dataclass itself, like `GaussianSearch`: subclasses declare these fields.
    """

    learning_rate: ScheduleLike
    optimizer: OptimizerFactory
    weight_decay: float

    def _transform(self) -> optax.GradientTransformation:
        return gradient_ascent(self.optimizer, self.learning_rate, self.weight_decay)

    def init(self, key: Array, mean: Array) -> SearchGradientState:
        del key
        mean = self._check_mean(mean)
        return SearchGradientState(
            mean=mean,
            opt_state=self._transform().init(mean),
            generation=jnp.zeros((), jnp.int32),
        )

    def _ascend(self, state: SearchGradientState, grad: Array) -> SearchGradientState:
        """`state` after one step of the mean up the fitness gradient `grad` [D]."""
        mean, opt_state = ascent_step(self._transform(), state.opt_state, state.mean, grad)
        return state.replace(mean=mean, opt_state=opt_state, generation=state.generation + 1)
