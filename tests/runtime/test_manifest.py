"""Offline validation: the CRD's schema and CEL rules, applied by `evokube validate`."""

import json
import os
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from evokube_contract.sweep import SWEEP_KIND
from evokube_trainer.envs import env_names, env_spec
from evokube_trainer.laptop import cli
from evokube_trainer.laptop.sweep import load_sweep
from evokube_trainer.runtime import exitcodes, manifest
from evokube_trainer.runtime.config import to_run_config
from evokube_trainer.workflows import CEMRLConfig, ECConfig, ERLConfig
from tests.bad_manifests import (
    BAD_MANIFESTS,
    BASE,
    DELETE,
    GOOD_MANIFESTS,
    BadManifest,
    ids,
    with_changes,
)

REPO = Path(__file__).resolve().parents[2]
EVOKUBE = str(Path(sys.executable).parent / "evokube")
EVOKUBE_TRAIN = str(Path(sys.executable).parent / "evokube-train")

# Only the trainer refuses these: the API server answers a wrong apiVersion or kind with "no
# matches for kind" before any validation, naming no field.
TRAINER_ONLY = [
    BadManifest("wrong apiVersion", {"apiVersion": "evokube.io/v1"}, "apiVersion"),
    BadManifest("wrong kind", {"kind": "Experiment"}, "kind"),
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
    # The operator's ConfigMap carries metadata.namespace; users' files carry labels.
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
    path.write_text(json.dumps(with_changes(changes)))  # JSON is YAML
    runs = tmp_path / "runs"

    assert cli.main(["validate", str(path)]) == exitcodes.PERMANENT
    assert f"  {field}:" in capsys.readouterr().err
    assert cli.main(["run", str(path), "--runs-dir", str(runs)]) == exitcodes.PERMANENT
    assert f"  {field}:" in capsys.readouterr().err
    assert not runs.exists()  # nothing written


@pytest.mark.parametrize("changes", [c.changes for c in GOOD_MANIFESTS], ids=ids(GOOD_MANIFESTS))
def test_edge_cases_the_api_server_admits_are_valid(tmp_path, changes):
    path = tmp_path / "good.yaml"
    path.write_text(json.dumps(with_changes(changes)))  # JSON is YAML
    assert cli.main(["validate", str(path)]) == exitcodes.SUCCESS


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
    examples = sorted(str(p) for p in (REPO / "examples").glob("*.yaml"))
    assert examples
    assert cli.main(["validate", *examples]) == exitcodes.SUCCESS


# -- hostile files: `evokube validate` answers 78 with one line, quickly, never a traceback ------
def _billion_laughs() -> str:
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [{','.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 10)]
    return "\n".join(lines) + "\nspec: *a9\n"


HOSTILE: dict[str, tuple[bytes | None, str]] = {
    # name: (file contents; None for a directory, the reason reported on (file))
    "billion laughs": (_billion_laughs().encode(), "anchors and aliases are not supported"),
    "one anchor": (b"apiVersion: &v evokube.io/v1alpha1\n", "anchors and aliases"),
    "deep nesting": (b"[" * 20000 + b"]" * 20000, "nesting depth"),
    "deep block nesting": (
        "".join(f"{' ' * i}k:\n" for i in range(200)).encode(),
        "maximum nesting depth of 32",
    ),
    "duplicate keys": (b"spec:\n  seed: 1\n  seed: 2\n", "duplicate key 'seed' on line 3"),
    "invalid UTF-8": (b"apiVersion: \xff\xfe\n", "not UTF-8 text"),
    "a directory": (None, "not a regular file"),
    "over a MiB": (b"# " + b"x" * (1 << 20) + b"\n", "larger than 1048576 bytes"),
    "an integer of 100000 digits": (b"spec: {seed: " + b"9" * 100000 + b"}\n", "(file):"),
    "a python tag": (b"spec: !!python/object/apply:os.system [id]\n", "not valid YAML"),
    "a NUL byte": (b"spec: \x00\n", "not valid YAML"),
    "non-string keys": (
        yaml.safe_dump({**BASE, 5: "x"}, sort_keys=False).encode(),
        "keys must be strings",
    ),
    "NaN": (
        yaml.safe_dump(with_changes({"spec.stopping.targetFitness": float("nan")})).encode(),
        "spec.stopping.targetFitness: nan is not a JSON number",
    ),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_files_are_refused_with_one_line_quickly(tmp_path, name):
    contents, reason = HOSTILE[name]
    path = tmp_path / "hostile.yaml"
    if contents is None:
        path.mkdir()
    else:
        path.write_bytes(contents)
    started = time.monotonic()
    run = subprocess.run(
        [EVOKUBE, "validate", str(path)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == exitcodes.PERMANENT, run.stderr
    assert "Traceback" not in run.stderr
    assert reason in run.stderr, run.stderr
    lines = run.stderr.splitlines()
    assert len(lines) == 2 and len(lines[1]) < 300, run.stderr  # the header and one reason
    assert time.monotonic() - started < 30


def test_special_files_are_not_read():
    run = subprocess.run([EVOKUBE, "validate", "/dev/zero"], capture_output=True, text=True)
    assert run.returncode == exitcodes.PERMANENT and "not a regular file" in run.stderr


def test_a_named_pipe_is_refused_without_waiting_for_a_writer(tmp_path):
    fifo = tmp_path / "experiment.yaml"
    os.mkfifo(fifo)
    run = subprocess.run(
        [EVOKUBE, "validate", str(fifo)], capture_output=True, text=True, timeout=60
    )
    assert run.returncode == exitcodes.PERMANENT and "not a regular file" in run.stderr


def test_timestamps_stay_strings_as_kubectl_sends_them():
    # YAML 1.1 reads 2020-01-01 as a date; kubectl (JSON) sends the string, which is a valid label.
    doc = with_changes({"spec.podLabels": {"release": "2020-01-01"}})
    path_text = yaml.safe_dump(doc).replace("'2020-01-01'", "2020-01-01")
    assert "release: 2020-01-01" in path_text
    loaded = yaml.load(path_text, Loader=manifest._Loader)
    assert manifest.check(loaded)[1] == []


# -- Go semantics ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("pattern", "text", "matches"),
    [
        ("^a$", "a", True),
        ("^a$", "a\n", False),  # Python's `$` would match before the newline
        ("^[$]$", "$", True),
        (r"^\$x$", "$x", True),
        ("^a$|^b", "b\n", True),
        (r"^\w+$", "é", False),  # RE2's classes are ASCII
    ],
)
def test_regular_expressions_have_go_semantics(pattern, text, matches):
    assert (manifest.go_regex(pattern).search(text) is not None) is matches


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("0", 0),
        ("1", 1),
        ("100m", Fraction(1, 10)),
        ("1.5Gi", 3 * 2**29),
        ("1G", 10**9),
        ("1e3", 1000),
        ("1E-3", Fraction(1, 1000)),
        ("+2k", 2000),
        ("-1", -1),
        (".5", Fraction(1, 2)),
        ("5.", 5),
        ("0.0000000001", Fraction(1, 10**9)),  # rounded up to 1n, as resource.Quantity does
        ("-0.0000000001", Fraction(-1, 10**9)),
        ("99999Ei", 2**63 - 1),  # binary quantities are capped at 2^63-1
        ("1000000000000000000000", 10**21),  # decimal ones are not
    ],
)
def test_quantities_have_kubernetes_values(text, value):
    assert manifest.parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "lots", "1e1.5", "1Ki5", "1 ", "1\n", "- 1", "1e", "1KiB"])
