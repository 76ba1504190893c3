"""A Prometheus server on loopback, from Debian's binary (`make system-deps`).

Its configuration, command line and HTTP API, apart from who runs the process: a test
starts and stops it itself (`start`, `stop`); the laptop cluster makes it one of the
cluster's components (ControlPlane.spawn), so that it outlives `make cluster`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

from tests.cluster.controlplane import free_port, wait_until


def get(url: str, timeout: float = 5) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return response.read().decode()


def static_scrape_configs(targets: dict[str, str]) -> list[dict]:
    """One job per target: {job name: "host:port"}."""
    return [
        {"job_name": job, "static_configs": [{"targets": [target]}]}
        for job, target in targets.items()
    ]


class Prometheus:
    """One Prometheus server on loopback: its folder holds prometheus.yml and the TSDB."""

    def __init__(self, folder: Path, scrape_configs: list[dict], interval_s: float = 1):
        self.port = free_port()
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.proc: subprocess.Popen | None = None
        self.log = self.folder / "prometheus.log"
        config = {
            "global": {"scrape_interval": f"{interval_s}s", "scrape_timeout": f"{interval_s}s"},
            "scrape_configs": scrape_configs,
        }
        (self.folder / "prometheus.yml").write_text(yaml.safe_dump(config))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self, binary: str) -> list[str]:
        return [
            binary,
            f"--config.file={self.folder / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.folder / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
        ]

    def ready(self) -> bool:
        with contextlib.suppress(OSError):
            return "Ready" in get(f"{self.url}/-/ready")
        return False

    def api(self, path: str, **params: str) -> dict:
        url = f"{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        try:
            body = json.loads(get(url))
        except urllib.error.HTTPError as err:
            raise AssertionError(f"{path} {params}: {err.read().decode()}") from None
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict]:
        return self.api("query", query=expr)["result"]

    # -- a process of the caller's own ---------------------------------------------------
    def start(self, binary: str) -> None:
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                self.command(binary), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

        def up() -> bool:
            assert self.proc.poll() is None, f"prometheus exited:\n{self.log.read_text()[-2000:]}"
            return self.ready()

        wait_until(up, 60, "Prometheus to be ready")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
