"""Checkpoints with Orbax: every N generations, on preemption, resumed automatically.

Orbax writes each checkpoint to a temporary folder and renames it when
complete, so a write cut short never looks finished. Each checkpoint holds two
items: `state` (the workflow state) and `layout` (the spec and device layout
that wrote it, to explain a refusal). Resuming never silently starts afresh:

* same shapes, any device or host count: restored straight into this run's
  shardings (Orbax reads each process's shards), an exact continuation;
* only the replay buffer's capacity differs (it is rounded up to a multiple of
  the device count): restored on the host and re-laid out keeping the newest
  transitions (`replay.resize_newest`);
* any other shape or structure differs: `IncompatibleCheckpoint` (exit 78),
  naming the checkpoint, both shapes and the spec fields that changed; nothing
  is deleted;
* unreadable (corrupt): skipped with a warning for the next older one; when
  none can be read, `UnreadableCheckpoints` (exit 75: a read may be transient).

Works with a local path or a gs:// URL; on several processes every process
takes part in each save and restore.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Collection, Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from evokube_trainer.replay import resize_newest
from evokube_trainer.runtime import exitcodes, objectstore

log = logging.getLogger(__name__)

_STATE, _LAYOUT = "state", "layout"
# Leaves whose leading axis may change between lives of a run: the replay storage.
_RESIZABLE = "replay.data."
# Of a failed pod's termination message the experiment's status keeps the last 500 characters,
# after a "permanent failure: " prefix.
_REASON_LIMIT = 470


class IncompatibleCheckpoint(exitcodes.PermanentError):
    """A checkpoint exists that this experiment's state cannot be restored from."""


class UnreadableCheckpoints(exitcodes.RetriableError):
    """Checkpoints exist and none of them can be read."""


def _abstract(tree: Any) -> Any:
    """Shapes, dtypes and (where given) shardings to restore into."""
    return jax.tree.map(ocp.utils.to_shape_dtype_struct, tree)


