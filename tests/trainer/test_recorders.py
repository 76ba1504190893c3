"""Tests of the metric recorders."""

import io
import json

import numpy as np
import pytest

from evokube_trainer.recorders import (
    ConsoleRecorder,
    JsonLinesRecorder,
    MemoryRecorder,
    Recorder,
)


def test_json_lines_recorder_writes_one_parsable_line_per_generation(tmp_path):
    path = tmp_path / "run" / "metrics.jsonl"  # the parent folder does not exist yet
    with JsonLinesRecorder(path) as recorder:
        recorder.write(1, {"env_steps": 2000, "eval/return_mean": np.float32(-812.5)})
        recorder.write(2, {"env_steps": 4000, "eval/return_mean": -301.25})
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    records = [json.loads(line) for line in lines]
    assert [r["generation"] for r in records] == [1, 2]
    assert records[0]["metrics"] == {"env_steps": 2000, "eval/return_mean": -812.5}
    assert records[1]["metrics"]["eval/return_mean"] == -301.25
    assert all(isinstance(r["time"], float) for r in records)


def test_json_lines_recorder_keeps_non_finite_values_as_valid_json(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with JsonLinesRecorder(path) as recorder:
        recorder.write(3, {"loss": float("nan"), "top": float("inf")})
    record = json.loads(path.read_text(), parse_constant=pytest.fail)
    assert record["metrics"] == {"loss": "nan", "top": "inf"}


def test_json_lines_recorder_appends_and_refuses_writes_after_close(tmp_path):
    path = tmp_path / "metrics.jsonl"
    with JsonLinesRecorder(path) as recorder:
        recorder.write(1, {"a": 1})
    recorder = JsonLinesRecorder(path)  # a restarted run appends to the same file
    recorder.write(2, {"a": 2})
    recorder.close()
    recorder.close()  # closing twice is harmless
    assert len(path.read_text().splitlines()) == 2
    with pytest.raises(ValueError, match="closed"):
        recorder.write(3, {"a": 3})


def test_console_recorder_prints_the_chosen_metrics_in_order():
    stream = io.StringIO()
    recorder = ConsoleRecorder(keys=["env_steps", "missing", "eval/return_mean"], stream=stream)
    recorder.write(7, {"eval/return_mean": -151.23456, "env_steps": 14000, "other": 1.0})
    assert stream.getvalue() == "gen      7 | env_steps 14000 | eval/return_mean -151.2\n"


def test_console_recorder_shows_everything_sorted_and_thins_output():
    stream = io.StringIO()
    recorder = ConsoleRecorder(keys=None, stream=stream, every=2)
    for generation in (1, 2, 3, 4):
        recorder.write(generation, {"b": generation, "a": 0.5})
    lines = stream.getvalue().splitlines()
    assert lines == ["gen      2 | a 0.5 | b 2", "gen      4 | a 0.5 | b 4"]
    with pytest.raises(ValueError):
        ConsoleRecorder(every=0)


def test_memory_recorder_and_the_protocol():
    recorder = MemoryRecorder()
    recorder.write(1, {"x": 1.0})
    recorder.write(2, {"y": 2.0})
    assert recorder.records == [(1, {"x": 1.0}), (2, {"y": 2.0})]
    assert recorder.last("x") == 1.0 and recorder.last("y") == 2.0
    with pytest.raises(KeyError):
        recorder.last("z")
    for candidate in (recorder, ConsoleRecorder()):
        assert isinstance(candidate, Recorder)


def _bucket_lines(url):
    import fsspec

    fs, path = fsspec.core.url_to_fs(url)
    return [json.loads(line) for line in fs.cat_file(path).decode().splitlines()]


def test_bucket_recorder_keeps_the_earlier_text_and_uploads_at_most_every_interval():
    from evokube_trainer.recorders import BucketJsonLinesRecorder, history_recorder

    url = "memory://evokube-test/runs/exp/history.jsonl"
    with BucketJsonLinesRecorder(url) as first:  # an earlier life of the run
        first.write(1, {"a": 1})
    assert [r["generation"] for r in _bucket_lines(url)] == [1]

    recorder = history_recorder(url)
    assert isinstance(recorder, BucketJsonLinesRecorder)
    recorder.write(2, {"a": 2})  # the first write uploads at once, after reading gen 1
    recorder.write(3, {"a": float("nan")})  # within 10 s: kept, not uploaded yet
    assert [r["generation"] for r in _bucket_lines(url)] == [1, 2]
    recorder.close()
    records = _bucket_lines(url)
    assert [r["generation"] for r in records] == [1, 2, 3]
    assert records[2]["metrics"] == {"a": "nan"}
    with pytest.raises(ValueError, match="closed"):
        recorder.write(4, {"a": 4})


def test_bucket_recorder_logs_storage_errors_and_never_raises(caplog):
    from evokube_trainer.recorders import BucketJsonLinesRecorder

    recorder = BucketJsonLinesRecorder("nosuchscheme://bucket/history.jsonl", upload_every_s=0)
    recorder.write(1, {"a": 1})
    recorder.close()
    assert "could not upload nosuchscheme://bucket/history.jsonl" in caplog.text


def test_history_goes_beside_the_checkpoints_and_to_evokube_history(tmp_path):
    from evokube_trainer.recorders import (
        BucketJsonLinesRecorder,
        JsonLinesRecorder,
        TensorBoardRecorder,
    )
    from evokube_trainer.runtime.entrypoint import history_recorders

    cluster, board = history_recorders("gs://bucket/ns/exp/")
    assert isinstance(cluster, BucketJsonLinesRecorder)
    assert cluster.url == "gs://bucket/ns/exp/history.jsonl"
    assert isinstance(board, TensorBoardRecorder)
    assert board.location == "gs://bucket/ns/exp/tensorboard"
    board.close()  # wrote nothing: uploads nothing
    assert history_recorders(None) == []

    extra = str(tmp_path / "history.jsonl")  # EVOKUBE_HISTORY
    same, board = history_recorders(str(tmp_path), extra)  # a local run: one file, not two
    assert isinstance(same, JsonLinesRecorder) and same.path == str(tmp_path / "history.jsonl")
    assert board.location == str(tmp_path / "tensorboard")
    same.close()
    board.close()
    bucket, local, board = history_recorders("s3://bucket/exp", extra)
    assert bucket.url == "s3://bucket/exp/history.jsonl"
    assert local.path == str(tmp_path / "history.jsonl")
    local.close()
    board.close()
