"""The genetic algorithm of ERL (Khadka & Tumer, 2018), over flat parameter vectors.

One `tell` builds the next population: the `num_elites` fittest members are copied unchanged to
the front, every other slot is filled by a tournament winner, optionally crossed with a second
tournament winner, then mutated (the operators of `_genetic.py`). `ask` returns that population
as it is and keeps its key in the state: `tell` draws its randomness from it (the interface gives
`tell` no key).

RL actors join through `replace_worst` before `tell` (ERL's synchronisation).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import struct

from evokube_trainer.ec._base import EvoOptimizer
from evokube_trainer.ec._genetic import Crossover, crossover, erl_mutation, tournament_selection


@struct.dataclass
class GAState:
    population: jax.Array  # [pop, D] to be evaluated next; elites of the last tell first
    key: jax.Array  # PRNG key for the next tell: the last ask's key (init's before any ask)
    generation: jax.Array  # [] int32


@dataclasses.dataclass(frozen=True)
class GA(EvoOptimizer):
    """ERL's GA. Defaults follow the ERL paper's code.

    Mutation: `erl_mutation`, whose arguments are the `mutation_*`, `super_mutation_*`,
    `reset_*`, `relative_mutation` and `weight_clip` fields. Crossover: `crossover` ("uniform" or
    "single_point"), with probability `crossover_prob` per child, with a second tournament
    winner (ERL always crosses the slots left unselected with an elite).

    The first population is `mean` (member 0) plus members drawn around it with `init_std`;
    `seed_population` replaces it by independent draws (the workflows: one network
    initialization per member, as in ERL). Selection reads the shaped fitness (raw by default).
    """

    num_elites: int = 1
    tournament_size: int = 3
    init_std: float = 0.1
    mutation_prob: float = 0.9
    mutation_frac: float = 0.1
    mutation_std: float = 0.1
    super_mutation_prob: float = 0.05
    super_mutation_std: float = 10.0
    reset_prob: float = 0.05
    reset_std: float = 1.0
    relative_mutation: bool = True
    crossover_prob: float = 0.0
    crossover: Crossover = "uniform"
    weight_clip: float = 1e6

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.num_elites < self.pop_size:
            raise ValueError(f"num_elites must lie in [0, {self.pop_size}), got {self.num_elites}")
        if self.tournament_size < 1:
            raise ValueError(f"tournament_size must be positive, got {self.tournament_size}")
        if self.super_mutation_prob + self.reset_prob > 1:
            raise ValueError("super_mutation_prob + reset_prob must not exceed 1")
        if self.crossover not in ("uniform", "single_point"):
            raise ValueError(f"crossover must be 'uniform' or 'single_point', got {self.crossover}")

    def init(self, key: jax.Array, mean: jax.Array) -> GAState:
        mean = self._check_mean(mean)
        k_init, k_state = jax.random.split(key)
        noise = jax.random.normal(k_init, (self.pop_size, self.num_dims), jnp.float32)
        population = (mean + self.init_std * noise).at[0].set(mean)
        return GAState(population=population, key=k_state, generation=jnp.zeros((), jnp.int32))

    def seed_population(
        self, state: GAState, key: jax.Array, draw: Callable[[jax.Array], jax.Array]
    ) -> GAState:
        population = jax.vmap(draw)(jax.random.split(key, self.pop_size))  # [pop, D]
        return state.replace(population=population)

    def ask(self, state: GAState, key: jax.Array) -> tuple[jax.Array, GAState]:
        return state.population, state.replace(key=key)

    def _tell(
        self, state: GAState, population: jax.Array, fitness: jax.Array
    ) -> tuple[GAState, dict[str, jax.Array]]:
        key, k_select, k_mate, k_cross, k_mutate = jax.random.split(state.key, 5)
        num_children = self.pop_size - self.num_elites
        elites = population[jax.lax.top_k(fitness, self.num_elites)[1]]  # [E, D]
        parents = tournament_selection(k_select, fitness, num_children, self.tournament_size)
        children = population[parents]  # [C, D]
        if self.crossover_prob > 0:
            mates = tournament_selection(k_mate, fitness, num_children, self.tournament_size)
            children = crossover(
                k_cross, children, population[mates], self.crossover_prob, self.crossover
            )
        children = self._mutate(k_mutate, children)
        state = state.replace(population=jnp.concatenate([elites, children]), key=key)
        return state, {"selected_fitness_mean": fitness[parents].mean()}

    def best(self, state: GAState) -> jax.Array:
        """Member 0: the best of the last population told (the initial mean before any tell)."""
        return state.population[0]

    def _mutate(self, key: jax.Array, children: jax.Array) -> jax.Array:
        return erl_mutation(
            key,
            children,
            prob=self.mutation_prob,
            frac=self.mutation_frac,
            std=self.mutation_std,
            super_prob=self.super_mutation_prob,
            super_std=self.super_mutation_std,
            reset_prob=self.reset_prob,
            reset_std=self.reset_std,
            relative=self.relative_mutation,
            clip=self.weight_clip,
        )
