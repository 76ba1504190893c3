"""`evokube curve`: the learning-curve PNG from a run folder, a history.jsonl or a bucket URL,
and errors that name what is missing. (An experiment's NAME, through the API server:
tests/objectstore/test_history_in_buckets.py.)"""

import fsspec
import pytest
from PIL import Image

from evokube_trainer.laptop.cli import main
from evokube_trainer.laptop.curves import history_rows, seed_band, seed_count
from evokube_trainer.recorders import JsonLinesRecorder
from evokube_trainer.runtime import exitcodes

GENERATIONS = [
    (1, {"ec/fitness_max": -900.0, "ec/fitness_mean": -1200.0, "env_steps": 2000}),
    (2, {"ec/fitness_max": -400.0, "ec/fitness_mean": -800.0, "eval/return_mean": -450.0}),
    (3, {"ec/fitness_max": -150.0, "ec/fitness_mean": -300.0, "eval/return_mean": "nan"}),
]


def write_history(path):
    with JsonLinesRecorder(path) as history:
        for generation, metrics in GENERATIONS:
            history.write(generation, metrics)


def assert_curve(png):
    with Image.open(png) as image:
        assert image.format == "PNG" and image.size == (800, 450)


def test_history_rows_keep_the_last_record_of_a_rewritten_generation(tmp_path):
    write_history(tmp_path / "history.jsonl")
    with JsonLinesRecorder(tmp_path / "history.jsonl") as resumed:  # resumed from generation 1
        resumed.write(2, {"ec/fitness_max": -350.0})
    rows = history_rows((tmp_path / "history.jsonl").read_text())
    assert [row["generation"] for row in rows] == [1, 2, 3]
    assert rows[1] == {"generation": 2, "ec/fitness_max": -350.0}


def test_curve_from_a_run_folder_and_a_history_file(tmp_path, capsys, monkeypatch):
    run = tmp_path / "runs" / "pendulum"
    write_history(run / "history.jsonl")
    monkeypatch.chdir(tmp_path)
    assert main(["curve", str(run)]) == exitcodes.SUCCESS
    assert_curve(tmp_path / "pendulum-learning-curve.png")  # named after the run by default
    assert "pendulum-learning-curve.png: 3 generations" in capsys.readouterr().out

    out = tmp_path / "out.png"
    assert main(["curve", str(run / "history.jsonl"), "-o", str(out)]) == exitcodes.SUCCESS
    assert_curve(out)


