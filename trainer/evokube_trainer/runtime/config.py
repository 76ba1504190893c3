"""From a (defaulted, schema-valid) ERLExperiment manifest to what the trainer runs.

`to_run_config` maps the spec onto a workflow config (`ECConfig`, `ERLConfig`,
`CEMRLConfig`, `PBTConfig`) plus the run's own settings (stopping, checkpoints, metrics).
The CRD's rules (checked by `manifest.check`) already refuse every manifest
the trainer cannot run; as a last line, anything the configs or the optimizer
refuse while being built is reported as a ManifestError too, so the trainer
exits 78 (permanent), not 75.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from evokube_trainer.agents import SACConfig, TD3Config
from evokube_trainer.runtime.algorithms import ALGORITHMS, EC, ERL, PBT, Algorithm
from evokube_trainer.runtime.manifest import FieldError, ManifestError
from evokube_trainer.workflows import (
    CEMRLConfig,
    ECConfig,
    EnvConfig,
    ERLConfig,
    PBTConfig,
    ReplayConfig,
    make_optimizer,
)


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything one training run needs, derived from one manifest.

    What depends on the pod (checkpoint location, metrics port, process group) is not here: the
    trainer reads it from its environment alone (inputs.Inputs)."""

    name: str
    namespace: str
    seed: int
    workflow: ECConfig | ERLConfig | CEMRLConfig | PBTConfig
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
    if not algorithm.distributions:  # pbt: no EC at all
        return {}
    return algorithm.distribution(ec).options(ec, pop)


def _agent(rl: Mapping[str, Any], hidden: list[int]) -> TD3Config | SACConfig:
    """The RL agent's config; what the spec leaves unset keeps the config class's default."""
    shared = dict(
        actor_hidden_sizes=tuple(hidden),
        critic_hidden_sizes=tuple(rl["criticHiddenLayers"]),
        critic_layer_norm=rl["criticLayerNorm"],
        actor_lr=rl["actorLearningRate"],
        critic_lr=rl["criticLearningRate"],
        discount=rl["gamma"],
        tau=rl["tau"],
    )
    if rl["learner"] == "sac":
        own = {
            "temperatureLearningRate": "temperature_lr",
            "initialTemperature": "init_temperature",
            "targetEntropy": "target_entropy",
        }
        return SACConfig(**shared, **{own[k]: v for k, v in rl.items() if k in own})
    own = {
        "policyNoise": "policy_noise",
        "noiseClip": "noise_clip",
        "actorUpdateInterval": "actor_update_interval",
        "explorationNoise": "exploration_noise",
    }
    return TD3Config(**shared, **{own[k]: v for k, v in rl.items() if k in own})


# spec.algorithm.pbt.hyperparameters field -> the agents' hyperparameter name
PBT_HYPERPARAMETERS = {
    "actorLearningRate": "actor_lr",
    "criticLearningRate": "critic_lr",
    "explorationNoise": "exploration_noise",
    "targetEntropyScale": "target_entropy_scale",
}


def _pbt(pbt: Mapping[str, Any]) -> dict[str, Any]:
    """PBTConfig's own fields from spec.algorithm.pbt; what it leaves unset (all of it, when
    the spec has no pbt section for the CRD to default) keeps PBTConfig's default, which is
    the CRD's."""
    fields: dict[str, Any] = {}
    if "interval" in pbt:
        fields["interval"] = pbt["interval"]
    if "exploitFraction" in pbt:
        fields["exploit_fraction"] = pbt["exploitFraction"]
    if "perturbFactors" in pbt:
        fields["perturb_factors"] = tuple(pbt["perturbFactors"])
    ranges = pbt.get("hyperparameters", {})
    fields["ranges"] = {PBT_HYPERPARAMETERS[k]: (r["min"], r["max"]) for k, r in ranges.items()}
    return fields


def to_run_config(manifest: Mapping[str, Any]) -> RunConfig:
    """Map a defaulted, valid manifest; raise ManifestError where the trainer refuses it."""
    try:
        return _run_config(manifest)
    except (ValueError, TypeError) as err:
        if isinstance(err, ManifestError):
            raise
        error = FieldError("spec.algorithm", f"the trainer refuses this configuration: {err}")
        raise ManifestError([error], manifest["metadata"]["name"]) from err


def to_env_config(
    environment: Mapping[str, Any], *, eval_episodes: int, normalize_observations: bool
) -> EnvConfig:
    """A defaulted `spec.environment` as the trainer runs it (exported policies rebuild their
    env with it). `normalize_observations`: the field, or the algorithm's default when unset."""
    return EnvConfig(
        name=environment["name"],
        episode_length=environment.get("episodeLength"),
        episodes_per_member=environment["episodesPerEvaluation"],
        eval_episodes=eval_episodes,
        action_repeat=environment["actionRepeat"],
        reward_scale=float(environment["rewardScale"]),
        backend=environment.get("backend"),
        normalize_observations=normalize_observations,
    )


def to_environment_spec(env: EnvConfig) -> dict[str, Any]:
    """The inverse of `to_env_config`: `spec.environment` as the trainer ran it (exported
    policies record it), with `normalizeObservations` resolved."""
    spec = {
        "name": env.name,
        "episodeLength": env.episode_length,
        "episodesPerEvaluation": env.episodes_per_member,
        "actionRepeat": env.action_repeat,
        "rewardScale": env.reward_scale,
        "backend": env.backend,
        "normalizeObservations": env.normalize_observations,
    }
    return {field: value for field, value in spec.items() if value is not None}


def _run_config(manifest: Mapping[str, Any]) -> RunConfig:
    spec = manifest["spec"]
    algorithm, env, pop = spec["algorithm"], spec["environment"], spec["population"]["size"]
    entry = ALGORITHMS[algorithm["name"]]
    ec = algorithm.get("ec") or {}
    options = _ec_options(entry, ec, pop, manifest["metadata"]["name"])
    if entry.workflow != PBT:
        optimizer = entry.distribution(ec).optimizer
        make_optimizer(optimizer, pop, 1, options)  # raises now what it would raise in training

    env_config = to_env_config(
        env,
        eval_episodes=spec["evaluation"]["episodes"],
        normalize_observations=env.get("normalizeObservations", entry.normalize_observations),
    )
    hidden = spec["policy"]["hiddenLayers"]
    common = dict(env=env_config, pop_size=pop)
    if entry.workflow != PBT:
        common.update(optimizer=optimizer, optimizer_options=options)
    workflow: ECConfig | ERLConfig | CEMRLConfig | PBTConfig
    if entry.workflow == EC:
        workflow = ECConfig(**common, actor_hidden_sizes=tuple(hidden))
    else:
        rl = algorithm["rl"]
        replay = ReplayConfig(
            capacity=rl["replayCapacity"],
            batch_size=rl["batchSize"],
            warmup_steps=rl["warmupSteps"],
        )
        rl_common = dict(
            agent=_agent(rl, hidden),
            replay=replay,
            updates_per_generation=rl.get("updatesPerGeneration"),
        )
        if entry.workflow == PBT:
            workflow = PBTConfig(**common, **rl_common, **_pbt(algorithm.get("pbt", {})))
        elif entry.workflow == ERL:
            workflow = ERLConfig(
                **common,
                **rl_common,
                num_agents=rl["numAgents"],
                injection_interval=rl["injectionInterval"],
            )
        else:
            workflow = CEMRLConfig(**common, **rl_common, num_actors=rl["numAgents"])

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
    )
