"""How one generation is laid out over the devices of every process.

The generation is written as one global computation; `DeviceLayout` only says
where its arrays live, and XLA's partitioner inserts the collectives:

* the candidates `[N, D]` are split over all devices along N, so each device
  plays the rollouts of its share of the population (fitness comes back as a
  replicated `[N]` vector, and the EC update runs identically everywhere);
* the replay buffer is split along its capacity axis, so each process keeps
  its shard; a sampled batch gathers across shards, and the RL gradients over
  it are all-reduced;
* PBT's members (`PBTState`: agents and hyperparameters, all `[K, ...]`) are
  split along K, so each device trains its share of the members;
* everything else in the state (search distribution, networks, optimizer
  states, counters) is replicated.

With one device nothing is constrained and the layout is a no-op.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from evokube_trainer.workflows._pbt import PBTState

AXIS = "devices"


@dataclasses.dataclass(frozen=True)
class DeviceLayout:
    mesh: Mesh

    @classmethod
    def over_all_devices(cls) -> DeviceLayout:
        """A 1-D mesh over every device of every process (jax.devices() order)."""
        return cls(Mesh(np.asarray(jax.devices()), (AXIS,)))

    @property
    def num_devices(self) -> int:
        return self.mesh.size

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    @property
    def split(self) -> NamedSharding:
        """Leading axis split over the devices."""
        return NamedSharding(self.mesh, PartitionSpec(AXIS))

    def population(self, x: jax.Array) -> jax.Array:
        """Constrain a per-member array `[N, ...]` to be split along N."""
        return jax.lax.with_sharding_constraint(x, self.split)

    def state_shardings(self, abstract_state: Any) -> Any:
        """Shardings for a WorkflowState: replay data split by capacity, PBT's members by
        member, the rest replicated."""
        shardings = jax.tree.map(lambda _: self.replicated, abstract_state)
        if isinstance(getattr(abstract_state, "learner", None), PBTState):
            learner = jax.tree.map(lambda _: self.split, abstract_state.learner)
            shardings = shardings.replace(learner=learner)
        if getattr(abstract_state, "replay", None) is None:
            return shardings
        data = jax.tree.map(lambda _: self.split, abstract_state.replay.data)
        return shardings.replace(replay=shardings.replay.replace(data=data))

    def put_replicated(self, value: np.ndarray) -> jax.Array:
        """A host value every process holds identically, as one global replicated array."""
        value = np.asarray(value)
        return jax.make_array_from_callback(value.shape, self.replicated, lambda idx: value[idx])
