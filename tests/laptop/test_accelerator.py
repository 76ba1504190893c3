"""The `evokube` command leaves the accelerator to the trainers it starts: a TPU chip can be
held by one process at a time, and importing the environments computes on JAX's default
device, so the command checks a manifest on the CPU, without changing its children's
environment (found on a TPU v5e, where the trainer of `evokube run` could not open the chip)."""

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = str(REPO / "examples" / "pendulum-cemrl.yaml")

CHECK = f"""
import json, os
import jax
from evokube_trainer.laptop import cli
from jax._src import xla_bridge
assert cli._load({EXAMPLE!r}) is not None
print(json.dumps({{
    "platforms": jax.config.jax_platforms,
    "backends": sorted(xla_bridge.backends()),
    "env": os.environ.get("JAX_PLATFORMS"),
}}))
"""


def test_checking_a_manifest_opens_only_the_cpu_and_leaves_the_environment_alone():
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env["PYTHONPATH"] = os.pathsep.join(str(REPO / p) for p in ("operator", "trainer", "."))
    done = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", CHECK],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"platforms": "cpu", "backends": ["cpu"], "env": None}
