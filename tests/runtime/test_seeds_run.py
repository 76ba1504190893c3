"""spec.seeds in real runs (`evokube run`, the pods' entry point): replicas over two hosts of
two devices each, their values in history.jsonl, one exported policy folder per replica, and a
resume that restores every replica exactly; and the status entries `SeedProgress` writes and
the Prometheus families of each replica."""

import math

import pytest

from evokube_trainer.policies import read_policy
from evokube_trainer.runtime.metrics import TrainerMetrics
from evokube_trainer.runtime.status import SeedProgress
from tests.runtime.test_multihost import CEMRL, experiment, finish, history, start_run

SEEDS = 3


def run(tmp_path, doc) -> None:
    code, out = finish(start_run(tmp_path, doc))
    assert code == 0, out


def seeded(name, generations, hosts=2, devices=2):
    doc = experiment(
        name, algorithm=CEMRL, hosts=hosts, devices=devices, generations=generations, interval=2
    )
    doc["spec"]["seeds"] = SEEDS
    doc["spec"]["checkpoint"]["keep"] = 2
    return doc


def per_seed(row, name):
    return [row[f"seed/{i}/{name}"] for i in range(SEEDS)]


def test_replicas_over_two_hosts_record_export_and_resume_exactly(tmp_path):
    straight = seeded("straight", generations=4)
    run(tmp_path, straight)
    rows = history(tmp_path, "straight")
    assert [row["generation"] for row in rows] == [1, 2, 3, 4]
    for row in rows:
        best = per_seed(row, "ec/fitness_max")
        assert len(set(best)) == SEEDS  # independent replicas
        assert row["ec/fitness_max"] == pytest.approx(sum(best) / SEEDS)
        assert row["env_steps"] == max(per_seed(row, "env_steps"))
    returns = per_seed(rows[-1], "eval/return_mean")
    policies = tmp_path / "runs" / "straight" / "policies"
    # Replica 0 keeps the one-seed run's folders; replica i exports under seed-<i>/. Each
    # chunk exports its last evaluation (4) and each replica's best of the chunk.
    listed = sorted(p.name for p in policies.iterdir())
    assert listed[0] == "best" and listed[-2:] == ["seed-1", "seed-2"]
    assert "generation-4" in listed and len(listed) == 5
    for i, folder in enumerate((policies, policies / "seed-1", policies / "seed-2")):
        exported = read_policy(str(folder / "generation-4"))
        assert exported.metadata["seed"] == 7 + i
        assert exported.metadata["evalReturn"] == returns[i]
        assert (folder / "best" / "policy.json").exists()

    # Two lives (stopped at 2, resumed to 4) on another layout compute the same replicas.
    resumed = seeded("resumed", generations=2, hosts=1, devices=4)
    run(tmp_path, resumed)
    resumed["spec"]["stopping"]["maxGenerations"] = 4
    run(tmp_path, resumed)
    log = (tmp_path / "runs" / "resumed" / "logs" / "process-0.log").read_text()
    assert "resumed from checkpoint at generation 2" in log
    again = history(tmp_path, "resumed")
    assert [r["generation"] for r in again] == [1, 2, 3, 4]
    for name in ("ec/fitness_max", "ec/fitness_mean", "env_steps"):
        for resumed_row, row in zip(again, rows, strict=True):
            assert per_seed(resumed_row, name) == pytest.approx(per_seed(row, name), rel=1e-5)


def test_seed_progress_keeps_the_best_so_far_and_the_newest_evaluation():
    progress = SeedProgress(root_seed=10, seeds=2)
    assert progress.entries() == [{"seed": 10}, {"seed": 11}]
    progress.update(
        {
            "seed/0/ec/fitness_max": -5.0,
            "seed/1/ec/fitness_max": -7.0,
            "seed/0/eval/return_mean": -6.0,
            "seed/1/eval/return_mean": math.nan,
        }
    )
    progress.update({"seed/0/ec/fitness_max": -9.0, "seed/1/ec/fitness_max": -3.0})
    assert progress.entries() == [
        {"seed": 10, "bestFitness": -5.0, "fitness": -9.0, "evalReturn": -6.0},
        {"seed": 11, "bestFitness": -3.0, "fitness": -3.0},  # a NaN return is left out
    ]
    one = SeedProgress(root_seed=3, seeds=1)
    one.update({"ec/fitness_max": -1.5, "eval/return_mean": -2.0})
    assert one.entries() == [{"seed": 3, "bestFitness": -1.5, "fitness": -1.5, "evalReturn": -2.0}]


def test_prometheus_has_each_replica_and_the_interval_of_their_mean():
    metrics = TrainerMetrics("exp", "ns", 0)
    metrics.record_seeds(
        [
            {"seed": 7, "bestFitness": -1.0, "fitness": -2.0, "evalReturn": -3.0},
            {"seed": 8, "bestFitness": -4.0, "fitness": -4.0},
        ]
    )
    base = {"experiment": "exp", "namespace": "ns", "process": "0"}

    def sample(name, **labels):
        return metrics.registry.get_sample_value(name, {**base, **labels})

    assert sample("evokube_seed_fitness", seed="7", stat="best") == -2.0
    assert sample("evokube_seed_fitness", seed="8", stat="best_so_far") == -4.0
    assert sample("evokube_seed_eval_return", seed="7") == -3.0
    assert sample("evokube_seed_eval_return", seed="8") is None
    # t(0.975, 1) = 12.706 times the standard error 1 of -2 and -4; no interval of one return.
    assert sample("evokube_seeds_interval", metric="fitness") == pytest.approx(12.706, rel=1e-4)
    assert sample("evokube_seeds_interval", metric="eval_return") is None