def test_invalid_quantities_are_not_quantities(text):
    assert manifest.parse_quantity(text) is None


# -- the CRD agrees with the trainer's env catalog (tests/trainer/test_catalog.py checks the
# catalog against the installed gymnax and Brax) ---------------------------------------------
def _spec_schema() -> dict:
    return manifest.crd_schema()["properties"]["spec"]["properties"]


def test_the_crds_environments_are_the_trainers():
    listed = _spec_schema()["environment"]["properties"]["name"]["enum"]
    assert listed == env_names()


def test_rl_hybrids_are_refused_exactly_the_discrete_action_envs():
    # The rule keys on algorithm.rl, which the base manifest (cem-rl) has.
    wrong = []
    for name in env_names():
        paths = [e.path for e in manifest.check(with_changes({"spec.environment.name": name}))[1]]
        if paths != (["spec.environment.name"] if env_spec(name).discrete else []):
            wrong.append((name, paths))
    assert wrong == []


def test_a_configuration_the_optimizer_refuses_is_a_manifest_error():
    # The CRD refuses this; a manifest that slipped past it (an older CRD) still exits 78.
    defaulted = manifest.check(
        with_changes({"spec.algorithm": {"name": "ga"}, "spec.population.size": 8})
    )[0]
    defaulted["spec"]["algorithm"]["ec"] = {"numElites": 8}
    with pytest.raises(manifest.ManifestError) as refused:
        to_run_config(defaulted)
    assert refused.value.errors[0].path == "spec.algorithm"
    assert "num_elites" in str(refused.value)


