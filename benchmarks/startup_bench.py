"""Start-up: time to the first generation when a trainer restarts, cold and with a warm XLA cache.

    .venv/bin/python -W ignore -m benchmarks.startup_bench                  # Pendulum, 3 algos
    .venv/bin/python -W ignore -m benchmarks.startup_bench --envs halfcheetah --warm-runs 1

Every run is a new Python process that calls the trainer's own `runtime.trainer.train` with a
checkpoint directory, as a pod does (the persistent compilation cache lives in
`<checkpoints>/xla-cache`, exactly as in a pod). Per configuration:

  first start   no checkpoint, empty cache: init (network init + replay warm-up) and the first
                generation, everything compiled; it stops after generation 1 and checkpoints it;
  restart cold  the checkpoint of generation 1, an empty cache: what a restart costs without
                the compilation cache (restore, then trace and compile the generation);
  restart warm  the same checkpoint and the cache the first start filled (`--warm-runs` times).

Columns, each measured from the moment the process started:

  import s     importing jax, the envs and the trainer,
  to gen 1 s   until the first generation of this process has finished (restore or init,
               compilation, evaluation and the generation itself),
  gen s        one more generation with nothing to compile: what a generation costs to run,
  start-up s   to gen 1 minus gen: the time before the first generation could start running
               (the target compares this between cold and warm restarts),
  peak RSS     the process's peak resident memory (ru_maxrss), whole run.

A second table splits compile-related time by jax.monitoring events (tracing, lowering to
MLIR, XLA compilation, loading from the cache). Configurations are trainer_bench.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import tempfile
import time

START = time.perf_counter()
from benchmarks._common import (  # noqa: E402
    child_command,
    load,
    print_header,
    print_row,
    run_children,
)
from benchmarks.config_flags import add_config_arguments, config_arguments  # noqa: E402
from evokube_contract import (  # noqa: E402
    CHECKPOINTS_SUBDIR,
    EXECUTABLES_SUBDIR,
    XLA_CACHE_SUBDIR,
)

# jax.monitoring duration events -> where compile-related time went (seconds, summed).
EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace_s",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
    "/jax/core/compile/backend_compile_duration": "xla_s",
    "/jax/compilation_cache/cache_retrieval_time_sec": "cache_load_s",
}


def child(args: argparse.Namespace) -> None:
    from evokube_trainer.runtime import distributed

    opener = distributed.open_devices_in_background()  # as the pod's entrypoint does
    import jax

    from benchmarks.trainer_bench import build_config
    from evokube_trainer.runtime.config import RunConfig
    from evokube_trainer.runtime.trainer import train

    imported = time.perf_counter()
    spent = dict.fromkeys(EVENTS.values(), 0.0)

    def listen(event: str, duration: float, **_) -> None:
        if event in EVENTS:
            spent[EVENTS[event]] += duration

    jax.monitoring.register_event_duration_secs_listener(listen)
    finished: list[tuple[float, float]] = []  # (time since start, the generation's step_s)

    class Clock:
        def write(self, generation: int, metrics) -> None:
            finished.append((time.perf_counter() - START, metrics["time/step_s"]))

    config = RunConfig(
        name="startup-bench",
        namespace="bench",
        seed=0,
        workflow=build_config(args.algo, args.env, args),
        max_generations=args.stop_at,
        max_env_steps=None,
        target_fitness=None,
        max_wall_clock_s=None,
        eval_interval=1,  # the manifest's default
        checkpoint_interval=10,  # the manifest's default
        checkpoint_keep=3,
    )
    train(config, checkpoint_dir=args.checkpoint_dir, recorders=[Clock()])
    first = finished[0][0]
    gen = finished[1][1] if len(finished) > 1 else 0.0
    opener.join()
    print(
        json.dumps(
            {
                "import_s": imported - START,
                "first_s": first,
                "gen_s": gen,
                "startup_s": first - gen,
                **spent,
                "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


def run_child(algo: str, env: str, checkpoint_dir: str, stop_at: int, args) -> dict:
    command = child_command(
        __spec__.name,
        "--algos",
        algo,
        "--envs",
        env,
        "--checkpoint-dir",
        checkpoint_dir,
        "--stop-at",
        str(stop_at),
        *config_arguments(args),
    )
    return run_children([command])


def restart(algo: str, env: str, workdir: str, saved: str, cache: bool, args) -> dict:
    """A new process resuming from the first start's checkpoint in the same directory (XLA's
    cache keys include the cache's path), with or without the first start's compilations (the
    XLA cache and the compiled programs)."""
    shutil.rmtree(workdir)
    shutil.copytree(
        os.path.join(saved, CHECKPOINTS_SUBDIR), os.path.join(workdir, CHECKPOINTS_SUBDIR)
    )
    if cache:
        for compiled in (XLA_CACHE_SUBDIR, EXECUTABLES_SUBDIR):
            shutil.copytree(os.path.join(saved, compiled), os.path.join(workdir, compiled))
    return run_child(algo, env, workdir, 3, args)  # resumes at 1, runs 2 and 3


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", nargs="+", default=["pendulum"])
    parser.add_argument("--algos", nargs="+", default=["cemrl", "erl", "openes"])
    parser.add_argument("--warm-runs", type=int, default=2)
    add_config_arguments(parser)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint-dir", help=argparse.SUPPRESS)
    parser.add_argument("--stop-at", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.algo, args.env = args.algos[0], args.envs[0]
        child(args)
        return

    print(f"# {os.cpu_count()} CPUs; load average at start {load():.2f}")
    print_header(
        "algorithm",
        "env",
        "run",
        "import s",
        "to gen 1 s",
        "gen s",
        "start-up s",
        "start-up vs cold restart",
        "peak RSS MiB",
        "load",
    )
    breakdown = []
    for env in args.envs:
        for algo in args.algos:
            workdir = tempfile.mkdtemp(prefix="evokube-startup-")
            saved = tempfile.mkdtemp(prefix="evokube-first-start-")
            try:
                runs = [("first start", run_child(algo, env, workdir, 1, args))]
                shutil.copytree(workdir, saved, dirs_exist_ok=True)
                runs.append(("restart cold", restart(algo, env, workdir, saved, False, args)))
                runs += [
                    (f"restart warm {i + 1}", restart(algo, env, workdir, saved, True, args))
                    for i in range(args.warm_runs)
                ]
            finally:
                shutil.rmtree(workdir, ignore_errors=True)
                shutil.rmtree(saved, ignore_errors=True)
            cold = runs[1][1]
            for label, r in runs:
                breakdown.append((algo, env, label, r))
                speed = f"{cold['startup_s'] / r['startup_s']:.1f}x" if "warm" in label else ""
                gen = f"{r['gen_s']:.2f}" if r["gen_s"] else "-"
                print_row(
                    algo,
                    env,
                    label,
                    f"{r['import_s']:.1f}",
                    f"{r['first_s']:.1f}",
                    gen,
                    f"{r['startup_s']:.1f}",
                    speed,
                    f"{r['maxrss_mib']:.0f}",
                    f"{load():.2f}",
                )
    print()
    print("Where compile-related time went (jax.monitoring events, whole run, seconds):")
    print_header(
        "algorithm", "env", "run", "trace s", "lower to MLIR s", "XLA compile s", "cache load s"
    )
    for algo, env, label, r in breakdown:
        print_row(
            algo,
            env,
            label,
            f"{r['trace_s']:.1f}",
            f"{r['lower_s']:.1f}",
            f"{r['xla_s']:.1f}",
            f"{r['cache_load_s']:.1f}",
        )
    print(f"# load average at end {load():.2f}")


if __name__ == "__main__":
    main()
