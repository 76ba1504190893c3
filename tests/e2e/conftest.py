"""The end-to-end stack, once per module: its own control plane, pod runner and chart.

It does not share the session's `cluster`: installing the chart (its CRD,
ClusterRole and operator) there would collide with the operator tests' own
operator and RBAC.
"""

import re
import uuid

import pytest

from tests.e2e.stack import Stack


@pytest.fixture(scope="module")
def stack(tmp_path_factory, request):
    """With JobSet's controller where the module says `JOBSET = True`."""
    stack = Stack(tmp_path_factory.mktemp("e2e"), jobset=getattr(request.module, "JOBSET", False))
    try:
        stack.up()
        yield stack
    finally:
        stack.down()


@pytest.fixture
def e2e_namespace(stack, request) -> str:
    """A fresh namespace with the checkpoint claim; the stack goes with the module."""
    slug = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    return stack.namespace(f"{slug}-{uuid.uuid4().hex[:6]}")
