"""Start-up: time to the first generation in a fresh process, cold and with a warm XLA cache.

    .venv/bin/python -W ignore benchmarks/startup_bench.py                  # Pendulum, 3 algos
    .venv/bin/python -W ignore benchmarks/startup_bench.py --envs halfcheetah --warm-runs 1

For each configuration the script starts a new Python process (a "restart") that turns on the
persistent compilation cache exactly as the trainer does (`enable_compilation_cache`), builds the
workflow, jits it with `jit_workflow`, runs `init` and the first generation and reports, from
the moment the process started:

  import s   importing jax and evokube (the same cold or warm),
  build s    make_workflow + jit_workflow (no compilation yet),
  init s     the jitted init (network init + replay warm-up), compilation included,
  gen 1 s    the first generation, compilation included,
  gen 2 s    the second generation: what one generation costs to run, nothing compiled,
  total s    process start to the end of the first generation,
  start-up s total minus gen 2: the time before the first generation could start running,
  peak RSS   the process's peak resident memory (ru_maxrss), the whole run.

The first run uses an empty cache directory (cold); the next `--warm-runs` reuse it (warm).
"speed-up" divides the cold figure by the warm one. The target is on start-up: a
generation's own run time is the same cold or warm. Configurations are trainer_bench.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

START = time.perf_counter()
# jax.monitoring duration events -> where compile-related time went (seconds, summed).
EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "trace_s",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
    "/jax/core/compile/backend_compile_duration": "xla_s",
    "/jax/compilation_cache/cache_retrieval_time_sec": "cache_load_s",
}


def child(args: argparse.Namespace) -> None:
    import jax

    sys.path.insert(0, os.path.dirname(__file__))
    from trainer_bench import build_config

    from evokube_trainer.runtime.checkpoints import enable_compilation_cache
    from evokube_trainer.workflows import jit_workflow, make_workflow

    imported = time.perf_counter()
    spent = dict.fromkeys(EVENTS.values(), 0.0)

    def listen(event: str, duration: float, **_) -> None:
        if event in EVENTS:
            spent[EVENTS[event]] += duration

    jax.monitoring.register_event_duration_secs_listener(listen)
    enable_compilation_cache(args.cache_dir)
    config = build_config(args.algo, args.env, args)
    fns = jit_workflow(make_workflow(config))
    built = time.perf_counter()
    state = jax.block_until_ready(fns.init(jax.random.PRNGKey(0)))
    initialized = time.perf_counter()
    state, _ = jax.block_until_ready(fns.step(state))
    stepped = time.perf_counter()
    jax.block_until_ready(fns.step(state))
    second = time.perf_counter() - stepped
    print(
        json.dumps(
            {
                "import_s": imported - START,
                "build_s": built - imported,
                "init_s": initialized - built,
                "gen1_s": stepped - initialized,
                "total_s": stepped - START,
                "gen2_s": second,
                "startup_s": stepped - START - second,
                **spent,
                "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


def run_child(algo: str, env: str, cache_dir: str, args: argparse.Namespace) -> dict:
    command = [
        sys.executable,
        "-W",
        "ignore",
        __file__,
        "--child",
        "--algos",
        algo,
        "--envs",
        env,
        "--cache-dir",
        cache_dir,
        "--updates",
        str(args.updates),
        "--replay-capacity",
        str(args.replay_capacity),
    ]
    wall = time.perf_counter()
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    row = json.loads(out.strip().splitlines()[-1])
    row["wall_s"] = time.perf_counter() - wall
    return row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--envs", nargs="+", default=["pendulum"])
    parser.add_argument("--algos", nargs="+", default=["cemrl", "erl", "openes"])
    parser.add_argument("--warm-runs", type=int, default=2)
    parser.add_argument("--updates", type=int, default=256, help="TD3 steps per generation")
    parser.add_argument("--replay-capacity", type=int, default=200_000)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cache-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        # The child needs trainer_bench's flags; fill in its defaults.
        args.algo, args.env = args.algos[0], args.envs[0]
        args.episode_length, args.es_pop_size, args.rl_pop_size = None, 32, 10
        args.erl_agents, args.hidden = 1, [256, 256]
        child(args)
        return

    print(f"# {os.cpu_count()} CPUs; load average at start {os.getloadavg()[0]:.2f}")
    print(
        "| algorithm | env | run | import s | build s | init s | gen 1 s | gen 2 s | total s "
        "| start-up s | speed-up start-up | speed-up total | peak RSS MiB | load |"
    )
    print("|" + "---|" * 14)
    breakdown = []
    for env in args.envs:
        for algo in args.algos:
            cache_dir = tempfile.mkdtemp(prefix="evokube-xla-cache-")
            try:
                runs = [run_child(algo, env, cache_dir, args)]
                runs += [run_child(algo, env, cache_dir, args) for _ in range(args.warm_runs)]
            finally:
                shutil.rmtree(cache_dir, ignore_errors=True)
            cold, warm = runs[0], runs[1:]
            for index, r in enumerate(runs):
                label = "cold" if index == 0 else f"warm {index}"
                breakdown.append((algo, env, label, r))
                speed = "| | |"
                if index > 0:
                    speed = (
                        f"| {cold['startup_s'] / r['startup_s']:.1f}x "
                        f"| {cold['total_s'] / r['total_s']:.1f}x |"
                    )
                print(
                    f"| {algo} | {env} | {label} | {r['import_s']:.1f} | {r['build_s']:.1f} "
                    f"| {r['init_s']:.1f} | {r['gen1_s']:.1f} | {r['gen2_s']:.1f} "
                    f"| {r['total_s']:.1f} | {r['startup_s']:.1f} {speed} "
                    f"{r['maxrss_mib']:.0f} | {os.getloadavg()[0]:.2f} |",
                    flush=True,
                )
            del warm
    print()
    print("Where compile-related time went (jax.monitoring events, whole run, seconds):")
    print("| algorithm | env | run | trace s | lower to MLIR s | XLA compile s | cache load s |")
    print("|" + "---|" * 7)
    for algo, env, label, r in breakdown:
        print(
            f"| {algo} | {env} | {label} | {r.get('trace_s', 0):.1f} | {r.get('lower_s', 0):.1f} "
            f"| {r.get('xla_s', 0):.1f} | {r.get('cache_load_s', 0):.1f} |"
        )
    print(f"# load average at end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
