"""What a sweep does (evokube_sweeps; its names in evokube_contract/sweep.py) and the offline
checks of an ERLSweep: how a sweep expands, names and builds its children, refuses what cannot
expand (naming the field), and sums up its children's outcomes. No cluster:
tests/operator/test_sweep_crd.py has the API server's side of tests/bad_sweeps.py,
tests/laptop/test_sweep.py the local runs."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from scipy import stats

import evokube_sweeps as sweeps
from evokube_contract import sweep
from evokube_trainer import generate
from evokube_trainer.laptop import cli
from evokube_trainer.laptop.sweep import load_sweep, local_seeds, table
from evokube_trainer.runtime import exitcodes, manifest
from tests.bad_manifests import BASE, MULTISLICE, ids, with_changes
from tests.bad_sweeps import BAD_SWEEPS, SWEEP

REPO = Path(__file__).resolve().parents[1]
LR, TAU, SIZE = (
    "spec.algorithm.rl.actorLearningRate",
    "spec.algorithm.rl.tau",
    "spec.population.size",
)


def spec(*parameters: dict, **fields) -> dict:
    return {"template": {"spec": BASE["spec"]}, "parameters": list(parameters), **fields}


# -- expansion ----------------------------------------------------------------------------------
def test_the_grid_varies_the_first_parameter_slowest():
    children = sweeps.expand(
        spec({"path": LR, "values": [1, 2, 3]}, {"path": SIZE, "values": [8, 16]})
    )
    assert children == [{LR: lr, SIZE: size} for lr in (1, 2, 3) for size in (8, 16)]
    assert [list(c) for c in children] == [[LR, SIZE]] * 6  # keys in the parameters' order


def test_the_grid_is_crossed_with_the_same_draws_at_every_point():
    drawn = {"path": TAU, "distribution": {"type": "uniform", "low": 0.0, "high": 1.0}}
    children = sweeps.expand(spec(drawn, {"path": LR, "values": [1, 2, 3]}, samples=4, seed=7))
    assert len(children) == 12
    draws = [c[TAU] for c in children[:4]]
    assert len(set(draws)) == 4 and all(0 <= d < 1 for d in draws)
    assert children == [{TAU: t, LR: lr} for lr in (1, 2, 3) for t in draws]


def test_samples_count_only_with_a_drawn_parameter():
    assert len(sweeps.expand(spec({"path": LR, "values": [1, 2]}, samples=5))) == 2


def test_draws_follow_the_seed_in_every_process():
    parameters = [
        {"path": LR, "distribution": {"type": "logUniform", "low": 1e-5, "high": 1e-2}},
        {"path": SIZE, "distribution": {"type": "intUniform", "low": 4, "high": 6}},
        {"path": "spec.algorithm.name", "distribution": {"type": "choice", "choices": ["a", "b"]}},
    ]
    mine = sweeps.expand(spec(*parameters, samples=30, seed=3))
    code = (
        "import json, sys; import evokube_sweeps; "
        "print(json.dumps(evokube_sweeps.expand(json.loads(sys.argv[1]))))"
    )
    other = subprocess.run(
        [sys.executable, "-c", code, json.dumps(spec(*parameters, samples=30, seed=3))],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONPATH": str(REPO / "operator"), "PYTHONHASHSEED": "123"},
    )
    assert json.loads(other.stdout) == mine
    assert mine != sweeps.expand(spec(*parameters, samples=30, seed=4))
    assert all(1e-5 <= c[LR] <= 1e-2 and c[LR] == float(f"{c[LR]:.6g}") for c in mine)
    assert {c[SIZE] for c in mine} == {4, 5, 6}  # both ends included
    assert {c["spec.algorithm.name"] for c in mine} == {"a", "b"}


def test_an_expansion_over_the_cap_is_refused_naming_the_parameters():
    axis = {"path": LR, "values": list(range(16))}
    assert len(sweeps.expand(spec(axis, {"path": SIZE, "values": list(range(16))}))) == 256
    drawn = {"path": TAU, "distribution": {"type": "uniform", "low": 0, "high": 1}}
    with pytest.raises(sweeps.SweepError, match="expands to 257 children, more than 256") as err:
        sweeps.expand(spec({"path": LR, "values": [1]}, drawn, samples=257))
    assert err.value.field == "spec.parameters"
    with pytest.raises(sweeps.SweepError, match="512 children"):
        sweeps.expand(spec(axis, {"path": SIZE, "values": list(range(32))}))


@pytest.mark.parametrize(
    ("parameters", "field"),
    [
        ([{"path": "status.phase", "values": [1]}], "spec.parameters[0].path"),
        ([{"path": "metadata.labels", "values": [1]}], "spec.parameters[0].path"),
        ([{"path": "spec.tolerations.key", "values": [1]}], "spec.parameters[0].path"),
        ([{"path": LR, "values": [1]}, {"path": LR, "values": [2]}], "spec.parameters[1].path"),
        ([{"path": "spec.algorithm", "values": [{}]}, {"path": LR, "values": [2]}],
         "spec.parameters[1].path"),
        ([{"path": LR, "values": []}], "spec.parameters[0].values"),
        ([{"path": LR}], "spec.parameters[0]"),
        ([{"path": LR, "distribution": {"type": "normal"}}],
         "spec.parameters[0].distribution.type"),
        ([{"path": LR, "distribution": {"type": "uniform", "low": 1, "high": 1}}],
         "spec.parameters[0].distribution.high"),
        ([{"path": LR, "distribution": {"type": "logUniform", "low": 0, "high": 1}}],
         "spec.parameters[0].distribution.low"),
        ([{"path": LR, "distribution": {"type": "intUniform", "low": 0.5, "high": 3}}],
         "spec.parameters[0].distribution.low"),
        ([{"path": LR, "distribution": {"type": "uniform", "high": 3}}],
         "spec.parameters[0].distribution.low"),
        ([{"path": LR, "distribution": {"type": "choice", "choices": []}}],
         "spec.parameters[0].distribution.choices"),
    ],
)  # fmt: skip
def test_what_cannot_expand_is_refused_naming_the_field(parameters, field):
    with pytest.raises(sweeps.SweepError) as err:
        sweeps.expand(spec(*parameters))
    assert err.value.field == field and str(err.value).startswith(f"{field}: ")


def test_every_parameter_path_is_a_field_of_the_experiment_crd():
    assert "spec.algorithm.rl.actorLearningRate" in sweep.EXPERIMENT_PATHS
    assert "spec.tolerations" in sweep.EXPERIMENT_PATHS  # a list, set whole
    assert not any(p.startswith("spec.tolerations.") for p in sweep.EXPERIMENT_PATHS)
    schema = manifest.crd_schema()["properties"]["spec"]
    for path in sweep.EXPERIMENT_PATHS:
        node = schema
        for part in path.split(".")[1:]:
            node = node["properties"][part]


# -- the generated regions and the CRD's copies of the contract ----------------------------------
@pytest.mark.parametrize("path", generate.SWEEP_CRD_FILES)
def test_the_sweep_crd_restates_the_contract(path):
    crd = yaml.safe_load((REPO / path).read_text())
    assert crd["metadata"]["name"] == f"{sweep.SWEEP_PLURAL}.evokube.io"
    names = crd["spec"]["names"]
    assert (names["kind"], names["plural"], names["shortNames"]) == (
        sweep.SWEEP_KIND,
        sweep.SWEEP_PLURAL,
        ["erls"],
    )
    (version,) = crd["spec"]["versions"]
    schema = version["schema"]["openAPIV3Schema"]["properties"]
    assert schema["metadata"]["properties"]["name"]["maxLength"] == sweep.MAX_SWEEP_NAME
    spec_schema = schema["spec"]["properties"]
    assert spec_schema["samples"]["maximum"] == sweep.MAX_CHILDREN
    assert spec_schema["maxParallel"]["maximum"] == sweep.MAX_CHILDREN
    assert schema["status"]["properties"]["configurations"]["maxItems"] == sweep.MAX_CHILDREN
    parameter = spec_schema["parameters"]["items"]["properties"]
    assert parameter["path"]["enum"] == list(sweep.EXPERIMENT_PATHS)
    assert parameter["distribution"]["properties"]["type"]["enum"] == list(sweep.DISTRIBUTIONS)


def test_the_generated_path_lists_and_template_schema_are_up_to_date():
    experiment_crd = (REPO / generate.CRD_FILES[0]).read_text()
    paths = generate.sweep_paths(experiment_crd)
    template = generate.template_schema(experiment_crd)
    for path in generate.SWEEP_CRD_FILES:
        text = (REPO / path).read_text()
        assert generate.render_sweep_crd(text, paths, template) == text, (
            f"{path}: {generate.COMMAND}"
        )
    text = (REPO / generate.SWEEP_CONTRACT).read_text()
    assert generate.render_sweep_contract(text, paths) == text, generate.COMMAND
    assert generate.render_sweep_contract(text, ["spec.x"]) != text


# -- the children -------------------------------------------------------------------------------
def test_a_child_is_the_template_with_its_assignment_labelled_as_the_sweeps():
    doc = with_changes({"metadata.namespace": "ml", "spec.queueName": "team-a"}, SWEEP)
    before = json.dumps(doc)
    child = sweeps.child_manifest(doc, 3, {LR: 0.01, "spec.algorithm.ec": {"noiseStd": 0.1}})
    assert json.dumps(doc) == before  # the sweep is not changed
    assert child["apiVersion"] == "evokube.io/v1alpha1" and child["kind"] == "ERLExperiment"
    assert child["metadata"]["name"] == "ok-3" and child["metadata"]["namespace"] == "ml"
    assert child["metadata"]["labels"] == {
        "team": "a",
        sweep.SWEEP_LABEL: "ok",
        sweep.SWEEP_INDEX_LABEL: "3",
    }
    assert json.loads(child["metadata"]["annotations"][sweep.SWEEP_ASSIGNMENT_ANNOTATION]) == {
        LR: 0.01,
        "spec.algorithm.ec": {"noiseStd": 0.1},
    }
    assert child["spec"]["algorithm"] == {
        "name": "cem-rl",
        "rl": {"numAgents": 2, "actorLearningRate": 0.01},
        "ec": {"noiseStd": 0.1},
    }
    assert child["spec"]["queueName"] == "team-a"
    assert "ownerReferences" not in child["metadata"]
    assert manifest.check(child)[1] == []


def test_the_longest_sweep_name_gives_valid_children_multislice_too():
    doc = with_changes({"metadata.name": "s" * sweep.MAX_SWEEP_NAME}, SWEEP)
    doc["spec"]["template"]["spec"] = with_changes(MULTISLICE, BASE)["spec"]
    child = sweeps.child_manifest(doc, sweep.MAX_CHILDREN - 1, {})
    assert child["metadata"]["name"] == sweeps.child_name("s" * sweep.MAX_SWEEP_NAME, 255)
    assert manifest.check(child)[1] == []
    longer = sweeps.child_manifest(with_changes({"metadata.name": "s" * 40}, doc), 255, {})
    assert "metadata.name" in {e.path for e in manifest.check(longer)[1]}


# -- summaries ------------------------------------------------------------------------------------
def child(name: str, index: int, phase: str | None, *seeds: tuple[float, float]) -> dict:
    """A child object as the API server returns it; `seeds`: (bestFitness, fitness) each."""
    status: dict = {"progress": {"seeds": [
        {"seed": i, "bestFitness": b, "fitness": f} for i, (b, f) in enumerate(seeds)
    ]}}  # fmt: skip
    if phase:
        status["phase"] = phase
    meta = {
        "name": name,
        "labels": {sweep.SWEEP_INDEX_LABEL: str(index)},
        "annotations": {sweep.SWEEP_ASSIGNMENT_ANNOTATION: json.dumps({LR: index})},
    }
    return {"metadata": meta, "spec": {}, "status": status}


def test_the_summary_gives_each_configuration_its_mean_and_t_interval():
    children = [
        child("s-1", 1, "Succeeded", (1.0, -100.0), (2.0, -110.0), (3.0, -120.0)),
        child("s-0", 0, "Succeeded", (5.0, 4.0)),
        child("s-2", 2, "Running"),
        {"metadata": {"name": "s-3", "labels": {sweep.SWEEP_INDEX_LABEL: "3"}}},
    ]
    summary = sweeps.summarize(children)
    assert summary["counts"] == {"Succeeded": 2, "Running": 1}
    first, second, running, new = summary["configurations"]
    assert first == {
        "name": "s-0",
        "assignment": {LR: 0},
        "phase": "Succeeded",
        "best": {"mean": 5.0, "interval": 0.0, "n": 1},
        "final": {"mean": 4.0, "interval": 0.0, "n": 1},
    }
    # 3 seeds: mean 2, standard deviation 1; t(0.975, 2 df) = 4.3027
    assert second["best"]["mean"] == 2.0 and second["best"]["n"] == 3
    assert second["best"]["interval"] == pytest.approx(4.3027 / math.sqrt(3))
    assert second["final"]["mean"] == -110.0
    assert second["final"]["interval"] == pytest.approx(4.3027 * 10 / math.sqrt(3))
    assert running == {"name": "s-2", "assignment": {LR: 2}, "phase": "Running"}
    assert new == {"name": "s-3"}  # nothing invented
    assert summary["bestConfiguration"] == {"name": "s-0", "best": first["best"]}


def test_a_summary_of_nothing_reported_has_no_best():
    assert sweeps.summarize([child("s-0", 0, None)]) == {
        "counts": {},
        "configurations": [{"name": "s-0", "assignment": {LR: 0}}],
    }


def test_the_t_quantiles_match_scipy():
    for df in range(1, 64):
        assert sweeps.t975(df) == pytest.approx(stats.t.ppf(0.975, df), abs=2e-4), df


# -- a local run's outcome, in the shape of status.progress.seeds --------------------------------
def test_local_seeds_read_per_replica_columns_or_the_run_itself():
    rows = [
        {"generation": 1, "ec/fitness_max": -5.0, "seed/0/ec/fitness_max": -4.0,
         "seed/1/ec/fitness_max": -6.0},
        {"generation": 2, "ec/fitness_max": -7.0, "seed/0/ec/fitness_max": -8.0,
         "seed/1/ec/fitness_max": -2.0, "seed/1/eval/return_mean": -3.0},
    ]  # fmt: skip
    assert local_seeds(rows, {"seed": 10, "seeds": 2}) == [
        {"seed": 10, "bestFitness": -4.0, "fitness": -8.0},
        {"seed": 11, "bestFitness": -2.0, "fitness": -2.0, "evalReturn": -3.0},
    ]
    one = [{k: v for k, v in r.items() if not k.startswith("seed/")} for r in rows]
    assert local_seeds(one, {"seed": 0}) == [{"seed": 0, "bestFitness": -5.0, "fitness": -7.0}]
    assert local_seeds([], {"seed": 0}) == []


def test_the_table_marks_the_best_configuration():
    summary = sweeps.summarize(
        [child("s-0", 0, "Succeeded", (1.0, 1.0)), child("s-1", 1, "Failed", (2.0, 0.5))]
    )
    lines = table({**summary, "children": 2}).splitlines()
    assert lines[0].split()[:2] == ["child", "phase"]
    assert lines[1].startswith("   s-0") and lines[2].startswith("*  s-1")
    assert "2.00 ± 0.00 (n=1)" in lines[2] and "actorLearningRate=1" in lines[2]
    assert lines[-1] == "2 children: 1 Failed, 1 Succeeded"


# -- offline validation: `evokube validate` of a sweep ---------------------------------------------
@pytest.mark.parametrize(
    ("changes", "field"), [(c.changes, c.field) for c in BAD_SWEEPS], ids=ids(BAD_SWEEPS)
)
def test_validate_refuses_bad_sweeps_naming_the_field(changes, field):
    errors = manifest.check(with_changes(changes, SWEEP), manifest.SWEEP_CRD_FILE)[1]
    assert field in {e.path for e in errors}


def test_validate_names_the_child_and_the_field_of_an_invalid_child(tmp_path, capsys):
    bad = with_changes({"spec.parameters": [{"path": SIZE, "values": [8, 1]}]}, SWEEP)
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    assert cli.main(["validate", str(tmp_path / "bad.yaml")]) == exitcodes.PERMANENT
    err = capsys.readouterr().err
    assert "spec.population.size: child ok-1 (population.size=1):" in err
    assert "ok-0" not in err


def test_validate_refuses_an_expansion_over_the_cap(tmp_path, capsys):
    axes = [{"path": p, "values": list(range(17))} for p in (LR, TAU)]
    (tmp_path / "big.yaml").write_text(
        yaml.safe_dump(with_changes({"spec.parameters": axes}, SWEEP))
    )
    assert cli.main(["validate", str(tmp_path / "big.yaml")]) == exitcodes.PERMANENT
    assert "spec.parameters: expands to 289 children, more than 256" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("template_field", "value", "path"),
    [
        ("algorithm", "openes", "spec.algorithm.ec.noiseStd"),
        ("population", [64], "spec.population.size"),
    ],
)
def test_validate_names_a_template_field_of_the_wrong_type_that_a_parameter_crosses(
    tmp_path, capsys, template_field, value, path
):
    """The template is an experiment spec by the CRD: the field is refused by type before
    the parameter is expanded (evokube_contract.sweep still names a crossing parameter, for a
    sweep read without the CRD: tests/operator/test_sweep_plan.py)."""
    bad = with_changes(
        {
            f"spec.template.spec.{template_field}": value,
            "spec.parameters": [{"path": path, "values": [1]}],
        },
        SWEEP,
    )
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    assert cli.main(["validate", str(tmp_path / "bad.yaml")]) == exitcodes.PERMANENT
    err = capsys.readouterr().err
    assert f"spec.template.spec.{template_field}: {value!r} is not of type 'object'" in err
    assert "AttributeError" not in err


def test_a_valid_sweep_loads_with_its_defaulted_children(tmp_path):
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump(SWEEP))
    loaded, children = load_sweep(tmp_path / "ok.yaml")
    assert loaded["spec"]["maxParallel"] == 1 and loaded["spec"]["seed"] == 0
    assert [c["metadata"]["name"] for c in children] == ["ok-0", "ok-1", "ok-2", "ok-3"]
    assert children[0]["spec"]["maxRestarts"] == 3  # the ERLExperiment CRD's default
