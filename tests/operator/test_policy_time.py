"""The deadline and TTL policies: seconds left, from the time stamps in status."""

from datetime import timedelta

import pytest

from evokube_operator.rules import deadline, timer
from tests.operator.factories import NOW


@pytest.mark.parametrize(
    ("started_ago", "limit", "left"),
    [(None, 60, None), (10, None, None), (10, 60, 50), (60, 60, 0), (90, 60, -30)],
)
def test_deadline_remaining(started_ago, limit, left):
    start = None if started_ago is None else NOW - timedelta(seconds=started_ago)
    assert timer.remaining(start, limit, NOW) == left


def test_a_new_job_gets_what_is_left_of_the_deadline_rounded_up():
    assert deadline.job_deadline(NOW - timedelta(seconds=10.5), 60, NOW) == 50
    assert deadline.job_deadline(None, 60, NOW) == 60
    assert deadline.job_deadline(NOW - timedelta(seconds=100), 60, NOW) == 1
    assert deadline.job_deadline(NOW, None, NOW) is None


@pytest.mark.parametrize(
    ("finished_ago", "limit", "left"),
    [(None, 60, None), (10, None, None), (10, 60, 50), (0, 0, 0), (100, 60, -40)],
)
def test_ttl_remaining(finished_ago, limit, left):
    finished = None if finished_ago is None else NOW - timedelta(seconds=finished_ago)
    assert timer.remaining(finished, limit, NOW) == left
