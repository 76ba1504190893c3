"""Metric recorders: where the host loop sends one dict of scalars per generation.

A recorder has two methods, `write(generation, metrics)` and `close()`, and works as a context
manager. `Workflow.learn` calls `write` once per generation with plain Python numbers; it never
closes recorders, their owner does.

    with JsonLinesRecorder("runs/exp/metrics.jsonl") as log, ConsoleRecorder() as console:
        workflow.learn(state, stop=lambda m: m["generation"] >= 100, recorders=[log, console])
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import IO, Any, Protocol, runtime_checkable

from evokube_trainer import metric_names as names

__all__ = [
    "BucketJsonLinesRecorder",
    "ConsoleRecorder",
    "JsonLinesRecorder",
    "MemoryRecorder",
    "Recorder",
    "RecorderBase",
    "TensorBoardRecorder",
    "WandbRecorder",
    "history_recorder",
    "wandb_recorders",
]

_log = logging.getLogger(__name__)

Metrics = Mapping[str, Any]


@runtime_checkable
class Recorder(Protocol):
    def write(self, generation: int, metrics: Metrics) -> None: ...

    def close(self) -> None: ...


class RecorderBase:
    """Context-manager support for recorders; subclasses implement `write` (and `close`), and
    may keep `describe_run`'s facts of the run (e.g. its physics pipeline)."""

    run: Mapping[str, str] = {}

    def describe_run(self, info: Mapping[str, str]) -> None:
        """Facts that hold for the whole run, given before its first generation."""
        self.run = dict(info)

    def write(self, generation: int, metrics: Metrics) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _json_number(value: Any) -> Any:
    """A JSON-safe scalar: NaN and infinities become strings (JSON has no literal for them)."""
    if hasattr(value, "item"):  # NumPy / JAX scalars
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


class JsonLinesRecorder(RecorderBase):
    """Appends one JSON object per generation to `path`:
    `{"generation": 7, "time": <unix seconds>, "metrics": {...}, "run": {"pipeline": ...}}`
    ("run": `describe_run`'s facts, absent when there are none).

    Each line is flushed as it is written, so a crashed run keeps everything up to its last
    generation. Parent folders are created.
    """

    def __init__(self, path: str | os.PathLike[str]):
        self.path = os.fspath(path)
        parent = os.path.dirname(self.path)
        if parent:
            os.makedirs(parent, exist_ok=True)
        self._file: IO[str] | None = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def write(self, generation: int, metrics: Metrics) -> None:
        if self._file is None:
            raise ValueError(f"recorder for {self.path} is closed")
        self._file.write(_json_line(generation, metrics, self.run))
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _json_line(generation: int, metrics: Metrics, run: Mapping[str, str]) -> str:
    record = {
        "generation": int(generation),
        "time": time.time(),
        "metrics": {name: _json_number(value) for name, value in metrics.items()},
    }
    if run:  # the run's facts on every line: a bucket's history joins the lives of a run
        record["run"] = dict(run)
    return json.dumps(record, sort_keys=True) + "\n"


class BucketJsonLinesRecorder(RecorderBase):
    """JsonLinesRecorder's format in a bucket object (`gs://…`, `s3://…`, any fsspec URL).

    An object cannot be appended to, so the recorder keeps the whole text (starting from what
    an earlier life of the run left there) and uploads it at most every `upload_every_s`
    seconds and at close. History is secondary to training: a read or upload that fails is
    logged and retried at the next write, never raised, and the object is never overwritten
    before its earlier text has been read.
    """

    def __init__(self, url: str, upload_every_s: float = 10.0):
        self.url = url
        self.upload_every_s = upload_every_s
        self._earlier: str | None = None  # the object's text before this run; read lazily
        self._lines: list[str] = []
        self._uploaded_at = -math.inf
        self._dirty = False
        self._closed = False

    def write(self, generation: int, metrics: Metrics) -> None:
        if self._closed:
            raise ValueError(f"recorder for {self.url} is closed")
        self._lines.append(_json_line(generation, metrics, self.run))
        self._dirty = True
        if time.monotonic() - self._uploaded_at >= self.upload_every_s:
            self._upload()

    def close(self) -> None:
        if not self._closed and self._dirty:
            self._upload()
        self._closed = True

    def _upload(self) -> None:
        import fsspec

        try:
            fs, path = fsspec.core.url_to_fs(self.url)
            if self._earlier is None:
                try:
                    self._earlier = fs.cat_file(path).decode("utf-8")
                except FileNotFoundError:
                    self._earlier = ""
            fs.pipe_file(path, (self._earlier + "".join(self._lines)).encode("utf-8"))
        except Exception as err:  # any storage error: training goes on
            _log.warning("could not upload %s (retried at the next generation): %s", self.url, err)
            return
        self._uploaded_at = time.monotonic()
        self._dirty = False