# -- the trainer's entry point: configuration errors are permanent (78), not retriable ---------
def _train(tmp_path, changes: dict, **env: str) -> subprocess.CompletedProcess:
    path = tmp_path / "experiment.yaml"
    path.write_text(json.dumps(with_changes(changes)))  # JSON is YAML
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "EVOKUBE_"))}
    environ.update(EVOKUBE_MANIFEST=str(path), JAX_PLATFORMS="cpu", **env)
    return subprocess.run([EVOKUBE_TRAIN], capture_output=True, text=True, env=environ, timeout=300)


def test_the_trainer_exits_78_on_a_manifest_the_crd_refuses(tmp_path):
    run = _train(tmp_path, {"spec.algorithm": {"name": "ga", "ec": {"numElites": 8}}})
    assert run.returncode == exitcodes.PERMANENT, run.stderr[-2000:]
    assert "spec.algorithm.ec.numElites" in run.stderr


def _one_permanent_line(run: subprocess.CompletedProcess) -> str:
    """The trainer exited 78 and said why in one line, with no traceback."""
    assert run.returncode == exitcodes.PERMANENT, run.stderr[-2000:]
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    lines = [line for line in run.stderr.splitlines() if "permanent failure" in line]
    assert len(lines) == 1, run.stderr[-2000:]
    return lines[0]


@pytest.mark.parametrize(
    ("location", "said"),
    [
        # /sys refuses new directories even to root (EPERM or EROFS), as a read-only volume would.
        ("/sys/evokube-test-checkpoints", "cannot write to /sys/evokube-test-checkpoints: "),
        ("{file}", "cannot write to {file}: a file is in the way"),
        ("{file}/checkpoints", "cannot write to {file}/checkpoints: a file is in the way"),
    ],
    ids=["read-only", "a file", "under a file"],
)
def test_the_trainer_exits_78_on_an_unwritable_checkpoint_directory(tmp_path, location, said):
    file = tmp_path / "a-file"
    file.write_text("")
    location, said = location.format(file=file), said.format(file=file)
    line = _one_permanent_line(_train(tmp_path, {}, EVOKUBE_CHECKPOINT_DIR=location))
    assert f"spec.checkpoint.location: {said}" in line


@pytest.mark.parametrize(
    ("env", "said"),
    [
        ({"EVOKUBE_METRICS_PORT": "70000"}, "EVOKUBE_METRICS_PORT='70000' is not a port"),
        ({"EVOKUBE_METRICS_PORT": "ninety"}, "EVOKUBE_METRICS_PORT='ninety' is not a port"),
        ({"EVOKUBE_CHECKPOINT_DIR": "ftp://host/ckpt"}, "EVOKUBE_CHECKPOINT_DIR='ftp://host/ckpt'"),
    ],
    ids=["port out of range", "port not a number", "not a bucket URL"],
)
def test_the_trainer_exits_78_on_an_environment_it_cannot_use(tmp_path, env, said):
    assert said in _one_permanent_line(_train(tmp_path, {}, **env))


@pytest.mark.parametrize(
    "path",
    sorted((REPO / "examples").glob("*.yaml")),
    ids=lambda p: p.name,
)
def test_every_example_experiment_is_valid_and_maps_to_a_run(path):
    """The examples users copy first: admitted by the CRD's rules and runnable by the trainer
    (a sweep's: each of its children)."""
    doc = yaml.safe_load(path.read_text())
    experiments = load_sweep(path)[1] if doc["kind"] == SWEEP_KIND else [doc]
    for experiment in experiments:
        defaulted, errors = manifest.check(experiment)
        assert errors == []
        to_run_config(defaulted)
