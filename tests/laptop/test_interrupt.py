"""Ctrl-C on `evokube run` as a terminal sends it: SIGINT to the whole process group (the
command and its trainer processes), here twice as an impatient user would. The run checkpoints
the generation it reached, says so without a traceback, and the same command resumes there."""

import os
import signal
import subprocess
import time
from pathlib import Path

import yaml

from benchmarks.run_resume import start_run
from evokube_trainer.laptop.curves import read_history
from evokube_trainer.runtime import exitcodes
from tests.cluster.controlplane import free_port, wait_until


def ctrl_c_twice(proc: subprocess.Popen) -> tuple[int, str]:
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=300)
    return proc.returncode, out


def checkpointed(run: Path) -> list[int]:
    folder = run / "checkpoints"
    if not folder.exists():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit())


def test_ctrl_c_checkpoints_where_the_run_was_and_the_same_command_resumes_there(tmp_path):
    manifest = tmp_path / "long.yaml"
    manifest.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "evokube.io/v1alpha1",
                "kind": "ERLExperiment",
                "metadata": {"name": "long"},
                "spec": {
                    "image": "trainer:test",
                    "algorithm": {"name": "openes"},
                    "environment": {"name": "gymnax/Pendulum-v1", "episodeLength": 20},
                    "policy": {"hiddenLayers": [4]},
                    "population": {"size": 4},
                    "evaluation": {"episodes": 1},
                    "stopping": {"maxGenerations": 10_000_000},  # only Ctrl-C ends it
                    "checkpoint": {"intervalGenerations": 1_000_000},  # none but the last
                    "metricsPort": free_port(),
                },
            }
        )
    )
    run = tmp_path / "runs" / "long"
    history = run / "history.jsonl"

    proc = start_run(manifest, tmp_path / "runs")
    wait_until(lambda: history.exists() and read_history(history), 300, "a first generation")
    code, out = ctrl_c_twice(proc)
    assert code == exitcodes.RETRIABLE, out
    assert "interrupted: checkpointing" in out and "Traceback" not in out, out
    reached = read_history(history)[-1]["generation"]
    assert checkpointed(run) == [reached], out  # written on the interrupt, nothing lost

    proc = start_run(manifest, tmp_path / "runs")
    log = run / "logs" / "process-0.log"
    resumed = f"resumed from checkpoint at generation {reached}"
    wait_until(lambda: resumed in log.read_text(errors="replace"), 300, "the resume")
    wait_until(lambda: read_history(history)[-1]["generation"] > reached, 120, "new generations")
    code, out = ctrl_c_twice(proc)
    assert code == exitcodes.RETRIABLE and "Traceback" not in out, out
    generations = [row["generation"] for row in read_history(history)]
    assert generations == list(range(generations[0], generations[-1] + 1)), "a gap or a repeat"
    assert checkpointed(run)[-1] == generations[-1]
