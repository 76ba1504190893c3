"""Exported policies: the deployable actor of a run as a small folder (`artifact.py`), written
by the trainer at each evaluation (`export.py`)."""

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

__all__ = [
    "BEST",
    "FORMAT",
    "METADATA_FILE",
    "PARAMS_FILE",
    "PolicyArtifact",
    "PolicyExporter",
    "PolicyReadError",
    "generation_folder",
    "network_config",
    "network_from_config",
    "read_policy",
    "write_policy",
]