def test_curve_from_a_bucket_location_or_its_history(tmp_path, capsys):
    write_history(tmp_path / "history.jsonl")
    fs = fsspec.filesystem("memory")
    fs.pipe_file("/curves/ml/pendulum/history.jsonl", (tmp_path / "history.jsonl").read_bytes())
    for url in ("memory://curves/ml/pendulum", "memory://curves/ml/pendulum/history.jsonl"):
        out = tmp_path / "bucket.png"
        out.unlink(missing_ok=True)
        assert main(["curve", url, "-o", str(out)]) == exitcodes.SUCCESS
        assert_curve(out)
    assert "3 generations" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("runs/nowhere/", "runs/nowhere/: no such file or folder"),
        ("{empty_folder}", "has no history.jsonl"),
        ("{empty_file}", "history.jsonl is empty"),
        ("{not_history}", "not a history.jsonl"),
        ("memory://curves/none", "no history yet: memory://curves/none/history.jsonl does not"),
        ("nosuchscheme://bucket/exp", "cannot read nosuchscheme://bucket/exp/history.jsonl"),
    ],
)
def test_curve_errors_name_what_is_missing(tmp_path, capsys, monkeypatch, target, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty.jsonl").touch()
    (tmp_path / "other.jsonl").write_text('{"no": "generation"}\n')
    target = target.format(
        empty_folder=tmp_path / "empty",
        empty_file=tmp_path / "empty.jsonl",
        not_history=tmp_path / "other.jsonl",
    )
    assert main(["curve", target]) == exitcodes.PERMANENT
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err
    assert not list(tmp_path.glob("*.png"))


def test_curve_of_a_name_without_a_kubeconfig_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    assert main(["curve", "pendulum"]) == exitcodes.PERMANENT
    assert "error: no kubeconfig to find experiment 'pendulum' with" in capsys.readouterr().err


def test_evokube_run_writes_tensorboard_beside_history_and_curve_draws_it(tmp_path, capsys):
    """End to end: `evokube run` (the trainer's own recorders) leaves event files whose
    scalars are history.jsonl's, and a rerun that resumes adds its own file; with
    WANDB_API_KEY set (offline here), each life logs to the same W&B run."""
    from tests.cluster.controlplane import free_port
    from tests.runtime.test_multihost import OPENES, experiment, finish, history, start_run
    from tests.trainer.test_tensorboard_wandb import event_files, scalars, wandb_records

    pytest.importorskip("wandb")  # the optional extra evokube[wandb]
    wandb_env = {"WANDB_API_KEY": "not-a-real-key", "WANDB_MODE": "offline"}

    doc = experiment("board", algorithm=OPENES, hosts=1, devices=1, generations=2, interval=1)
    doc["spec"]["metricsPort"] = free_port()  # 19100 may be another test's
    code, out = finish(start_run(tmp_path, doc, env=wandb_env))
    assert code == 0, out
    run = tmp_path / "runs" / "board"
    assert f"tensorboard --logdir {run}/tensorboard" in out
    doc["spec"]["stopping"]["maxGenerations"] = 3
    code, out = finish(start_run(tmp_path, doc, env=wandb_env))
    assert code == 0, out

    rows = history(tmp_path, "board")
    assert [row["generation"] for row in rows] == [1, 2, 3]
    lives = sorted(
        (scalars(path) for path in event_files(run / "tensorboard")),
        key=lambda life: life["ec/fitness_max"][0][0],  # by first generation
    )
    assert [life["ec/fitness_max"] for life in lives] == [
        [(row["generation"], pytest.approx(row["ec/fitness_max"])) for row in rows[:2]],
        [(3, pytest.approx(rows[2]["ec/fitness_max"]))],
    ]
    numbers = {k for k, v in rows[0].items() if isinstance(v, int | float)}  # "generation" too
    assert set(lives[0]) == numbers
    runs = sorted((run / "wandb").glob("offline-run-*-default-board"))  # W&B files: run folder
    assert len(runs) == 2, runs
    steps = [[record["_step"] for record in wandb_records(life)[1]] for life in runs]
    assert steps == [["1", "2"], ["3"]]
    assert main(["curve", str(run), "-o", str(tmp_path / "board.png")]) == exitcodes.SUCCESS
    assert_curve(tmp_path / "board.png")
    assert_curve(run / "learning-curve.png")


def test_a_run_of_several_seeds_draws_each_replica_and_their_mean_with_a_band(tmp_path):
    """Rows as `Workflow.learn` writes them for spec.seeds: 3 (`seed/<i>/<metric>`)."""
    fitness = {1: [-900.0, -700.0, -800.0], 2: [-400.0, "nan", -300.0], 3: [-150.0, -100.0, -50.0]}
    with JsonLinesRecorder(tmp_path / "history.jsonl") as history:
        for generation, values in fitness.items():
            history.write(generation, {f"seed/{i}/ec/fitness_max": v for i, v in enumerate(values)})
    rows = history_rows((tmp_path / "history.jsonl").read_text())
    assert seed_count(rows) == 3
    band = seed_band(rows, "ec/fitness_max", 3)
    # Generation 2 has a replica without a finite value: no band point there.
    assert [(g, m) for g, m, _ in band] == [(1, -800.0), (3, -100.0)]
    # 95% Student-t half-width of three values one standard deviation 100 apart: t(0.975, 2)
    # = 4.303, times 100 / sqrt(3).
    assert band[0][2] == pytest.approx(4.3027 * 100 / 3**0.5, rel=1e-4)
    assert main(["curve", str(tmp_path / "history.jsonl"), "-o", str(tmp_path / "seeds.png")]) == 0
    assert_curve(tmp_path / "seeds.png")
    assert seed_count(history_rows("")) == 1
