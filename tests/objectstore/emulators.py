"""The object-store emulators the tests start: fake-gcs-server (gs://) and moto (s3://).

fake-gcs-server is built once by tests/cluster/build.sh into the cache (pinned in
versions.env); moto's server comes with the dev extra. Each runs on a free loopback
port, in memory, for one test session; `env` is what a client (and the trainer) needs
to reach it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.cluster.controlplane import HERE, wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Emulator:
    """One running emulator: its scheme, endpoint and the environment pointing at it."""

    scheme: str
    endpoint: str
    env: dict[str, str]
    process: subprocess.Popen = field(repr=False)

    def filesystem(self):
        """An fsspec filesystem on this emulator, whatever this process's environment says."""
        import fsspec

        if self.scheme == "gs":
            return fsspec.filesystem(
                "gs", skip_instance_cache=True, endpoint_url=self.endpoint, token="anon"
            )
        return fsspec.filesystem(
            "s3",
            skip_instance_cache=True,
            endpoint_url=self.endpoint,
            key=self.env["AWS_ACCESS_KEY_ID"],
            secret=self.env["AWS_SECRET_ACCESS_KEY"],
        )

    def url(self, bucket: str, *prefix: str) -> str:
        return "/".join([f"{self.scheme}://{bucket}", *prefix])

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _serving(endpoint: str, path: str):
    def answer() -> bool:
        try:
            with urllib.request.urlopen(endpoint + path, timeout=2):
                return True
        except OSError:
            return False

    return answer


def fake_gcs_binary() -> Path:
    """Build (a no-op when cached) and return the pinned fake-gcs-server."""
    out = subprocess.run(
        ["bash", str(HERE / "build.sh"), "fake_gcs_server"],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout.split()
    return Path(out[-1]) / "fake-gcs-server"


def start_fake_gcs(log: Path) -> Emulator:
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [
            str(fake_gcs_binary()),
            "-backend=memory",
            "-scheme=http",
            "-host=127.0.0.1",
            f"-port={port}",
            f"-public-host=127.0.0.1:{port}",
        ],
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    wait_until(_serving(endpoint, "/storage/v1/b"), 60, "fake-gcs-server to answer")
    return Emulator("gs", endpoint, {"STORAGE_EMULATOR_HOST": endpoint}, process)


def start_moto(log: Path, *, enforce_iam: bool = False) -> Emulator:
    """moto's S3 endpoint; with `enforce_iam`, every request must be signed by a known IAM
    user (there is none: each is refused with 403 InvalidAccessKeyId)."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    process = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        env={**os.environ, **({"INITIAL_NO_AUTH_ACTION_COUNT": "0"} if enforce_iam else {})},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    wait_until(_serving(endpoint, "/moto-api/"), 60, "moto's S3 server to answer")
    env = {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    return Emulator("s3", endpoint, env, process)
