"""The trainer on one accelerator chip, row by row: throughput, start-up, restarts, profile.

    .venv/bin/python -W ignore -m benchmarks.chip_bench                      # every row
    .venv/bin/python -W ignore -m benchmarks.chip_bench --rows openes-64 --generations 50

Runs on whatever JAX sees (a TPU chip, a GPU, or the CPU); benchmarks/README.md has the TPU
table; `versus_evorl.py` runs the same rows beside EvoRL in one run. The rows are issue 23's
workloads, configured as EvoRL's side of it was (actor (16, 16)
for OpenES; (256, 256) actor and twin critic without LayerNorm, batch 256, replay capacity 1M,
1000 random warm-up transitions from one env and TD3 updates of 2 critic steps per actor step
for the RL rows; no observation normalization; 10 evaluation episodes every generation in the
trainer lives, none in the throughput figures).

Per row, three new processes, each on the real trainer (`runtime.trainer.train`) with a
checkpoint directory as a pod has:

  first start    empty directory: spawn -> end of the first generation (import, device
                 start-up, init and warm-up, compilation, the generation and its evaluation);
  restart warm   the same directory (checkpoint, XLA cache, compiled programs): spawn -> end
                 of its first generation;
  restart cold   the checkpoint alone (cache and compiled programs deleted); this process then
                 also measures throughput and the profile below.

Throughput, after one untimed generation, both with the trainer's one compiled `Workflow.steps`
(after a trainer life, the executable that life wrote beside its checkpoint: not compiled twice):
"step" runs one generation per call and blocks on it (EvoRL's way of timing); "trainer" runs
chunks of generations per call, as `Workflow.learn` does in a pod (chunks of about a second).
"env steps/s" counts agent steps of the trainer column.

Profile (unless --no-profile): a `jax.profiler` trace of one generation, its device time
attributed to the generation's parts by their named scopes (`workflows.PARTS`); "host" is the
wall time the device was idle. On a platform whose trace has no device ops (the CPU), the
split is omitted. A TPU trace keeps about a million device ops, so a Brax generation's ends
inside its rollout ("traced_ops" in the row's report line; benchmarks/README.md scales it); its
parsing takes minutes, and a child past `--timeout` in it still reports its throughput.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks._common import (
    REPO,
    busiest,
    load,
    part_categories,
    print_busiest,
    print_header,
    print_row,
    traced,
)
from evokube_contract import EXECUTABLES_SUBDIR, XLA_CACHE_SUBDIR

ROWS = {
    "openes-64": "OpenES gymnax Pendulum-v1 T=200, pop 64, actor (16,16)",
    "openes-4096": "OpenES gymnax Pendulum-v1 T=200, pop 4096, actor (16,16)",
    "openes-halfcheetah": "OpenES brax halfcheetah T=200, pop 1024, actor (16,16)",
    "cemrl-halfcheetah": "CEM-RL brax halfcheetah T=200, pop 8, 4 TD3 actors, 128+64 steps",
    "erlga-halfcheetah": "ERL-GA brax halfcheetah T=200, pop 8 + 1 TD3 agent, 128+64 steps",
}


def workflow_config(row: str, backend: str | None):
    """The row's workflow configuration (see the module docstring)."""
    from evokube_trainer.agents import TD3Config
    from evokube_trainer.workflows import (
        CEMRLConfig,
        ECConfig,
        EnvConfig,
        ERLConfig,
        ReplayConfig,
    )

    env_name = "gymnax/Pendulum-v1" if "halfcheetah" not in row else "brax/halfcheetah"
    env = EnvConfig(env_name, episode_length=200, eval_episodes=10, backend=backend)
    if row.startswith("openes"):
        pop = {"openes-64": 64, "openes-4096": 4096, "openes-halfcheetah": 1024}[row]
        return ECConfig(env=env, pop_size=pop, optimizer="open_es", actor_hidden_sizes=(16, 16))
    td3 = TD3Config(actor_hidden_sizes=(256, 256), critic_hidden_sizes=(256, 256))
    replay = ReplayConfig(capacity=1_000_000, batch_size=256, warmup_steps=1000, warmup_envs=1)
    # TD3's actor steps every 2nd critic step: 128 critic steps, 64 actor steps.
    rl = dict(env=env, pop_size=8, agent=td3, updates_per_generation=128, replay=replay)
    if row == "cemrl-halfcheetah":
        return CEMRLConfig(**rl, optimizer="sep_cem", num_actors=4)
    return ERLConfig(**rl, optimizer="ga", optimizer_options={"num_elites": 2}, num_agents=1)


def run_config(row: str, backend: str | None, generations: int):
    from evokube_trainer.runtime.config import RunConfig

    return RunConfig(
        name=row,
        namespace="bench",
        seed=0,
        workflow=workflow_config(row, backend),
        max_generations=generations,
        max_env_steps=None,
        target_fitness=None,
        max_wall_clock_s=None,
        eval_interval=1,
        checkpoint_interval=1,
        checkpoint_keep=2,
    )


