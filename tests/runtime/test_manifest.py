"""Offline validation: the CRD's schema and CEL rules plus the trainer's semantic rules."""

import copy

import pytest
import yaml

from evokube_trainer import cli
from evokube_trainer.runtime import exitcodes, manifest
from evokube_trainer.runtime.config import to_run_config
from evokube_trainer.workflows import CEMRLConfig, ECConfig, ERLConfig

BASE = {
    "apiVersion": "evokube.io/v1alpha1",
    "kind": "ERLExperiment",
    "metadata": {"name": "ok"},
    "spec": {
        "image": "trainer:1",
        "algorithm": {"name": "cem-rl", "rl": {"numAgents": 2}},
        "environment": {"name": "gymnax/Pendulum-v1"},
        "population": {"size": 8},
        "stopping": {"maxGenerations": 3},
    },
}


def with_changes(**paths):
    """BASE with dotted paths set (value None deletes the field)."""
    doc = copy.deepcopy(BASE)
    for dotted, value in paths.items():
        *parents, leaf = dotted.split("__")
        node = doc
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return doc


TPU = {"type": "tpu", "tpu": {"type": "tpu-v5-lite-podslice", "topology": "4x4"}}
# (manifest, the field path the error must name)
BAD = [
    (with_changes(apiVersion="evokube.io/v1"), "apiVersion"),
    (with_changes(kind="Experiment"), "kind"),
    (with_changes(metadata__name="Bad_Name"), "metadata.name"),
    (with_changes(spec__image=None), "spec.image"),
    (with_changes(spec__image=""), "spec.image"),
    (with_changes(spec__algorithm__name="ppo"), "spec.algorithm.name"),
    (with_changes(spec__population__size=-4), "spec.population.size"),
    (with_changes(spec__population__size="eight"), "spec.population.size"),
    (with_changes(spec__stopping={}), "spec.stopping"),
    (with_changes(spec__stopping__maxGenerations=0), "spec.stopping.maxGenerations"),
    (with_changes(spec__environment__name="Pendulum-v1"), "spec.environment.name"),
    (with_changes(spec__environment__name="gymnax/NoSuchEnv-v0"), "spec.environment.name"),
    (with_changes(spec__environment__name="gymnax/CartPole-v1"), "spec.environment.name"),
    (with_changes(spec__environment__backend="mjx"), "spec.environment.backend"),
    (with_changes(spec__algorithm__rl=None), "spec.algorithm.rl"),
    (with_changes(spec__algorithm={"name": "openes", "rl": {"numAgents": 1}}), "spec.algorithm.rl"),
    (with_changes(spec__algorithm__rl={"numAgents": 9}), "spec.algorithm.rl.numAgents"),
    (with_changes(spec__algorithm__rl={"numAgents": 2, "gamma": 1.5}), "spec.algorithm.rl.gamma"),
    (
        with_changes(spec__algorithm={"name": "cma-es", "ec": {"learningRate": 0.1}}),
        "spec.algorithm.ec.learningRate",
    ),
    (with_changes(spec__accelerator={**TPU, "hosts": 3}), "spec.accelerator.hosts"),
    (with_changes(spec__accelerator={"type": "tpu"}), "spec.accelerator.tpu"),
    (
        with_changes(spec__accelerator={"type": "tpu", "tpu": {"type": "v5e", "topology": "4by4"}}),
        "spec.accelerator.tpu.topology",
    ),
    (with_changes(spec__accelerator={"type": "gpu"}), "spec.accelerator.gpu"),
    (with_changes(spec__accelerator={"type": "cpu", "hosts": 3}), "spec.population.size"),
    (with_changes(spec__metricsPort=80), "spec.metricsPort"),
    (with_changes(spec__colour="blue"), "spec.colour"),
    (
        with_changes(spec__checkpoint={"intervalGenerations": 0}),
        "spec.checkpoint.intervalGenerations",
    ),
]


def test_the_base_manifest_is_valid_and_maps_to_each_workflow_type():
    assert isinstance(to_run_config(manifest.check(BASE)[0]).workflow, CEMRLConfig)
    erl = with_changes(spec__algorithm={"name": "erl-ga", "rl": {"numAgents": 2}})
    assert isinstance(to_run_config(manifest.check(erl)[0]).workflow, ERLConfig)
    es = with_changes(spec__algorithm={"name": "openes", "ec": {"noiseStd": 0.1}})
    config = to_run_config(manifest.check(es)[0])
    assert isinstance(config.workflow, ECConfig)
    assert config.workflow.optimizer_options == {"sigma": 0.1}


def test_object_metadata_beyond_the_name_is_the_api_servers_and_allowed():
    # The operator's ConfigMap carries metadata.namespace; users' files carry labels.
    doc = with_changes(metadata={"name": "ok", "namespace": "team-a", "labels": {"a": "b"}})
    assert manifest.check(doc)[1] == []


def test_defaults_come_from_the_crd():
    defaulted, errors = manifest.check(BASE)
    assert errors == []
    spec = defaulted["spec"]
    assert spec["accelerator"]["type"] == "cpu"
    assert spec["algorithm"]["rl"]["batchSize"] == 256
    assert spec["policy"]["hiddenLayers"] == [64, 64]
    assert spec["checkpoint"]["intervalGenerations"] == 10


@pytest.mark.parametrize(("doc", "field"), BAD, ids=[field for _, field in BAD])
def test_bad_manifests_fail_validate_and_run_naming_the_field(tmp_path, capsys, doc, field):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    runs = tmp_path / "runs"

    assert cli.main(["validate", str(path)]) == exitcodes.PERMANENT
    assert f"{field}:" in capsys.readouterr().err
    assert cli.main(["run", str(path), "--runs-dir", str(runs)]) == exitcodes.PERMANENT
    assert f"{field}:" in capsys.readouterr().err
    assert not runs.exists()  # nothing written


def test_every_error_is_reported_at_once(tmp_path, capsys):
    doc = with_changes(spec__image=None, spec__population__size=-1, spec__colour=1)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    cli.main(["validate", str(path)])
    err = capsys.readouterr().err
    for field in ("spec.image", "spec.population.size", "spec.colour"):
        assert f"{field}:" in err


def test_unreadable_files_are_reported(tmp_path, capsys):
    (tmp_path / "broken.yaml").write_text("spec: [unclosed")
    assert (
        cli.main(["validate", str(tmp_path / "broken.yaml"), str(tmp_path / "none.yaml")])
        == exitcodes.PERMANENT
    )
    err = capsys.readouterr().err
    assert "not valid YAML" in err and "does not exist" in err


def test_shipped_examples_are_valid(capsys):
    from pathlib import Path

    examples = sorted(str(p) for p in (Path(__file__).parents[2] / "examples").glob("*.yaml"))
    assert examples
    assert cli.main(["validate", *examples]) == exitcodes.SUCCESS
