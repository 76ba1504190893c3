"""Population-based training (PBT; Jaderberg et al. 2017) as a learner with no EC population.

The members are K RL agents (TD3 or SAC, actor and critic each), trained exactly as ERL's
`IndependentAgents` trains its agents, but each with its own hyperparameters: the names in
`Agent.hyperparameters` (both learning rates; TD3's exploration noise, SAC's target-entropy
scale). They are traced `[K]` arrays in `PBTState`, written into every member's optimizer state
(`optax.inject_hyperparams`) before the generation's updates, so one jitted, vmapped update
trains all members and a new value never recompiles. Members start log-uniform in their ranges;
a hyperparameter without a range keeps the agent config's value for every member.

Fitness is the return of each member's own rollouts this generation (the workflow's actors).
Every `interval` generations `merge`, inside the jitted step:
* exploit: each member in the bottom `exploit_fraction` (by fitness) copies the agent state
  (weights, targets, optimizer state) and hyperparameters of a member drawn uniformly from the
  top `exploit_fraction`;
* explore: each hyperparameter it copied is multiplied by a factor drawn from
  `perturb_factors`, then clipped to its range.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

from evokube_trainer import metric_names as names
from evokube_trainer.envs import RunningStats
from evokube_trainer.replay import ReplayState
from evokube_trainer.workflows._learners import IndependentAgents

Array = jax.Array
Metrics = dict[str, Array]


@struct.dataclass
class PBTState:
    """Every leaf leads with the member axis `[K]` (so a layout may split it over devices)."""

    agents: Any  # the members' agent states, leaves [K, ...]
    hyperparameters: dict[str, Array]  # name -> [K] each member's current value


@dataclasses.dataclass(frozen=True)
class PopulationBasedTraining:
    """PBT over `members.num_agents` agents; see the module docstring.

    `ranges`: name -> (min, max) for every name in `members.agent.hyperparameters`.
    """

    members: IndependentAgents  # how the K agents train (their injection is unused)
    ranges: Mapping[str, tuple[float, float]]
    interval: int  # generations between exploit/explore steps
    exploit_fraction: float  # share of members replaced, and share they copy from
    perturb_factors: tuple[float, ...]

    def __post_init__(self):
        if set(self.ranges) != set(self.members.agent.hyperparameters):
            raise ValueError(
                f"ranges must name {sorted(self.members.agent.hyperparameters)}, got "
                f"{sorted(self.ranges)}"
            )
        for name, (low, high) in self.ranges.items():
            if not (0 < low <= high or 0 <= low == high):  # a fixed value may be 0 (no noise)
                raise ValueError(f"the range of {name} must have 0 < min <= max, got {low, high}")
        if self.interval < 1:
            raise ValueError(f"interval must be >= 1, got {self.interval}")
        if not 0 < self.exploit_fraction <= 0.5 or self.members.num_agents < 2:
            raise ValueError("PBT needs >= 2 members and an exploit_fraction in (0, 0.5]")
        if not self.perturb_factors or min(self.perturb_factors) <= 0:
            raise ValueError(f"perturb_factors must be positive, got {self.perturb_factors}")

    @classmethod
    def searching(
        cls, members: IndependentAgents, ranges: Mapping[str, tuple[float, float]], **settings
    ) -> PopulationBasedTraining:
        """PBT over `members` searching `ranges`, any of the agent's hyperparameters; the
        others keep the agent config's value for every member."""
        offered = members.agent.hyperparameters
        unknown = sorted(set(ranges) - set(offered))
        if unknown:
            raise ValueError(f"PBT cannot vary {unknown}; the agent offers {sorted(offered)}")
        full = {}
        for name, value in offered.items():
            low, high = ranges.get(name, (value, value))
            full[name] = (float(low), float(high))
        return cls(members=members, ranges=full, **settings)

    @property
    def num_exploited(self) -> int:
        """Members replaced at each exploit step (and members they copy from)."""
        k = self.members.num_agents
        return min(k // 2, max(1, round(self.exploit_fraction * k)))

    def init(self, key: Array) -> PBTState:
        agent_key, hyper_key = jax.random.split(key)
        k = self.members.num_agents
        hyperparameters = {}
        for index, (name, (low, high)) in enumerate(sorted(self.ranges.items())):
            if low == high:  # not searched
                hyperparameters[name] = jnp.full((k,), low, jnp.float32)
                continue
            log_value = jax.random.uniform(
                jax.random.fold_in(hyper_key, index),
                (k,),
                minval=jnp.log(low),
                maxval=jnp.log(high),
            )
            hyperparameters[name] = jnp.clip(jnp.exp(log_value), low, high)  # [K]
        return PBTState(agents=self.members.init(agent_key), hyperparameters=hyperparameters)

    def improve(
        self,
        state: PBTState,
        replay: ReplayState,
        population: Array,
        key: Array,
        obs_stats: RunningStats | None = None,
    ) -> tuple[PBTState, Array, Metrics]:
        agents = jax.vmap(self.members.agent.with_hyperparameters)(
            state.agents, state.hyperparameters
        )
        agents, population, metrics = self.members.improve(
            agents, replay, population, key, obs_stats
        )
        return PBTState(agents, state.hyperparameters), population, metrics

    def actors(self, state: PBTState) -> tuple[Array, Array]:
        """The members' actors `[K, D]`, each exploring at its own scale `[K]`."""
        flat, _ = self.members.actors(state.agents)
        scale = jax.vmap(self.members.agent.exploration_scale_of)(state.hyperparameters)
        return flat, scale

    def merge(
        self,
        state: PBTState,
        generation: Array,
        population: Array,
        fitness: Array,
        actor_fitness: Array,
        key: Array,
    ) -> tuple[PBTState, Array, Array, Metrics]:
        """Every `interval` generations, exploit and explore by `actor_fitness` `[K]`."""
        ready = (generation + 1) % self.interval == 0
        state = jax.lax.cond(
            ready, lambda s: self.exploit_and_explore(s, actor_fitness, key), lambda s: s, state
        )
        best = jnp.argmax(actor_fitness)  # never replaced: the top members are only copied
        metrics = {f"pbt/best/{name}": v[best] for name, v in state.hyperparameters.items()}
        metrics["pbt/exploited"] = ready.astype(jnp.float32)
        metrics[names.ACTOR_RETURN_MEAN] = jnp.mean(actor_fitness)
        return state, population, fitness, metrics

    def exploit_and_explore(self, state: PBTState, fitness: Array, key: Array) -> PBTState:
        """The bottom members copy random top members, then perturb what they copied."""
        k, n = self.members.num_agents, self.num_exploited
        fitness = jnp.where(jnp.isnan(fitness), -jnp.inf, fitness)  # a diverged member is worst
        order = jnp.argsort(fitness)  # [K] ascending
        bottom, top = order[:n], order[k - n :]  # [n] each
        pick_key, perturb_key = jax.random.split(key)
        sources = top[jax.random.randint(pick_key, (n,), 0, n)]  # [n]
        source_of = jnp.arange(k).at[bottom].set(sources)  # [K] whom each member copies
        copied = jnp.zeros((k,), bool).at[bottom].set(True)  # [K]
        agents = jax.tree.map(lambda leaf: leaf[source_of], state.agents)
        factors = jnp.asarray(self.perturb_factors, jnp.float32)
        hyperparameters = {}
        for index, (name, (low, high)) in enumerate(sorted(self.ranges.items())):
            choice = jax.random.randint(
                jax.random.fold_in(perturb_key, index), (k,), 0, len(factors)
            )
            value = state.hyperparameters[name][source_of]  # [K]
            perturbed = jnp.clip(value * factors[choice], low, high)
            hyperparameters[name] = jnp.where(copied, perturbed, value)
        return PBTState(agents=agents, hyperparameters=hyperparameters)
