"""Resuming a run whose layout changed: real `evokube run`s on the same run folder.

The first life checkpoints, the spec changes (devices per host, hosts, the policy), and the
second life either continues the same run from the checkpoint (the state is resharded into
the new layout, the replay buffer re-laid out) or exits 78 naming the checkpoint and the
field that changed. Never a silent start from generation 1.
"""

import copy

import pytest

from evokube_operator import api
from evokube_operator.reading.observe import PodView
from evokube_operator.rules import failure
from evokube_trainer.runtime import exitcodes
from tests.operator.factories import job
from tests.runtime.test_multihost import CEMRL, PBT, experiment, finish, history, start_run

COMPLETION_INDEX = api.COMPLETION_INDEX_ANNOTATION
EPISODE = 20  # steps: short generations keep each test's two runs within a minute


def first_life(tmp_path, name, hosts, devices, population=8, algorithm=CEMRL):
    doc = experiment(
        name, algorithm=algorithm, hosts=hosts, devices=devices, generations=1, interval=1
    )
    doc["spec"]["population"]["size"] = population  # divisible by every device count it meets
    doc["spec"]["environment"]["episodeLength"] = EPISODE
    code, out = finish(start_run(tmp_path, doc))
    assert code == 0, out
    assert [r["generation"] for r in history(tmp_path, name)] == [1]
    return doc


def changed(doc, *, generations, hosts=None, devices=None, hidden=None):
    doc = copy.deepcopy(doc)
    spec = doc["spec"]
    spec["stopping"]["maxGenerations"] = generations
    if hosts is not None:
        spec["accelerator"]["hosts"] = hosts
    if devices is not None:
        spec["accelerator"]["devicesPerHost"] = devices
    if hidden is not None:
        spec["policy"]["hiddenLayers"] = hidden
    return doc


def checkpoints(tmp_path, name):
    folder = tmp_path / "runs" / name / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


@pytest.mark.parametrize(
    ("before", "after", "population", "capacity", "algorithm"),
    [
        ((1, 1), (1, 3), 6, "replay capacity 4000 -> 4002", CEMRL),  # rounded up to 3 shards
        ((1, 2), (1, 4), 8, None, CEMRL),
        ((1, 4), (1, 2), 8, None, CEMRL),
        ((1, 1), (2, 1), 8, None, CEMRL),
        # PBT: 4 learners, each with its own replay buffer and hyperparameters, on new devices.
        ((1, 2), (1, 4), 4, None, PBT),
    ],
    ids=["1-to-3-devices", "2-to-4-devices", "4-to-2-devices", "1-to-2-hosts", "pbt-2-to-4"],
)
def test_a_resized_run_continues_from_its_checkpoint(
    tmp_path, before, after, population, capacity, algorithm
):
    name = "resize"
    doc = first_life(tmp_path, name, *before, population, algorithm)
    first = history(tmp_path, name)

    resized = changed(doc, generations=3, hosts=after[0], devices=after[1])
    code, out = finish(start_run(tmp_path, resized))
    assert code == 0, out
    log = (tmp_path / "runs" / name / "logs" / "process-0.log").read_text()
    assert "resumed from checkpoint at generation 1" in log
    rows = history(tmp_path, name)
    assert [r["generation"] for r in rows] == [1, 2, 3]  # continued, not started afresh
    assert rows[:1] == first  # generation 1 was not run again
    assert rows[2]["env_steps"] - rows[0]["env_steps"] == 2 * population * EPISODE
    assert checkpoints(tmp_path, name)[-1] == 3  # the new life's checkpoints are written
    if capacity:
        assert capacity in log and "kept the newest" in log


