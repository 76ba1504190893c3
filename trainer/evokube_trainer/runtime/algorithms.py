"""The algorithm registry: every `spec.algorithm.name` the CRD accepts, as one entry.

An entry says which workflow the algorithm runs (pure EC, ERL's independent learners, CEM-RL's
shared critic, PBT's learners with their own hyperparameters), which EC distribution it evolves
(and which alternatives `spec.algorithm.ec.distribution` may pick), and so which spec fields it
reads. The CRD's enum and
CEL rules enforce the same facts at admission; tests/runtime/test_algorithms.py fails when the
CRD, this registry and docs/trainer-design.md disagree.

Adding an ERL variant built from existing parts is one entry here plus its name in the CRD; a new
optimizer or learner is one file under `ec/` or `workflows/` plus its entries.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

# spec.algorithm.ec value, population size -> the optimizer's keyword options
Converter = Callable[[Any, int], Mapping[str, Any]]

EC = "ec"  # evolution alone: a deterministic MLP actor per member
ERL = "erl"  # K independent RL learners (actor and critic each), injected into the population
CEM_RL = "cem-rl"  # K members trained against one shared critic before each evaluation
PBT = "pbt"  # population.size RL learners, each with its own hyperparameters; no EC at all


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
class Distribution:
    """An EC optimizer as the spec configures it.

    `fields`: the spec.algorithm.ec fields it reads and the options each becomes.
    `mirrored`: whether it samples antithetic pairs by default (then population.size must be
    even); `always_mirrored`: it always does (ARS).
    """

    optimizer: str  # a key of workflows.OPTIMIZERS
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


OPEN_ES = Distribution(
    "open_es",
    {
        "noiseStd": _to("sigma"),
        "learningRate": _to("learning_rate"),
        "weightDecay": _to("weight_decay"),
        "mirrored": _to("mirrored"),
    },
    mirrored=True,
)
VANILLA_ES = Distribution(
    "vanilla_es",
    {"noiseStd": _to("sigma"), "eliteFraction": _elites("num_elites"), "mirrored": _to("mirrored")},
)
ARS = Distribution(
    "ars",
    {
        "noiseStd": _to("sigma"),
        "learningRate": _to("learning_rate"),
        "weightDecay": _to("weight_decay"),
        "eliteFraction": _elites("num_top_directions", share=0.5),  # of the pop/2 directions
    },
    always_mirrored=True,
)
SEP_CEM = Distribution(
    "sep_cem",
    {
        "noiseStd": lambda std, _: {"init_cov": std * std},
        "eliteFraction": _elites("num_elites"),
        "mirrored": _to("mirrored"),
    },
)
CMA_ES = Distribution(
    "cma_es",
    {
        "noiseStd": _to("init_sigma"),
        "eliteFraction": _elites("num_elites"),
        "maxRestarts": _to("max_restarts"),
        "restartPopulationFactor": lambda factor, _: {"restart_factor": float(factor)},
    },
)
SEP_CMA_ES = dataclasses.replace(CMA_ES, optimizer="sep_cma_es")
GA = Distribution(
    "ga",
    {
        "noiseStd": _to("init_std"),
        "numElites": _to("num_elites"),
        "tournamentSize": _to("tournament_size"),
        "mutationStd": _to("mutation_std"),
        "mutationFraction": _to("mutation_frac"),
        "crossover": _crossover,
    },
)


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """One `spec.algorithm.name`.

    `distributions`: the EC distributions it may evolve, by their `spec.algorithm.ec.distribution`
    name; the first is the default, and only an algorithm with several reads that field; PBT has
    none. `workflow` is EC, ERL, CEM_RL or PBT; all but EC read `spec.algorithm.rl` (required)
    and need continuous actions. `normalize_observations`: the default of
    spec.environment.normalizeObservations, EvoRL's for the same algorithm (docs/trainer-design.md).
    """

    name: str
    summary: str
    workflow: str
    distributions: Mapping[str, Distribution]
    normalize_observations: bool = False

    @property
    def learns(self) -> bool:
        """Whether it trains RL learners (reads spec.algorithm.rl)."""
        return self.workflow != EC

    def distribution(self, ec: Mapping[str, Any]) -> Distribution:
        if not self.distributions:
            raise ValueError(f"{self.name} evolves no EC distribution")
        default = next(iter(self.distributions))
        return self.distributions[ec.get("distribution", default)]

    def reads(self, field: str, ec: Mapping[str, Any]) -> bool:
        """Whether the spec.algorithm.ec `field` means something with these ec settings."""
        if field == "distribution":
            return len(self.distributions) > 1
        if not self.distributions:
            return False
        return field in self.distribution(ec).fields


def _entries(*algorithms: Algorithm) -> Mapping[str, Algorithm]:
    return {a.name: a for a in algorithms}


ALGORITHMS: Mapping[str, Algorithm] = _entries(
    Algorithm(
        "openes",
        "OpenAI-ES: a search gradient and Adam",
        EC,
        {"openes": OPEN_ES},
        normalize_observations=True,
    ),
    Algorithm(
        "vanilla-es",
        "(mu, lambda)-ES on the elite mean",
        EC,
        {"vanilla-es": VANILLA_ES},
        normalize_observations=True,
    ),
    Algorithm(
        "ars", "Augmented Random Search (V1-t)", EC, {"ars": ARS}, normalize_observations=True
    ),
    Algorithm("cma-es", "CMA-ES", EC, {"cma-es": CMA_ES}),
    Algorithm(
        "sep-cma-es",
        "CMA-ES with a diagonal covariance",
        EC,
        {"sep-cma-es": SEP_CMA_ES},
        normalize_observations=True,
    ),
    Algorithm(
        "sep-cem",
        "Cross-entropy method, diagonal covariance",
        EC,
        {"sep-cem": SEP_CEM},
        normalize_observations=True,
    ),
    Algorithm("ga", "Genetic algorithm (elitism, tournaments, mutation)", EC, {"ga": GA}),
    Algorithm("erl-ga", "ERL: a GA plus K independent RL learners", ERL, {"ga": GA}),
    Algorithm("erl-es", "ERL with OpenES in place of the GA", ERL, {"openes": OPEN_ES}),
    Algorithm("erl-eda", "ERL with SepCEM (an EDA) in place of the GA", ERL, {"sep-cem": SEP_CEM}),
    Algorithm(
        "cem-rl",
        "CEM-RL: half the population trained against one shared critic",
        CEM_RL,
        {"sep-cem": SEP_CEM, "openes": OPEN_ES},
    ),
    Algorithm(
        "pbt",
        "Population-based training: RL learners with their own hyperparameters, no EC",
        PBT,
        {},
    ),
)
