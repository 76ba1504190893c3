"""The `evokube` command on a folder or file it cannot write: one line and exit 78, at once."""

import subprocess
import sys
from pathlib import Path

import pytest

from evokube_trainer.runtime import exitcodes

REPO = Path(__file__).resolve().parents[2]
EVOKUBE = str(Path(sys.executable).parent / "evokube")
EXAMPLE = str(REPO / "examples" / "pendulum-cemrl.yaml")


def one_error_line(*args: str) -> str:
    run = subprocess.run([EVOKUBE, *args], capture_output=True, text=True, timeout=120)
    assert run.returncode == exitcodes.PERMANENT, run.stderr[-2000:]
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), run.stderr[-2000:]
    return lines[0]


@pytest.fixture
def file(tmp_path) -> Path:
    """A plain file where a folder is wanted."""
    path = tmp_path / "a-file"
    path.write_text("")
    return path


@pytest.mark.parametrize("under", [False, True], ids=["a file", "under a file"])
def test_run_with_a_runs_dir_that_is_a_file(file, under):
    runs = file / "runs" if under else file
    line = one_error_line("run", EXAMPLE, "--runs-dir", str(runs))
    assert line == (
        f"error: --runs-dir {runs}: cannot write to {runs}/pendulum-cemrl: "
        "a file is in the way (it, or a folder above it, is a file)"
    )


def test_curve_into_a_file_that_cannot_be_written(tmp_path, file):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "history.jsonl").write_text('{"generation": 1, "metrics": {"bestFitness": 1.0}}\n')
    line = one_error_line("curve", str(run_dir), "-o", str(file / "curve.png"))
    assert line.startswith(f"error: cannot write to {file}/curve.png: a file is in the way")
    line = one_error_line("curve", str(run_dir), "-o", str(tmp_path))
    assert line == f"error: cannot write to {tmp_path}: it is a folder"


def test_render_into_a_file_that_cannot_be_written_says_so_before_playing(tmp_path, file):
    # No policy is even read: the output is checked first.
    line = one_error_line("render", str(tmp_path / "no-run"), "-o", str(file / "episode.gif"))
    assert line.startswith(f"error: cannot write to {file}/episode.gif: a file is in the way")