# -- child processes ------------------------------------------------------------------------


def child(args: argparse.Namespace) -> None:
    """One trainer life: train until `--stop-at`, then (with `--throughput`) measure."""
    from evokube_trainer.runtime import distributed

    opener = distributed.open_devices_in_background()  # as the pod's entrypoint does
    import jax

    from evokube_trainer.runtime.entrypoint import process_age_s
    from evokube_trainer.runtime.trainer import train

    # evokube's phases, timed (Orbax logs its every step at INFO: left out).
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", force=True)
    for handler in logging.getLogger().handlers:
        handler.addFilter(lambda r: r.name.startswith("evokube") or r.levelno >= logging.WARNING)
    imported = process_age_s()
    jax.devices()
    logging.getLogger("evokube.chip_bench").info(
        "imported %.1f s and devices open %.1f s after the process started",
        imported,
        process_age_s(),
    )
    first: list[float] = []

    class FirstGeneration:
        def write(self, generation: int, metrics) -> None:
            if not first:
                first.append(time.time())

        def close(self) -> None:
            pass

    if args.stop_at:  # 0: the throughput alone (--throughput-only)
        train(
            run_config(args.rows[0], args.backend, args.stop_at),
            checkpoint_dir=args.checkpoint_dir,
            recorders=[FirstGeneration()],
        )
    report = {"first_generation_at": first[0] if first else None}
    opener.join()
    if args.throughput:
        for measured in throughput(args.rows[0], args):
            report.update(measured)
            # A line per stage: a profile that outlives the timeout keeps the throughput.
            print(json.dumps(report), flush=True)
    else:
        print(json.dumps(report), flush=True)


