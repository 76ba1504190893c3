"""CMA-ES (Hansen's tutorial, arXiv:1604.00772) with full or diagonal (sep-CMA-ES) covariance,
composed of `_cma_parts.py`, `_covariance.py` (the only difference between the two variants)
and, optionally, the IPOP restarts of `_restarts.py`."""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from evokube_trainer.ec import _cma_parts as cma
from evokube_trainer.ec import _restarts as ipop
from evokube_trainer.ec._base import EvoOptimizer
from evokube_trainer.ec._covariance import DIAGONAL, FULL, Covariance
from evokube_trainer.ec._parts import log_rank_weights, resolve_num_elites, top_k_indices
from evokube_trainer.ec._shaping import raw_fitness


@struct.dataclass
class CMAESState:
    mean: jax.Array  # [D]
    sigma: jax.Array  # [] global step size
    p_sigma: jax.Array  # [D] conjugate evolution path (step-size control)
    p_c: jax.Array  # [D] evolution path (rank-one update)
    cov: jax.Array  # [D, D] full covariance, or [D] its diagonal (SepCMAES)
    basis: jax.Array | None  # [D, D] eigenvectors of cov (columns); None for SepCMAES
    scale: jax.Array  # [D] square roots of the eigenvalues (of the diagonal for SepCMAES)
    generation: jax.Array  # [] int32


@struct.dataclass
class IPOPState(CMAESState):
    """CMAESState plus IPOP's (`max_restarts` > 0); plain CMA-ES keeps its state and checkpoints."""

    restart: ipop.RestartState


@dataclasses.dataclass(frozen=True)
class CMAES(EvoOptimizer):
    """CMA-ES with full covariance; Hansen's default learning rates, positive weights only.

    `num_elites` is mu (pop // 2 when None), `init_sigma` the initial step size. (Hansen's default
    population is 4 + floor(3 ln D); the manifest sets `population.size`.)

    IPOP when `max_restarts` > 0 (`_restarts.py`): a stuck run starts over from the initial mean
    with `restart_factor` (>= 1) times more members, at most `max_restarts` times; `pop_size` is
    the last run's. `tol_fun`: fitness changes up to it count as none. `best` is then the best
    member told; the fitness stays raw and mu half of each run's (no `num_elites`).
    """

    covariance: ClassVar[Covariance] = FULL
    num_elites: int | None = None
    init_sigma: float = 0.5
    max_restarts: int = 0
    restart_factor: float = 2.0
    tol_fun: float = 1e-6

    def __post_init__(self) -> None:
        super().__post_init__()
        resolve_num_elites(self.num_elites, self.pop_size)
        self._sizes()

    def _sizes(self) -> tuple[int, ...]:
        shaped = self.fitness_shaping is not raw_fitness
        options = (self.max_restarts, self.restart_factor, self.num_elites, shaped)
        return ipop.population_sizes(self.pop_size, *options)

    def init(self, key: jax.Array, mean: jax.Array) -> CMAESState:
        del key
        mean = self._check_mean(mean)
        restart = ipop.init_restarts(mean, self._sizes()[0]) if self.max_restarts else None
        return self._start(mean, jnp.zeros((), jnp.int32), restart)

    def _start(self, mean: jax.Array, generation: jax.Array, restart) -> CMAESState:
        """A run from `mean` [D]: C = I, sigma = init_sigma, empty paths."""
        cov, basis = self.covariance.initial(self.num_dims)
        zeros, ones = jnp.zeros(self.num_dims, jnp.float32), jnp.ones(self.num_dims, jnp.float32)
        sigma = jnp.asarray(self.init_sigma, jnp.float32)
        state = CMAESState(mean, sigma, zeros, zeros, cov, basis, ones, generation)
        return state if restart is None else IPOPState(**vars(state), restart=restart)

    def ask(self, state: CMAESState, key: jax.Array) -> tuple[jax.Array, CMAESState]:
        z = jax.random.normal(key, (self.pop_size, self.num_dims), jnp.float32)
        return state.mean + state.sigma * self.covariance.color(state.basis, state.scale, z), state

    def _tell(
        self, state: CMAESState, population: jax.Array, fitness: jax.Array
    ) -> tuple[CMAESState, dict[str, jax.Array]]:
        if not self.max_restarts:
            weights = log_rank_weights(resolve_num_elites(self.num_elites, self.pop_size))
            c = cma.cma_constants(weights, self.num_dims, self.covariance)
            return self._update(state, population, fitness, c, 0)
        restart = state.restart
        c = ipop.run_constants(self._sizes(), self.num_dims, self.covariance, restart.count)
        fitness = ipop.mask_inactive(restart, fitness)
        state, metrics = self._update(state, population, fitness, c, restart.run_start)
        restart, stuck = ipop.advance(
            state, population, fitness, self.tol_fun, self._sizes(), self.init_sigma
        )
        fresh = self._start(restart.start, state.generation, restart)
        state = jax.tree.map(
            functools.partial(jnp.where, stuck), fresh, state.replace(restart=restart)
        )
        return state, {**metrics, "restarts": restart.count, "active_pop_size": restart.pop_size}

    def _update(self, state: CMAESState, population, fitness, c: cma.CMAConstants, run_start):
        """One CMA-ES update with constants `c`, in a run started at generation `run_start`."""
        steps = (population - state.mean) / state.sigma  # [pop, D]
        steps = steps[top_k_indices(fitness, c.weights.shape[0])]  # [mu, D], best first
        step = c.weights @ steps  # [D]
        whitened = self.covariance.whiten(state.basis, state.scale, step)  # [D]
        generations = (state.generation - run_start + 1).astype(jnp.float32)  # in this run
        p_sigma, p_c, h_sigma = cma.evolve_paths(
            c, state.p_sigma, state.p_c, step, whitened, generations
        )
        cov, basis, scale = cma.adapt_covariance(c, self.covariance, state.cov, p_c, steps, h_sigma)
        sigma = cma.adapt_step_size(c, state.sigma, p_sigma)
        mean = state.mean + state.sigma * step
        state = state.replace(
            mean=mean, sigma=sigma, p_sigma=p_sigma, p_c=p_c, cov=cov, basis=basis, scale=scale
        )
        return state, {"sigma": sigma, "axis_ratio": scale.max() / scale.min()}

    def best(self, state: CMAESState) -> jax.Array:
        """The mean; with restarts, the best member told (a restart moves the mean back)."""
        return state.restart.best if self.max_restarts else state.mean


@dataclasses.dataclass(frozen=True)
class SepCMAES(CMAES):
    """sep-CMA-ES (Ros & Hansen, 2008): CMA-ES over a diagonal covariance, O(pop * D) memory
    and time, so it scales to full policy networks (`DiagonalCovariance`)."""

    covariance: ClassVar[Covariance] = DIAGONAL
