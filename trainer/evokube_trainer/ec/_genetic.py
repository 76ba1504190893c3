"""Genetic operators over flat parameter vectors: selection, crossover, mutation, and the
injection of newcomers (RL actors) over the worst members. Pure functions; the GA composes them."""

from __future__ import annotations

from typing import Literal

import jax
import jax.numpy as jnp

Array = jax.Array
Crossover = Literal["uniform", "single_point"]


def tournament_selection(
    key: Array, fitness: Array, num_selected: int, tournament_size: int
) -> Array:
    """Indices [num_selected]: each the fittest of `tournament_size` members drawn with
    replacement."""
    entrants = jax.random.randint(
        key, (num_selected, tournament_size), 0, fitness.shape[0]
    )  # [num_selected, tournament_size]
    winners = jnp.argmax(fitness[entrants], axis=1)  # [num_selected]
    return jnp.take_along_axis(entrants, winners[:, None], axis=1)[:, 0]


def replace_worst(population: Array, fitness: Array, newcomers: Array) -> tuple[Array, Array]:
    """Put `newcomers` [k, D] in place of the `k` least fit members of `population` [pop, D].

    Returns the new population and the replaced indices [k] (worst first), so the caller can
    write the newcomers' fitness at them. ERL's synchronisation of RL actors into the GA:

        population, slots = replace_worst(population, fitness, rl_actors)
        fitness = fitness.at[slots].set(rl_fitness)
        state, metrics = ga.tell(state, population, fitness)

    The actors then compete in selection and survive unchanged if they rank among the elites.
    """
    indices = jax.lax.top_k(-fitness, newcomers.shape[0])[1]  # [k]
    return population.at[indices].set(newcomers), indices


def crossover(key: Array, first: Array, second: Array, prob: float, kind: Crossover) -> Array:
    """Children [C, D]: with probability `prob` each, `first` [C, D] crossed with `second`.

    "uniform" takes each weight from either parent; "single_point" takes the first parent's
    weights before a random cut. (ERL swaps whole rows of weight matrices; a flat vector has no
    rows.)
    """
    k_apply, k_genes = jax.random.split(key)
    num_children, num_dims = first.shape
    if kind == "uniform":
        from_first = jax.random.bernoulli(k_genes, 0.5, (num_children, num_dims))
    else:
        cut = jax.random.randint(k_genes, (num_children, 1), 1, max(num_dims, 2))
        from_first = jnp.arange(num_dims)[None, :] < cut
    crossed = jnp.where(from_first, first, second)
    apply = jax.random.bernoulli(k_apply, prob, (num_children, 1))
    return jnp.where(apply, crossed, first)


def erl_mutation(
    key: Array,
    children: Array,
    *,
    prob: float,
    frac: float,
    std: float,
    super_prob: float,
    super_std: float,
    reset_prob: float,
    reset_std: float,
    relative: bool,
    clip: float,
) -> Array:
    """ERL's mutation of `children` [C, D].

    A child is mutated with probability `prob`; then each weight, with probability `frac`, is
      * super-mutated (prob. `super_prob`): w += N(0, super_std * s),
      * reset (prob. `reset_prob`): w = N(0, reset_std),
      * or mutated: w += N(0, std * s),
    where s = |w| when `relative` (as in ERL) and 1 otherwise; weights are then clipped to
    +-`clip`. ERL draws a random number of weights per tensor; a Bernoulli mask over the flat
    vector is the jit-friendly equivalent.
    """
    # Two draws instead of five: cheaper to compile and to run eagerly.
    k_uniform, k_normal = jax.random.split(key)
    num_children, num_dims = children.shape
    uniform = jax.random.uniform(k_uniform, (num_children, 2 * num_dims + 1))
    mutated = uniform[:, :1] < prob  # [C, 1] child is mutated at all
    touched = (uniform[:, 1 : num_dims + 1] < frac) & mutated  # [C, D]
    kind = uniform[:, num_dims + 1 :]  # [C, D] picks super / reset / normal
    noise, reset = jax.random.normal(k_normal, (2, num_children, num_dims), jnp.float32)
    magnitude = jnp.abs(children) if relative else 1.0
    is_super = kind < super_prob
    scaled_std = jnp.where(is_super, super_std, std) * magnitude  # [C, D]
    perturbed = children + noise * scaled_std
    is_reset = ~is_super & (kind < super_prob + reset_prob)
    new = jnp.where(is_reset, reset_std * reset, perturbed)
    return jnp.clip(jnp.where(touched, new, children), -clip, clip)
