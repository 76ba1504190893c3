"""The success policy: every host exited 0."""

import pytest

from evokube_operator.rules import success
from tests.operator.factories import job, pod


@pytest.mark.parametrize(
    ("complete", "phases", "done"),
    [
        (False, ["Succeeded", "Succeeded"], True),
        (False, ["Succeeded", "Running"], False),
        (False, [], False),
        (True, [], True),  # the Job says so; its pods may be gone
    ],
)
def test_succeeded(complete, phases, done):
    pods = [pod(i, phase, exit_code=0) for i, phase in enumerate(phases)]
    assert success.succeeded(job(complete=complete), pods, hosts=2) is done


def test_all_running_counts_distinct_hosts():
    assert success.all_running([pod(0), pod(1)], 2)
    assert not success.all_running([pod(0), pod(0)], 2)
    assert not success.all_running([pod(0), pod(1, "Pending")], 2)


def test_a_gang_whose_hosts_exit_0_one_by_one_is_still_running():
    # Not back to Pending ("waiting for hosts") between Running and Succeeded.
    assert success.all_running([pod(0, "Succeeded", exit_code=0), pod(1)], 2)
    assert not success.all_running([pod(0, "Succeeded", exit_code=0), pod(1, "Pending")], 2)
