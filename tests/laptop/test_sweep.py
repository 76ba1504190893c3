"""`evokube sweep` end to end: real local runs of a tiny sweep (two OpenES children of Pendulum),
K at a time, interrupted with Ctrl-C and resumed, with the summary and the curves."""

import json
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from evokube_trainer.laptop.curves import read_history
from evokube_trainer.runtime import exitcodes
from tests.cluster.controlplane import free_port, wait_until

REPO = Path(__file__).resolve().parents[2]


def tiny_sweep(tmp_path: Path, generations: list[int]) -> Path:
    """Two children differing in spec.stopping.maxGenerations; a checkpoint every generation."""
    doc = {
        "apiVersion": "evokube.io/v1alpha1",
        "kind": "ERLSweep",
        "metadata": {"name": "tiny"},
        "spec": {
            "template": {
                "spec": {
                    "image": "trainer:test",
                    "algorithm": {"name": "openes", "ec": {"noiseStd": 0.1}},
                    "environment": {"name": "gymnax/Pendulum-v1", "episodeLength": 50},
                    "policy": {"hiddenLayers": [8]},
                    "population": {"size": 8},
                    "evaluation": {"episodes": 1},
                    "stopping": {"maxGenerations": 1},
                    "checkpoint": {"intervalGenerations": 1},
                    "metricsPort": free_port(),
                }
            },
            "parameters": [{"path": "spec.stopping.maxGenerations", "values": generations}],
        },
    }
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def sweep(path: Path, *args: str) -> subprocess.Popen:
    command = [sys.executable, "-m", "evokube_trainer.laptop.cli", "sweep", str(path), *args]
    command += ["--out", str(path.parent / "out")]
    return subprocess.Popen(
        command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def finish(proc: subprocess.Popen) -> tuple[int, str]:
    out, _ = proc.communicate(timeout=600)
    return proc.returncode, out


def test_an_interrupted_sweep_resumes_skipping_the_finished_child(tmp_path):
    path = tiny_sweep(tmp_path, [1, 3])
    folder = tmp_path / "out" / "tiny"
    proc = sweep(path)
    # Ctrl-C the moment the sweep records its first child's end, a file it writes on purpose:
    # the second child has then not started, or is in its start-up (imports and compilation,
    # seconds), so it cannot have finished (a race while the signal waited on its start).
    outcome = folder / "tiny-0" / "outcome.json"
    wait_until(outcome.exists, 300, "the first child's outcome", interval=0.02)
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc)
    assert code == exitcodes.RETRIABLE, out
    assert "[end]   tiny-0: Succeeded" in out and "interrupted" in out, out
    assert "1 unfinished: rerun the same command to resume them" in out
    assert json.loads((folder / "tiny-0" / "outcome.json").read_text())["phase"] == "Succeeded"
    assert not (folder / "tiny-1" / "outcome.json").exists()

    code, out = finish(sweep(path))
    assert code == exitcodes.SUCCESS, out
    assert "[skip]  tiny-0: Succeeded earlier" in out and "[start] tiny-0" not in out
    assert "[start] tiny-1: stopping.maxGenerations=3" in out
    assert [r["generation"] for r in read_history(folder / "tiny-1" / "history.jsonl")] == [1, 2, 3]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["counts"] == {"Succeeded": 2} and summary["children"] == 2
    history = read_history(folder / "tiny-1" / "history.jsonl")
    final = summary["configurations"][1]["final"]
    assert final == {"mean": history[-1]["ec/fitness_max"], "interval": 0.0, "n": 1}
    best = max(c["best"]["mean"] for c in summary["configurations"])
    assert summary["bestConfiguration"]["best"]["mean"] == best
    assert "2 children: 2 Succeeded" in out and (folder / "curves.png").exists()


def test_children_run_side_by_side_with_parallel(tmp_path):
    path = tiny_sweep(tmp_path, [1, 2])
    code, out = finish(sweep(path, "--parallel", "2"))
    assert code == exitcodes.SUCCESS, out
    lines = [line for line in out.splitlines() if line.startswith("[")]
    assert [line.split()[0] for line in lines] == ["[start]", "[start]", "[end]", "[end]"], out
    for child in ("tiny-0", "tiny-1"):  # each in its own folder, its output in its log
        assert "done." in (tmp_path / "out" / "tiny" / child / "evokube-run.log").read_text()
