"""Seconds left of a limit counted from a time stamp in status: one rule for both limits.

spec.activeDeadlineSeconds counts from status.startTime (deadline.py);
spec.ttlSecondsAfterFinished from status.completionTime, after which the experiment is
deleted (and with it everything it owns, by owner references: the TTL is the experiment's,
not the Job's).
"""

from __future__ import annotations

from datetime import datetime


def remaining(since: datetime | None, limit_seconds: int | None, now: datetime) -> float | None:
    """Seconds left (<= 0: reached), or None without a limit or before `since`."""
    if limit_seconds is None or since is None:
        return None
    return limit_seconds - (now - since).total_seconds()
