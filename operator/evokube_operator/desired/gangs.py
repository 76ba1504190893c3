"""The gang backends: the kind of object that runs an attempt's hosts, one entry each, and the
one place that chooses between them (`backend_for`).

A backend is what the rest of the operator needs to know of its kind: the API to create, read
and watch it, the builder of its body, the Kueue integration that queues it, and, for a kind
that a cluster may lack (a CRD of its own), why a spec needs it and what to install, so that an
experiment waits Blocked with that said. A third backend (a LeaderWorkerSet, a Kubeflow
TrainJob) is its builder module beside jobset.py, one entry in BACKENDS, its case in
`backend_for`, and its index and event handler in handlers.py (Kopf registers them by
decorator); Kopf's label selectors and the served-kinds check already cover every entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from evokube_operator import api
from evokube_operator.desired import builders, jobset
from evokube_operator.reading.spec import ExperimentSpec

# (experiment, spec, attempt, active_deadline_seconds, trainer_token=...) -> the object's body
Builder = Callable[..., dict[str, Any]]


@dataclass(frozen=True)
class GangBackend:
    kind: str
    group: str
    version: str
    plural: str
    build: Builder
    kueue_framework: str  # Kueue's integration for the kind (its Configuration's frameworks)
    # For a kind every cluster serves: None. Else the Blocked reason while it is not served,
    # what needs it (a function of the spec) and what to do about it.
    not_served_reason: str | None = None
    needed_by: Callable[[ExperimentSpec], str] | None = None
    install: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def optional(self) -> bool:
        """Whether a cluster may not serve the kind (asked by discovery before each create)."""
        return self.not_served_reason is not None


INDEXED_JOB: Final = GangBackend(
    kind="Job",
    group="batch",
    version="v1",
    plural="jobs",
    build=builders.job,
    kueue_framework="batch/job",
)
JOBSET: Final = GangBackend(
    kind=jobset.KIND,
    group=jobset.GROUP,
    version=jobset.VERSION,
    plural=jobset.PLURAL,
    build=jobset.jobset,
    kueue_framework=f"{jobset.GROUP}/jobset",
    not_served_reason=api.REASON_JOBSET_NOT_SERVED,
    needed_by=lambda spec: (
        f"spec.accelerator.tpu.slices is {spec.accelerator.slices}: a multislice gang"
    ),
    install="install JobSet (docs/multislice.md) or use one slice",
)
BACKENDS: Final = {backend.kind: backend for backend in (INDEXED_JOB, JOBSET)}


def backend_for(slices: int) -> GangBackend:
    """The backend of a gang over `slices` slices (the spec's, or a status's): one Indexed Job
    on one slice, a JobSet of one Indexed Job per slice on several."""
    return JOBSET if slices > 1 else INDEXED_JOB


def status_slices(spec: ExperimentSpec) -> int | None:
    """status.slices: set for a multislice gang only, so a single slice's status stays as it was."""
    return spec.accelerator.slices if backend_for(spec.accelerator.slices) is JOBSET else None


def hosts_of(spec: ExperimentSpec) -> str:
    """The gang's hosts in words, for Events and logs: "4 hosts", "2 slices of 4 hosts"."""
    count = spec.accelerator.hosts
    hosts = f"{count} host" + ("s" if count != 1 else "")
    slices = status_slices(spec)
    return f"{slices} slices of {hosts}" if slices else hosts
