"""`evokube sweep`: an ERLSweep on this machine, its children one after another or K at a time.

The sweep expands as on a cluster (evokube_sweeps): the same children, names and
manifests. Each child runs as `evokube run` runs a manifest (laptop/local.py), in a process of
its own, in <out>/<sweep>/<child>/; once it ends, its phase is recorded there (outcome.json),
so a rerun after Ctrl-C skips the finished children and resumes the others from their
checkpoints. The summary is `summarize` over child objects built from the runs' histories (the
per-seed shape of status.progress.seeds), so it reads as the operator's status does.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import json
import math
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, TextIO

import yaml

from evokube_contract import HISTORY_FILE
from evokube_contract.sweep import SWEEP_ASSIGNMENT_ANNOTATION
from evokube_sweeps import SweepError, child_manifest, expand, interval, summarize
from evokube_trainer import metric_names as names
from evokube_trainer.laptop import checks_on_cpu
from evokube_trainer.laptop.curves import plot_curves, read_history
from evokube_trainer.runtime import exitcodes, folders, manifest

OUTCOME_FILE = "outcome.json"  # in a child's folder: {"phase", "exitCode"} once it ended
CHILD_FILE = "child.yaml"  # in a child's folder: the child's manifest, as `evokube run` reads it
SUMMARY_FILE = "summary.json"
CURVES_FILE = "curves.png"
# The phase of a child `evokube run` ended with this exit code; any other code leaves it
# unfinished (interrupted, or a retriable failure), to resume.
PHASES = {exitcodes.SUCCESS: "Succeeded", exitcodes.PERMANENT: "Failed"}
# Children running side by side get metrics ports this far apart (spec.metricsPort + process).
PORT_STRIDE = 64


# -- reading and checking -----------------------------------------------------------------------
def _describe(assignment: dict[str, Any]) -> str:
    return ", ".join(f"{path.removeprefix('spec.')}={value}" for path, value in assignment.items())


def load_sweep(path: str | Path) -> tuple[dict, list[dict]]:
    """The defaulted sweep and its children's defaulted manifests. ManifestError lists every
    problem: the sweep's own fields (as the API server checks them), its expansion, and each
    child's fields, named with the child (as the ERLExperiment CRD and the trainer check them)."""
    checks_on_cpu()  # imports JAX
    from evokube_trainer.runtime.config import to_run_config

    sweep = manifest.load(path, manifest.SWEEP_CRD_FILE)
    source = manifest.shorten(str(path))
    try:
        assignments = expand(sweep["spec"])
    except SweepError as err:
        raise manifest.ManifestError([manifest.FieldError(err.field, err.reason)], source) from err
    children, errors = [], []
    for index, assignment in enumerate(assignments):
        child = child_manifest(sweep, index, assignment)
        which = f"child {child['metadata']['name']} ({_describe(assignment)})"
        checked, child_errors = manifest.check(child)
        if not child_errors:
            try:
                to_run_config(checked)  # what the trainer itself would refuse
            except manifest.ManifestError as err:
                child_errors = err.errors
        errors += [manifest.FieldError(e.path, f"{which}: {e.message}") for e in child_errors]
        children.append(checked)
    if errors:
        raise manifest.ManifestError(errors, source)
    return sweep, children


def kind_of(path: str | Path) -> str | None:
    """The `kind` of a file's one document, or None (the checks then say what is wrong)."""
    try:
        docs = manifest.read(path)
    except manifest.ManifestError:
        return None
    return docs[0].get("kind") if len(docs) == 1 and isinstance(docs[0], dict) else None


# -- one child's outcome --------------------------------------------------------------------------
def _numbers(rows: list[dict], key: str) -> list[float]:
    values = [r.get(key) for r in rows]
    return [v for v in values if isinstance(v, int | float) and math.isfinite(v)]


