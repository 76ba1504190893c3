"""Which Brax physics pipeline a run plays, and that it says so where results live: a new run
gets Brax's own default on every platform, a resumed one keeps what its checkpoints were
trained on whatever the default says, and history.jsonl, the checkpoints' record, the exported
policies, status.result, the run_info metric and the first log line name it (issue 35)."""

import json
import logging
import urllib.request

from benchmarks._common import free_port
from evokube_trainer.policies import read_policy
from evokube_trainer.recorders import JsonLinesRecorder
from evokube_trainer.runtime import trainer
from evokube_trainer.runtime.checkpoints import Checkpointer
from evokube_trainer.runtime.config import RunConfig
from evokube_trainer.runtime.status import StatusReporter
from evokube_trainer.workflows import ECConfig, EnvConfig


def run_config(env: str = "brax/hopper", backend: str | None = None, generations: int = 1):
    """A tiny OpenES run: 2 members of a (4,) policy, 5-step episodes, checkpoints every
    generation."""
    env_config = EnvConfig(env, episode_length=5, eval_episodes=1, backend=backend)
    workflow = ECConfig(env=env_config, pop_size=2, actor_hidden_sizes=(4,))
    return RunConfig("hop", "ns", 0, workflow, generations, None, None, None, 1, 1, 3)


def test_a_new_run_gets_braxs_default_and_a_named_pipeline_is_kept_as_named():
    assert trainer.choose_pipeline(run_config(), None, None) == (
        "generalized",
        "Brax's default for this env; spec.environment.backend picks another",
    )
    named = run_config(backend="positional")
    assert trainer.choose_pipeline(named, None, None)[0] == "positional"
    # The spec wins over the checkpoints; gymnax has no pipeline at all.
    assert trainer.choose_pipeline(named, {"pipeline": "spring"}, None)[0] == "positional"
    assert trainer.choose_pipeline(run_config("gymnax/Pendulum-v1"), None, None) == (None, "")


def test_a_checkpoint_that_names_no_pipeline_keeps_what_its_policies_were_played_on(tmp_path):
    # No record of a pipeline and no exported policy: the default an older trainer had here
    # (spring on this CPU), not today's, so a resume does not switch physics under a run.
    assert trainer.choose_pipeline(run_config(), {}, str(tmp_path))[0] == "spring"
    assert trainer.choose_pipeline(run_config(), {"spec": {}}, None)[0] == "spring"


class QueuedStatus(StatusReporter):
    """The reporter's own fields, kept here instead of patched into an API server."""

    def __init__(self):
        self.queued: list[tuple[str, dict]] = []

    def _queue(self, field: str, value: dict) -> None:
        self.queued.append((field, value))

    def close(self, flush_timeout_s: float = 10.0) -> None:
        pass


def test_a_run_records_its_pipeline_and_a_resume_keeps_it(tmp_path, caplog):
    status = QueuedStatus()
    location = tmp_path / "run"
    history_file = tmp_path / "history.jsonl"
    port = free_port()

    # First life: spring, named by the spec.
    with (
        caplog.at_level(logging.INFO, logger=trainer.__name__),
        JsonLinesRecorder(history_file) as history,
    ):
        trainer.train(
            run_config(backend="spring"),
            checkpoint_dir=str(location),
            recorders=[history],
            metrics_port=port,
            status_reporter=status,
        )
    first_line = next(r.getMessage() for r in caplog.records if r.name == trainer.__name__)
    assert (
        first_line
        == "ns/hop: ECConfig on brax/hopper, physics pipeline spring (spec.environment.backend)"
    )
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics") as response:
        scraped = response.read().decode()
    run_info = next(line for line in scraped.splitlines() if line.startswith("evokube_run_info"))
    assert 'pipeline="spring"' in run_info
    assert [value["pipeline"] for field, value in status.queued if field == "result"] == ["spring"]
    checkpoints = Checkpointer(location / "checkpoints", interval=1, keep=3)
    assert checkpoints.newest_record()["pipeline"] == "spring"
    checkpoints.close()

    # Second life: the spec names none; the checkpoints' spring is kept, not Brax's default.
    caplog.clear()
    with (
        caplog.at_level(logging.INFO, logger=trainer.__name__),
        JsonLinesRecorder(history_file) as history,
    ):
        trainer.train(run_config(generations=2), checkpoint_dir=str(location), recorders=[history])
    assert "physics pipeline spring (kept from the checkpoints)" in caplog.text
    lines = [json.loads(line) for line in history_file.read_text().splitlines()]
    assert [(line["generation"], line["run"]) for line in lines] == [
        (1, {"pipeline": "spring"}),
        (2, {"pipeline": "spring"}),
    ]
    for folder in ("best", "generation-2"):
        policy = read_policy(str(location / "policies" / folder))
        assert policy.metadata["environment"]["backend"] == "spring"


def test_an_env_without_pipelines_records_none(tmp_path):
    history_file = tmp_path / "history.jsonl"
    with JsonLinesRecorder(history_file) as history:
        trainer.train(run_config("gymnax/Pendulum-v1"), checkpoint_dir=None, recorders=[history])
    (line,) = [json.loads(line) for line in history_file.read_text().splitlines()]
    assert "run" not in line
