"""Session-scoped emulators, started only when a test of this package asks for one."""

import os
import uuid

import pytest

from tests.objectstore.emulators import start_fake_gcs, start_moto


@pytest.fixture(scope="session")
def fake_gcs(tmp_path_factory):
    emulator = start_fake_gcs(tmp_path_factory.mktemp("fake-gcs") / "server.log")
    yield emulator
    emulator.stop()


@pytest.fixture(scope="session")
def moto_s3(tmp_path_factory):
    emulator = start_moto(tmp_path_factory.mktemp("moto") / "server.log")
    yield emulator
    emulator.stop()


@pytest.fixture(scope="session")
def moto_s3_enforcing_iam(tmp_path_factory):
    emulator = start_moto(tmp_path_factory.mktemp("moto-iam") / "server.log", enforce_iam=True)
    yield emulator
    emulator.stop()


@pytest.fixture(params=["gs", "s3"])
def store(request, monkeypatch):
    """Each emulator in turn, with this process's environment pointing at it and a fresh
    bucket; yields (emulator, bucket)."""
    emulator = request.getfixturevalue({"gs": "fake_gcs", "s3": "moto_s3"}[request.param])
    for key, value in emulator.env.items():
        monkeypatch.setenv(key, value)
    import fsspec

    fsspec.config.conf.clear()
    fs = fsspec.filesystem(emulator.scheme, skip_instance_cache=True)
    bucket = f"evokube-{uuid.uuid4().hex[:12]}"
    fs.mkdir(bucket)
    yield emulator, bucket
    os.environ.pop("TENSORSTORE_GCS_HTTP_URL", None)
