"""The env catalog: generated from the installed gymnax and Brax, committed, and copied into the
CRD; the trainer refuses what it does not list."""

from __future__ import annotations

import re

import pytest
import yaml

from evokube_trainer import generate as gen
from evokube_trainer.envs import EnvSpec, catalog, env_names, env_spec, make_backend_env, survey
from evokube_trainer.runtime import manifest

REGENERATE = (
    "regenerate with `PYTHONPATH=operator:trainer python -m evokube_trainer.generate`"
    " (rewrites envs/catalog.json and both CRD copies) and commit the result"
)


def test_the_committed_catalog_is_what_the_installed_libraries_give():
    # Builds every registered env once (about 20 s of CPU): names, action types, sizes and time
    # limits all come from the envs themselves.
    generated = survey.survey()
    assert catalog.dumps(generated) == catalog.CATALOG_FILE.read_text(), REGENERATE
    assert set(generated.envs) | set(generated.excluded) == set(survey.registered())


@pytest.mark.parametrize("path", gen.CRD_FILES)
def test_the_crds_generated_regions_are_the_registries(path):
    text = (gen.repo_root() / path).read_text()
    assert gen.render_crd(text, catalog.load()) == text, f"{path} is stale: {REGENERATE}"


def _spec(name: str, actions: str) -> EnvSpec:
    return EnvSpec(name, actions, 2, 3, (3,), 100)


def test_render_crd_rewrites_only_the_env_lists():
    small = catalog.Catalog(
        envs={
            "gymnax/Pendulum-v1": _spec("gymnax/Pendulum-v1", "continuous"),
            "gymnax/CartPole-v1": _spec("gymnax/CartPole-v1", "discrete"),
            "brax/ant": _spec("brax/ant", "continuous"),
        },
        excluded={},
        libraries={},
    )
    text = (gen.repo_root() / gen.CRD_FILES[0]).read_text()
    rendered = gen.render_crd(text, small)
    assert gen.render_crd(rendered, small) == rendered  # idempotent
    assert gen.render_crd(rendered, catalog.load()) == text  # and reversible

    def schema(source: str) -> dict:
        crd = yaml.safe_load(source)
        return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]

    before, after = schema(text), schema(rendered)
    name = after["properties"]["environment"]["properties"]["name"]
    assert name["enum"] == ["brax/ant", "gymnax/CartPole-v1", "gymnax/Pendulum-v1"]
    assert name["description"] == gen.ENV_NAME_DESCRIPTION
    rules = [r["rule"] for r in after["x-kubernetes-validations"]]
    discrete = "!has(self.algorithm.rl) || self.environment.name != 'gymnax/CartPole-v1'"
    assert discrete in rules
    # Nothing else moved: drop the three rewritten values and the rest is the same.
    for doc in (before, after):
        doc["properties"]["environment"]["properties"]["name"].pop("enum")
        doc["properties"]["environment"]["properties"]["name"].pop("description")
        doc["x-kubernetes-validations"] = [
            r for r in doc["x-kubernetes-validations"] if "environment.name" not in r["rule"]
        ]
    assert before == after


def test_discrete_or_continuous_is_the_envs_own_action_space():
    assert env_spec("gymnax/CartPole-v1").discrete
    assert env_spec("gymnax/Breakout-MinAtar").discrete
    assert not env_spec("gymnax/Pendulum-v1").discrete
    assert not env_spec("brax/pusher").discrete
    assert env_spec("gymnax/Breakout-MinAtar").obs_shape == (10, 10, 4)  # flattened for the MLP
    assert env_spec("gymnax/Breakout-MinAtar").obs_dim == 400
    assert env_names() == sorted(env_names())
    counts = {f: sum(n.startswith(f"{f}/") for n in env_names()) for f in catalog.FAMILIES}
    assert counts == {"gymnax": 25, "brax": 11}


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("gymnax/MNISTBandit-bsuite", "downloads the MNIST data set"),
        ("brax/fast", "unit-test stub"),
        ("gymnax/Cartpole-v1", "did you mean 'gymnax/CartPole-v1'"),
        ("brax/cheetah", "unknown environment 'brax/cheetah'"),
        ("mujoco/halfcheetah", "must look like"),
        ("Pendulum-v1", "must look like"),
    ],
)
def test_names_outside_the_catalog_are_refused_with_the_reason(name, message):
    with pytest.raises(ValueError, match=message):
        env_spec(name)
    with pytest.raises(ValueError, match=message):
        make_backend_env(name)  # before building anything


def test_the_crds_step_budget_counts_an_unset_episode_length_as_the_longest_time_limit():
    """The rule bounding the agent steps an RL generation puts into the replay must not
    undercount any environment."""
    rules = [
        r["rule"] for r in manifest.crd_schema()["properties"]["spec"]["x-kubernetes-validations"]
    ]
    budget = next(r for r in rules if "<= 2000000000" in r and "episodeLength" in r)
    assumed = int(re.search(r"self\.environment\.episodeLength : (\d+)\)", budget).group(1))
    longest = max(spec.episode_length for spec in catalog.load().envs.values())
    assert longest == assumed
