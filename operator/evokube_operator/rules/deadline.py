"""spec.activeDeadlineSeconds: how long an experiment may be active.

It counts from status.startTime, the moment the experiment last started or
resumed (as a Job's deadline restarts when it is resumed), across gang
restarts. The operator checks it itself and also hands the remainder to each
Job as its own activeDeadlineSeconds, so pods stop on time even while the
operator is down.
"""

from __future__ import annotations

from datetime import datetime

from evokube_operator.rules.timer import remaining


def job_deadline(start: datetime | None, deadline_seconds: int | None, now: datetime) -> int | None:
    """The activeDeadlineSeconds for a Job created now: what is left, rounded up."""
    left = remaining(start or now, deadline_seconds, now)
    if left is None:
        return None
    return max(1, int(left + 0.999))
