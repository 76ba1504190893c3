"""What the trainer reads from its environment: its half of evokube_contract, in one place.

The operator sets these variables on every pod (builders.trainer_env), `evokube run` on every
local process (local.process_env); the log level is the user's (spec.env). Everything else comes
from the manifest at `manifest`: what the user wrote, and the experiment's name and namespace
(its metadata).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from urllib import parse

from evokube_contract import (
    ENV_CHECKPOINT_DIR,
    ENV_HISTORY,
    ENV_LOG_LEVEL,
    ENV_MANIFEST,
    ENV_METRICS_FD,
    ENV_METRICS_PORT,
    ENV_REPORT_STATUS,
)
from evokube_trainer.runtime.distributed import ProcessGroup, Slices
from evokube_trainer.runtime.exitcodes import PermanentError
from evokube_trainer.runtime.objectstore import is_url

MAX_PORT = 65535


@dataclass(frozen=True)
class Inputs:
    manifest: str  # path of the ERLExperiment YAML
    group: ProcessGroup | None  # None: a single process (or a TPU slice JAX finds itself)
    slices: Slices  # the gang's slices and this process's (one slice without MEGASCALE_*)
    checkpoint_dir: str | None  # path, gs:// or s3://; None: no checkpoints
    metrics_port: int | None  # None or 0: no /metrics server
    metrics_fd: int | None  # `evokube run`: an inherited socket, already bound to metrics_port
    report_status: bool  # process 0 patches status.progress
    history: str | None  # a second history.jsonl (`evokube run`)
    log_level: str  # a logging level's name (the user's, through spec.env)

    @property
    def process_id(self) -> int:
        return self.group.process_id if self.group else 0

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Inputs:
        """The inputs `env` gives; PermanentError where they are missing or malformed (a restart
        gets the same environment)."""
        manifest = env.get(ENV_MANIFEST)
        if not manifest:
            raise PermanentError(f"{ENV_MANIFEST} is not set")
        try:
            group = ProcessGroup.from_env(env)
            slices = Slices.from_env(env)
        except ValueError as err:
            raise PermanentError(str(err)) from None
        level = (env.get(ENV_LOG_LEVEL) or "INFO").upper()
        if level not in logging.getLevelNamesMapping():
            raise PermanentError(
                f"{ENV_LOG_LEVEL}={env[ENV_LOG_LEVEL]!r} is not a logging level "
                "(DEBUG, INFO, WARNING, ERROR or CRITICAL)"
            )
        return cls(
            manifest=manifest,
            group=group,
            slices=slices,
            checkpoint_dir=_checkpoint_dir(env.get(ENV_CHECKPOINT_DIR)),
            metrics_port=_metrics_port(env.get(ENV_METRICS_PORT)),
            metrics_fd=_metrics_fd(env.get(ENV_METRICS_FD)),
            report_status=env.get(ENV_REPORT_STATUS) == "1",
            history=env.get(ENV_HISTORY) or None,
            log_level=level,
        )


def _metrics_port(value: str | None) -> int | None:
    if not value:
        return None
    if not (value.isascii() and value.isdigit() and int(value) <= MAX_PORT):
        raise PermanentError(f"{ENV_METRICS_PORT}={value!r} is not a port (0 to {MAX_PORT})")
    return int(value)


def _metrics_fd(value: str | None) -> int | None:
    if not value:
        return None
    if not (value.isascii() and value.isdigit()):
        raise PermanentError(f"{ENV_METRICS_FD}={value!r} is not a file descriptor")
    return int(value)


def _checkpoint_dir(value: str | None) -> str | None:
    """An absolute path, or a gs:// or s3:// URL naming a bucket: anything else would be read
    as a folder relative to wherever the process started."""
    if not value:
        return None
    if os.path.isabs(value) or (is_url(value) and parse.urlparse(value).netloc):
        return value
    raise PermanentError(
        f"{ENV_CHECKPOINT_DIR}={value!r} is neither an absolute path nor a gs:// or s3:// URL "
        "naming a bucket"
    )
