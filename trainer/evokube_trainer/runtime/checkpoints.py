"""Checkpoints with Orbax: every N generations, on preemption, resumed automatically.

Orbax writes each checkpoint to a temporary folder and renames it when
complete, so a write cut short never looks finished. A finished checkpoint
that cannot be read (corrupt, or from an incompatible run) is skipped with a
warning and the next older one is tried. Works with a local path or a gs://
URL; on several processes every process takes part in each save and restore.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import jax
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


def _abstract(tree: Any) -> Any:
    """Shapes, dtypes and (where given) shardings to restore into."""
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


class Checkpointer:
    """Save and find checkpoints of a workflow state in one directory."""

    def __init__(self, directory: str | os.PathLike[str], *, interval: int, keep: int):
        if interval < 1 or keep < 1:
            raise ValueError("checkpoint interval and keep must be at least 1")
        self.directory = os.fspath(directory)
        self.interval = interval
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        )

    def due(self, generation: int) -> bool:
        return generation % self.interval == 0

    def save(self, generation: int, state: Any) -> None:
        """Write `state` as checkpoint `generation` and wait until it is complete."""
        if generation in self._manager.all_steps():
            return
        self._manager.save(generation, args=ocp.args.StandardSave(state))
        self._manager.wait_until_finished()

    def steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def restore_latest(self, template: Any) -> tuple[Any, int] | None:
        """The newest readable checkpoint shaped like `template`, with its generation.

        `template` may be a real state or `workflow.state_shapes()`; give its
        leaves shardings (`jax.ShapeDtypeStruct(..., sharding=...)`) to restore a state
        spread over devices and processes.
        """
        abstract = _abstract(template)
        for step in reversed(self.steps()):
            try:
                restored = self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
            except Exception as err:  # a corrupt checkpoint must not end the run
                log.warning("skipping checkpoint %d in %s: %s", step, self.directory, err)
                continue
            return restored, step
        return None

    def close(self) -> None:
        self._manager.close()


def enable_compilation_cache(directory: str | os.PathLike[str]) -> None:
    """Keep compiled XLA programs in `directory` so a restart skips most compilation."""
    jax.config.update("jax_compilation_cache_dir", os.fspath(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
