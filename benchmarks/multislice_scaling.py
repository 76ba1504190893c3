"""Multislice: bytes per generation crossing slices, and weak scaling over 1 to 4 slices.

    .venv/bin/python -W ignore -m benchmarks.multislice_scaling                   # OpenES
    .venv/bin/python -W ignore -m benchmarks.multislice_scaling --algo cemrl --generations 3

Each point starts S x P processes wired as `evokube run --slices S --processes S*P` wires them
(jax.distributed over 127.0.0.1, MEGASCALE_NUM_SLICES / MEGASCALE_SLICE_ID each), builds the
workflow on `DeviceLayout.over_all_devices(S)` and times `--generations` generations after one
untimed one. The population grows with the slices (`--pop-per-slice` members each); weak-scaling
efficiency = time per generation on 1 slice / time per generation on S slices.

Bytes crossing slices are read from the compiled generation (`compiled.as_text()`): every
collective whose device groups span more than one slice, times the trip counts of the loops
around it, at the traffic a hierarchical collective puts on the data-center network (one copy
per slice crosses, as XLA's multislice collectives reduce inside a slice first): for a group
over k slices and a result of B bytes, 2B(k-1) for an all-reduce, B(k-1) for an all-gather, a
reduce-scatter (B: its input) or an all-to-all, and B per pair across slices for a
collective-permute. Local processes share this machine's cores, so the efficiencies measure
the coordination overhead of more slices, not added compute.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections import defaultdict

import numpy as np

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
from evokube_contract import ENV_MEGASCALE_NUM_SLICES, ENV_MEGASCALE_SLICE_ID

_HEADER = re.compile(r"(?:ENTRY )?%?([\w.\-]+) \(.*\{$")
_OP = re.compile(r"=\s*(.+?)\s+(" + "|".join(COLLECTIVES) + r")(?:-start)?\(")
_CALLEE = re.compile(r"(body|to_apply|calls|true_computation|false_computation)=%([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')
_MESH_GROUPS = re.compile(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}")
_IOTA_GROUPS = re.compile(r"replica_groups=\[(\d+),(\d+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?")
_LIST_GROUPS = re.compile(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}")
_PAIRS = re.compile(r"source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}")


def _groups(line: str, devices: int) -> list[list[int]]:
    """The device groups (positions in the program's device assignment) of a collective."""
    if match := _MESH_GROUPS.search(line):
        axes = [
            (name.strip("'"), int(size)) for name, size in re.findall(r"('\w+')=(\d+)", match[1])
        ]
        inside = {name.strip("' ") for name in match[2].split(",") if name.strip()}
        ids = np.arange(devices).reshape([size for _, size in axes])
        order = [i for i, (n, _) in enumerate(axes) if n not in inside]
        order += [i for i, (n, _) in enumerate(axes) if n in inside]
        size = int(np.prod([s for n, s in axes if n in inside]))
        return ids.transpose(order).reshape(-1, size).tolist()
    if match := _IOTA_GROUPS.search(line):
        dims = [int(d) for d in match[3].split(",")]
        ids = np.arange(int(np.prod(dims))).reshape(dims)
        if match[4]:
            ids = ids.transpose([int(p) for p in match[4].split(",")])
        return ids.reshape(int(match[1]), int(match[2])).tolist()
    if match := _LIST_GROUPS.search(line):
        groups = [
            [int(i) for i in g.split(",") if i] for g in re.findall(r"\{([\d,]*)\}", match[1])
        ]
        if any(groups):
            return groups
    return [list(range(devices))]  # no groups: every device


def cross_slice_bytes(hlo: str, slices: int, devices: int) -> tuple[int, int]:
    """(collective ops run per generation whose groups span slices, bytes they put on the
    links between slices), for a program over `devices` devices in `slices` equal slices
    (device assignment slice by slice, as `DeviceLayout` orders it)."""
    per_slice = devices // slices
    body: dict[str, list[str]] = {}
    name = None
    for line in hlo.splitlines():
        if (header := _HEADER.match(line)) and not line.startswith(" "):
            name = header[1]
            body[name] = []
            if line.startswith("ENTRY"):
                entry = name
        elif name is not None and line.startswith(" "):
            body[name].append(line)
    runs: dict[str, int] = defaultdict(int)

    def visit(computation: str, times: int) -> None:
        runs[computation] += times
        for line in body.get(computation, ()):
            trips = _TRIPS.search(line)
            for kind, callee in _CALLEE.findall(line):
                visit(callee, times * (int(trips[1]) if kind == "body" and trips else 1))
            if branches := _BRANCHES.search(line):
                for callee in re.findall(r"%([\w.\-]+)", branches[1]):
                    visit(callee, times)  # an upper bound: every branch taken

    visit(entry, 1)
    ops = size = 0
    for computation, times in runs.items():
        for line in body[computation]:
            match = _OP.search(line)
            if not match:
                continue
            result, op = shape_bytes(match[1]), match[2]
            if op == "collective-permute":
                pairs = re.findall(r"\{(\d+),(\d+)\}", _PAIRS.search(line)[1])
                crossing = sum(int(a) // per_slice != int(b) // per_slice for a, b in pairs)
                moved = result * crossing
            else:
                moved = 0
                for group in _groups(line, devices):
                    spanned = len({device // per_slice for device in group})
                    full = result * len(group) if op == "reduce-scatter" else result
                    moved += (2 if op == "all-reduce" else 1) * full * (spanned - 1)
            if moved:
                ops += times
                size += times * moved
    return ops, size


def child(args: argparse.Namespace) -> None:
    import jax

    join_group(args.processes, args.process_id, args.port)
    from benchmarks.trainer_bench import build_config  # after: importing may start a backend
    from evokube_trainer.runtime.distributed import Slices
    from evokube_trainer.workflows import DeviceLayout, jit_workflow, make_workflow

    slices = Slices.from_env()
    slices.check()
    layout = DeviceLayout.over_all_devices(slices.count) if jax.device_count() > 1 else None
    workflow = make_workflow(build_config(args.algo, "pendulum", args), layout)
    fns = jit_workflow(workflow)
    state = fns.init(jax.random.PRNGKey(0))
    ops = size = 0
    if layout is not None:
        hlo = fns.step.lower(state).compile().as_text()
        ops, size = cross_slice_bytes(hlo, slices.count, jax.device_count())
    elapsed = time_steps(fns.step, state, args.generations)
    if jax.process_index() == 0:
        print(json.dumps({"s_per_gen": elapsed / args.generations, "ops": ops, "bytes": size}))


def run_point(slices: int, args: argparse.Namespace) -> dict:
    port = free_port()
    processes = slices * args.processes_per_slice
    # Each child gets its slice's variables, as a pod of that slice does.
    commands = [
        [
            "env",
            f"{ENV_MEGASCALE_NUM_SLICES}={slices}",
            f"{ENV_MEGASCALE_SLICE_ID}={pid * slices // processes}",
            *child_command(
                __spec__.name,
                f"--processes={processes}",
                f"--process-id={pid}",
                f"--port={port}",
                f"--algo={args.algo}",
                f"--pop={args.pop_per_slice * slices}",
                f"--generations={args.generations}",
                *config_arguments(args),
            ),
        ]
        for pid in range(processes)
    ]
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return run_children(commands, env=env, timeout=args.timeout)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--algo", default="openes", choices=["openes", "cemrl", "erl"])
    parser.add_argument("--slices", type=int, nargs="+", default=[1, 2, 3, 4])
    parser.add_argument("--processes-per-slice", type=int, default=1)
    parser.add_argument("--pop-per-slice", type=int, default=16)
    parser.add_argument("--generations", type=int, default=5)
    add_config_arguments(parser, updates=64, replay_capacity=100_000)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--processes", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--process-id", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--pop", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        args.es_pop_size = args.rl_pop_size = args.pop
        child(args)
        return

    print(
        f"# {args.algo} on gymnax/Pendulum-v1; {args.processes_per_slice} process(es) of one CPU "
        f"device per slice, {args.pop_per_slice} members per slice; {os.cpu_count()} CPUs "
        f"(shared); load average at start {load():.2f}; {args.generations} timed generations"
    )
    print_header(
        "slices",
        "population",
        "s per generation",
        "weak-scaling efficiency",
        "collectives across slices per generation",
        "bytes across slices per generation",
        "load",
    )
    base = None
    for slices in args.slices:
        r = run_point(slices, args)
        base = base or r["s_per_gen"]
        print_row(
            slices,
            args.pop_per_slice * slices,
            f"{r['s_per_gen']:.3f}",
            f"{base / r['s_per_gen']:.0%}",
            r["ops"],
            f"{r['bytes']:,}",
            f"{load():.2f}",
        )
    print(f"# load average at end {load():.2f}")


if __name__ == "__main__":
    main()
