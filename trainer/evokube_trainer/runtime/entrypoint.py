"""`evokube-train`: the trainer process, as the operator runs it in every pod.

Inputs come from the environment (docs/architecture.md, read by `inputs.Inputs`):
EVOKUBE_MANIFEST, JAX_* for the process group, MEGASCALE_NUM_SLICES and
MEGASCALE_SLICE_ID for a multislice gang, EVOKUBE_CHECKPOINT_DIR,
EVOKUBE_METRICS_PORT, EVOKUBE_REPORT_STATUS, EVOKUBE_HISTORY (a second
JSON-lines file for each generation's metrics; the first is history.jsonl
beside the checkpoints, next to TensorBoard's tensorboard/) and the user's
EVOKUBE_LOG_LEVEL; WANDB_API_KEY, if
the pod has it, turns on the optional W&B run; everything else, the
experiment's name and namespace too, from the manifest. The exit code tells
the operator what to do next: 0 done, 75 restart from checkpoint, 78 give up.
"""

from __future__ import annotations

import logging
import os
import sys

from evokube_contract import (
    ENV_TERMINATION_LOG,
    HISTORY_FILE,
    TENSORBOARD_SUBDIR,
    TERMINATION_LOG,
)
from evokube_trainer.runtime import exitcodes


def main() -> int:
    logging.basicConfig(  # at the user's level once the inputs are read
        level=logging.INFO,
        format="%(asctime)s %(levelname)s [process %(process)d] %(name)s: %(message)s",
    )
    logging.getLogger("absl").setLevel(logging.WARNING)  # Orbax logs every save step at INFO
    log = logging.getLogger("evokube-train")
    try:
        return _run(log)
    except exitcodes.PermanentError as err:
        log.error("permanent failure: %s", err)
        write_termination_message(f"permanent failure: {err}")
        return exitcodes.PERMANENT
    except exitcodes.RetriableError as err:
        log.error("retriable failure: %s", err)
        write_termination_message(f"retriable failure: {err}")
        return exitcodes.RETRIABLE
    except Exception as err:  # anything else may be the infrastructure: let the operator retry
        log.exception("trainer failed")
        # The error itself, not the traceback's last lines the kubelet would take instead.
        write_termination_message(f"unexpected failure: {type(err).__name__}: {err}")
        return exitcodes.RETRIABLE


def process_age_s() -> float:
    """Seconds since this process started (Linux's /proc; NaN elsewhere): a restart's imports
    and device start-up, which happen before any of the trainer's own timers."""
    try:
        with open("/proc/self/stat") as stat, open("/proc/uptime") as uptime:
            started_ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
            return float(uptime.read().split()[0]) - started_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


def write_termination_message(reason: str) -> None:
    """Put `reason` where the kubelet reads the container's termination message (the operator
    copies it into the experiment's status), so it is not lost among later log lines. Outside a
    pod (no such file) this does nothing; the reason is in the log either way."""
    path = os.environ.get(ENV_TERMINATION_LOG, TERMINATION_LOG)
    if not os.path.exists(path):
        return
    try:
        with open(path, "w") as f:
            f.write(reason[-4000:])  # the kubelet keeps at most 4096 bytes
    except OSError:
        pass


def _run(log: logging.Logger) -> int:
    from evokube_trainer.runtime import distributed, manifest
    from evokube_trainer.runtime.inputs import Inputs

    inputs = Inputs.from_env()
    logging.getLogger().setLevel(inputs.log_level)
    try:
        loaded = manifest.load(inputs.manifest)
    except manifest.ManifestError as err:
        log.error("%s", err)
        return exitcodes.PERMANENT
    # Join the group before anything starts a JAX backend (importing the workflows may).
    timeouts = loaded["spec"]["distributed"]
    distributed.initialize(
        inputs.group,
        initialization_timeout_s=timeouts["initializationTimeoutSeconds"],
        heartbeat_timeout_s=timeouts["heartbeatTimeoutSeconds"],
    )
    try:
        inputs.slices.check()
    except ValueError as err:
        raise exitcodes.PermanentError(str(err)) from None
    opener = distributed.open_devices_in_background()
    try:
        return _train(log, inputs, loaded)
    finally:
        opener.join()


