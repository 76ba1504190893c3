"""The trainer runs on a read-only root filesystem, writing only where its pod has volumes.

The operator's pods set readOnlyRootFilesystem (docs/security.md). Here
`evokube-train` runs with the environment the operator's Job gives it, in a
mount namespace of its own where `/` is read-only and only the pod's writable
volumes (the scratch emptyDir at /tmp, also HOME, and the checkpoint volume)
are writable tmpfs. Anything the trainer, JAX or a library writes elsewhere
fails the run.

The scratch tmpfs hides whatever lay under /tmp, and a clone there (its code, its
virtualenv) is what the trainer runs from: those folders are bound back, read-only,
at their own paths. The manifest and checkpoint volumes go to a folder that holds
nothing the run reads (OUTSIDE_CHOICES).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evokube_operator import api
from evokube_operator.desired import builders
from evokube_operator.reading.spec import parse_spec
from tests.cluster.controlplane import free_port
from tests.operator.factories import experiment

REPO = Path(__file__).resolve().parents[2]
EVOKUBE_TRAIN = str(Path(sys.executable).parent / "evokube-train")
# Where the manifest and checkpoint volumes are mounted (a tmpfs, before `/` turns read-only):
# the first of these that holds nothing the run reads, since the tmpfs hides what it holds.
OUTSIDE_CHOICES = ("/mnt", "/media", "/srv", "/opt")

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"),
    reason="needs root and unshare(1) for a private mount namespace (CI runs as root)",
)

SCRIPT = """
set -e
IFS=$'\\n'
mount --make-rprivate /
mount -t tmpfs -o mode=0755 outside {outside}
mkdir {outside}/manifest {outside}/checkpoints {outside}/kept
cp "$MANIFEST_SOURCE" {outside}/manifest/{manifest}
for kept in $KEPT; do
  mkdir -p "{outside}/kept$kept"; mount --bind "$kept" "{outside}/kept$kept"
done
mount -o remount,bind,ro /
mount -t tmpfs -o mode=1777 scratch {scratch}
for kept in $KEPT; do
  mkdir "$kept"; mount --bind "{outside}/kept$kept" "$kept"; mount -o remount,bind,ro "$kept"
done
if touch /evokube-probe 2>/dev/null; then echo "root is writable"; exit 90; fi
set +e
env -i "$@"
code=$?
for kept in $KEPT; do umount "$kept" && rmdir "$kept"; done
echo "--- written"
find {scratch} {outside}/checkpoints -mindepth 1 -maxdepth 2 | sort
exit $code
"""


def read_by_the_run() -> set[Path]:
    """Where the trainer's code, its virtualenv and Python come from."""
    paths = [sys.prefix, sys.exec_prefix, sys.base_prefix, REPO, *sys.path]
    paths += os.environ.get("PYTHONPATH", "").split(os.pathsep)
    return {Path(p).resolve() for p in paths if p}


def hidden_under(folder: str, paths: set[Path]) -> list[str]:
    """The entries of `folder` that hold any of `paths` (what a tmpfs over it would hide)."""
    top = Path(folder)
    return sorted({str(top / p.relative_to(top).parts[0]) for p in paths if top in p.parents})


def outside_folder(paths: set[Path]) -> str:
    return next(f for f in OUTSIDE_CHOICES if not hidden_under(f, paths) and Path(f).is_dir())


def trainer_command(manifest: Path, outside: str) -> list[str]:
    """`env` arguments: the Job's environment for host 0, paths moved under `outside`; and the
    test's own PYTHONPATH, if any (a worktree run with another checkout's virtualenv).

    Writes the experiment's manifest to `manifest` on the way.
    """
    exp = experiment(
        algorithm={"name": "openes"},
        population={"size": 8},
        stopping={"maxGenerations": 2},
        checkpoint={"intervalGenerations": 1},
    )
    job = builders.job(exp, parse_spec(exp.spec), 0)
    (container,) = job["spec"]["template"]["spec"]["containers"]
    writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
    assert writable == {api.SCRATCH_DIR, api.DEFAULT_CHECKPOINT_DIR}
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    assert env[api.ENV_HOME] == api.SCRATCH_DIR
    env.update(
        {
            api.ENV_MANIFEST: f"{outside}/manifest/{api.MANIFEST_FILE}",
            api.ENV_CHECKPOINT_DIR: f"{outside}/checkpoints",
            api.ENV_COORDINATOR: "",  # one process: no group to join
            api.ENV_NUM_PROCESSES: "1",
            api.ENV_PROCESS_ID: "0",
            api.ENV_METRICS_PORT: str(free_port()),
            # In a pod without a token (the chart's policy absent): reports are dropped.
            "KUBERNETES_SERVICE_HOST": "10.0.0.1",
            "KUBERNETES_SERVICE_PORT": "443",
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "JAX_PLATFORMS": "cpu",
            "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
        }
    )
    manifest.write_text(builders.manifest_yaml(exp))
    return [f"{k}={v}" for k, v in env.items() if v] + [EVOKUBE_TRAIN]


def test_the_trainer_runs_with_a_read_only_root_and_writes_only_its_volumes(tmp_path):
    read = read_by_the_run()
    outside = outside_folder(read)
    script = SCRIPT.format(outside=outside, manifest=api.MANIFEST_FILE, scratch=api.SCRATCH_DIR)
    manifest = tmp_path / "experiment.yaml"
    command = trainer_command(manifest, outside)
    kept = "\n".join(hidden_under(api.SCRATCH_DIR, read))
    run = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", script, "bash", *command],
        env={**os.environ, "MANIFEST_SOURCE": str(manifest), "KEPT": kept},
        capture_output=True,
        text=True,
        timeout=600,
        cwd="/",
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, output[-4000:]
    assert "stopped at generation 2" in output, output[-4000:]
    assert "progress is not reported" in output
    assert "Read-only file system" not in output, output[-4000:]  # nothing gave up quietly
    written = run.stdout.split("--- written", 1)[1].split()
    assert f"{outside}/checkpoints/checkpoints" in written  # Orbax
    assert f"{outside}/checkpoints/xla-cache" in written  # the compilation cache
    assert f"{outside}/checkpoints/history.jsonl" in written  # process 0's history
    assert f"{outside}/checkpoints/tensorboard" in written  # and its TensorBoard events


def test_what_the_scratch_and_outside_mounts_would_hide_is_found():
    read = {Path("/tmp/x/.venv"), Path("/tmp/x/trainer"), Path("/tmp/y"), Path("/mnt/d/evokube")}
    assert hidden_under("/tmp", read) == ["/tmp/x", "/tmp/y"]
    assert hidden_under("/srv", read) == []
    assert outside_folder(read) != "/mnt"
