"""The interface every optimizer implements, and the one `tell` they all share.

`tell` is a template, as in evosax: it shapes the fitness (`fitness_shaping`, raw by default),
hands the shaped values to the optimizer's own update (`_tell`), then does once what every
optimizer does: the statistics of the raw fitness and the generation count. An optimizer
implements `init`, `ask` and `_tell` from the parts in `_parts.py`; `best` and
`seed_population` have defaults.

Conventions: fitness is MAXIMIZED; a population is `[pop, D]` float32; every `tell` recomputes
what it needs from the population it is given (never from what `ask` sampled), so a caller may
edit individuals between `ask` and `tell`. Every state is a flax struct with `generation` [].
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from evokube_trainer.ec._parts import fitness_stats
from evokube_trainer.ec._shaping import FitnessShaping, raw_fitness

Array = jax.Array
State = Any  # a flax struct dataclass with a `generation` [] int32 field


@dataclasses.dataclass(frozen=True)
class EvoOptimizer(abc.ABC):
    """Ask/tell optimizer over flat parameter vectors; static and hashable.

    Subclasses are frozen dataclasses holding structure and hyperparameters; all changing values
    live in the state pytree, so `jax.jit(opt.tell)` and `lax.scan` over ask/tell just work.
    `fitness_shaping` (keyword only) maps fitness [pop] to what `_tell` sees.
    """

    pop_size: int
    num_dims: int
    fitness_shaping: FitnessShaping = dataclasses.field(default=raw_fitness, kw_only=True)

    def __post_init__(self) -> None:
        if self.pop_size < 2:
            raise ValueError(f"pop_size must be at least 2, got {self.pop_size}")
        if self.num_dims < 1:
            raise ValueError(f"num_dims must be positive, got {self.num_dims}")

    @abc.abstractmethod
    def init(self, key: Array, mean: Array) -> State:
        """The first state, centred on `mean` [D]."""

    @abc.abstractmethod
    def ask(self, state: State, key: Array) -> tuple[Array, State]:
        """A population [pop, D] to evaluate, and the state (unchanged by most optimizers)."""

    @abc.abstractmethod
    def _tell(
        self, state: State, population: Array, fitness: Array
    ) -> tuple[State, dict[str, Array]]:
        """The optimizer's own update from `population` [pop, D] and its SHAPED `fitness`
        [pop], and its own metrics; `state.generation` is still the generation being told."""

    def tell(
        self, state: State, population: Array, fitness: Array
    ) -> tuple[State, dict[str, Array]]:
        """Update from `population` [pop, D] and its `fitness` [pop] (higher is better)."""
        state, metrics = self._tell(state, population, self.fitness_shaping(fitness))
        state = state.replace(generation=state.generation + 1)
        return state, {**fitness_stats(fitness), **metrics}

    def best(self, state: State) -> Array:
        """The parameters to deploy/evaluate [D]: the search distribution's mean by default."""
        return state.mean

    def seed_population(self, state: State, key: Array, draw: Callable[[Array], Array]) -> State:
        """`state` after offering independent members, `draw(key) -> [D]` (e.g. one network
        initialization each). An optimizer that keeps a population (the GA) starts from such
        draws; a search distribution, centred on `init`'s mean, ignores them (the default)."""
        del key, draw
        return state

    def _check_mean(self, mean: Array) -> Array:
        mean = jnp.asarray(mean, jnp.float32)
        if mean.shape != (self.num_dims,):
            raise ValueError(f"mean must have shape ({self.num_dims},), got {mean.shape}")
        return mean