def test_a_checkpoint_that_cannot_be_resharded_stops_the_run_with_its_reason(tmp_path):
    name = "reshaped"
    doc = first_life(tmp_path, name, 1, 1)
    reason_file = tmp_path / "termination-log"
    reason_file.write_text("")
    environment = {"EVOKUBE_TERMINATION_LOG": str(reason_file)}
    code, out = finish(
        start_run(tmp_path, changed(doc, generations=3, hidden=[32, 32]), env=environment)
    )
    assert code == exitcodes.PERMANENT, out
    reason = reason_file.read_text()
    folder = tmp_path / "runs" / name / "checkpoints"
    assert reason.startswith(f"permanent failure: checkpoint 1 at {folder / '1'} cannot be")
    assert "spec.policy.hiddenLayers: [16, 16] -> [32, 32]" in reason
    assert "float32 there," in reason and "float32 now" in reason
    assert reason in out  # `evokube run` shows the log's last line
    assert checkpoints(tmp_path, name) == [1]  # nothing deleted, nothing overwritten
    assert [r["generation"] for r in history(tmp_path, name)] == [1]

    # The operator's path: the pod's termination message becomes the Failed condition's.
    pod = PodView.from_body(
        {
            "metadata": {"name": "reshaped-0-0-x", "annotations": {COMPLETION_INDEX: "0"}},
            "status": {
                "phase": "Failed",
                "containerStatuses": [
                    {
                        "name": api.CONTAINER,
                        "state": {"terminated": {"exitCode": 78, "message": reason}},
                    }
                ],
            },
        }
    )
    found = failure.classify(job(experiment=name), [pod])
    verdict = failure.verdict(found, restarts=0, max_restarts=3)
    assert (verdict.restart, verdict.reason) == (False, api.REASON_PERMANENT_FAILURE)
    assert verdict.message == f"host 0 (pod reshaped-0-0-x) exited with code 78: {reason}"


def test_a_checkpoint_from_before_the_two_word_step_count_resumes_counts_on_and_stops_at_its_budget(
    tmp_path,
):
    """Checkpoints written before env steps were counted in two words hold one int32 count
    (wrapped past 2**31 on a long run) and no `env_steps_high`: a newer trainer resumes them,
    across processes too, and counts on from where they were."""
    from evokube_trainer.runtime import manifest
    from evokube_trainer.runtime.checkpoints import Checkpointer
    from evokube_trainer.runtime.config import to_run_config
    from evokube_trainer.workflows import make_workflow
    from tests.trainer.test_workflows import older_trainers_state

    name = "old-count"
    doc = first_life(tmp_path, name, hosts=1, devices=1)
    # Rewrite checkpoint 1 as an older trainer wrote it, its count past 2**31 (int32: wrapped).
    config = to_run_config(manifest.load(tmp_path / f"{name}.yaml"))
    template = make_workflow(config.workflow, None, config.seeds).state_shapes()
    checkpointer = Checkpointer(
        tmp_path / "runs" / name / "checkpoints", interval=1, keep=config.checkpoint_keep
    )
    state, step = checkpointer.restore_latest(template)
    record = checkpointer._saved_layout(step)
    count = 2**31 + 1000
    checkpointer.save(step, older_trainers_state(state, count), record)
    assert "env_steps_high" not in checkpointer._saved_shapes(step)
    checkpointer.close()

    # Resumed past the old 1e9 cap and 2**31 with a budget there (issue 42): it stops at the
    # generation that reaches the budget, by the budget, not before and not at maxGenerations.
    per_generation = 8 * EPISODE  # one episode a member (CEM-RL's actors are members)
    budget = count + per_generation + 1
    resumed = changed(doc, generations=10, hosts=2)
    resumed["spec"]["stopping"]["maxEnvSteps"] = budget
    code, out = finish(start_run(tmp_path, resumed))
    assert code == 0, out
    log = (tmp_path / "runs" / name / "logs" / "process-0.log").read_text()
    assert "resumed from checkpoint at generation 1" in log
    assert f"reached maxEnvSteps={budget}" in log
    rows = history(tmp_path, name)
    assert [(r["generation"], r["env_steps"]) for r in rows[1:]] == [
        (2, count + per_generation),
        (3, count + 2 * per_generation),
    ]
