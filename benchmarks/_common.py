"""What the benchmark scripts share: Markdown tables, child processes, ports and waits.

Kept free of jax imports, like config_flags.py: multi-process benchmarks use it before
jax.distributed starts.
"""

from __future__ import annotations

import collections
import contextlib
import glob
import gzip
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(check: Callable[[], bool], seconds: float, what: str) -> None:
    """Call `check` every 0.2 s until it is true; RuntimeError naming `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {seconds:.0f} s waiting for {what}")
        time.sleep(0.2)


def load() -> float:
    """The 1-minute load average (every table prints it: the machine is shared)."""
    return os.getloadavg()[0]


def print_header(*columns: str) -> None:
    """A Markdown table's header and separator rows."""
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))


def print_row(*cells: object) -> None:
    """One Markdown table row, flushed (benchmarks print rows as they finish)."""
    print("| " + " | ".join(map(str, cells)) + " |", flush=True)


def child_command(module: str, *args: str) -> list[str]:
    """`python -W ignore -m <module> --child <args>`: a benchmark running itself in a new
    process (`module` is the caller's `__spec__.name`, e.g. `benchmarks.startup_bench`)."""
    return [sys.executable, "-W", "ignore", "-m", module, "--child", *args]


def run_children(
    commands: list[list[str]], env: dict[str, str] | None = None, timeout: float | None = None
) -> dict:
    """Start every command at once from the repository root (where `-m benchmarks...`
    imports), wait for all of them, and return the last line the first one printed, parsed
    as JSON: what a child reports. A failed child raises, with the end of its stderr (kept
    in a file: a pipe nobody reads while the others are awaited could stall a child)."""
    with contextlib.ExitStack() as stack:
        errors = [stack.enter_context(tempfile.TemporaryFile("w+")) for _ in commands]
        procs = [
            subprocess.Popen(
                command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=err, text=True
            )
            for command, err in zip(commands, errors, strict=True)
        ]
        try:
            outputs = [proc.communicate(timeout=timeout)[0] for proc in procs]
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        for proc, err in zip(procs, errors, strict=True):
            if proc.returncode:
                err.seek(0)
                tail = "\n".join(err.read().splitlines()[-20:])
                raise RuntimeError(f"{proc.args[4]} exited {proc.returncode}:\n{tail}")
    return json.loads(outputs[0].strip().splitlines()[-1])


# -- jax.profiler traces -----------------------------------------------------------------------


