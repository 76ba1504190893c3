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
import sys
import time
from collections.abc import Mapping, Sequence
from typing import IO, Any, Protocol, runtime_checkable

__all__ = [
    "BucketJsonLinesRecorder",
    "ConsoleRecorder",
    "JsonLinesRecorder",
    "MemoryRecorder",
    "Recorder",
    "RecorderBase",
    "history_recorder",
]

_log = logging.getLogger(__name__)

Metrics = Mapping[str, Any]


@runtime_checkable
class Recorder(Protocol):
    def write(self, generation: int, metrics: Metrics) -> None: ...

    def close(self) -> None: ...


class RecorderBase:
    """Context-manager support for recorders; subclasses implement `write` (and `close`)."""

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
    `{"generation": 7, "time": <unix seconds>, "metrics": {...}}`.

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
        self._file.write(_json_line(generation, metrics))
        self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def _json_line(generation: int, metrics: Metrics) -> str:
    record = {
        "generation": int(generation),
        "time": time.time(),
        "metrics": {name: _json_number(value) for name, value in metrics.items()},
    }
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
        self._lines.append(_json_line(generation, metrics))
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


DEFAULT_CONSOLE_KEYS = (
    "env_steps",
    "ec/fitness_max",
    "ec/fitness_mean",
    "eval/return_mean",
    "rl/critic_loss",
    "time/generations_per_s",
    "time/env_steps_per_s",
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
