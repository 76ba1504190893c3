"""TensorBoard event files and the optional W&B run, read back by their own readers."""

import glob
import logging
import math
import os
import struct
import sys
import time
from pathlib import Path

import fsspec
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from evokube_trainer.recorders import TensorBoardRecorder, wandb_recorders
from tests.cluster.controlplane import wait_until


def scalars(path) -> dict[str, list[tuple[int, float]]]:
    """{tag: [(step, value), ...]} of an event file or folder, read by TensorBoard itself."""
    events = EventAccumulator(str(path))
    events.Reload()
    return {
        tag: [(event.step, event.value) for event in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
    }


def event_files(folder) -> list[str]:
    return sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*")))


def test_tensorboard_scalars_in_a_folder(tmp_path):
    folder = tmp_path / "tensorboard"  # does not exist yet
    with TensorBoardRecorder(str(folder)) as recorder:
        recorder.write(1, {"ec/fitness_max": -300.5, "env_steps": 2000, "note": "skipped"})
        recorder.write(2, {"ec/fitness_max": -120.25, "env_steps": 4000, "flag": True})
    assert scalars(folder) == {
        "ec/fitness_max": [(1, -300.5), (2, -120.25)],
        "env_steps": [(1, 2000.0), (2, 4000.0)],
        "flag": [(2, 1.0)],
    }
    events = EventAccumulator(str(folder))
    events.Reload()
    walltimes = [event.wall_time for event in events.Scalars("env_steps")]
    assert all(abs(t - walltimes[0]) < 60 for t in walltimes) and walltimes[0] > 1.7e9
    with pytest.raises(ValueError, match="closed"):
        recorder.write(3, {"a": 1.0})


def test_tensorboard_keeps_nan_quietly(tmp_path, caplog):
    with caplog.at_level(logging.WARNING), TensorBoardRecorder(str(tmp_path)) as recorder:
        for generation in (1, 2):  # no evaluation yet: NaN, every generation
            recorder.write(generation, {"eval/return_mean": float("nan")})
    ((step, value),) = scalars(tmp_path)["eval/return_mean"][1:]
    assert step == 2 and math.isnan(value)
    assert not caplog.records


def test_a_resumed_run_adds_a_second_event_file_and_both_are_read(tmp_path):
    with TensorBoardRecorder(str(tmp_path)) as first:
        first.write(1, {"ec/fitness_max": 1.0})
        first.write(2, {"ec/fitness_max": 2.0})
    with TensorBoardRecorder(str(tmp_path)) as second:  # same second, same host
        second.write(3, {"ec/fitness_max": 3.0})
    files = event_files(tmp_path)
    assert len(files) == 2, files
    lives = sorted(scalars(path)["ec/fitness_max"] for path in files)
    assert lives == [[(1, 1.0), (2, 2.0)], [(3, 3.0)]]


def test_a_life_resumed_from_an_earlier_checkpoint_replaces_the_later_points(tmp_path):
    with TensorBoardRecorder(str(tmp_path)) as first:
        for generation in (1, 2, 3, 4):
            first.write(generation, {"ec/fitness_max": float(generation)})
    # File names start with the Unix second, the order TensorBoard reads them in; a pod
    # restarts seconds later, so start the second life in the next second.
    time.sleep(1.01 - time.time() % 1)
    with TensorBoardRecorder(str(tmp_path)) as resumed:  # from the checkpoint of generation 2
        for generation in (3, 4, 5):
            resumed.write(generation, {"ec/fitness_max": generation + 0.5})
    assert scalars(tmp_path) == {
        "ec/fitness_max": [(1, 1.0), (2, 2.0), (3, 3.5), (4, 4.5), (5, 5.5)]
    }


def test_tensorboard_in_a_bucket_uploads_at_most_every_interval_and_at_close(tmp_path):
    url = "memory://bucket/ns/exp/tensorboard"
    fs = fsspec.filesystem("memory")
    recorder = TensorBoardRecorder(url, upload_every_s=3600)
    recorder.write(1, {"ec/fitness_max": 1.5})  # the first write uploads
    recorder.write(2, {"ec/fitness_max": 2.5})  # within the interval: kept locally
    (uploaded,) = fs.ls("/bucket/ns/exp/tensorboard", detail=False)
    fs.get(uploaded, str(tmp_path / "early" / os.path.basename(uploaded)))
    assert scalars(tmp_path / "early") == {"ec/fitness_max": [(1, 1.5)]}

    recorder.close()
    assert not os.path.exists(recorder._folder), "the local copy is removed at close"
    TensorBoardRecorder(url, upload_every_s=0).close()  # a life that wrote nothing uploads nothing
    with TensorBoardRecorder(url, upload_every_s=0) as resumed:
        resumed.write(3, {"ec/fitness_max": 3.5})
    files = fs.ls("/bucket/ns/exp/tensorboard", detail=False)
    assert len(files) == 2, files
    fs.get("/bucket/ns/exp/tensorboard/", str(tmp_path / "all"), recursive=True)
    lives = sorted(scalars(path)["ec/fitness_max"] for path in event_files(tmp_path / "all"))
    assert lives == [[(1, 1.5), (2, 2.5)], [(3, 3.5)]]


def test_tensorboard_storage_errors_are_logged_never_raised(caplog):
    recorder = TensorBoardRecorder("nosuchscheme://bucket/tensorboard", upload_every_s=0)
    recorder.write(1, {"a": 1.0})
    recorder.close()
    assert "could not upload to nosuchscheme://bucket/tensorboard" in caplog.text


def wandb_records(run_dir: Path) -> tuple[str, list[dict[str, str]]]:
    """The project and the history records ({key: JSON value}) of an offline run's .wandb file
    (LevelDB's log format: 32 KiB blocks of chunks with 7-byte headers, after a 7-byte file
    header); wandb has no reader of its own for it. wandb-core may still be writing the file
    when `finish` returns: this waits for the run's exit record."""
    (path,) = run_dir.glob("*.wandb")
    read: list[tuple[str, list[dict[str, str]], bool]] = []

    def finished() -> bool:
        read[:] = [_wandb_file(path.read_bytes())]
        return read[0][2]

    wait_until(finished, 30, f"the exit record in {path}")
    project, history, _ = read[0]
    return project, history


def _wandb_file(data: bytes) -> tuple[str, list[dict[str, str]], bool]:
    from wandb.proto import wandb_internal_pb2

    position, pending, history, project, exited = 7, b"", [], "", False
    while position + 7 <= len(data):
        if 32768 - position % 32768 < 7:  # a block's tail too short for a header is padding
            position += 32768 - position % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        pending += data[position + 7 : position + 7 + length]
        position += 7 + length
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record.FromString(pending)
            pending = b""
            which = record.WhichOneof("record_type")
            if which == "history":
                items = record.history.item  # a key with "/" may come as nested_key parts
                history.append({i.key or "/".join(i.nested_key): i.value_json for i in items})
            elif which == "run":
                project = project or record.run.project  # later run records update
            exited = exited or which == "exit"
    return project, history, exited


def test_wandb_is_off_without_an_api_key(monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert wandb_recorders("exp", "ns") == []


def test_wandb_key_without_the_package_warns_once_and_goes_on(monkeypatch, caplog):
    monkeypatch.setenv("WANDB_API_KEY", "not-a-real-key")
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` meets uninstalled
    with caplog.at_level(logging.WARNING):
        assert wandb_recorders("exp", "ns") == []
    assert caplog.text.count("wandb is not installed") == 1


def test_wandb_offline_run_holds_the_scalars_and_a_restart_continues_it(tmp_path, monkeypatch):
    pytest.importorskip("wandb")  # the optional extra evokube[wandb]
    monkeypatch.setenv("WANDB_API_KEY", "not-a-real-key")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_DIR", raising=False)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    (recorder,) = wandb_recorders("pendulum", "ml", str(tmp_path))
    with recorder:
        recorder.write(1, {"ec/fitness_max": -300.5, "env_steps": 2000, "note": "skipped"})
        recorder.write(2, {"ec/fitness_max": -120.25, "env_steps": 4000})
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*-ml-pendulum")
    project, history = wandb_records(run_dir)
    assert project == "evokube"
    assert [(r["_step"], r["ec/fitness_max"], r["env_steps"]) for r in history] == [
        ("1", "-300.5", "2000"),
        ("2", "-120.25", "4000"),
    ]
    assert all("note" not in r for r in history)

    monkeypatch.setenv("WANDB_PROJECT", "pendulum-sweep")
    second_pod = tmp_path / "second-pod"  # a restarted pod has a fresh scratch folder
    (restarted,) = wandb_recorders("pendulum", "ml", str(second_pod))
    with restarted:
        restarted.write(3, {"ec/fitness_max": -80.5})
    (run_dir,) = (second_pod / "wandb").glob("offline-run-*")
    assert [p.name for p in run_dir.glob("*.wandb")] == ["run-ml-pendulum.wandb"]  # same run id
    project, history = wandb_records(run_dir)
    assert project == "pendulum-sweep"
    assert [(r["_step"], r["ec/fitness_max"]) for r in history] == [("3", "-80.5")]