def history_recorder(location: str) -> RecorderBase:
    """The history.jsonl recorder for `location`: a bucket URL or a path."""
    if "://" in location:
        return BucketJsonLinesRecorder(location)
    return JsonLinesRecorder(location)


def _scalars(metrics: Metrics) -> dict[str, float]:
    """The metrics that are numbers, as floats (NaN and infinities kept); others are skipped."""
    values = {}
    for name, value in metrics.items():
        if hasattr(value, "item"):  # NumPy / JAX scalars
            value = value.item()
        if isinstance(value, bool | int | float):
            values[name] = float(value)
    return values


class TensorBoardRecorder(RecorderBase):
    """TensorBoard event files in `location` (a folder, or a bucket URL for fsspec): one scalar
    per metric, step = generation, wall time real.

    Every life of a run (a restarted pod, a rerun) starts a new event file, named uniquely,
    with a SessionLog START at its first generation: TensorBoard reads every file of the
    folder, and a resumed run's generations replace those the earlier life wrote after the
    checkpoint. Events are written and flushed synchronously,
    one per generation (tensorboardX's SummaryWriter queues them for a thread that its
    `flush` does not wait for). In a bucket, the file is written in a local temporary folder
    and uploaded whole at most every `upload_every_s` seconds and at close; like
    BucketJsonLinesRecorder, a storage error is logged and retried, never raised.
    """

    def __init__(self, location: str, upload_every_s: float = 10.0):
        from tensorboardX.event_file_writer import EventsWriter  # imports protobuf: on demand

        self.location = location.rstrip("/")
        self.upload_every_s = upload_every_s
        self._bucket = "://" in location
        self._folder = tempfile.mkdtemp(prefix="evokube-tb-") if self._bucket else self.location
        os.makedirs(self._folder, exist_ok=True)
        # A restart within the same second on the same host must not reuse the file's name.
        suffix = f".{os.getpid()}.{uuid.uuid4().hex[:8]}"
        self._writer: Any = EventsWriter(os.path.join(self._folder, "events"), suffix)
        self._started = False
        self._uploaded_at = -math.inf
        self._dirty = False

    def write(self, generation: int, metrics: Metrics) -> None:
        from tensorboardX.proto.event_pb2 import Event, SessionLog
        from tensorboardX.proto.summary_pb2 import Summary

        if self._writer is None:
            raise ValueError(f"recorder for {self.location} is closed")
        if not self._started:  # TensorBoard then drops earlier lives' points from here on
            start = SessionLog(status=SessionLog.START)
            self._writer.write_event(
                Event(wall_time=time.time(), step=int(generation), session_log=start)
            )
            self._started = True
        # Summary values built directly: tensorboardX's `scalar` would log a warning for
        # every NaN (an evaluation return before the first evaluation), every generation.
        values = [Summary.Value(tag=k, simple_value=v) for k, v in _scalars(metrics).items()]
        event = Event(wall_time=time.time(), step=int(generation), summary=Summary(value=values))
        self._writer.write_event(event)
        self._writer.flush()
        self._dirty = True
        if self._bucket and time.monotonic() - self._uploaded_at >= self.upload_every_s:
            self._upload()

    def close(self) -> None:
        if self._writer is None:
            return
        self._writer.close()
        self._writer = None
        if self._bucket:
            if self._dirty:
                self._upload()
            shutil.rmtree(self._folder, ignore_errors=True)

    def _upload(self) -> None:
        import fsspec

        try:
            fs, root = fsspec.core.url_to_fs(self.location)
            for name in os.listdir(self._folder):
                fs.put_file(os.path.join(self._folder, name), f"{root}/{name}")
        except Exception as err:  # any storage error: training goes on
            _log.warning("could not upload to %s (retried later): %s", self.location, err)
            return
        self._uploaded_at = time.monotonic()
        self._dirty = False