def device_ops(trace_dir: str) -> list[dict] | None:
    """The device ops of the `jax.profiler` trace written under `trace_dir`, each as {"name",
    "category" (HLO category), "scope" (its named scopes, `tf_op`), "ms"}; container ops
    (while, conditional, call) left out, their bodies' ops being counted themselves. None when
    the trace has no device ops (a CPU trace)."""
    files = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    if not files:
        return None
    with gzip.open(files[0]) as stream:
        events = json.load(stream)["traceEvents"]
    threads = {
        (e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"
    }
    processes = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    ops = []
    for event in events:
        if event.get("ph") != "X" or "dur" not in event:
            continue
        if threads.get((event["pid"], event["tid"])) != "XLA Ops":
            continue
        if "/device:" not in processes.get(event["pid"], ""):
            continue
        arguments = event.get("args", {})
        category = arguments.get("hlo_category", "")
        if category in ("while", "conditional", "call"):
            continue
        ops.append(
            {
                "name": event.get("name", ""),
                "category": category,
                "scope": arguments.get("tf_op", ""),
                "ms": event["dur"] / 1e3,  # microseconds -> ms
            }
        )
    return ops or None


def traced(call: Callable[[], Any]) -> tuple[Any, list[dict] | None, float]:
    """Run `call` once under a `jax.profiler` trace, blocking on its result: the result, its
    device ops (`device_ops`) and the wall seconds it took."""
    import jax

    trace_dir = tempfile.mkdtemp(prefix="evokube-trace-")
    try:
        jax.profiler.start_trace(trace_dir)
        start = time.perf_counter()
        result = jax.block_until_ready(call())
        wall_s = time.perf_counter() - start
        jax.profiler.stop_trace()
        return result, device_ops(trace_dir), wall_s
    finally:
        shutil.rmtree(trace_dir, ignore_errors=True)


def busiest(ops: list[dict] | None) -> dict | None:
    """A traced program's device time by HLO category, by workflow part and category, and its
    busiest ops (as `print_busiest` prints them); None without device ops."""
    if not ops:
        return None
    return {"categories": category_ms(ops), "parts": part_categories(ops), "top_ops": top_ops(ops)}


def print_busiest(title: str, summary: dict) -> None:
    """`busiest`'s summary as a line of categories, a line a workflow part, and a Markdown
    table of ops."""
    print(f"\n{title}: device ms of one generation by category:", end=" ")
    print(", ".join(f"{name} {ms:.2f}" for name, ms in summary["categories"].items()))
    for part, categories in summary["parts"].items():
        spent = ", ".join(f"{name} {ms:.2f}" for name, ms in categories.items())
        print(f"- {part} {sum(categories.values()):.2f}: {spent}")
    print_header("op", "category", "calls", "ms", "scope")
    for op in summary["top_ops"]:
        print_row(op["name"], op["category"], op["calls"], f"{op['ms']:.3f}", op["scope"][-90:])


def top_ops(ops: list[dict], count: int = 12) -> list[dict]:
    """The `count` ops with the most device time in all, each {"name", "category", "scope",
    "calls", "ms"}: where a traced program spends the device."""
    totals: dict[str, dict] = {}
    for op in ops:
        entry = totals.setdefault(op["name"], {**op, "calls": 0, "ms": 0.0})
        entry["calls"] += 1
        entry["ms"] += op["ms"]
    return sorted(totals.values(), key=lambda e: -e["ms"])[:count]


def part_categories(ops: list[dict]) -> dict[str, dict[str, float]]:
    """Device milliseconds by workflow part (`workflows.PARTS`, found in each op's named
    scopes, vmapped ones too, as with several seeds: `vmap(rl_update)`; "other device" outside
    them), each by HLO category, busiest part first: which part a category's time is spent in
    (an 8-seed profile's dynamic-update-slice: the replay add's or not)."""
    from evokube_trainer.workflows import PARTS

    by_part: dict[str, list[dict]] = collections.defaultdict(list)
    for op in ops:
        names = re.findall(r"\w+", op["scope"])
        by_part[next((p for p in PARTS if p in names), "other device")].append(op)
    parts = {part: category_ms(part_ops) for part, part_ops in by_part.items()}
    return dict(sorted(parts.items(), key=lambda item: -sum(item[1].values())))


def category_ms(ops: list[dict]) -> dict[str, float]:
    """Device milliseconds by HLO category (fusion, convolution, scatter, ...)."""
    spent: dict[str, float] = collections.defaultdict(float)
    for op in ops:
        spent[op["category"] or "?"] += op["ms"]
    return dict(sorted(spent.items(), key=lambda item: -item[1]))


# -- children of the scaling benchmarks: processes of one jax.distributed group ------------------
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
BYTES = {"f32": 4, "s32": 4, "u32": 4, "pred": 1, "f16": 2, "bf16": 2, "s8": 1, "u8": 1}


def shape_bytes(shapes: str) -> int:
    """Bytes of the HLO shapes written in `shapes`, e.g. `(f32[64,3], s32[])`."""
    total = 0
    for dtype, dims in re.findall(r"(\w+)\[([\d,]*)\]", shapes):
        elements = 1
        for d in filter(None, dims.split(",")):
            elements *= int(d)
        total += elements * BYTES.get(dtype, 4)
    return total


def join_group(processes: int, process_id: int, port: int) -> None:
    """This child's place in the benchmark's jax.distributed group on 127.0.0.1, if several."""
    import jax

    if processes > 1:
        jax.distributed.initialize(
            coordinator_address=f"127.0.0.1:{port}",
            num_processes=processes,
            process_id=process_id,
        )


def time_steps(step: Callable, state, steps: int) -> float:
    """Seconds for `steps` calls of a compiled `step(state) -> (state, metrics)`, after one
    untimed call (compilation and first transfers)."""
    import jax

    state, metrics = step(state)
    jax.block_until_ready(metrics)
    start = time.perf_counter()
    for _ in range(steps):
        state, metrics = step(state)
    jax.block_until_ready(metrics)
    return time.perf_counter() - start
