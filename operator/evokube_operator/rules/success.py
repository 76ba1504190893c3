"""When a gang has finished: every host exited 0 (a stopping criterion was met)."""

from __future__ import annotations

from collections.abc import Sequence

from evokube_operator.reading.observe import JobView, PodView


def succeeded(job: JobView, pods: Sequence[PodView], hosts: int) -> bool:
    """The Job is Complete, or every completion index has a Succeeded pod."""
    if job.complete:
        return True
    done = {p.host_key for p in pods if p.phase == "Succeeded" and p.index is not None}
    return len(done) >= hosts


def all_running(pods: Sequence[PodView], hosts: int) -> bool:
    """Every host's pod runs or already exited 0 (and none is on its way out).

    Hosts of a finishing gang exit one after another: that gang still runs; it is
    not waiting for hosts.
    """
    running = {p.host_key for p in pods if p.phase in ("Running", "Succeeded") and not p.deleting}
    return len(running) >= hosts
