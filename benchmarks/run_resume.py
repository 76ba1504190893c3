"""`evokube run` stopped with Ctrl-C and run again, as a user at a terminal would: proof on a
new machine or accelerator that a run checkpoints where it was and the same command resumes
there (issue 23 ran it on a TPU chip).

    .venv/bin/python -m benchmarks.run_resume examples/pendulum-cemrl.yaml --after-rows 8

The command starts `evokube run MANIFEST` leading its own process group, waits until
history.jsonl has `--after-rows` rows, sends SIGINT to the group (what a terminal's Ctrl-C
does), then runs the same command to its end. It prints each life's exit code and wall time,
the generation the first reached, the checkpoints and policies on disk, and the trainer's own
start-up lines (device, programs compiled or loaded, checkpoint restored).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks._common import REPO
from evokube_contract import CHECKPOINTS_SUBDIR, HISTORY_FILE, POLICIES_SUBDIR
from evokube_trainer.laptop.curves import read_history

START_UP = re.compile(
    r"device\(s\) in all|started in|compiled the|loaded the compiled|resumed from|stopped at"
)


def start_run(manifest: Path, runs: Path) -> subprocess.Popen:
    """`evokube run` leading its own process group, as a shell runs a foreground command
    (a terminal's Ctrl-C signals that whole group)."""
    command = [sys.executable, "-m", "evokube_trainer.laptop.cli", "run", str(manifest)]
    return subprocess.Popen(
        [*command, "--runs-dir", str(runs)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def life(manifest: Path, runs: Path, history: Path, after_rows: int | None, timeout: float):
    """One `evokube run`; with `after_rows`, Ctrl-C once history.jsonl has that many rows."""
    started = time.monotonic()
    proc = start_run(manifest, runs)
    if after_rows:
        while proc.poll() is None and len(read_history(history)) < after_rows:
            if time.monotonic() - started > timeout:
                break
            time.sleep(0.5)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=timeout)
    return proc.returncode, time.monotonic() - started, out


def last_generation(history: Path) -> int | None:
    rows = read_history(history)
    return rows[-1]["generation"] if rows else None


def listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("manifest", type=Path)
    parser.add_argument("--after-rows", type=int, default=3, help="Ctrl-C after this many")
    parser.add_argument("--runs-dir", type=Path, help="default: a new temporary folder")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per life")
    args = parser.parse_args(argv)

    name = yaml.safe_load(args.manifest.read_text())["metadata"]["name"]
    runs = args.runs_dir or Path(tempfile.mkdtemp(prefix="run-resume-"))
    run = runs / name
    history = run / HISTORY_FILE
    logged = 0  # the process log's lines already shown (each life appends to it)
    for number, after_rows in ((1, args.after_rows), (2, None)):
        code, wall_s, out = life(args.manifest.resolve(), runs, history, after_rows, args.timeout)
        print(f"# life {number}: exit {code} after {wall_s:.1f} s", flush=True)
        print(f"  last generation in history.jsonl: {last_generation(history)}")
        print(f"  checkpoints: {listing(run / CHECKPOINTS_SUBDIR)}")
        print(f"  policies: {listing(run / POLICIES_SUBDIR)}")
        log = run / "logs" / "process-0.log"
        lines = log.read_text().splitlines() if log.exists() else out.splitlines()
        lines, logged = lines[logged:], len(lines)
        for line in lines:
            if START_UP.search(line):
                print(f"  | {line}")
        print("  command's last lines:")
        for line in out.strip().splitlines()[-4:]:
            print(f"  > {line}")


if __name__ == "__main__":
    main()
