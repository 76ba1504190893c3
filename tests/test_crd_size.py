"""The CRD bounds every list, map and string of spec and status (issue 22, operator memory):
the largest experiment it admits is the size the CRD's header and docs/security.md state, and
one near that size (benchmarks/largest_experiment.py) is valid and its Job fits the API
server's limit on annotations."""

import json
from pathlib import Path

import pytest

from benchmarks.largest_experiment import largest_experiment
from evokube_operator.desired import builders
from evokube_operator.reading.spec import Experiment, parse_spec
from evokube_trainer.runtime import manifest
from tests.crd_size import Unbounded, largest

REPO = Path(__file__).resolve().parents[1]
ANNOTATIONS_LIMIT = 256 * 1024  # Kubernetes' TotalAnnotationSizeLimitB, keys and values


def bounds(free_text: int) -> tuple[int, int]:
    schema = manifest.crd_schema()["properties"]
    return largest(schema["spec"], "spec", free_text), largest(
        schema["status"], "status", free_text
    )


def test_the_stated_bounds_are_the_computed_ones():
    (spec, status), (spec_bytes, status_bytes) = bounds(1), bounds(6)
    header = (REPO / "crds" / "erlexperiments.evokube.io.yaml").read_text().split("apiVersion")[0]
    stated = (
        f"largest spec admitted is {spec} characters of compact JSON, the largest status {status}"
    )
    assert stated in " ".join(header.replace("#", " ").split())
    assert f"{spec_bytes} and {status_bytes} bytes" in header
    security = (REPO / "docs" / "security.md").read_text()
    assert f"{spec:,} characters" in security and f"{status:,}" in security


def test_an_unbounded_string_list_or_map_is_found():
    with pytest.raises(Unbounded, match=r"spec\.x"):
        largest({"type": "object", "properties": {"x": {"type": "string"}}}, "spec")
    with pytest.raises(Unbounded, match=r"spec\.m"):
        labels = {"type": "object", "maxProperties": 4, "additionalProperties": {"type": "number"}}
        largest({"type": "object", "properties": {"m": labels}}, "spec")


def test_the_largest_experiment_is_valid_near_the_bound_and_its_job_fits():
    doc = largest_experiment("x" * 52, "n" * 63, "ghcr.io/evokube/trainer-cpu:0.1.0")
    checked, errors = manifest.check(doc)
    assert errors == []
    size = len(json.dumps(checked["spec"], separators=(",", ":")))
    assert size > 0.8 * bounds(1)[0]
    assert f"{size:,} characters" in (REPO / "docs" / "security.md").read_text()
    meta = {**checked["metadata"], "uid": "u" * 36, "generation": 1, "resourceVersion": "1"}
    exp = Experiment.from_body({**checked, "metadata": meta})
    annotations = builders.job(exp, parse_spec(exp.spec), 0)["spec"]["template"]["metadata"][
        "annotations"
    ]
    assert sum(len(k) + len(v) for k, v in annotations.items()) <= ANNOTATIONS_LIMIT
