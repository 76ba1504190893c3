"""Saving and restoring a `WorkflowState` (until the runtime brings Orbax).

A state is a pytree, so a checkpoint is simply its leaves as NumPy arrays in one `.npz` file;
the tree structure comes back from a template of the same workflow, usually
`jax.eval_shape(workflow.init, key)`, which costs no computation. Restoring checks every leaf's
shape and dtype against the template. Typed PRNG keys (`jax.random.key`) are stored as their raw
key data and rewrapped.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

_LEAF = "leaf_{:05d}"


def _is_key(x: Any) -> bool:
    return jnp.issubdtype(jnp.result_type(x), jax.dtypes.prng_key)


def state_to_numpy(state: Any) -> list[np.ndarray]:
    """The leaves of `state` as host NumPy arrays, in `jax.tree.leaves` order."""
    leaves = jax.tree.leaves(state)
    leaves = [jax.random.key_data(x) if _is_key(x) else x for x in leaves]
    return [np.asarray(x) for x in jax.device_get(leaves)]


def state_from_numpy(leaves: list[np.ndarray], like: Any) -> Any:
    """Rebuilds a state shaped like `like` (arrays or `jax.ShapeDtypeStruct`s) from `leaves`."""
    template, treedef = jax.tree.flatten(like)
    if len(template) != len(leaves):
        raise ValueError(f"checkpoint has {len(leaves)} leaves, the template {len(template)}")
    restored = []
    for index, (ref, value) in enumerate(zip(template, leaves, strict=True)):
        if _is_key(ref):
            impl = jax.random.key_impl(ref) if isinstance(ref, jax.Array) else None
            restored.append(jax.random.wrap_key_data(jnp.asarray(value), impl=impl))
            continue
        if tuple(value.shape) != tuple(ref.shape) or value.dtype != ref.dtype:
            raise ValueError(
                f"leaf {index}: checkpoint has {value.dtype}{list(value.shape)}, "
                f"the template {ref.dtype}{list(ref.shape)}"
            )
        restored.append(jnp.asarray(value))
    return jax.tree.unflatten(treedef, restored)


def save_state(path: str | os.PathLike[str], state: Any) -> None:
    """Writes `state` to `path` (an `.npz` file), atomically: a crash leaves the old file."""
    path = os.fspath(path)
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        np.savez(f, **{_LEAF.format(i): leaf for i, leaf in enumerate(state_to_numpy(state))})
    os.replace(tmp, path)


def restore_state(path: str | os.PathLike[str], like: Any) -> Any:
    """Reads a state saved by `save_state`, shaped like the template `like`."""
    with np.load(os.fspath(path)) as data:
        leaves = [data[_LEAF.format(i)] for i in range(len(data.files))]
    return state_from_numpy(leaves, like)


def checkpoint_every(
    directory: str | os.PathLike[str], every: int
) -> Callable[[Any, Mapping[str, float]], None]:
    """An `on_generation` hook for `Workflow.learn` that saves the state every `every`
    generations to `<directory>/gen_<generation>.npz` and `<directory>/latest.npz`."""
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    directory = os.fspath(directory)

    def hook(state: Any, metrics: Mapping[str, float]) -> None:
        generation = int(metrics["generation"])
        if generation % every == 0:
            save_state(os.path.join(directory, f"gen_{generation:08d}.npz"), state)
            save_state(os.path.join(directory, "latest.npz"), state)

    return hook
