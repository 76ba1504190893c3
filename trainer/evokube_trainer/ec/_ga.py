"""The genetic algorithm of ERL (Khadka & Tumer, 2018), over flat parameter vectors.

One `tell` builds the next population: the `num_elites` fittest members are copied unchanged to
the front, every other slot is filled by a tournament winner, optionally crossed with a second
tournament winner, then mutated. `ask` returns that population as it is and keeps its key in the
state: `tell` draws its randomness from it (the interface gives `tell` no key).

RL injection (ERL's synchronisation): before `tell`, overwrite the worst evaluated members with
the RL actors and write their fitness at the same indices, then tell:

    population, slots = replace_worst(population, fitness, rl_actors)
    fitness = fitness.at[slots].set(rl_fitness)
    state, metrics = ga.tell(state, population, fitness)

The actors then compete in selection and survive unchanged if they rank among the elites.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Literal

import jax
import jax.numpy as jnp
from flax import struct

from evokube_trainer.ec._base import EvoOptimizer


@struct.dataclass
class GAState:
    population: jax.Array  # [pop, D] to be evaluated next; elites of the last tell first
    key: jax.Array  # PRNG key for the next tell: the last ask's key (init's before any ask)
    generation: jax.Array  # [] int32


def tournament_selection(
    key: jax.Array, fitness: jax.Array, num_selected: int, tournament_size: int
) -> jax.Array:
    """Indices [num_selected]: each the fittest of `tournament_size` members drawn with
    replacement."""
    entrants = jax.random.randint(
        key, (num_selected, tournament_size), 0, fitness.shape[0]
    )  # [num_selected, tournament_size]
    winners = jnp.argmax(fitness[entrants], axis=1)  # [num_selected]
    return jnp.take_along_axis(entrants, winners[:, None], axis=1)[:, 0]


def replace_worst(
    population: jax.Array, fitness: jax.Array, newcomers: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Put `newcomers` [k, D] in place of the `k` least fit members of `population` [pop, D].

    Returns the new population and the replaced indices [k] (worst first), so the caller can
    write the newcomers' fitness with `fitness.at[indices].set(...)`.
    """
    indices = jax.lax.top_k(-fitness, newcomers.shape[0])[1]  # [k]
    return population.at[indices].set(newcomers), indices


@dataclasses.dataclass(frozen=True)
class GA(EvoOptimizer):
    """ERL's GA. Defaults follow the ERL paper's code.

    Mutation: a child is mutated with probability `mutation_prob`; then each weight, with
    probability `mutation_frac`, is either
      * super-mutated (prob. `super_mutation_prob`): w += N(0, super_mutation_std * s),
      * reset (prob. `reset_prob`): w = N(0, reset_std),
      * or mutated: w += N(0, mutation_std * s),
    where s = |w| when `relative_mutation` (as in ERL) and 1 otherwise; weights are then clipped
    to +-`weight_clip`. ERL draws a random number of weights per tensor; a Bernoulli mask over the
    flat vector is the jit-friendly equivalent.

    Crossover, with probability `crossover_prob` per child, with a second tournament winner:
    "uniform" takes each weight from either parent; "single_point" takes the first parent's
    weights before a random cut. (ERL swaps whole rows of weight matrices and always crosses the
    slots left unselected with an elite; a flat vector has no rows, so one probability it is.)

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
    crossover: Literal["uniform", "single_point"] = "uniform"
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
            children = self._cross(k_cross, children, population[mates])
        children = self._mutate(k_mutate, children)
        next_population = jnp.concatenate([elites, children])
        state = state.replace(population=next_population, key=key)
        return state, {"selected_fitness_mean": fitness[parents].mean()}

    def best(self, state: GAState) -> jax.Array:
        """Member 0: the best of the last population told (the initial mean before any tell)."""
        return state.population[0]

    def _cross(self, key: jax.Array, first: jax.Array, second: jax.Array) -> jax.Array:
        """Children [C, D] mixing `first` and `second` parents, each with prob. crossover_prob."""
        k_apply, k_genes = jax.random.split(key)
        num_children, num_dims = first.shape
        if self.crossover == "uniform":
            from_first = jax.random.bernoulli(k_genes, 0.5, (num_children, num_dims))
        else:
            cut = jax.random.randint(k_genes, (num_children, 1), 1, max(num_dims, 2))
            from_first = jnp.arange(num_dims)[None, :] < cut
        crossed = jnp.where(from_first, first, second)
        apply = jax.random.bernoulli(k_apply, self.crossover_prob, (num_children, 1))
        return jnp.where(apply, crossed, first)

    def _mutate(self, key: jax.Array, children: jax.Array) -> jax.Array:
        """ERL's Gaussian / super / reset mutation of a fraction of each child's weights."""
        # Two draws instead of five: cheaper to compile and to run eagerly.
        k_uniform, k_normal = jax.random.split(key)
        num_children, num_dims = children.shape
        uniform = jax.random.uniform(k_uniform, (num_children, 2 * num_dims + 1))
        mutated = uniform[:, :1] < self.mutation_prob  # [C, 1] child is mutated at all
        touched = (uniform[:, 1 : num_dims + 1] < self.mutation_frac) & mutated  # [C, D]
        kind = uniform[:, num_dims + 1 :]  # [C, D] picks super / reset / normal
        noise, reset = jax.random.normal(k_normal, (2, num_children, num_dims), jnp.float32)
        magnitude = jnp.abs(children) if self.relative_mutation else 1.0
        is_super = kind < self.super_mutation_prob
        std = jnp.where(is_super, self.super_mutation_std, self.mutation_std) * magnitude
        perturbed = children + noise * std
        is_reset = ~is_super & (kind < self.super_mutation_prob + self.reset_prob)
        new = jnp.where(is_reset, self.reset_std * reset, perturbed)
        return jnp.clip(jnp.where(touched, new, children), -self.weight_clip, self.weight_clip)
