"""Fixtures for tests that need the real JobSet controller (tests/cluster/jobset.py).

- `jobset`: a running JobSet manager on the session's `cluster`, started on first use
  (seconds when the binary is cached) and kept for the session.
- Kueue's fixtures (tests/kueue/conftest.py), for JobSets queued by Kueue: a test that
  asks for `jobset` before `kueue` has the JobSet CRD in place when Kueue starts, which
  Kueue's JobSet integration needs (without it Kueue defers the integration and retries
  with a backoff of up to minutes).
"""

from __future__ import annotations

import pytest

from tests.cluster.jobset import JobSet
from tests.kueue.conftest import kueue, kueue_objects, kueue_runner, kueue_settings

__all__ = ["kueue", "kueue_objects", "kueue_runner", "kueue_settings"]


@pytest.fixture(scope="session")
def jobset(cluster) -> JobSet:
    """The session's JobSet manager; stopped (webhooks first) at the end."""
    manager = JobSet(cluster)
    manager.start()
    yield manager
    manager.stop()
