"""End to end, a sweep (issue 26): `kubectl apply` of examples/sweep-pendulum.yaml's 3 x 2 grid
with 3 seeds each and maxParallel 2, run by the chart's operator, every child's trainer a real
process on the pod runner.

The template is scaled down to OpenES (16 hidden units, 3 generations, one evaluation episode)
with the grid's shape, seeds and maxParallel kept: under `evokube run` on 2 cores the example's
CEM-RL child takes 39 s (31 s scaled down: nearly all start-up and compilation), this one 17 s;
the sweep runs here in 44 to 86 s, the example's unchanged template in 166 s.
"""

import math
import time
from pathlib import Path

import pytest
import yaml

from evokube_contract import GROUP, PLURAL, VERSION
from evokube_contract.sweep import SWEEP_LABEL, SWEEP_PLURAL
from tests.e2e.scenarios import Timeline, table_columns

pytestmark = pytest.mark.cluster

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sweep-pendulum.yaml"
FINISHED = ("Succeeded", "Failed")


def sweep_document(stack) -> dict:
    """The example with an OpenES template of the same grid shape, placed on the runner's pool."""
    sweep = yaml.safe_load(EXAMPLE.read_text())
    template = sweep["spec"]["template"]["spec"]
    template["algorithm"] = {"name": "openes", "ec": {"noiseStd": 0.1, "learningRate": 0.05}}
    template["policy"] = {"hiddenLayers": [16]}
    template["evaluation"] = {"episodes": 1}
    template["stopping"] = {"maxGenerations": 3}
    template["nodeSelector"] = stack.runner.node_selector
    template["tolerations"] = stack.runner.tolerations
    grid = sweep["spec"]["parameters"]
    assert [len(p["values"]) for p in grid] == [3, 2] and template["seeds"] == 3
    grid[0] = {"path": "spec.algorithm.ec.learningRate", "values": [0.1, 0.05, 0.02]}
    return sweep


def test_a_sweep_runs_its_grid_at_most_max_parallel_at_a_time_to_the_summary(stack, e2e_namespace):
    ns, timeline = e2e_namespace, Timeline()
    sweep = sweep_document(stack)
    name, parallel = sweep["metadata"]["name"], sweep["spec"]["maxParallel"]
    stack.cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(sweep))
    timeline.add("kubectl apply", f"-n {ns} ERLSweep {name}")

    def table(*flags: str) -> dict[str, str]:
        """`kubectl get erls NAME [flags]`: {column: cell} of the CRD's printer columns."""
        out = stack.cluster.kubectl("get", "erls", name, "-n", ns, *flags).stdout
        return table_columns(*out.splitlines())

    def look() -> tuple[dict, dict[str, str]]:
        status = (
            stack.custom.get_namespaced_custom_object(GROUP, VERSION, ns, SWEEP_PLURAL, name).get(
                "status"
            )
            or {}
        )
        children = stack.custom.list_namespaced_custom_object(
            GROUP, VERSION, ns, PLURAL, label_selector=f"{SWEEP_LABEL}={name}"
        )["items"]
        return status, {
            c["metadata"]["name"]: (c.get("status") or {}).get("phase", "-") for c in children
        }

    most, seen, rows, deadline = 0, None, [], time.monotonic() + 300
    while True:
        status, phases = look()
        if phases != seen:
            seen = phases
            timeline.add("children", " ".join(f"{c}={p}" for c, p in sorted(phases.items())))
            rows.append(table())
            timeline.add("kubectl get erls", str(rows[-1]))
        most = max(most, sum(p not in FINISHED for p in phases.values()))
        if status.get("phase") in ("Succeeded", "Failed", "Invalid"):
            break
        assert time.monotonic() < deadline, f"the sweep did not finish\n{timeline}"
        time.sleep(0.25)
    timeline.add(f"sweep {status['phase']}", str(status.get("counts")))

    assert status["phase"] == "Succeeded", f"{status}\n{timeline}"
    # Both slots were used, never a third: polled every 0.25 s while it ran.
    assert most == parallel, f"{most} unfinished at once\n{timeline}"
    assert status["children"] == 6 and status["counts"] == {"Succeeded": 6}, status
    assert sorted(phases) == [f"{name}-{i}" for i in range(6)], phases
    configurations = status["configurations"]
    assert [c["name"] for c in configurations] == [f"{name}-{i}" for i in range(6)]
    assignments = {tuple(sorted(c["assignment"].items())) for c in configurations}
    assert len(assignments) == 6, configurations  # each point of the grid once
    for configuration in configurations:
        assert configuration["phase"] == "Succeeded", configuration
        for key in ("best", "final"):
            figure = configuration[key]
            assert figure["n"] == 3, configuration
            assert math.isfinite(figure["mean"]) and math.isfinite(figure["interval"]), figure
            assert figure["interval"] >= 0, figure
    best = status["bestConfiguration"]
    chosen = {c["name"]: c for c in configurations}[best["name"]]
    assert best["best"] == chosen["best"], (best, chosen)
    assert best["best"]["mean"] == max(c["best"]["mean"] for c in configurations)

    # The printer columns: while it ran (children running, never more than maxParallel), and at
    # the end with -o wide (the best configuration's mean and interval).
    running = [int(r["RUNNING"]) for r in rows if r["PHASE"] == "Running" and r["RUNNING"]]
    assert running and max(running) <= parallel, f"{rows}\n{timeline}"
    row = table("-o", "wide")
    assert (row["NAME"], row["PHASE"], row["CHILDREN"]) == (name, "Succeeded", "6"), row
    assert (row["SUCCEEDED"], row["FAILED"], row["BEST"]) == ("6", "", best["name"]), row
    assert math.isclose(float(row["BEST-MEAN"]), best["best"]["mean"], rel_tol=1e-6), row
    assert math.isclose(float(row["BEST-INTERVAL"]), best["best"]["interval"], rel_tol=1e-6), row
