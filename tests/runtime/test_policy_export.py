"""Policy exports of real training runs (`evokube run`, the trainer the pods run): every
evaluation's policy under runs/<name>/policies/, `keep` honoured, best/ the best evaluation
over every life of the run, and a policy written by 2 hosts of 2 devices loaded and played by
this 1-device process.
"""

import json

import jax
import numpy as np

from evokube_trainer.policies import evaluate_policy, read_policy
from tests.runtime.test_multihost import OPENES, experiment, finish, history, start_run

EPISODE = 50  # Pendulum steps per episode (the experiment's episodeLength)


def run(tmp_path, doc) -> str:
    code, out = finish(start_run(tmp_path, doc))
    assert code == 0, out
    return out


def test_a_run_exports_its_policies_and_its_best_survives_a_resume(tmp_path):
    doc = experiment("export", algorithm=OPENES, hosts=2, devices=2, generations=4, interval=2)
    doc["spec"]["checkpoint"]["keep"] = 2
    out = run(tmp_path, doc)
    policies = tmp_path / "runs" / "export" / "policies"
    # Each chunk of generations (here at most 2: a checkpoint every 2) exports its last
    # evaluation and its best; `keep` 2 leaves the newest two and best/.
    folders = sorted(p.name for p in policies.iterdir())
    assert folders[0] == "best" and folders[-1] == "generation-4" and len(folders) == 3
    returns = {row["generation"]: row["eval/return_mean"] for row in history(tmp_path, "export")}
    assert sorted(returns) == [1, 2, 3, 4]  # every generation evaluated, inside its chunk
    for folder in folders[1:]:
        exported = read_policy(str(policies / folder))
        assert exported.metadata["evalReturn"] == returns[int(folder.split("-")[1])]
    best = read_policy(str(policies / "best"))
    first_best = max(returns, key=returns.get)
    assert (best.metadata["generation"], best.metadata["evalReturn"]) == (
        first_best,
        returns[first_best],
    )
    assert f"best policy: {policies / 'best'} (evaluation return" in out

    # Written by process 0 of 2 (4 devices), read and played here, on 1, from the folder alone.
    assert jax.device_count() == 1
    assert best.metadata["algorithm"] == "openes" and best.metadata["seed"] == 7
    assert best.obs_stats is not None  # openes normalizes observations by default
    assert best.env_config.episode_length == EPISODE
    episode_returns = evaluate_policy(best, episodes=4)
    assert episode_returns.shape == (4,)
    assert np.all((episode_returns <= 0) & (episode_returns >= -16.3 * EPISODE))

    # A second life resumes at generation 4. Raise best/'s recorded return above anything
    # Pendulum can score: were the best so far forgotten, generation 5 would replace it.
    metadata_file = policies / "best" / "policy.json"
    metadata = json.loads(metadata_file.read_text())
    metadata_file.write_text(json.dumps({**metadata, "evalReturn": 1.0}))
    doc["spec"]["stopping"]["maxGenerations"] = 6
    doc["spec"]["accelerator"].update(hosts=1, devicesPerHost=4)  # same shapes: it resumes
    run(tmp_path, doc)
    log = (tmp_path / "runs" / "export" / "logs" / "process-0.log").read_text()
    assert "resumed from checkpoint at generation 4" in log
    assert sorted(p.name for p in policies.iterdir()) == ["best", "generation-5", "generation-6"]
    best = read_policy(str(policies / "best"))
    assert (best.metadata["generation"], best.metadata["evalReturn"]) == (first_best, 1.0)
    returns = {row["generation"]: row["eval/return_mean"] for row in history(tmp_path, "export")}
    assert read_policy(str(policies / "generation-6")).metadata["evalReturn"] == returns[6]


def test_a_policy_records_the_brax_pipeline_its_env_ran():
    """A spec that names no pipeline runs Brax's default (generalized, on every platform);
    the export records the pipeline played, so a replay anywhere plays the same physics."""
    from evokube_trainer.runtime.config import RunConfig
    from evokube_trainer.runtime.trainer import _policy_exporter
    from evokube_trainer.workflows import ECConfig, EnvConfig, make_workflow

    for backend, played in ((None, "generalized"), ("spring", "spring")):
        env = EnvConfig("brax/hopper", episode_length=5, eval_episodes=1, backend=backend)
        config = ECConfig(env=env, pop_size=2, actor_hidden_sizes=(4,))
        run = RunConfig("hop", "ns", 0, config, 1, None, None, None, 1, 1, 1)
        exporter = _policy_exporter(run, make_workflow(config), "/tmp/unused", 0)
        assert exporter.metadata["environment"]["backend"] == played
