"""The trainer runs on a read-only root filesystem, writing only where its pod has volumes.

The operator's pods set readOnlyRootFilesystem (docs/security.md). Here
`evokube-train` runs with the environment the operator's Job gives it, in a
mount namespace of its own where `/` is read-only and only the pod's writable
volumes (the scratch emptyDir at /tmp, also HOME, and the checkpoint volume)
are writable tmpfs. Anything the trainer, JAX or a library writes elsewhere
fails the run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from evokube_operator import api, builders
from evokube_operator.spec import parse_spec
from tests.cluster.controlplane import free_port
from tests.operator.factories import experiment

EVOKUBE_TRAIN = str(Path(sys.executable).parent / "evokube-train")
# Mounted tmpfs before `/` turns read-only: the manifest (read-only) and the checkpoints.
OUTSIDE = "/mnt"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"),
    reason="needs root and unshare(1) for a private mount namespace (CI runs as root)",
)

SCRIPT = """
set -e
mount --make-rprivate /
mount -t tmpfs -o mode=0755 outside {outside}
mkdir {outside}/manifest {outside}/checkpoints
cp "$MANIFEST_SOURCE" {outside}/manifest/{manifest}
mount -o remount,bind,ro /
mount -t tmpfs -o mode=1777 scratch {scratch}
if touch /evokube-probe 2>/dev/null; then echo "root is writable"; exit 90; fi
set +e
env -i "$@"
code=$?
echo "--- written"
find {scratch} {outside}/checkpoints -mindepth 1 -maxdepth 2 | sort
exit $code
"""


def trainer_command(manifest: Path) -> list[str]:
    """`env` arguments: the Job's environment for host 0, paths moved under OUTSIDE.

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
            api.ENV_MANIFEST: f"{OUTSIDE}/manifest/{api.MANIFEST_FILE}",
            api.ENV_CHECKPOINT_DIR: f"{OUTSIDE}/checkpoints",
            api.ENV_COORDINATOR: "",  # one process: no group to join
            api.ENV_NUM_PROCESSES: "1",
            api.ENV_PROCESS_ID: "0",
            api.ENV_METRICS_PORT: str(free_port()),
            # In a pod without a token (the chart's policy absent): reports are dropped.
            "KUBERNETES_SERVICE_HOST": "10.0.0.1",
            "KUBERNETES_SERVICE_PORT": "443",
            "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
            "JAX_PLATFORMS": "cpu",
        }
    )
    manifest.write_text(builders.manifest_yaml(exp))
    return [f"{k}={v}" for k, v in env.items() if v] + [EVOKUBE_TRAIN]


def test_the_trainer_runs_with_a_read_only_root_and_writes_only_its_volumes(tmp_path):
    script = SCRIPT.format(outside=OUTSIDE, manifest=api.MANIFEST_FILE, scratch=api.SCRATCH_DIR)
    manifest = tmp_path / "experiment.yaml"
    command = trainer_command(manifest)
    run = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "bash", "-c", script, "bash", *command],
        env={**os.environ, "MANIFEST_SOURCE": str(manifest)},
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
    assert f"{OUTSIDE}/checkpoints/checkpoints" in written  # Orbax
    assert f"{OUTSIDE}/checkpoints/xla-cache" in written  # the compilation cache
    assert f"{OUTSIDE}/checkpoints/history.jsonl" in written  # process 0's history
    assert f"{OUTSIDE}/checkpoints/tensorboard" in written  # and its TensorBoard events
