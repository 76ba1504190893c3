"""When a gang has finished: every host exited 0 (a stopping criterion was met)."""

from __future__ import annotations

from collections.abc import Sequence

from evokube_operator.observe import JobView, PodView


def succeeded(job: JobView, pods: Sequence[PodView], hosts: int) -> bool:
    """The Job is Complete, or every completion index has a Succeeded pod."""
    if job.complete:
        return True
    done = {p.index for p in pods if p.phase == "Succeeded" and p.index is not None}
    return len(done) >= hosts


def all_running(pods: Sequence[PodView], hosts: int) -> bool:
    """Every host's pod runs (and none is on its way out)."""
    running = {p.index for p in pods if p.phase == "Running" and not p.deleting}
    return len(running) >= hosts
