"""The algorithm registry: every `spec.algorithm.name` the CRD accepts, as one entry.

An entry names the workflow kind the algorithm runs (`workflows.KINDS`: pure EC, ERL's
independent learners, CEM-RL's shared critic, PBT's learners with their own hyperparameters)
and the EC optimizers it may evolve (`workflows.OPTIMIZERS`; the first is the default, and
`spec.algorithm.ec.distribution` picks another where there are several), and so which spec
fields it reads. The CRD's algorithm enum and its rules on those fields are generated from
these entries (`python -m evokube_trainer.generate`); tests/runtime/test_algorithms.py
evaluates them for every algorithm and fails when the CRD, this registry or
docs/trainer-design.md disagree.

A new algorithm built from existing parts is one entry here (then run the generator); a new
optimizer or workflow kind is its code plus one entry in `OPTIMIZERS` or `KINDS`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from evokube_trainer.workflows import KINDS, OPTIMIZERS, Optimizer, WorkflowKind


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """One `spec.algorithm.name`.

    `optimizers`: the EC optimizers it may evolve, the default first; none exactly when its
    kind evolves no population (pbt). `normalize_observations`: the default of
    spec.environment.normalizeObservations, EvoRL's for the same algorithm
    (docs/trainer-design.md).
    """

    name: str
    summary: str
    kind: WorkflowKind
    optimizers: tuple[Optimizer, ...]
    normalize_observations: bool = False

    def __post_init__(self):
        if bool(self.optimizers) != self.kind.evolves:
            evolves = "evolves" if self.kind.evolves else "evolves no population"
            raise ValueError(f"{self.name}: its kind {self.kind.name} {evolves}")

    @property
    def distributions(self) -> Mapping[str, Optimizer]:
        """Its optimizers by their spec.algorithm.ec.distribution name."""
        return {optimizer.spec_name: optimizer for optimizer in self.optimizers}

    @property
    def learns(self) -> bool:
        """Whether it trains RL learners (reads spec.algorithm.rl)."""
        return self.kind.learns

    def distribution(self, ec: Mapping[str, Any]) -> Optimizer:
        """The optimizer the spec's ec settings pick."""
        if not self.optimizers:
            raise ValueError(f"{self.name} evolves no EC distribution")
        return self.distributions[ec.get("distribution", self.optimizers[0].spec_name)]

    def reads(self, field: str, ec: Mapping[str, Any]) -> bool:
        """Whether the spec.algorithm.ec `field` means something with these ec settings."""
        if field == "distribution":
            return len(self.optimizers) > 1
        if not self.optimizers:
            return False
        return field in self.distribution(ec).fields


def registry(*algorithms: Algorithm) -> Mapping[str, Algorithm]:
    """Algorithms by name, in the order the CRD's enum and the docs list them."""
    return {a.name: a for a in algorithms}


EC, ERL, CEM_RL, PBT = (KINDS[name] for name in ("ec", "erl", "cem-rl", "pbt"))


def _optimizers(*names: str) -> tuple[Optimizer, ...]:
    return tuple(OPTIMIZERS[name] for name in names)


ALGORITHMS: Mapping[str, Algorithm] = registry(
    Algorithm(
        "openes",
        "OpenAI-ES: a search gradient and Adam",
        EC,
        _optimizers("open_es"),
        normalize_observations=True,
    ),
    Algorithm(
        "vanilla-es",
        "(mu, lambda)-ES on the elite mean",
        EC,
        _optimizers("vanilla_es"),
        normalize_observations=True,
    ),
    Algorithm(
        "ars", "Augmented Random Search (V1-t)", EC, _optimizers("ars"), normalize_observations=True
    ),
    Algorithm("cma-es", "CMA-ES", EC, _optimizers("cma_es")),
    Algorithm(
        "sep-cma-es",
        "CMA-ES with a diagonal covariance",
        EC,
        _optimizers("sep_cma_es"),
        normalize_observations=True,
    ),
    Algorithm(
        "sep-cem",
        "Cross-entropy method, diagonal covariance",
        EC,
        _optimizers("sep_cem"),
        normalize_observations=True,
    ),
    Algorithm("ga", "Genetic algorithm (elitism, tournaments, mutation)", EC, _optimizers("ga")),
    Algorithm("erl-ga", "ERL: a GA plus K independent RL learners", ERL, _optimizers("ga")),
    Algorithm("erl-es", "ERL with OpenES in place of the GA", ERL, _optimizers("open_es")),
    Algorithm(
        "erl-eda", "ERL with SepCEM (an EDA) in place of the GA", ERL, _optimizers("sep_cem")
    ),
    Algorithm(
        "cem-rl",
        "CEM-RL: half the population trained against one shared critic",
        CEM_RL,
        _optimizers("sep_cem", "open_es"),
    ),
    Algorithm(
        "pbt",
        "Population-based training: RL learners with their own hyperparameters, no EC",
        PBT,
        (),
    ),
)
