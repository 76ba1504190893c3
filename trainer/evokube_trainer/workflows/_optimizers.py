"""The EC optimizers a workflow config may name, one entry each: the one table of optimizers.

An entry says which `ec` class it builds, under which name a config picks it
(`ECConfig(optimizer="open_es")`), under which name `spec.algorithm.ec.distribution` and the
docs call it, which `spec.algorithm.ec` fields it reads and the options each becomes, and
whether it samples mirrored pairs. The algorithm registry (`runtime/algorithms.py`) lists the
entries each algorithm may evolve; the CRD's "used only by" rules are generated from both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from evokube_trainer import ec as evo

# spec.algorithm.ec value, population size -> the optimizer's keyword options
Converter = Callable[[Any, int], Mapping[str, Any]]


def _to(keyword: str) -> Converter:
    return lambda value, _: {keyword: value}


def _elites(keyword: str, share: float = 1.0) -> Converter:
    return lambda fraction, pop: {keyword: max(1, round(fraction * pop * share))}


def _crossover(kind: str, _: int) -> Mapping[str, Any]:
    """GA crossover: a kind applied to half the children, or none at all."""
    if kind == "none":
        return {"crossover_prob": 0.0}
    return {"crossover": kind.replace("-", "_"), "crossover_prob": 0.5}


@dataclasses.dataclass(frozen=True)
class Optimizer:
    """One EC optimizer.

    `fields`: the spec.algorithm.ec fields it reads and the options each becomes.
    `mirrored`: whether it samples antithetic pairs by default (then population.size must be
    even); `always_mirrored`: it always does (ARS).
    """

    name: str  # a config's `optimizer`
    spec_name: str  # its name in spec.algorithm.ec.distribution and the docs
    cls: type[evo.EvoOptimizer]
    fields: Mapping[str, Converter]
    mirrored: bool = False
    always_mirrored: bool = False

    def options(self, ec: Mapping[str, Any], pop: int) -> dict[str, Any]:
        """The optimizer's keyword options for the spec's ec fields it reads."""
        options: dict[str, Any] = {}
        for field, value in ec.items():
            if field in self.fields:
                options.update(self.fields[field](value, pop))
        return options

    def is_mirrored(self, ec: Mapping[str, Any]) -> bool:
        if self.always_mirrored:
            return True
        return bool(ec.get("mirrored", self.mirrored)) if "mirrored" in self.fields else False


OPEN_ES = Optimizer(
    "open_es",
    "openes",
    evo.OpenES,
    {
        "noiseStd": _to("sigma"),
        "learningRate": _to("learning_rate"),
        "weightDecay": _to("weight_decay"),
        "mirrored": _to("mirrored"),
    },
    mirrored=True,
)
VANILLA_ES = Optimizer(
    "vanilla_es",
    "vanilla-es",
    evo.VanillaES,
    {"noiseStd": _to("sigma"), "eliteFraction": _elites("num_elites"), "mirrored": _to("mirrored")},
)
ARS = Optimizer(
    "ars",
    "ars",
    evo.ARS,
    {
        "noiseStd": _to("sigma"),
        "learningRate": _to("learning_rate"),
        "weightDecay": _to("weight_decay"),
        "eliteFraction": _elites("num_top_directions", share=0.5),  # of the pop/2 directions
    },
    always_mirrored=True,
)
SEP_CEM = Optimizer(
    "sep_cem",
    "sep-cem",
    evo.SepCEM,
    {
        "noiseStd": lambda std, _: {"init_cov": std * std},
        "eliteFraction": _elites("num_elites"),
        "mirrored": _to("mirrored"),
    },
)
CMA_ES = Optimizer(
    "cma_es",
    "cma-es",
    evo.CMAES,
    {
        "noiseStd": _to("init_sigma"),
        "eliteFraction": _elites("num_elites"),
        "maxRestarts": _to("max_restarts"),
        "restartPopulationFactor": lambda factor, _: {"restart_factor": float(factor)},
    },
)
SEP_CMA_ES = dataclasses.replace(
    CMA_ES, name="sep_cma_es", spec_name="sep-cma-es", cls=evo.SepCMAES
)
GA = Optimizer(
    "ga",
    "ga",
    evo.GA,
    {
        "noiseStd": _to("init_std"),
        "numElites": _to("num_elites"),
        "tournamentSize": _to("tournament_size"),
        "mutationStd": _to("mutation_std"),
        "mutationFraction": _to("mutation_frac"),
        "crossover": _crossover,
    },
)

OPTIMIZERS: Mapping[str, Optimizer] = {
    o.name: o for o in (OPEN_ES, VANILLA_ES, ARS, SEP_CEM, CMA_ES, SEP_CMA_ES, GA)
}


def make_optimizer(
    name: str, pop_size: int, num_dims: int, options: Mapping[str, Any] | None = None
) -> evo.EvoOptimizer:
    """The optimizer registered as `name`, over `num_dims` parameters."""
    if name not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; expected one of {sorted(OPTIMIZERS)}")
    return OPTIMIZERS[name].cls(pop_size=pop_size, num_dims=num_dims, **dict(options or {}))
