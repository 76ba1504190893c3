"""Sections of an ERLExperiment spec as the configs they mean: pure mappings of plain dicts.

The spec arrives defaulted and valid (the CRD's schema and rules, `runtime.manifest`); what it
leaves unset keeps the config class's default. These live beside the configs, not in the
runtime, so that everything below the runtime (the workflow kinds, exported policies) maps a
spec the one way the trainer does.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evokube_trainer.agents import SACConfig, TD3Config
from evokube_trainer.workflows._configs import EnvConfig, ReplayConfig

# spec.algorithm.pbt.hyperparameters field -> the agents' hyperparameter name
PBT_HYPERPARAMETERS = {
    "actorLearningRate": "actor_lr",
    "criticLearningRate": "critic_lr",
    "explorationNoise": "exploration_noise",
    "targetEntropyScale": "target_entropy_scale",
}
# spec.algorithm.rl fields each learner alone reads -> its config's field
_TD3_FIELDS = {
    "policyNoise": "policy_noise",
    "noiseClip": "noise_clip",
    "actorUpdateInterval": "actor_update_interval",
    "explorationNoise": "exploration_noise",
}
_SAC_FIELDS = {
    "temperatureLearningRate": "temperature_lr",
    "initialTemperature": "init_temperature",
    "targetEntropy": "target_entropy",
}


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


def agent_config(rl: Mapping[str, Any], hidden: tuple[int, ...]) -> TD3Config | SACConfig:
    """The RL agent's config from `spec.algorithm.rl`; `hidden`: spec.policy.hiddenLayers."""
    shared = dict(
        actor_hidden_sizes=hidden,
        critic_hidden_sizes=tuple(rl["criticHiddenLayers"]),
        critic_layer_norm=rl["criticLayerNorm"],
        actor_lr=rl["actorLearningRate"],
        critic_lr=rl["criticLearningRate"],
        discount=rl["gamma"],
        tau=rl["tau"],
    )
    config, own = (SACConfig, _SAC_FIELDS) if rl["learner"] == "sac" else (TD3Config, _TD3_FIELDS)
    return config(**shared, **{own[k]: v for k, v in rl.items() if k in own})


def learner_fields(spec: Mapping[str, Any]) -> dict[str, Any]:
    """What every RL kind's config reads from `spec.algorithm.rl`: agent, replay, updates."""
    rl = spec["algorithm"]["rl"]
    return dict(
        agent=agent_config(rl, tuple(spec["policy"]["hiddenLayers"])),
        replay=ReplayConfig(
            capacity=rl["replayCapacity"],
            batch_size=rl["batchSize"],
            warmup_steps=rl["warmupSteps"],
        ),
        updates_per_generation=rl.get("updatesPerGeneration"),
    )


def pbt_fields(pbt: Mapping[str, Any]) -> dict[str, Any]:
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
