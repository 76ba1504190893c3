"""Offline validation: the CRD's schema and CEL rules plus the trainer's semantic rules."""

import pytest
import yaml

from evokube_trainer import cli
from evokube_trainer.runtime import exitcodes, manifest
from evokube_trainer.runtime.config import to_run_config
from evokube_trainer.workflows import CEMRLConfig, ECConfig, ERLConfig
from tests.bad_manifests import BAD_MANIFESTS, BASE, DELETE, BadManifest, ids, with_changes

# Only the trainer refuses these, so they are not in the shared list: the API server answers a
# wrong apiVersion or kind with "no matches for kind" before any validation, naming no field, and
# it admits the rest, which are the trainer's semantic rules (`to_run_config`), not the CRD's.
TRAINER_ONLY = [
    BadManifest("wrong apiVersion", {"apiVersion": "evokube.io/v1"}, "apiVersion"),
    BadManifest("wrong kind", {"kind": "Experiment"}, "kind"),
    BadManifest(
        "learning rate for CMA-ES",
        {"spec.algorithm": {"name": "cma-es", "ec": {"learningRate": 0.1}}},
        "spec.algorithm.ec.learningRate",
    ),
    BadManifest(
        "env not in gymnax",
        {"spec.environment.name": "gymnax/NoSuchEnv-v0"},
        "spec.environment.name",
    ),
    BadManifest(
        "discrete env for an RL hybrid",
        {"spec.environment.name": "gymnax/CartPole-v1"},
        "spec.environment.name",
    ),
    BadManifest(
        "unknown env backend", {"spec.environment.backend": "mjx"}, "spec.environment.backend"
    ),
]
BAD = BAD_MANIFESTS + TRAINER_ONLY


def test_the_base_manifest_is_valid_and_maps_to_each_workflow_type():
    assert isinstance(to_run_config(manifest.check(BASE)[0]).workflow, CEMRLConfig)
    erl = with_changes({"spec.algorithm": {"name": "erl-ga", "rl": {"numAgents": 2}}})
    assert isinstance(to_run_config(manifest.check(erl)[0]).workflow, ERLConfig)
    es = with_changes({"spec.algorithm": {"name": "openes", "ec": {"noiseStd": 0.1}}})
    config = to_run_config(manifest.check(es)[0])
    assert isinstance(config.workflow, ECConfig)
    assert config.workflow.optimizer_options == {"sigma": 0.1}


def test_object_metadata_beyond_the_name_is_the_api_servers_and_allowed():
    # The operator's pod annotation carries metadata.namespace; users' files carry labels.
    doc = with_changes({"metadata": {"name": "ok", "namespace": "team-a", "labels": {"a": "b"}}})
    assert manifest.check(doc)[1] == []


def test_defaults_come_from_the_crd():
    defaulted, errors = manifest.check(BASE)
    assert errors == []
    spec = defaulted["spec"]
    assert spec["accelerator"]["type"] == "cpu"
    assert spec["algorithm"]["rl"]["batchSize"] == 256
    assert spec["policy"]["hiddenLayers"] == [64, 64]
    assert spec["checkpoint"]["intervalGenerations"] == 10


@pytest.mark.parametrize(("changes", "field"), [(c.changes, c.field) for c in BAD], ids=ids(BAD))
def test_bad_manifests_fail_validate_and_run_naming_the_field(tmp_path, capsys, changes, field):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(with_changes(changes)))
    runs = tmp_path / "runs"

    assert cli.main(["validate", str(path)]) == exitcodes.PERMANENT
    assert f"{field}:" in capsys.readouterr().err
    assert cli.main(["run", str(path), "--runs-dir", str(runs)]) == exitcodes.PERMANENT
    assert f"{field}:" in capsys.readouterr().err
    assert not runs.exists()  # nothing written


def test_every_error_is_reported_at_once(tmp_path, capsys):
    doc = with_changes({"spec.image": DELETE, "spec.population.size": -1, "spec.colour": 1})
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
