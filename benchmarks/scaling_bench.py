"""Scaling: generations/s over 1, 2, 4 local processes and 1, 2, 4 CPU devices per process.

    .venv/bin/python -W ignore -m benchmarks.scaling_bench                        # OpenES, Pendulum
    .venv/bin/python -W ignore -m benchmarks.scaling_bench --algo cemrl --generations 3

Each point starts P processes (as `evokube run --processes P` does: jax.distributed over
127.0.0.1, `--xla_force_host_platform_device_count=D` each), builds the workflow with
`DeviceLayout.over_all_devices()` and times `--generations` generations after one untimed one.
Two series:

  weak    the population grows with the devices (`--pop-per-device` members per device);
          efficiency = gen/s(P x D devices) / gen/s(1 device),
  strong  the total population is fixed (`--total-pop`);
          efficiency = speed-up / (P x D).

The collectives column counts the collective operations in the compiled generation (from
`compiled.as_text()`) and the bytes they move per device; on one machine of 2 cores, every
device shares the same 2 cores, so the efficiencies measure overhead, not added compute.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time

from benchmarks._common import (
    COLLECTIVES,
    child_command,
    free_port,
    join_group,
    load,
    print_header,
    print_row,
    run_children,
    shape_bytes,
    time_steps,
)
from benchmarks.config_flags import add_config_arguments, config_arguments
from evokube_contract import ENV_XLA_FLAGS


def collective_summary(hlo: str) -> tuple[int, int]:
    """(number of collective ops, bytes of their results) in an optimized HLO module."""
    count = size = 0
    for line in hlo.splitlines():
        match = re.search(r"=\s*(.+?)\s+(" + "|".join(COLLECTIVES) + r")(-start)?\(", line)
        if not match:
            continue
        count += 1
        size += shape_bytes(match.group(1))
    return count, size


def child(args: argparse.Namespace) -> None:
    import jax

    join_group(args.processes, args.process_id, args.port)
    from benchmarks.trainer_bench import build_config
    from evokube_trainer.workflows import DeviceLayout, jit_workflow, make_workflow

    layout = DeviceLayout.over_all_devices() if jax.device_count() > 1 else None
    workflow = make_workflow(build_config(args.algo, "pendulum", args), layout)
    fns = jit_workflow(workflow)
    state = fns.init(jax.random.PRNGKey(0))
    compiled = fns.step.lower(state).compile() if layout is not None else None
    count, size = collective_summary(compiled.as_text()) if compiled is not None else (0, 0)
    elapsed = time_steps(fns.step, state, args.generations)
    allreduce_ms = time_allreduce(workflow.optimizer.num_dims)
    if jax.process_index() == 0:
        print(
            json.dumps(
                {
                    "gen_per_s": args.generations / elapsed,
                    "devices": jax.device_count(),
                    "collectives": count,
                    "collective_bytes": size,
                    "allreduce_ms": allreduce_ms,
                }
            )
        )


def time_allreduce(num_dims: int) -> float:
    """Median ms of one all-reduce of a [D] float32 vector over every device (the ES
    gradient's, the largest collective a generation has), on the same processes."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    if jax.device_count() == 1:
        return 0.0
    mesh = jax.make_mesh((jax.device_count(),), ("d",))
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("d"))
    local = np.ones((jax.local_device_count(), num_dims), np.float32)
    x = jax.make_array_from_process_local_data(rows, local)
    reduce = jax.jit(
        lambda x: jnp.sum(x, axis=0),
        out_shardings=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()),
    )
    jax.block_until_ready(reduce(x))
    times = []
    for _ in range(20):
        start = time.perf_counter()
        jax.block_until_ready(reduce(x))
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[len(times) // 2]


def run_point(processes: int, devices: int, pop: int, args: argparse.Namespace) -> dict:
    port = free_port()
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        ENV_XLA_FLAGS: f"--xla_force_host_platform_device_count={devices}",
    }
    commands = [
        child_command(
            __spec__.name,
            f"--processes={processes}",
            f"--process-id={pid}",
            f"--port={port}",
            f"--algo={args.algo}",
            f"--pop={pop}",
            f"--generations={args.generations}",
            *config_arguments(args),
        )
        for pid in range(processes)
    ]
    return run_children(commands, env=env, timeout=args.timeout)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algo", default="openes", choices=["openes", "cemrl", "erl"])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--devices", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--pop-per-device", type=int, default=16)
    parser.add_argument("--total-pop", type=int, default=64)
    parser.add_argument("--generations", type=int, default=5)
    add_config_arguments(parser, updates=64, replay_capacity=100_000)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--process-id", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--pop", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.processes = args.processes[0]
        args.es_pop_size = args.rl_pop_size = args.pop
        child(args)
        return

    print(
        f"# {args.algo} on gymnax/Pendulum-v1 (T=200); {os.cpu_count()} CPUs; load average "
        f"at start {load():.2f}; {args.generations} timed generations per point"
    )
    print_header(
        "series",
        "processes x devices",
        "population",
        "generations/s",
        "efficiency",
        "collectives per generation (ops, MiB)",
        "all-reduce of [D] ms",
        "load",
    )
    for series in ("weak", "strong"):
        base = None
        for processes in args.processes:
            for devices in args.devices:
                total = processes * devices
                pop = args.pop_per_device * total if series == "weak" else args.total_pop
                r = run_point(processes, devices, pop, args)
                if base is None:
                    base = r["gen_per_s"]
                speedup = r["gen_per_s"] / base
                efficiency = speedup if series == "weak" else speedup / total
                print_row(
                    series,
                    f"{processes} x {devices}",
                    pop,
                    f"{r['gen_per_s']:.2f}",
                    f"{efficiency:.0%}",
                    f"{r['collectives']}, {r['collective_bytes'] / 2**20:.2f}",
                    f"{r['allreduce_ms']:.2f}",
                    f"{load():.2f}",
                )
    print(f"# load average at end {load():.2f}")


if __name__ == "__main__":
    main()
