"""benchmarks/ stand apart from tests/: no benchmark imports a test module.

operator_scale.py needs the test control plane; it starts and stops it through
`python -m tests.cluster` (up --json says where it is), a process boundary, not an import.
"""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _imports(path: Path) -> set[str]:
    """Every module `path` imports, at its top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_no_benchmark_imports_the_tests():
    modules = sorted(BENCHMARKS.glob("*.py"))
    assert any(p.name == "operator_scale.py" for p in modules)
    found = {
        path.name: sorted(m for m in _imports(path) if m.split(".")[0] == "tests")
        for path in modules
    }
    assert {name: tests for name, tests in found.items() if tests} == {}


@pytest.mark.cluster
def test_placement_rate_places_both_ways_exclusively():
    """The smallest run of benchmarks/placement_rate.py (its own control plane, with JobSet):
    both ways put 2 slices of 2 hosts on 2 pools of their own."""
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.placement_rate", "--slices", "2", "--hosts", "2",
         "--repeats", "1"],
        cwd=BENCHMARKS.parent, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in run.stdout.splitlines() if line.startswith("| 0 ")]
    assert [(r[1].strip(), r[5].strip()) for r in rows] == [
        ("jobset", "True"),
        ("affinity", "True"),
    ]


def test_seeds_bench_measures_several_seeds_against_one():
    """The smallest run of benchmarks/seeds_bench.py (CPU): 2 seeds of the OpenES row against
    1, both rows of its table complete, the state growing by one replica's."""
    run = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "benchmarks.seeds_bench", "--rows", "openes-64",
         "--seeds", "1", "2", "--generations", "2"],
        cwd=BENCHMARKS.parent, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in run.stdout.splitlines() if "| openes-64 |" in line]
    cells = [[cell.strip() for cell in row] for row in rows]
    assert [row[1] for row in cells] == ["1", "2"]
    assert cells[0][5] == "1.00" and float(cells[1][5]) > 0
    state = [float(row[6].replace(",", "")) for row in cells]  # KiB
    assert state[1] == pytest.approx(2 * state[0], abs=0.1) and float(cells[1][7]) > 0


def test_replay_gather_bench_times_every_layout():
    """The smallest run of benchmarks/replay_gather_bench.py (CPU): a row per field width, the
    transition, and the replicas batched and in turn, each counting every replica's rows."""
    run = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "benchmarks.replay_gather_bench", "--capacity",
         "1000", "--batch", "8", "--draws", "4", "--replicas", "3", "--widths", "1", "5",
         "--repeats", "2"],
        cwd=BENCHMARKS.parent, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in run.stdout.splitlines() if line.startswith("| ")]
    cells = {row[0].strip(): [cell.strip() for cell in row[1:]] for row in rows[1:]}
    assert list(cells) == [
        "one field [C, 1]", "one field [C, 5]", "transition", "replicas batched",
        "replicas in turn",
    ]  # fmt: skip
    assert cells["transition"][:2] == ["1", "32"] and cells["replicas in turn"][:2] == ["3", "96"]
    assert all(float(row[2]) > 0 and float(row[3]) > 0 for row in cells.values())


def test_chip_bench_runs_a_row_on_the_cpu(tmp_path):
    """benchmarks/chip_bench.py must still run without an accelerator (issue 23): the smallest
    row's three trainer lives, throughput and profile, each life's log kept in --logs."""
    run = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "benchmarks.chip_bench", "--rows", "openes-64",
         "--generations", "2", "--logs", str(tmp_path / "logs")],
        cwd=BENCHMARKS.parent, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    lives = [line for line in run.stdout.splitlines() if line.startswith("# openes-64, life")]
    assert [line.split(":")[0] for line in lives] == [f"# openes-64, life {n}" for n in (1, 2, 3)]
    assert '"traced_ops": 0' in lives[2], lives[2]  # the profile ran: a CPU trace has no device ops
    row = next(line for line in run.stdout.splitlines() if line.startswith("| OpenES gymnax"))
    cells = [cell.strip() for cell in row.split("|")[1:-1]]
    figures = [float(cell.rstrip("x").replace(",", "")) for cell in cells[1:]]
    assert len(figures) == 7 and all(figure > 0 for figure in figures), cells
    logs = sorted(path.name for path in (tmp_path / "logs").iterdir())
    assert logs == [f"chip-bench-openes-64-{n}.log" for n in (1, 2, 3)]


def test_run_resume_interrupts_a_run_and_the_same_command_resumes_it(tmp_path):
    """benchmarks/run_resume.py on a small manifest (CPU): the first life stops on Ctrl-C with
    a checkpoint (exit 75), the second resumes from it and runs to the end (exit 0)."""
    manifest = tmp_path / "small.yaml"
    manifest.write_text(
        "apiVersion: evokube.io/v1alpha1\nkind: ERLExperiment\nmetadata: {name: small}\n"
        "spec:\n  image: trainer:test\n  algorithm: {name: openes}\n"
        "  environment: {name: gymnax/Pendulum-v1, episodeLength: 20}\n"
        "  policy: {hiddenLayers: [4]}\n  population: {size: 4}\n"
        "  stopping: {maxGenerations: 2000}\n  checkpoint: {intervalGenerations: 100000}\n"
    )
    run = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "benchmarks.run_resume", str(manifest),
         "--after-rows", "2", "--runs-dir", str(tmp_path / "runs"), "--timeout", "300"],
        cwd=BENCHMARKS.parent, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    out = run.stdout
    assert "# life 1: exit 75" in out and "# life 2: exit 0" in out, out
    first, second = out.split("# life 2")
    reached = int(first.split("last generation in history.jsonl: ")[1].split()[0])
    assert f"checkpoints: ['{reached}']" in first, out  # written on the interrupt
    assert f"resumed from checkpoint at generation {reached}" in second, out
    assert "last generation in history.jsonl: 2000" in second, out


def test_a_profile_summary_splits_each_workflow_part_by_category(capsys):
    """`busiest` (seeds_bench's and chip_bench's --profile) says which part of a generation
    each category's device time is spent in, by the named scopes in the ops' `tf_op`."""
    from benchmarks._common import busiest, print_busiest

    def op(name, category, scope, ms):
        return {"name": name, "category": category, "scope": scope, "ms": ms}

    ops = [
        op("gather.1", "custom fusion", "jit(steps)/while/body/rl_update/gather", 2.0),
        op("gather.1", "custom fusion", "jit(steps)/while/body/rl_update/gather", 2.0),
        op("dot.3", "convolution", "jit(steps)/while/body/vmap(rl_update)/vmap()/dot", 1.5),
        op("dus.7", "dynamic-update-slice", "jit(steps)/while/body/replay_add/scatter", 0.5),
        op("dus.8", "dynamic-update-slice", "jit(steps)/while/body/rl_update_x/select", 0.25),
        op("copy.2", "", "jit(steps)/while/body/copy", 0.125),
    ]
    summary = busiest(ops)
    assert summary["parts"] == {
        "rl_update": {"custom fusion": 4.0, "convolution": 1.5},
        "replay_add": {"dynamic-update-slice": 0.5},
        "other device": {"dynamic-update-slice": 0.25, "?": 0.125},  # a scope, not a prefix
    }
    assert summary["categories"]["dynamic-update-slice"] == 0.75
    print_busiest("cemrl-pendulum, 8 seeds", summary)
    lines = capsys.readouterr().out.splitlines()
    assert "- rl_update 5.50: custom fusion 4.00, convolution 1.50" in lines
    assert "- replay_add 0.50: dynamic-update-slice 0.50" in lines
    assert busiest([]) is None