class WandbRecorder(RecorderBase):
    """Each generation's scalars to a Weights & Biases run, step = generation.

    The run's id is the experiment's namespace and name, so a restarted pod continues the
    same run (`resume="allow"`). W&B is secondary to training: an error is logged, never
    raised. Build it through `wandb_recorders`, which decides whether W&B is on at all.
    """

    def __init__(self, run: Any):
        self._run = run

    def write(self, generation: int, metrics: Metrics) -> None:
        if self._run is None:
            raise ValueError("the W&B recorder is closed")
        try:
            self._run.log(_scalars(metrics), step=int(generation))
        except Exception as err:
            _log.warning("could not log generation %d to W&B: %s", generation, err)

    def close(self) -> None:
        if self._run is None:
            return
        try:
            self._run.finish()
        except Exception as err:
            _log.warning("could not finish the W&B run: %s", err)
        self._run = None


def wandb_recorders(name: str, namespace: str, folder: str | None = None) -> list[RecorderBase]:
    """[a WandbRecorder] when WANDB_API_KEY is set, else []: W&B is never required.

    The project is WANDB_PROJECT, else "evokube". W&B's local files go to WANDB_DIR if set,
    else `folder`, else the temporary folder (a pod's root filesystem is read-only). Without
    the optional `wandb` package (`evokube[wandb]`), or when the run cannot start, one
    warning is logged and training goes on without it.
    """
    if not os.environ.get("WANDB_API_KEY"):
        return []
    try:
        import wandb
    except ImportError:
        _log.warning(
            "WANDB_API_KEY is set but wandb is not installed (evokube[wandb]): not logging to W&B"
        )
        return []
    try:
        run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "evokube"),
            id=f"{namespace}-{name}",
            name=f"{namespace}/{name}",
            resume="allow",
            dir=None if os.environ.get("WANDB_DIR") else folder or tempfile.gettempdir(),
        )
    except Exception as err:
        _log.warning("could not start the W&B run (training goes on without it): %s", err)
        return []
    return [WandbRecorder(run)]


DEFAULT_CONSOLE_KEYS = (
    names.ENV_STEPS,
    names.BEST_FITNESS,
    names.MEAN_FITNESS,
    names.EVAL_RETURN,
    names.CRITIC_LOSS,
    names.GENERATIONS_PER_S,
    names.ENV_STEPS_PER_S,
)


class ConsoleRecorder(RecorderBase):
    """One readable line per generation, e.g.

        gen     12 | env_steps 26000 | ec/fitness_max -151.2 | eval/return_mean -160.4 | ...

    `keys` picks and orders the metrics shown (missing ones are skipped); None shows every
    metric. `every` prints only every n-th generation.
    """

    def __init__(
        self,
        keys: Sequence[str] | None = DEFAULT_CONSOLE_KEYS,
        *,
        stream: IO[str] | None = None,
        every: int = 1,
    ):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every}")
        self.keys = None if keys is None else tuple(keys)
        self.stream = stream
        self.every = every

    def write(self, generation: int, metrics: Metrics) -> None:
        if generation % self.every:
            return
        names = sorted(metrics) if self.keys is None else [k for k in self.keys if k in metrics]
        fields = [f"gen {int(generation):6d}"]
        fields += [f"{name} {_format(metrics[name])}" for name in names]
        stream = self.stream if self.stream is not None else sys.stdout
        print(" | ".join(fields), file=stream, flush=True)


def _format(value: Any) -> str:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool | int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class MemoryRecorder(RecorderBase):
    """Keeps every `(generation, metrics)` in `records`; handy in tests and notebooks."""

    def __init__(self):
        self.records: list[tuple[int, dict[str, Any]]] = []

    def write(self, generation: int, metrics: Metrics) -> None:
        self.records.append((int(generation), dict(metrics)))

    def last(self, name: str) -> Any:
        """The most recent value of metric `name`."""
        for _, metrics in reversed(self.records):
            if name in metrics:
                return metrics[name]
        raise KeyError(name)
