"""Fixtures for tests that need the real JobSet controller (tests/cluster/jobset.py).

- `jobset`: a running JobSet manager on the session's `cluster`, started on first use
  (seconds when the binary is cached) and kept for the session.
- Kueue's fixtures (tests/kueue/conftest.py), and `kueue_jobsets` for JobSets queued by
  Kueue: it asks for `jobset` before `kueue`, so the JobSet CRD is in place when Kueue
  starts, which Kueue's JobSet integration needs (without it Kueue defers the integration
  and retries with a backoff of up to minutes).
"""

from __future__ import annotations

import pytest

from tests.cluster.controlplane import wait_until
from tests.cluster.jobset import API_VERSION, GROUP, JobSet
from tests.kueue.conftest import kueue, kueue_objects, kueue_runner, kueue_settings
from tests.kueue.helpers import workloads

__all__ = ["kueue", "kueue_objects", "kueue_runner", "kueue_settings"]


@pytest.fixture(scope="session")
def jobset(cluster) -> JobSet:
    """The session's JobSet manager; stopped (webhooks first) at the end."""
    manager = JobSet(cluster)
    manager.start()
    yield manager
    manager.stop()


@pytest.fixture
def kueue_jobsets(jobset, kueue, api, namespace):
    """`kueue` for a test whose JobSets Kueue queues. After the test the namespace's JobSets
    are deleted and their Workloads awaited gone while this Kueue (JobSet integration on)
    still runs: left to the namespace's deletion, a Workload that no later Kueue releases
    holds its quota and, under waitForPodsReady, blocks every other admission."""
    from kubernetes import client

    yield kueue
    version = API_VERSION.rpartition("/")[2]
    client.CustomObjectsApi(api).delete_collection_namespaced_custom_object(
        GROUP, version, namespace, "jobsets", propagation_policy="Background"
    )
    wait_until(lambda: not workloads(api, namespace), 60, f"the Workloads of {namespace} gone")