def throughput(row: str, args: argparse.Namespace):
    """Yields the throughput figures, then (with --profile) the profile's."""
    import jax

    from evokube_trainer.runtime.executables import ExecutableStore, fingerprint
    from evokube_trainer.workflows import StopAt, env_steps_count, jit_workflow, make_workflow

    config = workflow_config(row, args.backend)
    workflow = make_workflow(config)
    fns = jit_workflow(workflow, donate=True)
    state = jax.block_until_ready(fns.init(jax.random.PRNGKey(0)))
    one = workflow.chunk_arguments(1, StopAt.of())
    steps = fns.steps
    if args.stop_at:  # the trainer's life just compiled this program: load it, not again
        executables = os.path.join(args.checkpoint_dir, EXECUTABLES_SUBDIR)
        steps = ExecutableStore(executables, fingerprint(config)).compiled(
            "steps", steps, state, *one
        )
    state, *_ = jax.block_until_ready(steps(state, *one))  # compiles; untimed
    times = []
    for _ in range(args.generations):  # one dispatch per generation, blocked on (EvoRL's way)
        start = time.perf_counter()
        state, *_ = jax.block_until_ready(steps(state, *one))
        times.append(time.perf_counter() - start)
    step_gen_s = sorted(times)[len(times) // 2]

    # Chunks of about a second, as the trainer sizes them (the same executable: count is traced).
    count = max(1, min(64, int(1.0 / step_gen_s)))
    arguments = workflow.chunk_arguments(count, StopAt.of())
    generations = 0
    before = int(env_steps_count(state))
    start = time.perf_counter()
    while generations < args.generations:
        state, _, done, _ = steps(state, *arguments)
        generations += int(done)  # syncs, as the trainer's fetch of the metrics does
    elapsed = time.perf_counter() - start
    env_steps = int(env_steps_count(state)) - before
    yield {
        "step_gen_per_s": 1.0 / step_gen_s,
        "trainer_gen_per_s": generations / elapsed,
        "env_steps_per_s": env_steps / elapsed,
        "chunk": count,
        "platform": jax.devices()[0].platform,
        "device_kind": jax.devices()[0].device_kind,
        "parts_ms": None,
        "busiest": None,
    }
    if args.profile:
        # One generation: a Brax generation alone is millions of traced kernels.
        started = time.perf_counter()
        _, ops, traced_s = traced(lambda: steps(state, *one))
        yield {
            "parts_ms": profile_parts(ops, traced_s),
            "busiest": busiest(ops),
            "traced_ops": len(ops or ()),
            "profile_s": time.perf_counter() - started,
        }


def profile_parts(ops: list[dict] | None, wall_s: float) -> dict | None:
    """Device milliseconds of one generation by part (`workflows.PARTS`), "other device" for
    ops outside them and "host" for the rest of the wall time; None without device ops."""
    if not ops:
        return None
    spent = {part: sum(ms.values()) for part, ms in part_categories(ops).items()}
    spent["host"] = max(0.0, wall_s * 1e3 - sum(spent.values()))
    return dict(spent)


# -- the parent ------------------------------------------------------------------------------


def spawn(row: str, directory: str, stop_at: int, args, throughput: bool = False) -> dict:
    """A child trainer; returns its report with `spawn_to_first_s`."""
    command = [
        sys.executable,
        "-W",
        "ignore",
        "-m",
        __spec__.name,
        "--child",
        "--rows",
        row,
        "--checkpoint-dir",
        directory,
        "--stop-at",
        str(stop_at),
        "--generations",
        str(args.generations),
    ]
    command += ["--backend", args.backend] if args.backend else []
    command += ["--throughput"] if throughput else []
    command += [] if args.profile else ["--no-profile"]
    logs = args.logs or tempfile.gettempdir()
    os.makedirs(logs, exist_ok=True)
    log = os.path.join(logs, f"chip-bench-{row}-{stop_at}.log")
    spawned = time.time()
    with open(log, "w") as stderr:  # kept: a child that times out still shows where it was
        try:
            done = subprocess.run(
                command,
                cwd=REPO,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                timeout=args.timeout,
            )
        except subprocess.TimeoutExpired as late:
            # Its throughput line, if it got that far, is still a measurement.
            printed = late.stdout or ""
            if isinstance(printed, bytes):  # a timeout's partial output comes undecoded
                printed = printed.decode()
            if not throughput or not printed.strip():
                raise
            print(f"# {row}: timed out after {args.timeout} s; its last report kept", flush=True)
            done = subprocess.CompletedProcess(command, 0, printed, "")
    if done.returncode:
        raise RuntimeError(f"{row} exited {done.returncode}; its log: {log}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    first = report["first_generation_at"]
    report["spawn_to_first_s"] = None if first is None else first - spawned
    print(f"# {row}, life {stop_at}: {json.dumps(report)}", flush=True)
    return report


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--generations", type=int, default=20, help="timed generations")
    parser.add_argument("--backend", help="Brax pipeline (default: the trainer's choice)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per process")
    parser.add_argument("--logs", help="folder for the children's logs (default: the temp folder)")
    parser.add_argument(
        "--no-restarts",
        action="store_true",
        help="one process a row: its first start, then throughput (no restart columns)",
    )
    parser.add_argument(
        "--throughput-only",
        action="store_true",
        help="one process a row, throughput alone: no trainer life, no restart columns",
    )
    parser.add_argument(
        "--no-profile",
        dest="profile",
        action="store_false",
        help="skip the jax.profiler trace of one generation",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--throughput", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint-dir", help=argparse.SUPPRESS)
    parser.add_argument("--stop-at", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return

    print(f"# {os.cpu_count()} CPUs; load average at start {load():.2f}", flush=True)
    results = {}
    for row in args.rows:
        directory = tempfile.mkdtemp(prefix=f"chip-bench-{row}-")
        try:
            if args.throughput_only:
                first = warm = cold = spawn(row, directory, 0, args, throughput=True)
            elif args.no_restarts:
                first = warm = cold = spawn(row, directory, 1, args, throughput=True)
            else:
                first = spawn(row, directory, 1, args)
                warm = spawn(row, directory, 2, args)
                for cached in (XLA_CACHE_SUBDIR, EXECUTABLES_SUBDIR):
                    shutil.rmtree(os.path.join(directory, cached), ignore_errors=True)
                cold = spawn(row, directory, 3, args, throughput=True)
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        results[row] = (first, warm, cold)

    print_header(
        "workload",
        "step gen/s",
        "trainer gen/s",
        "env steps/s",
        "spawn -> first gen s",
        "restart cold s",
        "restart warm s",
        "cold / warm",
    )
    for row, (first, warm, cold) in results.items():
        restarts = ["-"] * 3
        if warm is not cold:
            restarts = [
                f"{cold['spawn_to_first_s']:.1f}",
                f"{warm['spawn_to_first_s']:.1f}",
                f"{cold['spawn_to_first_s'] / warm['spawn_to_first_s']:.1f}x",
            ]
        print_row(
            ROWS[row],
            f"{cold['step_gen_per_s']:.3g}",
            f"{cold['trainer_gen_per_s']:.3g}",
            f"{cold['env_steps_per_s']:,.0f}",
            "-" if first["spawn_to_first_s"] is None else f"{first['spawn_to_first_s']:.1f}",
            *restarts,
        )
    print()
    print("Where a generation's time goes (ms per generation, from a jax.profiler trace):")
    columns = ["ask", "rl_update", "rollout", "replay_add", "merge", "tell", "other device", "host"]
    print_header("workload", "chunk", *columns)
    for row, (_, _, cold) in results.items():
        parts = cold["parts_ms"]
        cells = [f"{parts.get(c, 0.0):.2f}" for c in columns] if parts else ["-"] * len(columns)
        print_row(ROWS[row], cold["chunk"], *cells)
    for row, (_, _, cold) in results.items():
        if cold["busiest"]:
            print_busiest(row, cold["busiest"])
    print(f"# load average at end {load():.2f}")


if __name__ == "__main__":
    main()
