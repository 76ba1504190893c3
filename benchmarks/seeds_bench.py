"""Seeds in one program (issue 26): aggregate env steps/s and memory with N seeds against 1.

    .venv/bin/python -W ignore -m benchmarks.seeds_bench                     # both rows, 1 and 8
    .venv/bin/python -W ignore -m benchmarks.seeds_bench --rows openes-64 --seeds 1 8 \
        --generations 50

Runs on whatever JAX sees (a TPU chip, a GPU, or the CPU), unchanged. The rows are
benchmarks/chip_bench.py's configurations: `openes-64` and `openes-4096` as there, and
`cemrl-pendulum`, its CEM-RL row (4 TD3 actors of (256, 256), replay capacity 1M, 128 + 64
update steps per generation) on gymnax Pendulum-v1 with T=200; `openes-512`, one replica of
openes-64 with 8 times its population (`--rows openes-512 --seeds 1` against `--rows
openes-64 --seeds 8`: the same work, with and without the seeds axis).

Each (row, seeds) runs in a new process: the workflow of `seeds` replicas (`make_workflow(...,
seeds=N)`, what spec.seeds builds), one untimed chunk (compilation), then chunks of about a
second of the trainer's one compiled `Workflow.steps` (as `Workflow.learn` runs them) until
`--generations` have run. "env steps/s" counts every replica's agent steps; "x" is it against
the first seed count's. Memory: the state's KiB (every replica's population, replay buffer,
optimizer states), the device's peak bytes in use where the platform reports them (TPU, GPU),
and the process's peak resident set; "per seed" is the growth from the first seed count,
divided by the seeds added.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import time

from benchmarks import chip_bench
from benchmarks._common import (
    busiest,
    child_command,
    load,
    print_busiest,
    print_header,
    print_row,
    run_children,
    traced,
)

ROWS = {
    "openes-64": "OpenES gymnax Pendulum-v1 T=200, pop 64, actor (16,16)",
    "openes-4096": "OpenES gymnax Pendulum-v1 T=200, pop 4096, actor (16,16)",
    "cemrl-pendulum": "CEM-RL gymnax Pendulum-v1 T=200, pop 8, 4 TD3 actors, 128+64 steps",
    # One replica as large as 8 seeds of openes-64: what the seeds axis costs beyond its work.
    "openes-512": "OpenES gymnax Pendulum-v1 T=200, pop 512, actor (16,16)",
}
MIB = 2**20


def workflow_config(row: str):
    """chip_bench's configuration of the row (its CEM-RL row's on Pendulum)."""
    if row == "openes-512":
        return dataclasses.replace(chip_bench.workflow_config("openes-64", None), pop_size=512)
    if row != "cemrl-pendulum":
        return chip_bench.workflow_config(row, None)
    pendulum = chip_bench.workflow_config("openes-64", None).env
    return dataclasses.replace(chip_bench.workflow_config("cemrl-halfcheetah", None), env=pendulum)


def child(row: str, seeds: int, generations: int, profile: bool) -> dict:
    """Throughput and memory of one (row, seeds); see the module docstring."""
    import jax
    import numpy as np

    from evokube_trainer.workflows import StopAt, env_steps_count, jit_workflow, make_workflow

    workflow = make_workflow(workflow_config(row), seeds=seeds)
    fns = jit_workflow(workflow, donate=True)
    state = jax.block_until_ready(fns.init(workflow.root_key(0)))
    state_bytes = sum(leaf.nbytes for leaf in jax.tree.leaves(state))
    one = workflow.chunk_arguments(1, StopAt.of())
    state, *_ = jax.block_until_ready(fns.steps(state, *one))  # compiles; untimed
    start = time.perf_counter()
    state, *_ = jax.block_until_ready(fns.steps(state, *one))
    # Chunks of about a second, as the trainer sizes them (the same executable: count is traced).
    count = max(1, min(64, int(1.0 / (time.perf_counter() - start))))
    arguments = workflow.chunk_arguments(count, StopAt.of())
    done_generations, before = 0, int(np.sum(env_steps_count(state)))
    start = time.perf_counter()
    while done_generations < generations:
        state, _, done, _ = fns.steps(state, *arguments)
        done_generations += int(done)  # syncs, as the trainer's fetch of the metrics does
    elapsed = time.perf_counter() - start
    steps = int(np.sum(env_steps_count(state))) - before
    summary = None
    if profile:  # one generation's device ops
        (state, *_), ops, _ = traced(lambda: fns.steps(state, *one))
        summary = busiest(ops)
    stats = jax.devices()[0].memory_stats() or {}
    return {
        "env_steps_per_s": steps / elapsed,
        "gen_per_s": done_generations / elapsed,
        "state_kib": state_bytes / 1024,
        "device_peak_mib": stats["peak_bytes_in_use"] / MIB
        if "peak_bytes_in_use" in stats
        else None,
        "host_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "chunk": count,
        "device": f"{jax.devices()[0].platform} {jax.devices()[0].device_kind}",
        "busiest": summary,
    }


def _amount(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _per_seed(result: dict, first: dict, key: str) -> str:
    """What each seed added to `key` since the first seed count's run."""
    added = result["seeds"] - first["seeds"]
    if not added or result[key] is None:
        return "-"
    return _amount((result[key] - first[key]) / added)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--rows", nargs="+", default=["openes-64", "cemrl-pendulum"], choices=list(ROWS)
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 8], help="seed counts")
    parser.add_argument("--generations", type=int, default=20, help="timed generations")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per process")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="trace one generation of each run: device ms by part and category, top ops (TPU, GPU)",
    )
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.rows[0], args.seeds[0], args.generations, args.profile)))
        return

    print(f"load {load():.2f}, {args.generations} timed generations per run")
    print_header(
        "row", "seeds", "device", "gen/s", "env steps/s", "x", "state KiB", "per seed",
        "device peak MiB", "per seed", "host peak MiB", "per seed",
    )  # fmt: skip
    profiles = []
    for row in args.rows:
        first = None
        for seeds in args.seeds:
            command = child_command(
                __spec__.name, "--rows", row, "--seeds", str(seeds),
                "--generations", str(args.generations), *(["--profile"] if args.profile else []),
            )  # fmt: skip
            result = {**run_children([command], timeout=args.timeout), "seeds": seeds}
            first = first or result
            print_row(
                row, seeds, result["device"], f"{result['gen_per_s']:.2f}",
                f"{result['env_steps_per_s']:,.0f}",
                f"{result['env_steps_per_s'] / first['env_steps_per_s']:.2f}",
                f"{result['state_kib']:,.1f}", _per_seed(result, first, "state_kib"),
                _amount(result["device_peak_mib"]), _per_seed(result, first, "device_peak_mib"),
                _amount(result["host_peak_mib"]), _per_seed(result, first, "host_peak_mib"),
            )  # fmt: skip
            profiles.append((f"{row}, {seeds} seeds", result["busiest"]))
    for title, summary in profiles:
        if summary:
            print_busiest(title, summary)


if __name__ == "__main__":
    main()
