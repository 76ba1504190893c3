"""A cluster run's history in a real bucket (fake-gcs-server, moto): TensorBoard event files
read back by TensorBoard's reader, and `evokube curve NAME` finding history.jsonl through the
experiment on the API server.

Buckets are reached as the trainer reaches them, through the environment the `store` fixture
sets: the emulator's explicit-endpoint filesystem makes gcsfs probe fake-gcs-server for the
bucket type over gRPC, 60 s per probe."""

import fsspec
import pytest
from kubernetes import client
from PIL import Image

from evokube_trainer.laptop.cli import main
from evokube_trainer.recorders import TensorBoardRecorder
from evokube_trainer.runtime import exitcodes
from evokube_trainer.runtime.status import GROUP, PLURAL, VERSION
from tests.laptop.test_curves import write_history
from tests.runtime.test_status import experiment
from tests.trainer.test_tensorboard_wandb import event_files, scalars


def test_tensorboard_event_files_of_two_lives_in_the_bucket(store, tmp_path):
    emulator, bucket = store
    location = emulator.url(bucket, "ml", "pendulum", "tensorboard")
    with TensorBoardRecorder(location, upload_every_s=0) as first:
        first.write(1, {"ec/fitness_max": -900.0, "env_steps": 2000})
        first.write(2, {"ec/fitness_max": -400.0, "env_steps": 4000})
    with TensorBoardRecorder(location, upload_every_s=0) as resumed:  # a restarted pod
        resumed.write(3, {"ec/fitness_max": -150.0, "env_steps": 6000})
    fs = fsspec.filesystem(emulator.scheme)  # as the recorder reaches it, from the environment
    fs.get(f"{bucket}/ml/pendulum/tensorboard/", str(tmp_path), recursive=True)
    lives = sorted(scalars(path)["env_steps"] for path in event_files(tmp_path))
    assert lives == [[(1, 2000.0), (2, 4000.0)], [(3, 6000.0)]]


@pytest.mark.cluster
def test_curve_of_an_experiment_reads_its_checkpoint_location(
    store, cluster, crd, api, namespace, tmp_path, capsys, monkeypatch
):
    emulator, bucket = store
    monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig))
    monkeypatch.chdir(tmp_path)
    custom = client.CustomObjectsApi(api)

    def create(name, location):
        body = experiment(name)
        body["spec"]["checkpoint"] = {"location": location}
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)

    location = emulator.url(bucket, namespace, "pendulum")
    create("pendulum", location)
    args = ["curve", "pendulum", "--namespace", namespace]
    assert main(args) == exitcodes.PERMANENT  # no history yet
    assert f"no history yet: {location}/history.jsonl does not exist" in capsys.readouterr().err

    write_history(tmp_path / "history.jsonl")
    fsspec.filesystem(emulator.scheme).put_file(
        str(tmp_path / "history.jsonl"), f"{bucket}/{namespace}/pendulum/history.jsonl"
    )
    assert main(args) == exitcodes.SUCCESS
    assert "pendulum-learning-curve.png: 3 generations" in capsys.readouterr().out
    with Image.open(tmp_path / "pendulum-learning-curve.png") as image:
        assert image.size == (800, 450)

    assert main(["curve", "absent", "--namespace", namespace]) == exitcodes.PERMANENT
    err = capsys.readouterr().err
    assert f"error: no ERLExperiment 'absent' in namespace '{namespace}'" in err

    create("on-a-volume", "/checkpoints/on-a-volume")
    assert main(["curve", "on-a-volume", "--namespace", namespace]) == exitcodes.PERMANENT
    err = capsys.readouterr().err
    assert "keeps its history at /checkpoints/on-a-volume, a path inside its pods" in err

    # No location of its own: the operator's default put it where status.checkpointLocation
    # says (written here as the operator would), and curve reads it there.
    body = experiment("defaulted")
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, body)
    defaulted = emulator.url(bucket, "operator-default", namespace, "defaulted")
    custom.patch_namespaced_custom_object_status(
        GROUP,
        VERSION,
        namespace,
        PLURAL,
        "defaulted",
        {"status": {"checkpointLocation": defaulted}},
    )
    fsspec.filesystem(emulator.scheme).put_file(
        str(tmp_path / "history.jsonl"), f"{defaulted.split('://', 1)[1]}/history.jsonl"
    )
    assert main(["curve", "defaulted", "--namespace", namespace]) == exitcodes.SUCCESS
    assert "defaulted-learning-curve.png: 3 generations" in capsys.readouterr().out
