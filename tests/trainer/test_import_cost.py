"""Start-up: importing the envs must not load gymnax's rendering libraries (seconds of import),
yet code that renders still reaches the real modules; what a pod imports loads none of the
laptop's tools."""

import subprocess
import sys

PROBE = """
import sys
import evokube_trainer.envs
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