def _train(log: logging.Logger, inputs, loaded: dict) -> int:
    """Build the run from the checked manifest and train it (the devices are opening)."""
    import jax

    from evokube_trainer.runtime import manifest
    from evokube_trainer.runtime.config import to_run_config
    from evokube_trainer.runtime.status import StatusReporter
    from evokube_trainer.runtime.trainer import StopFlags, train

    try:
        config = to_run_config(loaded)
    except manifest.ManifestError as err:
        log.error("%s", err)
        return exitcodes.PERMANENT
    checkpoint_dir = inputs.checkpoint_dir
    if checkpoint_dir:
        check_checkpoint_dir(checkpoint_dir)
    reporter = None
    if inputs.report_status and inputs.process_id == 0:
        reporter = StatusReporter(config.name, config.namespace)
    histories = []
    if inputs.process_id == 0:
        histories = history_recorders(checkpoint_dir, inputs.history)
        histories += _wandb_recorders(config.name, config.namespace, checkpoint_dir)
    flags = StopFlags()
    flags.install()
    devices = jax.devices()
    log.info(
        "process %d of %d: %d %s device(s) in all (%s), open %.1f s after the process started",
        inputs.process_id,
        jax.process_count(),
        len(devices),
        devices[0].platform,
        devices[0].device_kind,
        process_age_s(),
    )
    try:
        outcome = train(
            config,
            checkpoint_dir=checkpoint_dir,
            metrics_port=inputs.metrics_port,
            metrics_fd=inputs.metrics_fd,
            slices=inputs.slices.count,
            status_reporter=reporter,
            recorders=histories,
            flags=flags,
        )
    finally:
        flags.settle()
        for history in histories:
            history.close()
    log.info("stopped at generation %d: %s", outcome.generation, outcome.reason)
    return outcome.exit_code


def history_recorders(checkpoint_dir: str | None, extra: str | None = None) -> list:
    """Where process 0 writes its history: history.jsonl and TensorBoard event files beside the
    checkpoints (so a cluster run's curve outlives its pods, in a bucket too, and
    `tensorboard --logdir <location>/tensorboard` shows it), and history.jsonl at `extra`
    (EVOKUBE_HISTORY) when that is elsewhere (`evokube run` follows that file to print
    progress)."""
    from evokube_trainer.recorders import TensorBoardRecorder, history_recorder

    locations = []
    if checkpoint_dir:
        locations.append(checkpoint_dir.rstrip("/") + "/" + HISTORY_FILE)
    if extra and os.path.abspath(extra) not in map(os.path.abspath, locations):
        locations.append(extra)
    recorders = [history_recorder(location) for location in locations]
    if checkpoint_dir:
        recorders.append(TensorBoardRecorder(checkpoint_dir.rstrip("/") + "/" + TENSORBOARD_SUBDIR))
    return recorders


def _wandb_recorders(name: str, namespace: str, checkpoint_dir: str | None) -> list:
    """The optional W&B run (on when WANDB_API_KEY is in the pod's environment); its local
    files go beside a local checkpoint folder, else to the scratch folder."""
    from evokube_trainer.recorders import wandb_recorders
    from evokube_trainer.runtime.objectstore import is_url

    local = checkpoint_dir if checkpoint_dir and not is_url(checkpoint_dir) else None
    return wandb_recorders(name, namespace, local)


def check_checkpoint_dir(path: str) -> None:
    """Create a local checkpoint directory and write a probe file there. One that cannot be
    written raises PermanentError when every restart would meet it again (a file in its place
    or above it, permissions, a read-only filesystem: runtime/folders.py), else RetriableError
    (a full disk, I/O); a bucket is checked by `objectstore.prepare` when training starts."""
    from evokube_trainer.runtime import folders, objectstore

    if objectstore.is_url(path):
        return
    try:
        folders.prepare(path)
    except OSError as err:
        message = f"spec.checkpoint.location: {folders.describe(path, err)}"
        if folders.permanent(err):
            raise exitcodes.PermanentError(message) from err
        raise exitcodes.RetriableError(message) from err


if __name__ == "__main__":
    sys.exit(main())
