"""Fixtures for tests that need the real Kueue controller (tests/cluster/kueue.py).

- `kueue`: a running Kueue on the session's `cluster`, started on first use
  (about 6 s when the binary is cached) and kept for the session. A test or
  module chooses its settings by overriding `kueue_settings`, directly or
  with `@pytest.mark.parametrize("kueue_settings", [KueueSettings(...)])`; a
  test asking for other settings than the running ones restarts Kueue.
- `kueue_objects`: a `KueueObjects` for the test's namespace: flavors for the
  kwok pools, ClusterQueues, LocalQueues and WorkloadPriorityClasses; it deletes
  the cluster-scoped ones after the test.

Another package uses them by importing them into its conftest (the operator fixtures, `operator`
and `k8s`, are in tests/conftest.py for every package):
`from tests.kueue.conftest import kueue, kueue_objects, kueue_runner, kueue_settings`.
"""

from __future__ import annotations

import pytest

from tests.cluster.kueue import Kueue, KueueRunner, KueueSettings
from tests.kueue.helpers import KueueObjects


@pytest.fixture(scope="session")
def kueue_runner(cluster) -> KueueRunner:
    """The session's one Kueue slot; stopped (webhooks first) at the end."""
    runner = KueueRunner(cluster)
    yield runner
    runner.stop()


@pytest.fixture
def kueue_settings() -> KueueSettings:
    """Settings for `kueue`: batch/job only, no waitForPodsReady. Override to change."""
    return KueueSettings()


@pytest.fixture
def kueue(kueue_runner, kueue_settings) -> Kueue:
    """A running Kueue with `kueue_settings`."""
    return kueue_runner.ensure(kueue_settings)


@pytest.fixture
def kueue_objects(kueue, api, namespace) -> KueueObjects:
    objects = KueueObjects(api, namespace)
    yield objects
    objects.cleanup()
