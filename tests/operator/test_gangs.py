"""The gang backends (desired/gangs.py): one chooser, and everything the operator needs of a
kind read from its entry."""

from __future__ import annotations

import pytest

from evokube_operator import api, handlers
from evokube_operator.cluster.kube import KINDS
from evokube_operator.desired import gangs
from evokube_operator.reading.spec import parse_spec
from tests.operator.factories import TPU, experiment

MULTISLICE = {**TPU, "tpu": {**TPU["tpu"], "slices": 2}}


@pytest.mark.parametrize(
    ("accelerator", "backend", "slices", "hosts"),
    [
        (None, gangs.INDEXED_JOB, None, "1 host"),
        (TPU, gangs.INDEXED_JOB, None, "4 hosts"),
        (MULTISLICE, gangs.JOBSET, 2, "2 slices of 4 hosts"),
    ],
)
def test_the_slices_choose_the_backend_which_builds_its_own_kind(
    accelerator, backend, slices, hosts
):
    extra = {"accelerator": accelerator, "population": {"size": 32}} if accelerator else {}
    exp = experiment(name="demo", **extra)
    spec = parse_spec(exp.spec)
    chosen = gangs.backend_for(spec.accelerator.slices)
    assert chosen is backend
    body = chosen.build(exp, spec, 3)
    assert (body["apiVersion"], body["kind"]) == (chosen.api_version, chosen.kind)
    assert body["metadata"]["name"] == "demo-3"
    assert (gangs.status_slices(spec), gangs.hosts_of(spec)) == (slices, hosts)


def test_every_backend_is_known_to_the_api_client_and_the_watches():
    for kind, backend in gangs.BACKENDS.items():
        assert KINDS[kind] == (f"/apis/{backend.api_version}", backend.plural)
        # A kind a cluster may lack is asked for by discovery and blocks with its own reason.
        assert (kind in handlers.OPTIONAL_KINDS) == backend.optional
    assert gangs.JOBSET.optional and not gangs.INDEXED_JOB.optional
    assert gangs.JOBSET.not_served_reason == api.REASON_JOBSET_NOT_SERVED
    spec = parse_spec(experiment(accelerator=MULTISLICE, population={"size": 32}).spec)
    assert gangs.JOBSET.needed_by(spec) == "spec.accelerator.tpu.slices is 2: a multislice gang"
    assert {b.kueue_framework for b in gangs.BACKENDS.values()} == {
        "batch/job",
        "jobset.x-k8s.io/jobset",
    }
