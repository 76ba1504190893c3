"""From a (defaulted, schema-valid) ERLExperiment manifest to what the trainer runs.

`to_run_config` maps the spec onto a workflow config (its algorithm's kind builds it:
`workflows.KINDS`) plus the run's own settings (stopping, checkpoints, metrics).
The CRD's rules (checked by `manifest.check`) already refuse every manifest
the trainer cannot run; as a last line, anything the configs or the optimizer
refuse while being built is reported as a ManifestError too, so the trainer
exits 78 (permanent), not 75.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from evokube_trainer.runtime.algorithms import ALGORITHMS, Algorithm
from evokube_trainer.runtime.manifest import FieldError, ManifestError
from evokube_trainer.workflows import WorkflowConfig, make_optimizer, to_env_config

# The device counts generations in int32: every run ends here, whatever its stopping rules
# say, so the counter and a chunk past it stay below 2**31. The CRD's maximum of maxGenerations.
GENERATION_LIMIT = 2_000_000_000


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything one training run needs, derived from one manifest.

    What depends on the pod (checkpoint location, metrics port, process group) is not here: the
    trainer reads it from its environment alone (inputs.Inputs)."""

    name: str
    namespace: str
    seed: int
    workflow: WorkflowConfig
    max_generations: int | None
    max_env_steps: int | None
    target_fitness: float | None
    max_wall_clock_s: float | None
    eval_interval: int
    checkpoint_interval: int
    checkpoint_keep: int
    # The manifest's spec as given, kept with every checkpoint to name what changed when a
    # later life of the run cannot restore it.
    spec: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Seconds between SIGTERM and SIGKILL (the pod's terminationGracePeriodSeconds).
    grace_s: float = 30.0
    # Replicas trained as one program (spec.seeds): replica i's root seed is seed + i.
    seeds: int = 1

    @property
    def generation_limit(self) -> int:
        """The generation the run ends at, at the latest: maxGenerations, else GENERATION_LIMIT."""
        return self.max_generations or GENERATION_LIMIT


def _ec_options(algorithm: Algorithm, ec: Mapping[str, Any], pop: int, source: str) -> dict:
    """The optimizer's options; a field the algorithm does not read is refused (the CRD refuses
    it too: this is the last line for a manifest that slipped past an older CRD)."""
    errors = [
        FieldError(f"spec.algorithm.ec.{field}", f"not used by {algorithm.name}")
        for field in ec
        if not algorithm.reads(field, ec)
    ]
    if errors:
        raise ManifestError(errors, source)
    if not algorithm.optimizers:  # pbt: no EC at all
        return {}
    return algorithm.distribution(ec).options(ec, pop)


def to_run_config(
    manifest: Mapping[str, Any], algorithms: Mapping[str, Algorithm] = ALGORITHMS
) -> RunConfig:
    """Map a defaulted, valid manifest; raise ManifestError where the trainer refuses it.
    `algorithms`: the registry its spec.algorithm.name is looked up in."""
    try:
        return _run_config(manifest, algorithms)
    except (ValueError, TypeError) as err:
        if isinstance(err, ManifestError):
            raise
        error = FieldError("spec.algorithm", f"the trainer refuses this configuration: {err}")
        raise ManifestError([error], manifest["metadata"]["name"]) from err


def _run_config(manifest: Mapping[str, Any], algorithms: Mapping[str, Algorithm]) -> RunConfig:
    spec = manifest["spec"]
    env, pop = spec["environment"], spec["population"]["size"]
    algorithm = algorithms[spec["algorithm"]["name"]]
    ec = spec["algorithm"].get("ec") or {}
    options = _ec_options(algorithm, ec, pop, manifest["metadata"]["name"])
    common: dict[str, Any] = {}
    if algorithm.optimizers:
        optimizer = algorithm.distribution(ec).name
        make_optimizer(optimizer, pop, 1, options)  # raises now what it would raise in training
        common.update(optimizer=optimizer, optimizer_options=options)
    normalize = env.get("normalizeObservations", algorithm.normalize_observations)
    eval_episodes = spec["evaluation"]["episodes"]
    common.update(
        env=to_env_config(env, eval_episodes=eval_episodes, normalize_observations=normalize),
        pop_size=pop,
    )
    workflow = algorithm.kind.from_spec(spec, common)

    stopping, checkpoint = spec["stopping"], spec["checkpoint"]
    return RunConfig(
        name=manifest["metadata"]["name"],
        namespace=manifest["metadata"].get("namespace", "default"),
        seed=spec["seed"],
        workflow=workflow,
        max_generations=stopping.get("maxGenerations"),
        max_env_steps=stopping.get("maxEnvSteps"),
        target_fitness=stopping.get("targetFitness"),
        max_wall_clock_s=stopping.get("maxWallClockSeconds"),
        eval_interval=spec["evaluation"]["intervalGenerations"],
        checkpoint_interval=checkpoint["intervalGenerations"],
        checkpoint_keep=checkpoint["keep"],
        spec=spec,
        grace_s=float(spec.get("terminationGracePeriodSeconds", 30)),
        seeds=spec.get("seeds", 1),
    )
