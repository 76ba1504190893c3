"""Exported policies: the deployable actor of a run as a small folder (`artifact.py`), written
by the trainer at each evaluation (`export.py`), played and rendered from it (`play.py`)."""

from evokube_trainer.policies.artifact import (
    FORMAT,
    METADATA_FILE,
    PARAMS_FILE,
    PolicyArtifact,
    PolicyReadError,
    network_config,
    network_from_config,
    read_policy,
    write_policy,
)
from evokube_trainer.policies.export import BEST, PolicyExporter, generation_folder
from evokube_trainer.policies.play import (
    GYMNAX_VISUALIZED,
    PlaybackError,
    evaluate_policy,
    find_policy,
    render_policy,
)

__all__ = [
    "BEST",
    "FORMAT",
    "GYMNAX_VISUALIZED",
    "METADATA_FILE",
    "PARAMS_FILE",
    "PlaybackError",
    "PolicyArtifact",
    "PolicyExporter",
    "PolicyReadError",
    "evaluate_policy",
    "find_policy",
    "generation_folder",
    "network_config",
    "network_from_config",
    "read_policy",
    "render_policy",
    "write_policy",
]
