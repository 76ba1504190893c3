"""Fixtures for the chart's tests: stand-in monitoring CRDs and throwaway namespaces."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def monitoring_crds(cluster):
    """ServiceMonitor and PodMonitor served (stand-ins), removed again after the module.

    Removed so that other tests see the cluster as it was: without them, the
    chart renders no monitors.
    """
    path = str(HERE / "monitoring-crds.yaml")
    cluster.kubectl("apply", "--server-side", "-f", path)
    for name in ("servicemonitors", "podmonitors"):
        cluster.kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            f"crd/{name}.monitoring.coreos.com",
        )
    yield
    # Wait until they are gone: a CRD still terminating when the next module
    # applies it again would vanish under that module's feet.
    cluster.kubectl("delete", "-f", path, "--wait=true", "--timeout=120s")


@pytest.fixture
def make_namespace(cluster) -> Callable[[str], str]:
    """Creates namespaces `<prefix>-<random>` on demand; deletes them after the test."""
    made: list[str] = []

    def make(prefix: str) -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        cluster.kubectl("create", "namespace", name)
        made.append(name)
        return name

    yield make
    for name in made:
        cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