def _leaf_name(path) -> str:
    """`replay.data.obs`: Orbax's name for a leaf (its metadata's `name`)."""
    parts = []
    for key in path:
        for attr in ("name", "key", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
    return ".".join(parts)


def shapes_of(tree: Any) -> dict[str, tuple[tuple[int, ...], str]]:
    """{leaf name: (shape, dtype)} of a state or a template."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {
        _leaf_name(path): (tuple(np.shape(leaf)), str(np.dtype(leaf.dtype)))
        for path, leaf in leaves
    }


class Checkpointer:
    """Save and find checkpoints of a workflow state in one directory."""

    def __init__(self, directory: str | os.PathLike[str], *, interval: int, keep: int):
        if interval < 1 or keep < 1:
            raise ValueError("checkpoint interval and keep must be at least 1")
        self.directory = os.fspath(directory)
        self.interval = interval
        self._writing: int | None = None  # a background save's generation (`save`)
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(
                max_to_keep=keep,
                create=True,
                atomicity_options=objectstore.atomicity_options(self.directory),
            ),
            item_handlers={
                _STATE: ocp.StandardCheckpointHandler(),
                _LAYOUT: ocp.JsonCheckpointHandler(),
            },
        )

    def due(self, generation: int) -> bool:
        return generation % self.interval == 0

    def save(
        self,
        generation: int,
        state: Any,
        layout: Mapping[str, Any] | None = None,
        *,
        wait: bool = True,
    ) -> None:
        """Write `state` (and the `layout` record that explains it) as checkpoint `generation`.

        `wait` True returns once it is complete. False returns once the state is copied off
        the devices (Orbax's asynchronous save: the caller may donate or change the state
        now); the files are written in the background and finished before the next save,
        `wait` or `close`. Until then `steps` does not list it, and a process killed meanwhile
        leaves only Orbax's temporary folder, which is never restored.

        A step already on disk can only be one `restore_latest` skipped as unreadable (it
        restores the newest readable one): it is replaced, never kept in place of this state.
        """
        if generation in self._manager.all_steps():
            log.warning(
                "replacing unreadable checkpoint %d in %s with this run's",
                generation,
                self.directory,
            )
            self._manager.delete(generation)
        self._manager.save(
            generation,
            args=ocp.args.Composite(
                **{
                    _STATE: ocp.args.StandardSave(state),
                    _LAYOUT: ocp.args.JsonSave(dict(layout or {})),
                }
            ),
        )
        self._writing = generation
        if wait:
            self.wait()

    def wait(self) -> None:
        """Returns once a save still being written in the background is complete."""
        self._manager.wait_until_finished()
        self._writing = None

    def writing(self) -> int | None:
        """The generation a background save is still writing, or None."""
        if self._writing is not None and not self._manager.is_saving_in_progress():
            self._writing = None
        return self._writing

    def steps(self) -> list[int]:
        """The complete checkpoints' generations, oldest first."""
        writing = self.writing()
        return sorted(step for step in self._manager.all_steps() if step != writing)

    def path(self, step: int) -> str:
        return os.path.join(self.directory, str(step))

    def newest_record(self) -> Mapping[str, Any] | None:
        """The record (`save`'s `layout`) of the newest checkpoint; {} for one written before
        records, or whose record cannot be read; None when there is no checkpoint."""
        steps = self.steps()
        return self._saved_layout(steps[-1]) if steps else None

    def restore_latest(
        self,
        template: Any,
        layout: Mapping[str, Any] | None = None,
        *,
        added: Collection[str] = (),
    ) -> tuple[Any, int] | None:
        """The newest readable checkpoint restored into `template`'s layout, with its generation;
        None when there is no checkpoint at all.

        `template` may be a real state or `workflow.state_shapes()`; give its leaves shardings
        (`jax.ShapeDtypeStruct(..., sharding=...)`) to restore a state spread over devices and
        processes. `layout` is this run's record (as `save` takes it), compared with the
        checkpoint's to name the spec fields that changed when the shapes do not fit.
        `added`: fields a newer trainer added to the state's dataclass (top-level leaves); a
        checkpoint written before them restores without them, and they come back as None, for
        the caller to fill.
        """
        names = set(shapes_of(template))
        failures = []
        for step in reversed(self.steps()):
            try:
                saved = self._saved_shapes(step)
            except Exception as err:  # a corrupt checkpoint must not end the run
                log.warning("skipping checkpoint %d in %s: %s", step, self.directory, err)
                failures.append((step, err))
                continue
            lacking = (names - set(saved)) & set(added)
            target = _without(template, lacking)
            wanted = shapes_of(target)
            resize = _resizable_difference(saved, wanted)
            if resize is None:
                raise IncompatibleCheckpoint(self._refusal(step, saved, wanted, layout))
            try:
                restored = self._restore(step, target, saved if resize else None)
            except Exception as err:
                log.warning("skipping checkpoint %d in %s: %s", step, self.directory, err)
                failures.append((step, err))
                continue
            restored = _with_fields(template, restored, lacking)
            if resize:
                restored = _relaid_replay(restored, template)
                old, new = saved[resize[0]][0][0], wanted[resize[0]][0][0]
                log.warning(
                    "checkpoint %d: replay capacity %d -> %d; kept the newest %d transitions",
                    step,
                    old,
                    new,
                    int(restored.replay.size),
                )
            return restored, step
        if failures:
            step, err = failures[0]
            raise UnreadableCheckpoints(
                f"no checkpoint in {self.directory} can be read (steps "
                f"{sorted(s for s, _ in failures)}); newest, {self.path(step)}: {err}"
            )
        return None

    def _saved_shapes(self, step: int) -> dict[str, tuple[tuple[int, ...], str]]:
        metadata = self._manager.item_metadata(step)[_STATE]
        if metadata is None:
            raise ValueError(f"checkpoint {step} has no '{_STATE}' item")
        tree = getattr(metadata, "tree", metadata)
        return {
            leaf.name: (tuple(leaf.shape), str(np.dtype(leaf.dtype)))
            for leaf in jax.tree.leaves(tree)
        }

    def _restore(self, step: int, template: Any, host_replay_shapes: Mapping | None) -> Any:
        abstract = _abstract(template)
        if host_replay_shapes is not None:
            # The replay buffer as host arrays of the saved shape; re-laid out afterwards.
            abstract = _with_host_replay(abstract, host_replay_shapes)
        args = ocp.args.Composite(**{_STATE: ocp.args.StandardRestore(abstract)})
        return self._manager.restore(step, args=args)[_STATE]

    def _saved_layout(self, step: int) -> Mapping[str, Any]:
        try:
            args = ocp.args.Composite(**{_LAYOUT: ocp.args.JsonRestore()})
            return self._manager.restore(step, args=args)[_LAYOUT] or {}
        except Exception:  # an older checkpoint without the record: say so, refuse anyway
            return {}

    def _refusal(self, step: int, saved: Mapping, wanted: Mapping, layout) -> str:
        """One self-contained line: it becomes the pod's termination message and the
        experiment's Failed reason."""
        differing = sorted(set(saved) ^ set(wanted)) + sorted(
            n for n in set(saved) & set(wanted) if saved[n] != wanted[n]
        )
        shapes = "; ".join(
            f"{n} is {_shape(saved.get(n))} there, {_shape(wanted.get(n))} now"
            for n in differing[:2]
        )
        more = f" (and {len(differing) - 2} more)" if len(differing) > 2 else ""
        changed = spec_changes(self._saved_layout(step), layout or {})
        cause = (
            "changed since: " + ", ".join(changed[:3])
            if changed
            else "it was written by another spec or trainer version"
        )
        reason = (
            f"checkpoint {step} at {self.path(step)} cannot be restored into this experiment: "
            f"{shapes}{more}; {cause}."
        )
        advice = (
            " Nothing was deleted: revert the spec, or move the checkpoints away to start afresh"
        )
        # The status keeps the last 500 characters: the advice is dropped first when space is short.
        return reason + advice if len(reason + advice) <= _REASON_LIMIT else reason

    def close(self) -> None:
        self._manager.close()


def _without(tree: Any, names: Collection[str]) -> Any:
    """A dataclass `tree` as the mapping of its fields but `names`: what a checkpoint written
    before those fields were added holds (Orbax keeps a dataclass as the mapping of its fields,
    and refuses a target with a field the checkpoint lacks, even a None one)."""
    if not names:
        return tree
    fields = dataclasses.fields(tree)
    return {f.name: getattr(tree, f.name) for f in fields if f.name not in names}


def _with_fields(template: Any, restored: Any, names: Collection[str]) -> Any:
    """`restored` (restored into `_without(template, names)`) as `template`'s dataclass again,
    with None for `names`."""
    if not names:
        return restored
    return type(template)(**restored, **dict.fromkeys(names))


def _shape(entry) -> str:
    return "absent" if entry is None else f"{list(entry[0])} {entry[1]}"


def _resizable_difference(saved: Mapping, wanted: Mapping) -> list[str] | None:
    """The replay leaves whose capacity alone differs ([] when all fits), or None when any
    other difference makes the checkpoint incompatible."""
    if set(saved) != set(wanted):
        return None
    resize = []
    for name, (shape, dtype) in wanted.items():
        saved_shape, saved_dtype = saved[name]
        if (saved_shape, saved_dtype) == (shape, dtype):
            continue
        if (
            f"{name}.".startswith(_RESIZABLE)
            and saved_dtype == dtype
            and saved_shape[1:] == shape[1:]
        ):
            resize.append(name)
            continue
        return None
    return resize


def _with_host_replay(abstract: Any, saved: Mapping) -> Any:
    """`abstract` with the replay buffer's leaves as host numpy targets of the saved shapes."""

    def host(path, leaf):
        name = _leaf_name(path)
        if not name.startswith("replay."):
            return leaf
        shape, dtype = saved[name]
        return np.broadcast_to(np.zeros((), dtype), shape)  # a target only: no memory

    return jax.tree_util.tree_map_with_path(host, abstract)


def _relaid_replay(restored: Any, template: Any) -> Any:
    """Resize the host replay buffer to the template's capacity and place it like the template."""
    replay = restored.replay
    capacity = jax.tree.leaves(template.replay.data)[0].shape[0]
    data, insert_pos, size = resize_newest(
        replay.data, int(replay.insert_pos), int(replay.size), capacity
    )
    host = replay.replace(
        data=data, insert_pos=np.int32(insert_pos), size=np.asarray(size, np.int32)
    )
    placed = jax.tree.map(_place, host, template.replay)
    return restored.replace(replay=placed)


def _place(value: np.ndarray, like: Any) -> jax.Array:
    """A host value every process holds in full, laid out like `like` (global array)."""
    value = np.asarray(value, dtype=like.dtype)
    sharding = getattr(like, "sharding", None)
    if sharding is None:
        return jax.device_put(value, jax.sharding.SingleDeviceSharding(jax.devices()[0]))
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def spec_changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    """`spec.a.b: old -> new` for every spec field (and the device/process counts) that
    differs between two layout records."""
    changes: list[str] = []

    def walk(path: str, old: Any, new: Any) -> None:
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            for key in sorted(set(old) | set(new)):
                walk(f"{path}.{key}", old.get(key), new.get(key))
        elif old != new:
            changes.append(f"{path}: {_short(old)} -> {_short(new)}")

    if before and after:
        walk("spec", before.get("spec") or {}, after.get("spec") or {})
        for key in ("processes", "devices"):
            if before.get(key) != after.get(key):
                changes.append(f"{key}: {before.get(key)} -> {after.get(key)}")
    return changes


def _short(value: Any) -> str:
    text = "unset" if value is None else repr(value)
    return text if len(text) <= 30 else text[:27] + "..."


def enable_compilation_cache(directory: str | os.PathLike[str]) -> None:
    """Keep compiled XLA programs in `directory` so a restart skips most compilation."""
    jax.config.update("jax_compilation_cache_dir", os.fspath(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
