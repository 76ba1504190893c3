"""spec.ttlSecondsAfterFinished: delete a finished experiment after a while.

Deleting the experiment deletes everything it owns (owner references), so
the TTL is the experiment's, not the Job's.
"""

from __future__ import annotations

from datetime import datetime


def remaining(finished: datetime | None, ttl_seconds: int | None, now: datetime) -> float | None:
    """Seconds until the experiment should go (<= 0: now), or None to keep it."""
    if ttl_seconds is None or finished is None:
        return None
    return ttl_seconds - (now - finished).total_seconds()
