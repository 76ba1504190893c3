"""The algorithm registry, the CRD and the docs say the same thing.

The CRD's algorithm rules are generated from the registry (`python -m evokube_trainer.generate`);
here they are evaluated as the API server would (manifest.check runs its CEL), for every
algorithm, every distribution it may pick and every spec.algorithm.ec field, so a rule that
names the wrong algorithms fails here, not at a user's admission. A new algorithm is one
registry entry: the last test adds one and runs it from a manifest.
"""

import dataclasses
import re
from pathlib import Path

import jax
import numpy as np
import pytest
import yaml

from evokube_trainer import generate
from evokube_trainer.agents import SACConfig, TD3Config
from evokube_trainer.envs import catalog
from evokube_trainer.runtime import manifest
from evokube_trainer.runtime.algorithms import (
    ALGORITHMS,
    CEM_RL,
    EC,
    ERL,
    PBT,
    Algorithm,
    registry,
)
from evokube_trainer.runtime.config import to_run_config
from evokube_trainer.workflows import (
    OPTIMIZERS,
    PBT_HYPERPARAMETERS,
    CEMRLConfig,
    ECConfig,
    ERLConfig,
    PBTConfig,
    jit_workflow,
    make_workflow,
)
from tests.bad_manifests import with_changes

REPO = Path(__file__).resolve().parents[2]
EC_VALUES = {
    "noiseStd": 0.1,
    "learningRate": 0.01,
    "weightDecay": 0.001,
    "eliteFraction": 0.5,
    "mirrored": False,
    "numElites": 1,
    "tournamentSize": 3,
    "mutationStd": 0.1,
    "mutationFraction": 0.5,
    "crossover": "uniform",
    "maxRestarts": 2,
    "restartPopulationFactor": 1,
}
CONFIG_TYPES = {EC: ECConfig, ERL: ERLConfig, CEM_RL: CEMRLConfig, PBT: PBTConfig}


def _algorithm_schema() -> dict:
    return manifest.crd_schema()["properties"]["spec"]["properties"]["algorithm"]


def _choices():
    """(algorithm, its ec settings that pick a distribution) for every distribution."""
    for name, entry in ALGORITHMS.items():
        if len(entry.distributions) == 1:
            yield name, {}
        else:
            for distribution in entry.distributions:
                yield name, {"distribution": distribution}


def _rl(name: str, **fields) -> dict:
    """spec.algorithm.rl for a learning algorithm: K = 2, except for pbt (K = population)."""
    return fields if ALGORITHMS[name].kind is PBT else {"numAgents": 2, **fields}


def _manifest(name: str, ec: dict, **changes) -> dict:
    algorithm: dict = {"name": name, "ec": ec}
    if ALGORITHMS[name].learns:
        algorithm["rl"] = _rl(name)
    return with_changes({"spec.algorithm": algorithm, **changes})


def test_the_crd_offers_exactly_the_registered_algorithms():
    assert _algorithm_schema()["properties"]["name"]["enum"] == list(ALGORITHMS)


def test_the_crds_algorithm_rules_are_the_generated_ones():
    """The rules as the API server reads them (tests/trainer/test_catalog.py checks the text)."""

    def in_crd(rule: generate.Rule) -> dict:
        return {"rule": rule.rule, "fieldPath": rule.field_path, "message": rule.message}

    stale = f"run `{generate.COMMAND}` and commit both CRD copies"
    for rule in generate.algorithm_rules(ALGORITHMS):
        assert in_crd(rule) in _algorithm_schema()["x-kubernetes-validations"], stale
    spec_rules = manifest.crd_schema()["properties"]["spec"]["x-kubernetes-validations"]
    assert in_crd(generate.mirrored_rule(ALGORITHMS)) in spec_rules, stale
    distribution = _algorithm_schema()["properties"]["ec"]["properties"]["distribution"]
    assert distribution["enum"] == ["sep-cem", "openes"]


def test_the_crd_has_an_ec_field_for_everything_a_distribution_reads():
    listed = set(_algorithm_schema()["properties"]["ec"]["properties"])
    read = {
        f for entry in ALGORITHMS.values() for d in entry.distributions.values() for f in d.fields
    }
    assert listed == read | {"distribution"}
    assert set(EC_VALUES) == read


