"""The pod runner's own pieces that need no cluster: what a pod's volumes become on disk."""

import pytest

from tests.e2e.podrunner import Unsupported, _write_downward_api

MANIFEST = "apiVersion: evokube.io/v1alpha1\nkind: ERLExperiment\n"


def pod(**annotations: str) -> dict:
    return {
        "metadata": {"name": "demo-0-0", "namespace": "ns", "uid": "u", "annotations": annotations},
        "spec": {},
    }


def test_a_downward_api_volume_writes_each_annotation_it_names(tmp_path):
    items = [
        {"path": "experiment.yaml", "fieldRef": {"fieldPath": "metadata.annotations['m']"}},
        {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
    ]
    _write_downward_api(pod(m=MANIFEST), items, tmp_path / "manifest")
    assert (tmp_path / "manifest" / "experiment.yaml").read_text() == MANIFEST
    assert (tmp_path / "manifest" / "name").read_text() == "demo-0-0"


def test_a_downward_api_item_without_a_field_ref_is_refused(tmp_path):
    items = [{"path": "cpu", "resourceFieldRef": {"resource": "limits.cpu"}}]
    with pytest.raises(Unsupported):
        _write_downward_api(pod(), items, tmp_path)
