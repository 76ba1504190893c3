"""`evokube run`: a manifest on this machine, as N local processes wired like pods.

Each process gets exactly the environment the operator gives a pod
(JAX_COORDINATOR_ADDRESS on 127.0.0.1, JAX_NUM_PROCESSES, JAX_PROCESS_ID,
EVOKUBE_CHECKPOINT_DIR, ...), so a laptop run exercises the multi-host code
path; with `slices`, the processes are numbered within their slice and get the
slice variables (MEGASCALE_NUM_SLICES, MEGASCALE_SLICE_ID) a multislice gang's
pods get. Everything lands under runs/<name>/: logs, checkpoints, history.jsonl,
TensorBoard's tensorboard/, history.csv, learning-curve.png and the exported
policies (policies/best/ and policies/generation-<N>/, as beside a cluster run's
checkpoints). Rerunning
resumes from the newest checkpoint.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, TextIO

import yaml

import evokube_contract as contract
from evokube_trainer import metric_names as names
from evokube_trainer.laptop.curves import plot_learning_curve, read_history
from evokube_trainer.runtime import exitcodes, folders
from evokube_trainer.runtime.objectstore import is_url

# After SIGTERM, how long processes get to checkpoint before SIGKILL, unless the spec's
# terminationGracePeriodSeconds says otherwise (the trainer plans with the same number).
GRACE_S = 30.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the metrics server does
    try:
        sock.bind(("127.0.0.1", port))
        sock.listen()
    except OSError:
        sock.close()
        raise
    return sock


def _metrics_sockets(first: int, processes: int) -> list[socket.socket] | None:
    """A listening socket per process for its /metrics, on `first` and up where free, else
    on a port the system picks. Bound here and inherited by the process, so that two runs
    started together (`evokube sweep --parallel`) cannot both find a port free and then
    race to bind it. None where this machine lets no program open a network socket (some
    sandboxes): the run goes on without /metrics."""
    sockets: list[socket.socket] = []
    try:
        for port in range(first, first + processes):
            try:
                sockets.append(_listening(port))
            except OSError as err:
                if err.errno != errno.EADDRINUSE:
                    raise
                sockets.append(_listening(0))
    except OSError as err:
        for sock in sockets:
            sock.close()
        if err.errno in (errno.EAFNOSUPPORT, errno.EPERM, errno.EACCES):
            return None
        raise
    return sockets


def checkpoint_dir(manifest: Mapping[str, Any], run_dir: Path) -> str:
    """Where a local run's checkpoints, XLA cache and policies go. A bucket location is
    honoured; a path is not: everything of a local run stays in its run folder."""
    location = (manifest["spec"].get("checkpoint") or {}).get("location") or ""
    return location if is_url(location) else str(run_dir)


def best_policy(location: str) -> str | None:
    """'<folder> (evaluation return R at generation N)' for the best policy the run at
    `location` exported, or None when there is none (or it cannot be read)."""
    import fsspec

    from evokube_trainer.policies import BEST, METADATA_FILE

    folder = f"{location.rstrip('/')}/{contract.POLICIES_SUBDIR}/{BEST}"
    try:
        fs, path = fsspec.core.url_to_fs(folder)
        metadata = json.loads(fs.cat_file(f"{path}/{METADATA_FILE}"))
    except OSError:
        return None
    score, generation = metadata["evalReturn"], metadata["generation"]
    return f"{folder} (evaluation return {score:.6g} at generation {generation})"


def process_env(
    manifest: Mapping[str, Any],
    run_dir: Path,
    processes: int,
    process_id: int,
    coordinator_port: int | None,
    metrics: socket.socket | None,
    slices: int = 1,
) -> dict[str, str]:
    """The environment of local process `process_id`: what the operator sets in a pod (the
    experiment's name and namespace are the manifest's, as in a pod). Of the slice variables
    only those the trainer reads: on CPU every collective, between slices too, goes through the
    one jax.distributed group (libtpu's coordinator of the slices has nothing to do)."""
    spec = manifest["spec"]
    env = {
        **os.environ,
        contract.ENV_MANIFEST: str(run_dir / contract.MANIFEST_FILE),
        contract.ENV_CHECKPOINT_DIR: checkpoint_dir(manifest, run_dir),
        contract.ENV_HISTORY: str(run_dir / contract.HISTORY_FILE),
        "PYTHONUNBUFFERED": "1",
    }
    if metrics is not None:
        env[contract.ENV_METRICS_PORT] = str(metrics.getsockname()[1])
        env[contract.ENV_METRICS_FD] = str(metrics.fileno())
    if processes > 1:
        env[contract.ENV_COORDINATOR] = f"127.0.0.1:{coordinator_port}"
        env[contract.ENV_NUM_PROCESSES] = str(processes)
        # Within its slice, as a multislice pod's completion index.
        env[contract.ENV_PROCESS_ID] = str(process_id % (processes // slices))
    if slices > 1:
        env[contract.ENV_MEGASCALE_NUM_SLICES] = str(slices)
        env[contract.ENV_MEGASCALE_SLICE_ID] = str(process_id // (processes // slices))
    devices = spec["accelerator"]["devicesPerHost"]
    if devices > 1:
        flags = env.get(contract.ENV_XLA_FLAGS, "")
        flags = f"{flags} --xla_force_host_platform_device_count={devices}".strip()
        env[contract.ENV_XLA_FLAGS] = flags
    return env


class Progress:
    """Follows history.jsonl and prints one line per generation."""

    def __init__(self, path: Path, max_generations: int | None, out: TextIO):
        self.path, self.max_generations, self.out = path, max_generations, out
        self._offset = path.stat().st_size if path.exists() else 0
        self._started = time.monotonic()
        self._first_gen: int | None = None
        self.last: dict | None = None

    def poll(self) -> None:
        if not self.path.exists():
            return
        with self.path.open() as f:
            f.seek(self._offset)
            for line in f:
                if not line.endswith("\n"):
                    break
                self._offset += len(line)
                self._show(json.loads(line))

    def _show(self, record: dict) -> None:
        metrics = record["metrics"]
        generation = int(record["generation"])
        if self._first_gen is None:
            self._first_gen = generation - 1
            pipeline = record.get("run", {}).get("pipeline")
            if pipeline:  # the physics this run's returns belong to
                print(f"physics pipeline: {pipeline}", file=self.out, flush=True)
        self.last = metrics
        elapsed = time.monotonic() - self._started
        done = generation - self._first_gen
        eta = ""
        if self.max_generations and done > 0:
            remaining = (self.max_generations - generation) * elapsed / done
            eta = f"  ETA {remaining:5.0f}s"
        best = metrics.get(names.BEST_FITNESS, float("nan"))
        evaluation = metrics.get(names.EVAL_RETURN)
        eval_text = f"  eval {evaluation:9.2f}" if isinstance(evaluation, float) else ""
        total = f"/{self.max_generations}" if self.max_generations else ""
        print(
            f"gen {generation:5d}{total}  best {best:9.2f}{eval_text}  "
            f"env steps {int(metrics['env_steps']):>10,}  "
            f"{metrics.get(names.ENV_STEPS_PER_S, 0):>9,.0f} steps/s{eta}",
            file=self.out,
            flush=True,
        )


def write_reports(run_dir: Path) -> list[Path]:
    """history.csv and learning-curve.png from history.jsonl."""
    rows = read_history(run_dir / contract.HISTORY_FILE)
    if not rows:
        return []
    columns = sorted({k for row in rows for k in row}, key=lambda k: (k != "generation", k))
    csv_path = run_dir / "history.csv"
    with csv_path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return [csv_path, plot_learning_curve(rows, run_dir.name, run_dir / "learning-curve.png")]


@contextlib.contextmanager
def interrupts_ignored() -> Iterator[None]:
    """Ctrl-C again (or a terminal's signal sent twice) while the trainers checkpoint would
    abandon them mid-save; the stop is bounded by its grace period, so wait it out."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _stop(procs: list[subprocess.Popen], grace_s: float = GRACE_S) -> None:
    """SIGTERM (they checkpoint and exit), then SIGKILL whatever outlives `grace_s`."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, deadline - time.monotonic()))
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_locally(
    manifest: Mapping[str, Any],
    *,
    processes: int,
    slices: int = 1,
    runs_root: Path = Path("runs"),
    out: TextIO = sys.stdout,
) -> int:
    """Run a validated manifest with `processes` local processes in `slices` equal slices;
    returns the exit code."""
    name = manifest["metadata"]["name"]
    run_dir = (runs_root / name).resolve()
    try:
        folders.prepare(run_dir / "logs")
        (run_dir / contract.MANIFEST_FILE).write_text(
            yaml.safe_dump(dict(manifest), sort_keys=False)
        )
    except OSError as err:
        print(f"error: --runs-dir {runs_root}: {folders.describe(run_dir, err)}", file=sys.stderr)
        return exitcodes.PERMANENT
    spec = manifest["spec"]
    # One process needs no coordinator (nor a socket: jax.distributed stays off).
    coordinator = _free_port() if processes > 1 else None
    metrics = _metrics_sockets(spec["metricsPort"], processes)
    print(
        f"evokube run: {name}: {spec['algorithm']['name']} on {spec['environment']['name']}, "
        f"population {spec['population']['size']}, {processes} process(es)"
        + (f" in {slices} slices" if slices > 1 else ""),
        file=out,
    )
    print(f"  run folder: {run_dir}", file=out)
    location = (spec.get("checkpoint") or {}).get("location") or ""
    board = f"{location if is_url(location) else run_dir}/{contract.TENSORBOARD_SUBDIR}"
    print(f"  curves:     tensorboard --logdir {board}", file=out)
    if metrics is None:
        print("  metrics:    off (this machine opens no network socket)", file=out, flush=True)
        metrics = metrics_ports = [None] * processes
    else:
        metrics_ports = [sock.getsockname()[1] for sock in metrics]
        print(
            "  metrics:    " + ", ".join(f"http://127.0.0.1:{p}/metrics" for p in metrics_ports),
            file=out,
            flush=True,
        )

    progress = Progress(
        run_dir / contract.HISTORY_FILE, spec["stopping"].get("maxGenerations"), out
    )
    procs = []
    try:
        for i, sock in enumerate(metrics):
            with (run_dir / "logs" / f"process-{i}.log").open("ab") as log:
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "evokube_trainer.runtime.entrypoint"],
                        env=process_env(manifest, run_dir, processes, i, coordinator, sock, slices),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        pass_fds=() if sock is None else (sock.fileno(),),
                    )
                )
    finally:
        for sock in metrics:
            if sock is not None:
                sock.close()  # each process holds its own copy now
    (run_dir / "processes.json").write_text(
        json.dumps(
            [
                {"pid": p.pid, "metrics_port": port}
                for p, port in zip(procs, metrics_ports, strict=True)
            ]
        )
    )
    with contextlib.ExitStack() as after_interrupt:
        try:
            while True:
                states = [p.poll() for p in procs]  # poll every one: any() would stop early
                progress.poll()
                if all(code is not None for code in states):
                    break
                if any(code not in (None, 0) for code in states):
                    # The survivors cannot checkpoint without the lost peer (saves are
                    # collective) and would wait for it until the heartbeat timeout.
                    _stop(procs, grace_s=0)
                    break
                time.sleep(0.5)
        except KeyboardInterrupt:
            # Ctrl-C again, until the command ends, is waited out: the trainers' saves and
            # this command's reports finish.
            after_interrupt.enter_context(interrupts_ignored())
            print("\ninterrupted: checkpointing (rerun the same command to resume)", file=out)
            _stop(procs, spec.get("terminationGracePeriodSeconds", GRACE_S))
        progress.poll()
        return _outcome(procs, manifest, run_dir, out)


def _outcome(
    procs: list[subprocess.Popen], manifest: Mapping[str, Any], run_dir: Path, out: TextIO
) -> int:
    """Once every process has ended: the reports, and the run's exit code with what ended it."""
    codes = [p.wait() for p in procs]
    reports = write_reports(run_dir)
    if all(code == 0 for code in codes):
        print(f"done. {', '.join(str(p) for p in reports)}", file=out)
        best = best_policy(checkpoint_dir(manifest, run_dir))
        if best is not None:
            print(f"best policy: {best}", file=out)
        return exitcodes.SUCCESS
    worst = next(c for c in codes if c != 0)
    failed_id = codes.index(worst)
    tail = (run_dir / "logs" / f"process-{failed_id}.log").read_text(errors="replace")
    tail = "\n".join(tail.splitlines()[-15:])
    print(f"process {failed_id} exited with code {worst}; its log ends:\n{tail}", file=out)
    if worst == exitcodes.RETRIABLE or worst < 0:
        print("rerun the same command to resume from the newest checkpoint", file=out)
    return worst if worst > 0 else exitcodes.RETRIABLE
