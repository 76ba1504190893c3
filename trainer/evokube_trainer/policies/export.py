"""The trainer's policy exports: at each evaluation, the evaluated policy beside the checkpoints.

Under `<checkpoint location>/policies/` (process 0 alone writes; host side, after the jitted
evaluation every process ran):

* `generation-<N>/` -- the policy evaluated at generation N; the newest `keep` are kept, as
  checkpoints are.
* `best/` -- replaced only when an evaluation's return beats the best so far. The best so far
  is read back from `best/policy.json` on the first export of a run's life, so it survives a
  restart or resume.

Exports are secondary to training: a storage error is logged, never raised. A best policy that
could not be written stays pending and is written at the next evaluation (unless a better one
replaces it); a folder that could not be pruned is pruned next time.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

import fsspec
import jax
import numpy as np

from evokube_trainer.envs import RunningStats
from evokube_trainer.policies.artifact import METADATA_FILE, PolicyArtifact, write_policy

__all__ = ["BEST", "PolicyExporter", "generation_folder"]

log = logging.getLogger(__name__)

Array = jax.Array
Params = Any

BEST = "best"
_GENERATION = re.compile(r"generation-(\d+)")


def generation_folder(generation: int) -> str:
    return f"generation-{generation}"


def unflatten_on_host(unflatten: Callable[[Array], Params], flat: np.ndarray) -> Params:
    """`unflatten(flat)` computed with NumPy: the leaves' shapes from a trace of `unflatten`,
    cut from `flat` in `ravel_pytree`'s order. No device op, so nothing compiles: op by op on
    a device, the first export of each life compiled every slice and reshape (0.1 s on a CPU,
    0.3 s on a TPU, inside the chunk that followed it)."""
    template = jax.eval_shape(unflatten, jax.ShapeDtypeStruct(flat.shape, flat.dtype))
    leaves, treedef = jax.tree.flatten(template)
    ends = np.cumsum([math.prod(leaf.shape) for leaf in leaves])
    parts = np.split(flat, ends[:-1])
    pieces = zip(parts, leaves, strict=True)
    return jax.tree.unflatten(
        treedef, [part.reshape(leaf.shape).astype(leaf.dtype) for part, leaf in pieces]
    )


@dataclasses.dataclass
class PolicyExporter:
    """Writes the policies of one run's evaluations under `root` (`<location>/policies`).

    `unflatten`: a candidate `[D]` -> the actor's parameters (the workflow's). `metadata`: what
    every export of the run shares (algorithm, environment, network, seed, ...); each export
    adds `generation` and `evalReturn`.
    """

    root: str
    keep: int
    unflatten: Callable[[Array], Params]
    metadata: Mapping[str, Any]
    _best_read: bool = False  # best/policy.json has been read (or found absent)
    _written: dict[str, Any] | None = None  # what best/ holds: `result()`
    _pending: PolicyArtifact | None = None  # this life's best, until written or beaten

    @property
    def best_uri(self) -> str:
        return f"{self.root.rstrip('/')}/{BEST}"

    def result(self) -> dict[str, Any] | None:
        """`status.result`: the return, generation and URI of the policy in best/, or None."""
        return self._written

    def export(
        self,
        generation: int,
        policy: Array,
        obs_stats: RunningStats | None,
        eval_return: float,
    ) -> dict[str, Any] | None:
        """Writes `generation-<N>/`, and `best/` when `eval_return` beats the best so far;
        returns `result()`. `policy`: the evaluated candidate `[D]`; `obs_stats`: the
        statistics it was evaluated with (None without normalization)."""
        # To the host first: `policy` may span every process's devices, and only this process
        # runs what follows (unflattening it in place would be a collective of one).
        params = unflatten_on_host(self.unflatten, np.asarray(jax.device_get(policy)))  # [D]
        artifact = PolicyArtifact(
            metadata={**self.metadata, "generation": generation, "evalReturn": eval_return},
            params=params,
            obs_stats=None if obs_stats is None else jax.device_get(obs_stats),
        )
        self._try(f"write {generation_folder(generation)}", self._write_generation, artifact)
        if math.isfinite(eval_return) and all(
            eval_return > best for best in (self._pending_return(), self._written_return())
        ):
            self._pending = artifact
        self._try("read the best policy so far", self._read_best)
        if self._best_read and self._pending is not None:
            if self._pending_return() <= self._written_return():  # an earlier life's is better
                self._pending = None
            else:
                self._try(f"write {BEST}", self._write_best)
        return self.result()

    def _pending_return(self) -> float:
        return -math.inf if self._pending is None else self._pending.metadata["evalReturn"]

    def _written_return(self) -> float:
        return -math.inf if self._written is None else self._written["bestReturn"]

    def _try(self, what: str, action: Callable[..., None], *args: Any) -> None:
        try:
            action(*args)
        except Exception as err:  # any storage error: training goes on, retried next time
            log.warning("policy export: could not %s under %s: %s", what, self.root, err)

    def _write_generation(self, artifact: PolicyArtifact) -> None:
        generation = artifact.metadata["generation"]
        write_policy(f"{self.root}/{generation_folder(generation)}", artifact)
        fs, root = fsspec.core.url_to_fs(self.root)
        generations = sorted(
            int(match.group(1))
            for name in fs.ls(root, detail=False)
            if (match := _GENERATION.fullmatch(name.rstrip("/").rsplit("/", 1)[-1]))
        )
        for old in generations[: max(len(generations) - self.keep, 0)]:
            fs.rm(f"{root}/{generation_folder(old)}", recursive=True)

    def _read_best(self) -> None:
        if self._best_read:
            return
        fs, root = fsspec.core.url_to_fs(self.best_uri)
        try:
            metadata = json.loads(fs.cat_file(f"{root}/{METADATA_FILE}"))
        except FileNotFoundError:
            metadata = None
        if metadata is not None:
            self._written = self._result_of(metadata)
        self._best_read = True

    def _write_best(self) -> None:
        assert self._pending is not None
        write_policy(self.best_uri, self._pending)
        self._written = self._result_of(self._pending.metadata)
        self._pending = None

    def _result_of(self, metadata: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "bestReturn": float(metadata["evalReturn"]),
            "generation": int(metadata["generation"]),
            "policyURI": self.best_uri,
        }
