"""Exported policies: the deployable actor of a run as a small folder (`artifact.py`)."""

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

__all__ = [
    "FORMAT",
    "METADATA_FILE",
    "PARAMS_FILE",
    "PolicyArtifact",
    "PolicyReadError",
    "network_config",
    "network_from_config",
    "read_policy",
    "write_policy",
]
