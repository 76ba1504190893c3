"""IPOP restarts for CMA-ES (Auger & Hansen, 2005) with static shapes, inside the jitted `tell`.

A stuck run starts over from the initial mean with `restart_factor` times more members. Shapes
cannot grow under jit and the population is sharded with a fixed size, so `pop_size` is the LAST
run's population and run k uses the first lambda_k = pop_size / factor^(K - k) members
(K = max_restarts). The others are still sampled and evaluated (the compute IPOP trades for
static shapes) but rank last and get no weight. Each run's constants come from a table indexed by
the traced restart count; the restart itself is a `jnp.where` between the state and a fresh one.

Stopping criteria (a subset of Hansen's, arXiv:1604.00772), on the active members:
  * TolFun: for 10 + ceil(30 D / lambda_k) generations, each generation's fitness spanned at
    most `tol_fun` and the run's best did not improve by more than `tol_fun`;
  * stagnation: the run's best has not improved by more than `tol_fun` for
    120 + ceil(30 D / lambda_k) generations (Hansen compares medians over that window);
  * TolX: sigma * max(|p_c|, sqrt of C's largest eigenvalue) < 1e-12 * init_sigma (the largest
    axis bounds every coordinate's standard deviation);
  * ConditionCov: C's condition number exceeds 1e14 (in float32 that is also when eigh loses
    the smallest eigenvalue, clamped to 1e-20: the distribution has degenerated);
  * a non-finite sigma or C.
Hansen's tol_fun, 1e-12, assumes float64; float32 fitness rounds at about 1e-7 of its magnitude,
hence CMAES's 1e-6. restart_factor 1 restarts at the full population (no member idles).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import struct

from evokube_trainer.ec._cma_parts import CMAConstants, cma_constants
from evokube_trainer.ec._covariance import Covariance
from evokube_trainer.ec._parts import log_rank_weights

Array = jax.Array
_TOL_X = 1e-12  # relative to init_sigma
_MAX_CONDITION = 1e14


@struct.dataclass
class RestartState:
    count: Array  # [] int32 restarts so far, k
    pop_size: Array  # [] int32 active members lambda_k: the first lambda_k rows of a population
    run_start: Array  # [] int32 generation at which the current run started
    run_best: Array  # [] float32 the run's best fitness at its last improvement > tol_fun
    stall: Array  # [] int32 generations since that improvement
    flat: Array  # [] int32 of those, the last ones in a row whose fitness spanned <= tol_fun
    best: Array  # [D] the best member told so far, over all runs
    best_fitness: Array  # [] float32 its fitness
    start: Array  # [D] the initial mean, where every run starts


def population_sizes(
    pop_size: int, max_restarts: int, factor: float, num_elites: int | None, shaped: bool
) -> tuple[int, ...]:
    """lambda_k = floor(pop_size / factor^(max_restarts - k)) for k = 0..max_restarts, after
    checking the options of a CMA-ES with restarts."""
    if max_restarts < 0 or factor < 1:
        raise ValueError(f"need max_restarts >= 0, restart_factor >= 1: {max_restarts}, {factor}")
    sizes = tuple(int(pop_size / factor ** (max_restarts - k)) for k in range(max_restarts + 1))
    if sizes[0] < 2:
        raise ValueError(f"the first run would have {sizes[0]} < 2 members: raise pop_size")
    if max_restarts and num_elites is not None:
        raise ValueError("with restarts, mu is half of each run's population: no num_elites")
    if max_restarts and shaped:
        raise ValueError("restarts compare fitness across generations: keep it raw")
    return sizes


def run_constants(
    sizes: tuple[int, ...], num_dims: int, covariance: Covariance, run: Array
) -> CMAConstants:
    """The CMA constants of run `run` [] int32: every run's, stacked (weights zero-padded to the
    last run's mu) and indexed, so they are traced scalars."""
    runs = []
    for size in sizes:
        c = cma_constants(log_rank_weights(size // 2), num_dims, covariance)
        runs.append(c._replace(weights=jnp.pad(c.weights, (0, sizes[-1] // 2 - size // 2))))
    table = jax.tree.map(lambda *values: jnp.asarray(values), *runs)
    return jax.tree.map(lambda values: values[run], table)


def init_restarts(start: Array, pop_size: int) -> RestartState:
    """Before the first run, of `pop_size` members, from `start` [D]."""
    zero, minus_inf = jnp.zeros((), jnp.int32), jnp.asarray(-jnp.inf, jnp.float32)
    size = jnp.asarray(pop_size, jnp.int32)
    return RestartState(zero, size, zero, minus_inf, zero, zero, start, minus_inf, start)


def mask_inactive(restart: RestartState, fitness: Array) -> Array:
    """`fitness` [pop] with the inactive members' at -inf: they rank last."""
    return jnp.where(jnp.arange(fitness.shape[0]) < restart.pop_size, fitness, -jnp.inf)


def advance(
    state, population: Array, fitness: Array, tol_fun: float, sizes: tuple[int, ...], sigma0: float
) -> tuple[RestartState, Array]:
    """`state.restart` after the CMA-ES update `state` (an IPOPState) of `population` [pop, D]
    with masked `fitness` [pop], and whether the run restarts [] bool: `restart` then already
    describes the next run, which starts with the next generation. `sigma0`: init_sigma."""
    restart = _track(state.restart, population, fitness, tol_fun)
    stuck = _is_stuck(restart, state.sigma / sigma0, state.p_c, state.scale)
    stuck &= restart.count < len(sizes) - 1
    next_size = jnp.asarray(sizes, jnp.int32)[jnp.minimum(restart.count + 1, len(sizes) - 1)]
    following = restart.replace(
        count=restart.count + 1,
        pop_size=next_size,
        run_start=state.generation + 1,
        run_best=jnp.full_like(restart.run_best, -jnp.inf),
        stall=jnp.zeros_like(restart.stall),
        flat=jnp.zeros_like(restart.flat),
    )
    return jax.tree.map(functools.partial(jnp.where, stuck), following, restart), stuck


def _track(
    restart: RestartState, population: Array, fitness: Array, tol_fun: float
) -> RestartState:
    """The best member, and the run's stall and flat counts, after a tell."""
    active = jnp.arange(fitness.shape[0]) < restart.pop_size  # [pop]
    top = jnp.argmax(fitness)
    improved = fitness[top] > restart.run_best + tol_fun
    spread = fitness[top] - jnp.min(jnp.where(active, fitness, jnp.inf))
    better = fitness[top] > restart.best_fitness
    return restart.replace(
        run_best=jnp.where(improved, fitness[top], restart.run_best),
        stall=jnp.where(improved, 0, restart.stall + 1),
        flat=jnp.where(improved | (spread > tol_fun), 0, restart.flat + 1),
        best=jnp.where(better, population[top], restart.best),
        best_fitness=jnp.where(better, fitness[top], restart.best_fitness),
    )


def _is_stuck(restart: RestartState, relative_sigma: Array, p_c: Array, scale: Array) -> Array:
    """Whether any of the module's stopping criteria holds [] bool."""
    history = jnp.ceil(30 * restart.start.shape[0] / restart.pop_size)
    flat = restart.flat >= 10 + history
    stagnated = restart.stall >= 120 + history
    tiny = relative_sigma * jnp.maximum(jnp.abs(p_c).max(), scale.max()) < _TOL_X
    ill_conditioned = (scale.max() / scale.min()) ** 2 > _MAX_CONDITION
    broken = ~jnp.isfinite(relative_sigma) | ~jnp.all(jnp.isfinite(scale))
    return flat | stagnated | tiny | ill_conditioned | broken
