"""SIGTERM during a generation longer than the grace period: the process does not wait for it.

Generations that are long against the grace period (spec.terminationGracePeriodSeconds, the
pod's) are each checkpointed as they complete; a SIGTERM during the
next one ends the process at once with exit 75, the last completed generation on disk.
"""

import os
import signal
import subprocess
import sys
import time

import yaml

from evokube_trainer.laptop.curves import read_history
from evokube_trainer.runtime import exitcodes
from tests.cluster.controlplane import wait_until
from tests.runtime.test_multihost import OPENES, REPO, experiment


def test_sigterm_during_a_long_generation_exits_at_once_with_the_last_one_saved(tmp_path):
    doc = experiment("slow", algorithm=OPENES, hosts=1, devices=1, generations=1000, interval=1000)
    # A generation of seconds on CPU: 256 policies of 256x256 units, 1000 steps each.
    doc["spec"]["population"]["size"] = 256
    doc["spec"]["policy"]["hiddenLayers"] = [256, 256]
    doc["spec"]["environment"]["episodeLength"] = 1000
    doc["spec"]["terminationGracePeriodSeconds"] = 1  # every generation is long against it
    run_dir = tmp_path / "runs" / "slow"
    run_dir.mkdir(parents=True)
    (run_dir / "experiment.yaml").write_text(yaml.safe_dump(doc))
    history = run_dir / "h.jsonl"
    env = {
        **os.environ,
        "EVOKUBE_MANIFEST": str(run_dir / "experiment.yaml"),
        "EVOKUBE_CHECKPOINT_DIR": str(run_dir),
        "EVOKUBE_HISTORY": str(history),
        "EVOKUBE_METRICS_PORT": "0",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "evokube_trainer.runtime.entrypoint"],
        env=env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    # Generation 1 includes compilation; from generation 2 on each is long, and saved.
    wait_until(lambda: len(read_history(history)) >= 2, 300, "generation 2")
    wait_until(lambda: len(read_history(history)) >= 3, 300, "generation 3")  # right after it
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    took = time.monotonic() - signalled
    assert proc.returncode == exitcodes.RETRIABLE, out
    rows = read_history(history)
    last = rows[-1]["generation"]
    saved = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert saved[-1] == last  # the last completed generation is on disk
    assert "checkpointing every generation while they stay this long" in out
    assert f"SIGTERM during generation {last + 1}: generation {last} is checkpointed" in out
    # It did not wait for the running generation (the old behaviour saved `last + 1`).
    assert took < rows[-1]["time/step_s"], (took, rows[-1]["time/step_s"])


# A process whose run is over and which is SIGTERMed again and again while Python shuts down
# (a pod deleted as the process ends): Python puts a handled SIGTERM back to its default late
# in its shutdown, while the objects of a large run are still being freed.
LATE_SIGTERMS = """
import os, subprocess, sys
from evokube_trainer.runtime.trainer import StopFlags

flags = StopFlags()
flags.install()
if sys.argv[1] == "settled":
    flags.settle()
heap = [[i] * 3 for i in range(2_000_000)]  # freed late in the shutdown
subprocess.Popen(["bash", "-c", f"while kill -TERM {os.getpid()}; do sleep 0.002; done"],
                 stderr=subprocess.DEVNULL)
sys.exit(75)
"""


def test_a_settled_run_keeps_its_exit_code_through_sigterms_during_shutdown():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(["trainer", "operator", "."])}
    ends = {
        how: subprocess.run(
            [sys.executable, "-c", LATE_SIGTERMS, how], cwd=REPO, env=env, timeout=120
        ).returncode
        for how in ("settled", "unsettled")
    }
    # Unsettled, the default SIGTERM kills it during shutdown: what a pod reported as 143.
    assert ends == {"settled": exitcodes.RETRIABLE, "unsettled": -signal.SIGTERM}
