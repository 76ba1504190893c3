"""The pod runner's own pieces that need no cluster: what a pod's volumes become on disk."""

import pytest

from tests.e2e.podrunner import Unsupported, _write_downward_api, expand

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


def test_env_references_expand_as_kubelet_expands_them():
    """A multislice pod's TPU_WORKER_HOSTNAMES names its slice through $(MEGASCALE_SLICE_ID)."""
    declared = {"MEGASCALE_SLICE_ID": "1"}
    assert expand("js-slice-$(MEGASCALE_SLICE_ID)-0.svc", declared) == "js-slice-1-0.svc"
    # Undeclared (or declared later) stays as written; $$ escapes.
    assert (
        expand("$(LATER) $$(MEGASCALE_SLICE_ID) $$", declared) == "$(LATER) $(MEGASCALE_SLICE_ID) $"
    )
