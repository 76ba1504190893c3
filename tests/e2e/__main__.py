"""`python -m tests.e2e` (`make demo`): the end-to-end flow, narrated as it happens.

Starts a control plane, the pod runner and the chart's operator; applies
tests/e2e/experiment.yaml; kills a trainer mid-run; prints a timeline until the
experiment succeeds, then a summary. Everything stops at the end; the logs stay
in the work folder.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from tests.e2e import scenarios
from tests.e2e.stack import REPO, Stack


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.e2e", description=__doc__)
    parser.add_argument(
        "scenario",
        nargs="?",
        default="killed-trainer",
        choices=[*scenarios.SCENARIOS, "all"],
        help="what to do to the run (default: killed-trainer)",
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=REPO / "runs" / "e2e-demo",
        help="logs and state (default: runs/e2e-demo; emptied first)",
    )
    args = parser.parse_args(argv)
    shutil.rmtree(args.workdir, ignore_errors=True)
    names = list(scenarios.SCENARIOS) if args.scenario == "all" else [args.scenario]

    setup = scenarios.Timeline(echo=sys.stdout)
    stack = Stack(args.workdir, jobset=any(n.startswith("multislice") for n in names))
    started = time.monotonic()
    try:
        stack.up(log=lambda line: setup.add("setup", line))
        for name in names:
            print(f"\n== {name}: {scenarios.SCENARIOS[name].__doc__}", flush=True)
            namespace = stack.namespace(f"demo-{name}")
            report = scenarios.SCENARIOS[name](
                stack, namespace, scenarios.Timeline(echo=sys.stdout)
            )
            print(summary(report), flush=True)
    finally:
        stack.down()
    print(f"\nall done in {time.monotonic() - started:.0f}s; logs under {args.workdir}")
    return 0


def summary(report: scenarios.Report) -> str:
    status = report.status
    progress = status.get("progress", {})
    lines = [
        "",
        f"  phase {status.get('phase')}: generation {progress.get('generation')}, "
        f"best fitness {progress.get('bestFitness')} (target {report.target})",
        f"  restarts {status.get('restarts', 0)}, preemptions {status.get('preemptions', 0)}, "
        f"Jobs {', '.join(sorted(report.watcher.jobs))}",
        f"  disturbed when /metrics showed generation {report.disturbed_at}; the next attempt "
        f"resumed from the checkpoint of generation {report.resumed_at} "
        f"(interval {report.interval})",
        f"  events: {' '.join(report.events)}",
        "  kubectl get erlx, at each progress update:",
        *_table(report.watcher.tables),
    ]
    return "\n".join(lines)


def _table(tables: list[tuple[str, str]]) -> list[str]:
    """The rows kubectl printed, realigned under one header."""
    rows = [scenarios.table_columns(header, row) for header, row in tables]
    if not rows:
        return []
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(r.get(c, "")) for r in rows)) for c in columns}
    line = lambda cells: "    " + "  ".join(cells.get(c, "").ljust(widths[c]) for c in columns)
    return [line({c: c for c in columns}), *(line(r) for r in rows)]


if __name__ == "__main__":
    sys.exit(main())