def local_seeds(rows: list[dict], spec: dict) -> list[dict]:
    """status.progress.seeds of a local run from its history: per replica, its root seed, its
    best fitness so far and its last generation's. A history without per-replica columns
    (seed/<i>/...) is one replica, the run itself."""
    from evokube_trainer.workflows import replica_seed  # the trainer's own numbering

    replicas = spec.get("seeds", 1)
    per_seed = any(names.seed_key(0, names.BEST_FITNESS) in r for r in rows)
    keyed = [lambda name, i=i: names.seed_key(i, name) for i in range(replicas)]
    seeds = []
    for i, key in enumerate(keyed if per_seed else [lambda name: name]):
        fitness = _numbers(rows, key(names.BEST_FITNESS))
        if not fitness:
            continue
        entry = {"seed": replica_seed(spec.get("seed", 0), i), "bestFitness": max(fitness)}
        entry["fitness"] = fitness[-1]
        returns = _numbers(rows, key(names.EVAL_RETURN))
        if returns:
            entry["evalReturn"] = returns[-1]
        seeds.append(entry)
    return seeds


@dataclasses.dataclass
class Child:
    """One child of a local sweep: its manifest and its folder."""

    manifest: dict
    folder: Path

    @property
    def name(self) -> str:
        return self.manifest["metadata"]["name"]

    def phase(self) -> str | None:
        """The recorded phase, Succeeded or Failed; None while unfinished."""
        path = self.folder / OUTCOME_FILE
        return json.loads(path.read_text())["phase"] if path.exists() else None

    def record(self, code: int) -> str | None:
        phase = PHASES.get(code)
        if phase is not None:
            (self.folder / OUTCOME_FILE).write_text(json.dumps({"phase": phase, "exitCode": code}))
        return phase

    def history(self) -> list[dict]:
        return read_history(self.folder / HISTORY_FILE)

    def as_object(self) -> dict:
        """The child as the operator would see it: its manifest and a status of what ran."""
        progress = {"seeds": local_seeds(self.history(), self.manifest["spec"])}
        phase = self.phase()
        status = {"progress": progress, **({"phase": phase} if phase else {})}
        return {**self.manifest, "status": status}


# -- the run ------------------------------------------------------------------------------------
def _start(child: Child, index: int, parallel: int) -> subprocess.Popen:
    """`evokube run` of the child in a session of its own (the terminal's Ctrl-C reaches only
    this process, which passes it on once); beside others, its output goes to a log file."""
    manifest_doc = copy.deepcopy(child.manifest)
    if parallel > 1:
        manifest_doc["spec"]["metricsPort"] += PORT_STRIDE * index
    folders.prepare(child.folder)
    (child.folder / CHILD_FILE).write_text(yaml.safe_dump(manifest_doc, sort_keys=False))
    command = [sys.executable, "-m", "evokube_trainer.laptop.cli", "run"]
    command += [str(child.folder / CHILD_FILE), "--runs-dir", str(child.folder.parent)]
    log = None if parallel == 1 else (child.folder / "evokube-run.log").open("ab")
    try:
        return subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
    finally:
        if log is not None:
            log.close()


def _figures(seeds: list[dict]) -> str:
    if not seeds:
        return "no generation yet"
    best = interval([s["bestFitness"] for s in seeds])
    return f"best {best['mean']:.2f} ± {best['interval']:.2f} over {best['n']} seed(s)"


