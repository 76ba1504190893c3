"""EC optimizers: ask/tell over flat parameter vectors [D], maximizing fitness.

    opt = OpenES(pop_size=64, num_dims=d)
    state = opt.init(key, mean)                      # mean [D]
    population, state = opt.ask(state, key)          # [pop, D]
    state, metrics = opt.tell(state, population, fitness)   # fitness [pop], higher is better
    params = opt.best(state)                         # [D]

Optimizers are frozen dataclasses (hashable, static); states are flax struct dataclasses, so
`jax.jit(opt.tell)` and ask/tell inside `lax.scan` work. `tell` always reads the population it is
given, so a workflow may edit individuals (e.g. RL-trained actors) between ask and tell.

Every optimizer subclasses `EvoOptimizer` directly: `tell` is shared (fitness shaping, the
optimizer's `_tell`, fitness statistics, generation count) and each optimizer is composed of the
pure parts of `_parts.py`. `seed_population(state, key, draw)` lets a workflow offer independent
initial members; the GA takes them, search distributions ignore them.
"""

from evokube_trainer.ec._ars import ARS, ARSState
from evokube_trainer.ec._base import EvoOptimizer
from evokube_trainer.ec._cma_es import CMAES, CMAESState, IPOPState, SepCMAES
from evokube_trainer.ec._ga import GA, GAState
from evokube_trainer.ec._genetic import replace_worst, tournament_selection
from evokube_trainer.ec._open_es import OpenES, OpenESState
from evokube_trainer.ec._parts import (
    OptimizerFactory,
    Schedule,
    ScheduleLike,
    as_schedule,
    gaussian_noise,
    log_rank_weights,
)
from evokube_trainer.ec._sep_cem import SepCEM, SepCEMState
from evokube_trainer.ec._shaping import FitnessShaping, centered_rank, raw_fitness, z_score
from evokube_trainer.ec._vanilla_es import VanillaES, VanillaESState

__all__ = [
    "ARS",
    "CMAES",
    "GA",
    "ARSState",
    "CMAESState",
    "EvoOptimizer",
    "FitnessShaping",
    "GAState",
    "IPOPState",
    "OpenES",
    "OpenESState",
    "OptimizerFactory",
    "Schedule",
    "ScheduleLike",
    "SepCEM",
    "SepCEMState",
    "SepCMAES",
    "VanillaES",
    "VanillaESState",
    "as_schedule",
    "centered_rank",
    "gaussian_noise",
    "log_rank_weights",
    "raw_fitness",
    "replace_worst",
    "tournament_selection",
    "z_score",
]
