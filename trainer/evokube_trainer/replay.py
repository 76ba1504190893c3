"""A jittable circular replay buffer over pytrees.

`ReplayBuffer` is static (capacity and sample batch size); `ReplayState` holds the storage and
two counters and is passed in and out of every call, so `add` and `sample` can be jitted,
scanned and vmapped (one buffer per agent) like any other pure function.

Layout: every leaf of the stored pytree gets a leading `[capacity]` axis. Items are written at
`insert_pos`, which wraps around, so once the buffer is full the oldest items are overwritten
first. Because writing always starts at index 0 and wraps only once `size == capacity`, the
filled part is always the prefix `[0, size)`; sampling draws uniformly from it.

Masking: `add(state, batch, mask)` skips the rows where `mask` is false. The kept rows are
compacted with a cumulative sum (row i goes to slot `insert_pos + cumsum(mask)[i] - 1`) and the
others are scattered to an out-of-range index that the scatter drops, so the shapes stay static
and no Python branching on values is needed. If more rows are kept than the buffer holds, only
the last `capacity` of them are written, matching what sequential inserts would leave behind.

Replicas (`Workflow.seeds`): vmapped over a leading seeds axis of the state, `sample` becomes
one gather batched over the replicas' buffers. A buffer built with `replicas_in_turn` gathers
from one replica's buffer after another instead (a loop over the seeds axis); the rows are the
same. `add` stays one batched scatter: written in turn, the TPU copied every buffer each turn.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

__all__ = ["ReplayBuffer", "ReplayState", "Transition", "resize_newest"]

Array = jax.Array


@struct.dataclass
class Transition:
    """One environment step, as TD3 and the workflows store it (batch dims in front)."""

    obs: Array  # [..., obs_dim]
    action: Array  # [..., action_dim] in [-1, 1]
    reward: Array  # [...]
    next_obs: Array  # [..., obs_dim] the true next observation (final obs before an autoreset)
    terminated: Array  # [...] float 0/1: true end, the critic target does not bootstrap
    truncated: Array  # [...] float 0/1: time limit, the critic target still bootstraps

    @classmethod
    def zeros(cls, obs_dim: int, action_dim: int) -> Transition:
        """One transition of float32 zeros: the example a buffer's layout is made from."""
        scalar = jnp.zeros((), jnp.float32)
        obs = jnp.zeros((obs_dim,), jnp.float32)
        action = jnp.zeros((action_dim,), jnp.float32)
        return cls(obs, action, scalar, obs, terminated=scalar, truncated=scalar)


@struct.dataclass
class ReplayState:
    data: Any  # pytree, every leaf [capacity, ...]
    insert_pos: Array  # [] int32, next slot to write
    size: Array  # [] int32, number of valid items, <= capacity


def _leaf_name(path) -> str:
    return jax.tree_util.keystr(path, simple=True, separator=".") or "<root>"