@pytest.mark.parametrize(("name", "choice"), list(_choices()), ids=str)
def test_the_crd_refuses_exactly_the_ec_fields_the_registry_says_are_unused(name, choice):
    entry = ALGORITHMS[name]
    for field, value in EC_VALUES.items():
        ec = {**choice, field: value}
        defaulted, errors = manifest.check(_manifest(name, ec))
        used = entry.reads(field, ec)
        assert [e.path for e in errors] == ([] if used else [f"spec.algorithm.ec.{field}"]), field
        if used:
            config = to_run_config(defaulted).workflow  # and the trainer builds it
            assert config.optimizer == entry.distribution(ec).name


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_a_distribution_is_chosen_only_where_there_is_a_choice(name):
    entry = ALGORITHMS[name]
    for distribution in ("sep-cem", "openes"):
        errors = manifest.check(_manifest(name, {"distribution": distribution}))[1]
        allowed = distribution in entry.distributions and len(entry.distributions) > 1
        assert [e.path for e in errors] == ([] if allowed else ["spec.algorithm.ec.distribution"])


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_rl_settings_are_required_exactly_by_the_learning_algorithms(name):
    entry = ALGORITHMS[name]
    without = with_changes({"spec.algorithm": {"name": name}})
    with_rl = with_changes(
        {"spec.algorithm": {"name": name, "rl": _rl(name) if entry.learns else {"numAgents": 2}}}
    )
    refused = ["spec.algorithm.rl"]
    assert [e.path for e in manifest.check(without)[1]] == (refused if entry.learns else [])
    assert [e.path for e in manifest.check(with_rl)[1]] == ([] if entry.learns else refused)
    config = to_run_config(manifest.check(with_rl if entry.learns else without)[0]).workflow
    assert type(config) is CONFIG_TYPES[entry.kind]


@pytest.mark.parametrize(("name", "choice"), list(_choices()), ids=str)
def test_an_odd_population_is_refused_exactly_when_the_distribution_mirrors(name, choice):
    distribution = ALGORITHMS[name].distribution(choice)
    settings = [choice]
    if "mirrored" in distribution.fields:
        settings += [{**choice, "mirrored": True}, {**choice, "mirrored": False}]
    for ec in settings:
        odd = _manifest(name, ec, **{"spec.population.size": 7})
        errors = [e.path for e in manifest.check(odd)[1]]
        mirrored = distribution.is_mirrored(ec)
        assert errors == (["spec.population.size"] if mirrored else []), ec


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_observations_are_normalized_by_the_algorithms_default_unless_the_spec_says(name):
    entry = ALGORITHMS[name]
    for setting, expected in ((None, entry.normalize_observations), (True, True), (False, False)):
        changes = {} if setting is None else {"spec.environment.normalizeObservations": setting}
        defaulted, errors = manifest.check(_manifest(name, {}, **changes))
        assert errors == []
        assert to_run_config(defaulted).workflow.env.normalize_observations is expected


TD3_ONLY = {"policyNoise": 0.3, "noiseClip": 0.4, "explorationNoise": 0.2, "actorUpdateInterval": 3}
SAC_ONLY = {"temperatureLearningRate": 1e-3, "initialTemperature": 0.5, "targetEntropy": -2.0}


@pytest.mark.parametrize("learner", ["td3", "sac"])
def test_each_learner_reads_its_own_rl_fields_and_refuses_the_others(learner):
    own, other = (TD3_ONLY, SAC_ONLY) if learner == "td3" else (SAC_ONLY, TD3_ONLY)
    for name in ("erl-ga", "cem-rl", "pbt"):
        rl = _rl(name, learner=learner, **own)
        defaulted, errors = manifest.check(
            with_changes({"spec.algorithm": {"name": name, "rl": rl}})
        )
        assert errors == []
        agent = to_run_config(defaulted).workflow.agent
        assert type(agent) is (TD3Config if learner == "td3" else SACConfig)
        fields = {f.name: getattr(agent, f.name) for f in dataclasses.fields(agent)}
        assert set(own.values()) <= set(fields.values())
        for field, value in other.items():
            wrong = {"spec.algorithm": {"name": name, "rl": {**rl, field: value}}}
            paths = [e.path for e in manifest.check(with_changes(wrong))[1]]
            assert paths == [f"spec.algorithm.rl.{field}"], field


def test_an_rl_spec_without_a_learner_is_td3_with_td3s_own_defaults():
    defaulted = manifest.check(_manifest("erl-ga", {}))[0]
    assert defaulted["spec"]["algorithm"]["rl"]["learner"] == "td3"
    agent = to_run_config(defaulted).workflow.agent
    defaults = TD3Config()
    assert (agent.policy_noise, agent.noise_clip, agent.exploration_noise) == (
        defaults.policy_noise,
        defaults.noise_clip,
        defaults.exploration_noise,
    )
    assert agent.actor_update_interval == defaults.actor_update_interval


