"""How one generation is laid out over the devices of every process.

The generation is written as one global computation; `DeviceLayout` only says
where its arrays live, and XLA's partitioner inserts the collectives:

* the candidates `[N, D]` are split over all devices along N, so each device
  plays the rollouts of its share of the population (fitness comes back as a
  replicated `[N]` vector, and the EC update runs identically everywhere);
* the mesh is 2-D, slices x devices of a slice, and every split is over both
  axes with the slice outer: a slice holds a contiguous block of members, so a
  member's rollouts stay on its slice and only the reductions and gathers of
  the members' results (fitness, the ES gradient, the RL gradients) cross the
  data-center network between slices (docs/multislice-trainer.md);
* the replay buffer is split along its capacity axis, so each process keeps
  its shard; a sampled batch gathers across shards, and the RL gradients over
  it are all-reduced;
* PBT's members (`PBTState`: agents and hyperparameters, all `[K, ...]`) are
  split along K, so each device trains its share of the members;
* everything else in the state (search distribution, networks, optimizer
  states, counters) is replicated;
* with several seeds (`Workflow.seeds`), the replicas' axis leads every array of
  the state and is not split: each device holds every replica's share, so the
  splits above apply to the axis after it.

With one device nothing is constrained and the layout is a no-op.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from evokube_trainer.workflows._pbt import PBTState

SLICE_AXIS = "slices"
AXIS = "devices"  # within a slice


def slice_index(device: jax.Device, slices: int) -> int:
    """The slice `device` belongs to: its own `slice_index` on TPU (libtpu knows the slices),
    else its process's share of `slices` equal groups of processes (process ids count the
    hosts slice by slice, as the operator and `evokube run` number them; CPU devices of a
    jax.distributed group all say slice 0)."""
    index = getattr(device, "slice_index", None) if device.platform == "tpu" else None
    if index is not None:
        return int(index)
    return device.process_index * slices // jax.process_count()


@dataclasses.dataclass(frozen=True)
class DeviceLayout:
    mesh: Mesh

    @classmethod
    def over_all_devices(cls, slices: int = 1) -> DeviceLayout:
        """A slices x devices mesh over every device of every process (jax.devices() order
        within a slice); ValueError unless the devices fall into `slices` equal slices."""
        devices = jax.devices()
        groups = [[d for d in devices if slice_index(d, slices) == s] for s in range(slices)]
        sizes = [len(group) for group in groups]
        if sum(sizes) != len(devices) or len(set(sizes)) != 1:
            found = sorted({slice_index(d, slices) for d in devices})
            raise ValueError(
                f"{len(devices)} devices in slices {found} do not split into {slices} equal "
                f"slices (devices per slice: {sizes})"
            )
        return cls(Mesh(np.asarray(groups), (SLICE_AXIS, AXIS)))

    @property
    def num_devices(self) -> int:
        return self.mesh.size

    @property
    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())

    @property
    def split(self) -> NamedSharding:
        """Leading axis split over the devices, slice by slice."""
        return NamedSharding(self.mesh, PartitionSpec((SLICE_AXIS, AXIS)))

    def population(self, x: jax.Array) -> jax.Array:
        """Constrain a per-member array `[N, ...]` to be split along N."""
        return jax.lax.with_sharding_constraint(x, self.split)

    def state_shardings(self, abstract_state: Any, replicas: bool = False) -> Any:
        """Shardings for a WorkflowState: replay data split by capacity, PBT's members by
        member, the rest replicated. `replicas`: every array leads with the seeds' axis
        (`Workflow.seeds` > 1), which stays whole."""
        split = self.split
        if replicas:
            split = NamedSharding(self.mesh, PartitionSpec(None, (SLICE_AXIS, AXIS)))
        shardings = jax.tree.map(lambda _: self.replicated, abstract_state)
        if isinstance(getattr(abstract_state, "learner", None), PBTState):
            learner = jax.tree.map(lambda _: split, abstract_state.learner)
            shardings = shardings.replace(learner=learner)
        if getattr(abstract_state, "replay", None) is None:
            return shardings
        data = jax.tree.map(lambda _: split, abstract_state.replay.data)
        return shardings.replace(replay=shardings.replay.replace(data=data))

    def put_replicated(self, value: np.ndarray) -> jax.Array:
        """A host value every process holds identically, as one global replicated array."""
        value = np.asarray(value)
        return jax.make_array_from_callback(value.shape, self.replicated, lambda idx: value[idx])
