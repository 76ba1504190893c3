"""Start-up: a gymnax env must not load gymnax's rendering libraries (seconds of import), yet
code that renders still reaches the real modules; what a pod imports loads none of the
laptop's tools, and opens no device."""

import os
import subprocess
import sys

PROBE = """
import sys
import evokube_trainer.envs
evokube_trainer.envs.make_backend_env("gymnax/Pendulum-v1")  # imports gymnax
heavy = sorted(m for m in ("scipy.stats", "pandas") if m in sys.modules)
print("loaded:", heavy)
import gymnax.environments.misc.pong as pong
palette = pong.sns.color_palette("cubehelix", 2)
print("palette:", len(palette), "subplots:", pong.plt.subplots.__module__)
import seaborn
print("same:", seaborn.color_palette is pong.sns.color_palette)
"""


def test_envs_import_leaves_rendering_libraries_until_used():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True
    ).stdout
    assert "loaded: []" in out
    assert "palette: 2 subplots: matplotlib.pyplot" in out
    assert "same: True" in out


POD = """
import sys
from evokube_trainer import recorders  # what evokube-train imports (entrypoint._run)
from evokube_trainer.runtime import config, distributed, entrypoint, inputs, manifest, objectstore
from evokube_trainer.runtime import status, trainer
# matplotlib.figure: the real pyplot was loaded, not the envs' stand-in
tools = ("evokube_trainer.laptop", "pygame", "matplotlib.figure")
print("laptop:", sorted(m for m in sys.modules if m.startswith(tools)))
"""


def test_the_pod_path_loads_no_laptop_tool_nor_their_libraries():
    out = subprocess.run(
        [sys.executable, "-c", POD], capture_output=True, text=True, check=True
    ).stdout
    assert "laptop: []" in out


IMPORT_THE_TRAINER = """
from jax._src import xla_bridge
import evokube_trainer.runtime.entrypoint, evokube_trainer.runtime.trainer
import evokube_trainer.workflows, evokube_trainer.envs, evokube_trainer.laptop.cli
print("backends initialized:", xla_bridge.backends_are_initialized())
"""


def test_importing_the_trainer_opens_no_device():
    """What `distributed.open_devices_in_background` relies on: an import that ran a
    computation (gymnax's does) would wait in the main thread for the chip's start-up."""
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_THE_TRAINER],
        env={**os.environ, "JAX_PLATFORMS": "cpu"},
        capture_output=True,
        text=True,
    )
    assert "backends initialized: False" in done.stdout, done.stdout + done.stderr
