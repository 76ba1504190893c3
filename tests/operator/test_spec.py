"""Reading spec: defaults filled in, host counts derived, what cannot run named."""

import pytest

from evokube_operator.reading.spec import SpecError, parse_spec, topology_chips
from tests.operator.factories import spec


@pytest.mark.parametrize(
    ("topology", "chips"), [("1x1", 1), ("2x4", 8), ("4x4", 16), ("2x2x4", 16), ("4x4x8", 128)]
)
def test_topology_chips(topology, chips):
    assert topology_chips(topology) == chips


@pytest.mark.parametrize(
    ("accelerator", "hosts", "devices"),
    [
        ({}, 1, 1),
        ({"type": "cpu", "hosts": 4, "devicesPerHost": 8}, 4, 8),
        ({"type": "gpu", "gpu": {"count": 4}}, 1, 4),
        ({"type": "tpu", "tpu": {"type": "t", "topology": "4x4"}}, 4, 4),
        ({"type": "tpu", "tpu": {"type": "t", "topology": "2x2x4", "chipsPerHost": 4}}, 4, 4),
        ({"type": "tpu", "tpu": {"type": "t", "topology": "2x4", "chipsPerHost": 8}}, 1, 8),
        ({"type": "tpu", "hosts": 4, "tpu": {"type": "t", "topology": "4x4"}}, 4, 4),
    ],
)
def test_hosts_and_devices_follow_from_the_accelerator(accelerator, hosts, devices):
    parsed = parse_spec(spec(accelerator=accelerator)).accelerator
    assert (parsed.hosts, parsed.devices_per_host) == (hosts, devices)
    assert (parsed.slices, parsed.processes) == (1, hosts)


def test_slices_multiply_the_hosts_of_one_slice():
    tpu = {"type": "t", "topology": "4x4", "slices": 2}
    parsed = parse_spec(spec(accelerator={"type": "tpu", "tpu": tpu})).accelerator
    assert (parsed.hosts, parsed.slices, parsed.processes) == (4, 2, 8)


def test_defaults_match_the_crd():
    parsed = parse_spec({"image": "i"})
    assert parsed.max_restarts == 3
    assert parsed.metrics_port == 9100
    assert parsed.coordinator_port == 8476
    assert parsed.checkpoint_location == "/checkpoints"
    assert parsed.suspend is False
    assert parsed.ttl_seconds_after_finished is None
    assert parse_spec({"image": "i", "maxRestarts": 0}).max_restarts == 0


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"image": ""}, "spec.image"),
        ({"accelerator": {"type": "fpga"}}, "spec.accelerator.type"),
        ({"accelerator": {"type": "gpu"}}, "spec.accelerator.gpu.count"),
        ({"accelerator": {"type": "tpu", "tpu": {"type": "t"}}}, "spec.accelerator.tpu"),
        (
            {"accelerator": {"type": "tpu", "tpu": {"type": "t", "topology": "4by4"}}},
            "spec.accelerator.tpu.topology",
        ),
        (
            {"accelerator": {"type": "tpu", "tpu": {"type": "t", "topology": "3x3"}}},
            "spec.accelerator.tpu.topology",
        ),
        (
            {"accelerator": {"type": "tpu", "hosts": 2, "tpu": {"type": "t", "topology": "4x4"}}},
            "spec.accelerator.hosts",
        ),
        (
            {"accelerator": {"type": "tpu", "tpu": {"type": "t", "topology": "4x4", "slices": 0}}},
            "spec.accelerator.tpu.slices",
        ),
        (  # 64 slices of 256 hosts
            {
                "accelerator": {
                    "type": "tpu",
                    "tpu": {"type": "t", "topology": "16x16", "chipsPerHost": 1, "slices": 64},
                }
            },
            "spec.accelerator.tpu.slices",
        ),
        ({"maxRestarts": -1}, "spec.maxRestarts"),
        ({"maxRestarts": "3"}, "spec.maxRestarts"),
        ({"tolerations": "all"}, "spec.tolerations"),
        ({"affinity": ["x"]}, "spec.affinity"),
        ({"nodeSelector": ["x"]}, "spec.nodeSelector"),
    ],
)
def test_what_cannot_run_is_named(overrides, field):
    with pytest.raises(SpecError, match=f"^{field}"):
        parse_spec(spec(**overrides))