def run_sweep(
    sweep: dict,
    children: list[dict],
    *,
    parallel: int = 1,
    out_root: Path = Path("evokube-sweeps"),
    out: TextIO = sys.stdout,
) -> int:
    """Run the children not finished yet, `parallel` at a time, then print and write the
    summary; returns 0 once every child finished, 75 when interrupted or some are unfinished."""
    root = (out_root / sweep["metadata"]["name"]).resolve()
    runs = [Child(m, root / m["metadata"]["name"]) for m in children]
    todo = [(i, c) for i, c in enumerate(runs) if c.phase() is None]
    print(
        f"evokube sweep: {sweep['metadata']['name']}: {len(runs)} children, "
        f"{len(runs) - len(todo)} finished earlier, {parallel} at a time; folder {root}",
        file=out,
        flush=True,
    )
    for child in runs:
        if child.phase() is not None:
            print(f"[skip]  {child.name}: {child.phase()} earlier", file=out, flush=True)
    running: dict[int, tuple[Child, subprocess.Popen, float]] = {}
    # Ctrl-C sets a flag the loop reads between steps, never an exception mid-step: a child
    # whose process was just started is always in `running`, so it is passed the signal.
    interrupt = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: interrupt.set())
    try:
        while (todo or running) and not interrupt.is_set():
            while todo and len(running) < parallel and not interrupt.is_set():
                index, child = todo.pop(0)
                assignment = json.loads(
                    child.manifest["metadata"]["annotations"][SWEEP_ASSIGNMENT_ANNOTATION]
                )
                print(f"[start] {child.name}: {_describe(assignment)}", file=out, flush=True)
                running[index] = (child, _start(child, index, parallel), time.monotonic())
            for index, (child, proc, started) in list(running.items()):
                code = proc.poll()
                if code is None:
                    continue
                del running[index]
                phase = child.record(code) or f"unfinished (exit code {code})"
                seeds = local_seeds(child.history(), child.manifest["spec"])
                took = time.monotonic() - started
                print(
                    f"[end]   {child.name}: {phase} after {took:.0f}s, {_figures(seeds)}",
                    file=out,
                    flush=True,
                )
            interrupt.wait(0.2)
        if interrupt.is_set():
            # Ctrl-C again while the trainers checkpoint only sets the flag again: the stop
            # is bounded by their grace period, so it is waited out.
            print("\ninterrupted: the running children checkpoint", file=out, flush=True)
            for _, proc, _ in running.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGINT)
            for child, proc, _ in running.values():
                child.record(proc.wait())
        return _report(root, runs, interrupt.is_set(), out)  # a Ctrl-C during it is waited out
    finally:
        signal.signal(signal.SIGINT, previous)


def _report(root: Path, runs: list[Child], interrupted: bool, out: TextIO) -> int:
    summary = summarize([c.as_object() for c in runs])
    summary["children"] = len(runs)
    (root / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    print(table(summary), file=out)
    print(f"summary: {root / SUMMARY_FILE}", file=out)
    if importlib.util.find_spec("matplotlib") is not None:
        series = {c.name: c.history() for c in runs}
        if any(series.values()):
            png = plot_curves(
                series, names.BEST_FITNESS, f"{root.name}: best fitness", root / CURVES_FILE
            )
            print(f"curves:  {png}", file=out)
    unfinished = [c.name for c in runs if c.phase() is None]
    if interrupted or unfinished:
        print(f"{len(unfinished)} unfinished: rerun the same command to resume them", file=out)
        return exitcodes.RETRIABLE
    return exitcodes.SUCCESS


def _stat(stat: dict | None) -> str:
    if stat is None:
        return "-"
    return f"{stat['mean']:.2f} ± {stat['interval']:.2f} (n={stat['n']})"


def table(summary: dict) -> str:
    """The summary as text: one line per configuration, the best one marked with *."""
    best = (summary.get("bestConfiguration") or {}).get("name")
    rows = [("", "child", "phase", "best (mean ± 95%)", "final (mean ± 95%)", "assignment")]
    for c in summary["configurations"]:
        mark = "*" if c["name"] == best else ""
        assignment = _describe(c.get("assignment") or {})
        rows.append(
            (mark, c["name"], c.get("phase", "-"), _stat(c.get("best")), _stat(c.get("final")),
             assignment)
        )  # fmt: skip
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    counts = ", ".join(f"{n} {phase}" for phase, n in sorted(summary["counts"].items()))
    return "\n".join([*lines, f"{summary['children']} children: {counts or 'none finished'}"])
