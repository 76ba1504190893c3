"""Checkpoints on gs:// and s3://, against real emulators (fake-gcs-server, moto's server).

Every test runs once per emulator (the `store` fixture). The trainer reaches the buckets
through the same libraries as on a cluster: Orbax (TensorStore's gcs/s3 drivers for
arrays, etils epath with gcsfs/s3fs for the rest).
"""

import json
import time

import fsspec
import jax
import jax.numpy as jnp
import pytest

from evokube_trainer.laptop.curves import read_history
from evokube_trainer.runtime import exitcodes, objectstore
from evokube_trainer.runtime.checkpoints import Checkpointer
from tests.objectstore.emulators import free_port
from tests.runtime.test_multihost import CEMRL, experiment, start_run


def bucket_fs(emulator):
    return fsspec.filesystem(emulator.scheme)


def test_checkpoint_round_trip(store, capsys):
    emulator, bucket = store
    location = emulator.url(bucket, "exp")
    objectstore.prepare(location)
    state = {"w": jnp.arange(4096.0).reshape(64, 64), "step": jnp.int32(3)}
    checkpointer = Checkpointer(location + "/checkpoints", interval=1, keep=2)
    started = time.perf_counter()
    checkpointer.save(3, state, {"spec": {"seed": 1}})
    saved = time.perf_counter()
    restored, step = checkpointer.restore_latest(jax.tree.map(jnp.zeros_like, state))
    restored_at = time.perf_counter()
    checkpointer.close()
    with capsys.disabled():
        print(
            f"\n{emulator.scheme}: save {saved - started:.2f}s, "
            f"restore {restored_at - saved:.2f}s (64x64 float32 + int32)"
        )
    assert step == 3
    assert jnp.array_equal(restored["w"], state["w"]) and int(restored["step"]) == 3
    found = bucket_fs(emulator).find(f"{bucket}/exp/checkpoints/3")
    assert f"{bucket}/exp/checkpoints/3/commit_success.txt" in found
    assert not any("orbax-checkpoint-tmp" in f for f in found)


def test_missing_bucket_is_a_configuration_error(store):
    emulator, _ = store
    with pytest.raises(exitcodes.PermanentError, match="does not exist"):
        objectstore.prepare(emulator.url("evokube-no-such-bucket", "exp"))


def test_denied_access_is_a_configuration_error(moto_s3_enforcing_iam, monkeypatch):
    """(fake-gcs-server checks no credentials, so only S3 can deny here.)"""
    for key, value in moto_s3_enforcing_iam.env.items():
        monkeypatch.setenv(key, value)
    fsspec.filesystem("s3").clear_instance_cache()
    try:
        with pytest.raises(exitcodes.PermanentError, match="denied"):
            objectstore.prepare(moto_s3_enforcing_iam.url("team-bucket", "exp"))
    finally:
        fsspec.filesystem("s3").clear_instance_cache()


def test_unreachable_endpoint_is_retriable(store, monkeypatch):
    emulator, bucket = store
    closed = f"http://127.0.0.1:{free_port()}"
    for key, value in emulator.env.items():
        if value == emulator.endpoint:
            monkeypatch.setenv(key, closed)
    monkeypatch.delenv("TENSORSTORE_GCS_HTTP_URL", raising=False)
    fs_class = type(bucket_fs(emulator))
    fs_class.clear_instance_cache()
    # gcsfs/s3fs retry a refused connection a few times before giving up.
    monkeypatch.setattr(objectstore, "probe", _probe_with_few_retries(emulator.scheme))
    try:
        with pytest.raises(exitcodes.RetriableError, match="cannot reach"):
            objectstore.prepare(emulator.url(bucket, "exp"))
    finally:
        fs_class.clear_instance_cache()


def _probe_with_few_retries(scheme):
    probe = objectstore.probe

    def quick(location):
        if scheme == "s3":
            fsspec.config.conf["s3"] = {"config_kwargs": {"retries": {"max_attempts": 1}}}
        try:
            probe(location)
        finally:
            fsspec.config.conf.pop("s3", None)

    return quick


def test_two_hosts_write_to_the_bucket_and_resume_there(store, tmp_path):
    """`evokube run` with 2 processes x 2 devices: each process writes its shard, process 0
    commits once; a second run with more generations resumes from the bucket."""
    emulator, bucket = store
    location = emulator.url(bucket, "runs", "two-hosts")
    doc = experiment(
        "two-hosts",
        algorithm=CEMRL,  # its replay buffer is sharded over the 4 devices
        hosts=2,
        devices=2,
        generations=2,
        interval=1,
        extra={"checkpoint": {"intervalGenerations": 1, "location": location}},
    )
    env = emulator.env
    first = start_run(tmp_path, doc, "--processes", "2", env=env)
    out, _ = first.communicate(timeout=600)
    assert first.returncode == 0, out

    fs = bucket_fs(emulator)
    root = f"{bucket}/runs/two-hosts"
    state = fs.find(f"{root}/checkpoints/2/state")
    shards = {f.split("/state/")[1].split("/")[0] for f in state if "ocdbt.process_" in f}
    assert shards == {"ocdbt.process_0", "ocdbt.process_1"}, state
    assert fs.exists(f"{root}/checkpoints/2/commit_success.txt")
    assert fs.find(f"{root}/xla-cache"), "the XLA compilation cache is in the bucket"
    assert not (tmp_path / "runs" / "two-hosts" / "checkpoints").exists()

    doc["spec"]["stopping"]["maxGenerations"] = 4
    second = start_run(tmp_path, doc, "--processes", "2", env=env)
    out, _ = second.communicate(timeout=600)
    assert second.returncode == 0, out
    generations = [
        row["generation"] for row in read_history(tmp_path / "runs" / "two-hosts" / "history.jsonl")
    ]
    assert generations == [1, 2, 3, 4], generations
    in_bucket = [json.loads(line) for line in fs.cat_file(f"{root}/history.jsonl").splitlines()]
    assert [record["generation"] for record in in_bucket] == [1, 2, 3, 4], in_bucket
    layout = json.loads(fs.cat_file(f"{root}/checkpoints/4/layout/metadata"))
    assert layout["processes"] == 2 and layout["devices"] == 4