def test_the_docs_list_every_algorithm_with_its_workflow_and_distributions():
    text = (REPO / "docs" / "trainer-design.md").read_text()
    section = text.split("## Algorithms", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and re.fullmatch(r"`[a-z-]+`", cells[0]):
            rows[cells[0].strip("`")] = cells
    assert list(rows) == list(ALGORITHMS)
    for name, entry in ALGORITHMS.items():
        assert rows[name][1] == entry.kind.name, name
        assert rows[name][2] == (", ".join(entry.distributions) or "none"), name
        assert rows[name][3] == ("yes" if entry.normalize_observations else "no"), name


def _pbt(pbt: dict | None = None, learner: str = "td3", **changes) -> dict:
    algorithm: dict = {"name": "pbt", "rl": {"learner": learner}}
    if pbt is not None:
        algorithm["pbt"] = pbt
    return with_changes({"spec.algorithm": algorithm, **changes})


def test_pbt_maps_its_section_onto_the_config_and_defaults_like_the_config():
    ranges = {
        "actorLearningRate": {"min": 1e-4, "max": 1e-3},
        "explorationNoise": {"min": 0.05, "max": 0.3},
    }
    pbt = {
        "interval": 3,
        "exploitFraction": 0.5,
        "perturbFactors": [0.5, 2.0],
        "hyperparameters": ranges,
    }
    defaulted, errors = manifest.check(_pbt(pbt, **{"spec.population.size": 6}))
    assert errors == []
    config = to_run_config(defaulted).workflow
    assert isinstance(config, PBTConfig) and config.pop_size == 6
    assert (config.interval, config.exploit_fraction, config.perturb_factors) == (
        3,
        0.5,
        (0.5, 2.0),
    )
    assert config.ranges == {"actor_lr": (1e-4, 1e-3), "exploration_noise": (0.05, 0.3)}
    # No section and an empty one (which the CRD defaults) give the same config.
    without = to_run_config(manifest.check(_pbt())[0]).workflow
    empty = to_run_config(manifest.check(_pbt({}))[0]).workflow
    assert without == empty and without.ranges == {}
    assert (empty.interval, empty.exploit_fraction, empty.perturb_factors) == (
        PBTConfig.interval,
        PBTConfig.exploit_fraction,
        PBTConfig.perturb_factors,
    )


@pytest.mark.parametrize("learner", ["td3", "sac"])
def test_pbt_hyperparameters_are_those_of_the_learner(learner):
    """Each spec field maps onto a hyperparameter the learner's agent offers; the other
    learner's own is refused at admission, naming it."""
    own, other = ("explorationNoise", "targetEntropyScale")[:: 1 if learner == "td3" else -1]
    for field in ("actorLearningRate", "criticLearningRate", own):
        pbt = {"hyperparameters": {field: {"min": 0.5, "max": 0.8}}}
        defaulted, errors = manifest.check(_pbt(pbt, learner))
        assert errors == [], field
        workflow = to_run_config(defaulted).workflow
        assert workflow.ranges == {PBT_HYPERPARAMETERS[field]: (0.5, 0.8)}
    wrong = _pbt({"hyperparameters": {other: {"min": 0.5, "max": 0.8}}}, learner)
    paths = [e.path for e in manifest.check(wrong)[1]]
    assert paths == [f"spec.algorithm.pbt.hyperparameters.{other}"]


@pytest.mark.parametrize(
    ("pbt", "path"),
    [
        (
            {"hyperparameters": {"criticLearningRate": {"min": 1e-3, "max": 1e-4}}},
            "hyperparameters.criticLearningRate.max",
        ),
        (
            {"hyperparameters": {"actorLearningRate": {"min": 0.0, "max": 1e-4}}},
            "hyperparameters.actorLearningRate.min",
        ),
        (
            {"hyperparameters": {"actorLearningRate": {"min": 1e-4}}},
            "hyperparameters.actorLearningRate.max",
        ),
        ({"exploitFraction": 0.6}, "exploitFraction"),
        ({"interval": 0}, "interval"),
        ({"perturbFactors": []}, "perturbFactors"),
        ({"perturbFactors": [0.8, -1.0]}, "perturbFactors[1]"),
    ],
    ids=str,
)
def test_bad_pbt_settings_are_refused_naming_the_field(pbt, path):
    assert [e.path for e in manifest.check(_pbt(pbt))[1]] == [f"spec.algorithm.pbt.{path}"]


@pytest.mark.parametrize("name", [n for n in ALGORITHMS if n != "pbt"])
def test_a_pbt_section_is_refused_for_every_other_algorithm(name):
    doc = _manifest(name, {})
    doc["spec"]["algorithm"]["pbt"] = {"interval": 2}
    assert [e.path for e in manifest.check(doc)[1]] == ["spec.algorithm.pbt"]


def test_pbt_refuses_every_ec_field_and_num_agents():
    for field, value in EC_VALUES.items():
        paths = [e.path for e in manifest.check(_manifest("pbt", {field: value}))[1]]
        assert f"spec.algorithm.ec.{field}" in paths, field
        assert all(p.startswith("spec.algorithm.ec") for p in paths), (field, paths)
    with_k = with_changes({"spec.algorithm": {"name": "pbt", "rl": {"numAgents": 2}}})
    assert [e.path for e in manifest.check(with_k)[1]] == ["spec.algorithm.rl.numAgents"]
    without_k = with_changes({"spec.algorithm": {"name": "cem-rl", "rl": {}}})
    assert [e.path for e in manifest.check(without_k)[1]] == ["spec.algorithm.rl.numAgents"]


# ---- a new algorithm is one registry entry ------------------------------------------------------

# ERL evolving CMA-ES by default, or a GA: an algorithm built from existing parts.
ERL_CMA = Algorithm(
    "erl-cma", "ERL over CMA-ES or a GA", ERL, (OPTIMIZERS["cma_es"], OPTIMIZERS["ga"])
)
TINY_RL = {
    "numAgents": 1,
    "batchSize": 16,
    "replayCapacity": 512,
    "warmupSteps": 64,
    "updatesPerGeneration": 2,
    "criticHiddenLayers": [16],
}


def _erl_cma(ec: dict) -> dict:
    """A manifest of erl-cma with these ec settings, small enough to train in seconds."""
    return with_changes(
        {
            "spec.algorithm": {"name": "erl-cma", "ec": ec, "rl": TINY_RL},
            "spec.population.size": 4,
            "spec.policy.hiddenLayers": [8],
            "spec.environment.episodeLength": 10,
            "spec.evaluation.episodes": 2,
        }
    )


def test_a_new_algorithm_is_one_registry_entry(monkeypatch):
    algorithms = registry(*ALGORITHMS.values(), ERL_CMA)  # the one entry
    assert [e.path for e in manifest.check(_erl_cma({}))[1]] == ["spec.algorithm.name"]

    # The generator writes it into the CRD: the enum and the rules on what it reads.
    crd = (generate.repo_root() / generate.CRD_FILES[0]).read_text()
    crd = yaml.safe_load(generate.render_crd(crd, catalog.load(), algorithms))
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    monkeypatch.setattr(manifest, "crd_schema", lambda *crd_file: schema)
    assert "erl-cma" in _algorithm_schema()["properties"]["name"]["enum"]
    messages = [r["message"] for r in _algorithm_schema()["x-kubernetes-validations"]]
    assert (
        "algorithm.ec.maxRestarts is used only by cma-es, sep-cma-es and erl-cma with "
        "distribution cma-es" in messages
    )

    # A manifest parses into an ERL config with the distribution it picks, ...
    for ec, optimizer, options in [
        ({"noiseStd": 0.2}, "cma_es", {"init_sigma": 0.2}),
        ({"distribution": "ga", "numElites": 1}, "ga", {"num_elites": 1}),
    ]:
        defaulted, errors = manifest.check(_erl_cma(ec))
        assert errors == [], ec
        workflow = to_run_config(defaulted, algorithms).workflow
        assert isinstance(workflow, ERLConfig) and workflow.num_agents == 1
        assert (workflow.optimizer, workflow.optimizer_options) == (optimizer, options)
    # ... and what it does not read is refused naming the field.
    for ec, field in [
        ({"numElites": 1}, "ec.numElites"),
        ({"distribution": "ga", "maxRestarts": 1}, "ec.maxRestarts"),
        ({"distribution": "openes"}, "ec.distribution"),
        ({"learningRate": 0.1}, "ec.learningRate"),
    ]:
        assert [e.path for e in manifest.check(_erl_cma(ec))[1]] == [f"spec.algorithm.{field}"]
    without_rl = with_changes({"spec.algorithm": {"name": "erl-cma"}})
    assert [e.path for e in manifest.check(without_rl)[1]] == ["spec.algorithm.rl"]

    # It trains: one generation of the workflow the manifest builds.
    run = to_run_config(manifest.check(_erl_cma({}))[0], algorithms)
    fns = jit_workflow(make_workflow(run.workflow))
    state, metrics = fns.step(fns.init(jax.random.PRNGKey(0)))
    assert int(state.generation) == 1
    assert np.isfinite(metrics["ec/fitness_max"]) and np.isfinite(metrics["rl/critic_loss"])