@dataclasses.dataclass(frozen=True)
class ReplayBuffer:
    """Circular buffer of `capacity` items, sampled `sample_batch_size` at a time."""

    capacity: int
    sample_batch_size: int
    # Vmapped over replicas' buffers, gather each replica's rows in turn: on a TPU, 8 Pendulum
    # CEM-RL replicas' batches took 37.7 ms a generation gathered in turn, 53.7 ms batched
    # (`benchmarks/seeds_bench.py --profile`). Only for a buffer that is not split over
    # devices, where the loop would gather across devices once per replica.
    replicas_in_turn: bool = False

    def __post_init__(self):
        if self.capacity <= 0:
            raise ValueError(f"capacity must be positive, got {self.capacity}")
        if self.sample_batch_size <= 0:
            raise ValueError(f"sample_batch_size must be positive, got {self.sample_batch_size}")

    def init(self, example_transition: Any) -> ReplayState:
        """Empty storage shaped like `example_transition` (ONE item, no batch dimension)."""
        data = jax.tree.map(
            lambda x: jnp.zeros((self.capacity, *jnp.shape(x)), jnp.asarray(x).dtype),
            example_transition,
        )
        zero = jnp.zeros((), jnp.int32)
        return ReplayState(data=data, insert_pos=zero, size=zero)

    def check_batch(self, state: ReplayState, batch: Any) -> int:
        """Checks `batch` against the stored layout and returns its batch size N.

        Runs in Python on static shapes, so under jit it costs nothing at run time. Raises a
        ValueError naming the first offending leaf.
        """
        ref_paths, ref_def = jax.tree_util.tree_flatten_with_path(state.data)
        got_paths, got_def = jax.tree_util.tree_flatten_with_path(batch)
        if got_def != ref_def:  # type: ignore[operator]
            raise ValueError(
                f"transition structure does not match the buffer: expected {ref_def}, got {got_def}"
            )
        batch_size = None
        first_name = None
        for (path, ref), (_, leaf) in zip(ref_paths, got_paths, strict=True):
            name = _leaf_name(path)
            shape, dtype = jnp.shape(leaf), jnp.result_type(leaf)
            if len(shape) != ref.ndim:
                raise ValueError(
                    f"transition leaf '{name}': expected shape [N, *{ref.shape[1:]}] with a "
                    f"leading batch dimension, got {shape}"
                )
            if shape[1:] != ref.shape[1:]:
                raise ValueError(
                    f"transition leaf '{name}': expected trailing shape {ref.shape[1:]}, "
                    f"got {shape[1:]}"
                )
            if dtype != ref.dtype:
                raise ValueError(
                    f"transition leaf '{name}': expected dtype {ref.dtype}, got {dtype}"
                )
            if batch_size is None:
                batch_size, first_name = shape[0], name
            elif shape[0] != batch_size:
                raise ValueError(
                    f"transition leaf '{name}': batch dimension {shape[0]} differs from "
                    f"{batch_size} of leaf '{first_name}'"
                )
        return 0 if batch_size is None else batch_size

    def add(self, state: ReplayState, batch: Any, mask: Array | None = None) -> ReplayState:
        """Writes the rows of `batch` (every leaf `[N, ...]`) whose `mask` `[N]` is true."""
        n = self.check_batch(state, batch)
        if mask is None:
            keep = jnp.ones((n,), jnp.int32)
        else:
            if jnp.shape(mask) != (n,):
                raise ValueError(f"mask: expected shape ({n},), got {jnp.shape(mask)}")
            keep = jnp.asarray(mask).astype(bool).astype(jnp.int32)  # [N]
        rank = jnp.cumsum(keep) - 1  # [N] position among the kept rows
        num_kept = jnp.sum(keep)
        # Of more than `capacity` kept rows only the newest `capacity` survive.
        write = (keep > 0) & (rank >= num_kept - self.capacity)
        slot = (state.insert_pos + rank) % self.capacity
        index = jnp.where(write, slot, self.capacity)  # capacity = out of range, dropped

        data = jax.tree.map(
            lambda stored, new: stored.at[index].set(new, mode="drop"), state.data, batch
        )
        return ReplayState(
            data=data,
            insert_pos=((state.insert_pos + num_kept) % self.capacity).astype(jnp.int32),
            size=jnp.minimum(state.size + num_kept, self.capacity).astype(jnp.int32),
        )

    def sample(self, state: ReplayState, key: Array) -> Any:
        """`sample_batch_size` items drawn uniformly with replacement from the filled part.

        An empty buffer returns copies of slot 0 (zeros); callers should wait for `size > 0`.
        """
        index = jax.random.randint(
            key, (self.sample_batch_size,), 0, jnp.maximum(state.size, 1)
        )  # [B]
        take = _take_rows_in_turn if self.replicas_in_turn else _take_rows
        return jax.tree.map(lambda stored: take(stored, index), state.data)

    def can_sample(self, state: ReplayState, min_size: int | None = None) -> Array:
        """True once at least `min_size` (default `sample_batch_size`) items are stored."""
        threshold = self.sample_batch_size if min_size is None else min_size
        return state.size >= threshold


def _take_rows(table: Array, index: Array) -> Array:
    """`table[index]`: the rows `[*index.shape, ...]` of `table` `[capacity, ...]`."""
    return table[index]


@jax.custom_batching.custom_vmap
def _take_rows_in_turn(table: Array, index: Array) -> Array:
    """`_take_rows`, which vmapped over tables gathers from one table at a time."""
    return _take_rows(table, index)


@_take_rows_in_turn.def_vmap
def _take_rows_vmap(axis_size: int, in_batched: list[bool], table: Array, index: Array):
    table_batched, index_batched = in_batched
    if not table_batched:  # one table: the vmapped axis only adds rows (an index dimension)
        return _take_rows_in_turn(table, index), True
    if not index_batched:
        index = jnp.broadcast_to(index, (axis_size, *index.shape))
    # table [R, capacity, ...], index [R, ...] -> rows [R, ..., ...]
    return jax.lax.map(lambda r: table[r, index[r]], jnp.arange(axis_size)), True


def resize_newest(data: Any, insert_pos: int, size: int, capacity: int) -> tuple[Any, int, int]:
    """The same buffer re-laid out for `capacity` (host numpy, for a resumed run whose capacity
    changed): the newest `min(size, capacity)` items, oldest first at slot 0, as `add` would
    have left them had they been inserted in order into an empty buffer of that capacity.
    Returns `(data, insert_pos, size)`."""
    old_capacity = jax.tree.leaves(data)[0].shape[0]
    kept = min(int(size), capacity)
    # The newest item sits just before insert_pos (a buffer that never wrapped has
    # insert_pos == size, so this covers both cases).
    index = (int(insert_pos) - kept + np.arange(kept)) % old_capacity

    def move(stored):
        resized = np.zeros((capacity, *stored.shape[1:]), stored.dtype)
        resized[:kept] = np.asarray(stored)[index]
        return resized

    return jax.tree.map(move, data), kept % capacity, kept
