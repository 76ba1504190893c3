"""The operator/trainer contract (evokube_contract) holds end to end.

The operator's pod, rendered by its own builders, is handed to the trainer's own reader: the
environment with its downward-API fields resolved for a fake pod, the manifest file the
attempt's ConfigMap volume would mount. Both halves must see the same experiment, process group,
checkpoint location and ports, and docs/architecture.md must list exactly the contract.
"""

from __future__ import annotations

import errno
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

import evokube_contract as contract
from evokube_operator.desired import builders
from evokube_operator.reading.spec import parse_spec
from evokube_trainer.laptop import local
from evokube_trainer.runtime import manifest
from evokube_trainer.runtime.config import to_run_config
from evokube_trainer.runtime.distributed import ProcessGroup
from evokube_trainer.runtime.exitcodes import PERMANENT, RETRIABLE, SUCCESS, PermanentError
from evokube_trainer.runtime.inputs import Inputs
from evokube_trainer.runtime.metrics import TrainerMetrics
from tests.bad_manifests import with_changes
from tests.operator.factories import TPU, experiment

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
_FIELD = re.compile(r"metadata\.(annotations|labels)\['([^']+)'\]\Z")


def _field(pod_meta: dict, path: str) -> str:
    """A downward-API fieldRef's value for a pod with metadata `pod_meta`."""
    match = _FIELD.match(path)
    if match:
        return pod_meta[match.group(1)][match.group(2)]
    assert path in ("metadata.name", "metadata.namespace"), path
    return pod_meta[path.split(".")[1]]


def pod_as_trainer_sees_it(
    job: dict, config_maps: list[dict], index: int, root: Path
) -> dict[str, str]:
    """The trainer container's environment in pod `index` of `job`, with its ConfigMap volumes
    (of `config_maps`) written under `root` and the variables naming them pointed there."""
    template = job["spec"]["template"]
    pod_meta = {
        "name": f"{job['metadata']['name']}-{index}-abcde",
        "namespace": job["metadata"]["namespace"],
        "labels": dict(template["metadata"]["labels"]),
        "annotations": {
            **template["metadata"].get("annotations", {}),
            contract.COMPLETION_INDEX_ANNOTATION: str(index),
        },
    }
    data = {c["metadata"]["name"]: c["data"] for c in config_maps}
    (container,) = template["spec"]["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    moved = {}
    for volume in template["spec"]["volumes"]:
        if volume.get("configMap", {}).get("name") not in data:
            continue
        mount = mounts[volume["name"]]
        moved[mount] = str(root / mount.lstrip("/"))
        source = data[volume["configMap"]["name"]]
        for item in volume["configMap"]["items"]:
            target = root / mount.lstrip("/") / item["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(source[item["key"]])
    env = {}
    for var in container["env"]:
        if "valueFrom" in var:
            value = _field(pod_meta, var["valueFrom"]["fieldRef"]["fieldPath"])
        else:
            value = var["value"]
        for mount, there in moved.items():
            if value.startswith(mount + "/"):
                value = there + value[len(mount) :]
        env[var["name"]] = value
    return env


def _ports(job: dict) -> dict[str, int]:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return {p["name"]: p["containerPort"] for p in container["ports"]}


@pytest.mark.parametrize(
    ("overrides", "index"),
    [
        ({"accelerator": {"type": "cpu", "hosts": 2, "devicesPerHost": 4}}, 1),
        ({"accelerator": {"type": "cpu", "devicesPerHost": 1}}, 0),
        ({"accelerator": TPU, "checkpoint": {"location": "gs://bucket/runs/demo"}}, 3),
        (
            {
                "metricsPort": 9200,
                "coordinatorPort": 9300,
                "env": [
                    {"name": "A", "value": "b"},
                    {"name": "EVOKUBE_LOG_LEVEL", "value": "debug"},
                ],
            },
            0,
        ),
    ],
)
def test_the_trainer_reads_what_the_operator_meant(tmp_path, overrides, index):
    exp = experiment(name="demo", namespace="team-a", **overrides)
    spec = parse_spec(exp.spec)
    attempt = 2
    job = builders.job(exp, spec, attempt)
    env = pod_as_trainer_sees_it(job, [builders.manifest_config_map(exp, attempt)], index, tmp_path)
    operators = {v["name"] for v in builders.trainer_env(exp, spec, attempt)}
    on_type = contract.OPERATOR_ENV_ON.get(spec.accelerator.type, ())
    assert set(contract.OPERATOR_ENV) <= operators <= {*contract.OPERATOR_ENV, *on_type}

    inputs = Inputs.from_env(env)
    config = to_run_config(manifest.load(inputs.manifest))
    assert (config.name, config.namespace) == ("demo", "team-a")
    assert inputs.group == ProcessGroup(
        builders.coordinator_address("demo", attempt, spec.coordinator_port),
        spec.accelerator.hosts,
        index,
    )
    assert inputs.process_id == index
    assert inputs.group.coordinator_address.endswith(f":{_ports(job)['coordinator']}")
    assert inputs.checkpoint_dir == spec.checkpoint_location
    assert inputs.metrics_port == spec.metrics_port == _ports(job)["metrics"]
    assert inputs.report_status
    assert inputs.history is None
    users = {v["name"]: v["value"] for v in overrides.get("env", ())}
    assert inputs.log_level == users.get(contract.ENV_LOG_LEVEL, "info").upper()
    if contract.ENV_TPU_WORKER_ID in env:
        assert env[contract.ENV_TPU_WORKER_ID] == str(index)


def test_evokube_run_gives_its_processes_what_a_pod_gets(tmp_path):
    exp = experiment(name="demo", namespace="team-a")
    raw = {"metadata": {"name": "demo", "namespace": "team-a"}, "spec": dict(exp.spec)}
    raw["spec"]["accelerator"] = {"type": "cpu", "hosts": 2, "devicesPerHost": 2}
    with local._listening(0) as metrics:
        env = local.process_env(raw, tmp_path, 2, 1, coordinator_port=1234, metrics=metrics)
        port, fd = metrics.getsockname()[1], metrics.fileno()
    inputs = Inputs.from_env(env)
    assert inputs.manifest == str(tmp_path / contract.MANIFEST_FILE)
    assert inputs.group == ProcessGroup("127.0.0.1:1234", 2, 1)
    assert (inputs.checkpoint_dir, inputs.metrics_port) == (str(tmp_path), port)
    assert inputs.metrics_fd == fd
    assert inputs.history == str(tmp_path / contract.HISTORY_FILE)
    assert not inputs.report_status


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({}, "EVOKUBE_MANIFEST is not set"),
        ({"EVOKUBE_MANIFEST": "m", "EVOKUBE_METRICS_PORT": "http"}, "EVOKUBE_METRICS_PORT='http'"),
        ({"EVOKUBE_MANIFEST": "m", "EVOKUBE_METRICS_PORT": "70000"}, r"is not a port \(0 to 65535"),
        ({"EVOKUBE_MANIFEST": "m", "EVOKUBE_METRICS_PORT": "-1"}, "is not a port"),
        ({"EVOKUBE_MANIFEST": "m", "EVOKUBE_CHECKPOINT_DIR": "ftp://host/x"}, "gs:// or s3://"),
        ({"EVOKUBE_MANIFEST": "m", "EVOKUBE_CHECKPOINT_DIR": "s3://"}, "naming a bucket"),
        ({"EVOKUBE_MANIFEST": "m", "EVOKUBE_CHECKPOINT_DIR": "ckpt"}, "an absolute path"),
        (
            {"EVOKUBE_MANIFEST": "m", "JAX_COORDINATOR_ADDRESS": "h:1", "JAX_PROCESS_ID": "2"},
            "outside",
        ),
        ({"EVOKUBE_MANIFEST": "m", "EVOKUBE_LOG_LEVEL": "loud"}, "EVOKUBE_LOG_LEVEL='loud'"),
        ({"EVOKUBE_MANIFEST": "m", "EVOKUBE_METRICS_FD": "3x"}, "'3x' is not a file descriptor"),
    ],
)
def test_a_bad_environment_is_permanent(env, message):
    with pytest.raises(PermanentError, match=message):
        Inputs.from_env(env)


@pytest.mark.parametrize(
    "accelerator",
    [
        {"type": "cpu"},
        {"type": "gpu", "gpu": {"count": 1}},
        {"type": "tpu", "tpu": {"type": "tpu-v5-lite-podslice", "topology": "4x4"}},
    ],
    ids=lambda acc: acc["type"],
)
def test_spec_env_may_set_what_the_contract_leaves_to_users_and_nothing_else(accelerator):
    # The CRD's rules on spec.env, as `evokube validate` applies them (the same as the API
    # server's: tests/operator/test_crd.py), against the contract's lists.
    operators = {*contract.OPERATOR_ENV, *contract.OPERATOR_ENV_ON.get(accelerator["type"], ())}
    refused, expected = {}, {}
    for name in (*contract.ENV_VARS, f"{contract.ENV_PREFIX}ANYTHING", "WANDB_API_KEY"):
        doc = with_changes({"spec.accelerator": accelerator, "spec.env": [{"name": name}]})
        errors = manifest.check(doc)[1]
        refused[name] = any(e.path.startswith("spec.env") for e in errors)
        reserved = name.startswith(contract.ENV_PREFIX) and name not in contract.USER_ENV
        expected[name] = name in operators or reserved
    assert refused == expected
    assert not any(refused[name] for name in contract.USER_ENV)


def _table(heading: str) -> list[list[str]]:
    """The rows (cells) of the first table after `heading` in docs/architecture.md."""
    lines = ARCHITECTURE.read_text().split(heading, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split("|")])
    return rows


def test_the_docs_list_exactly_the_contracts_environment():
    names = [name for row in _table("## The contract") for name in re.findall(r"`(\w+)`", row[0])]
    assert names == list(contract.ENV_VARS)


def test_the_docs_list_exactly_the_contracts_exit_codes():
    codes = {
        int(match.group())
        for row in _table("### Exit codes")
        if (match := re.match(r"\d+", row[0]))
    }
    assert codes == {contract.EXIT_SUCCESS, contract.EXIT_RETRIABLE, contract.EXIT_PERMANENT}
    assert (SUCCESS, RETRIABLE, PERMANENT) == (0, 75, 78)


def test_the_contract_imports_nothing_but_the_standard_library():
    probe = "import sys, evokube_contract; print(' '.join(sorted(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    heavy = {"jax", "yaml", "kopf", "kubernetes", "evokube_operator", "evokube_trainer"}
    assert heavy.isdisjoint(loaded)


def test_evokube_run_goes_on_without_metrics_where_no_socket_opens(tmp_path, monkeypatch):
    # Some sandboxes (the lent TPU machine among them) refuse every network socket: one
    # process needs none (no coordinator), so the run starts without /metrics.
    def refuse(*args, **kwargs):
        raise OSError(errno.EAFNOSUPPORT, "Address family not supported by protocol")

    monkeypatch.setattr(local.socket, "socket", refuse)
    assert local._metrics_sockets(9100, 1) is None
    raw = {"metadata": {"name": "demo", "namespace": "default"}, "spec": dict(experiment().spec)}
    raw["spec"]["accelerator"] = {"type": "cpu", "hosts": 1, "devicesPerHost": 1}
    inputs = Inputs.from_env(local.process_env(raw, tmp_path, 1, 0, None, None))
    assert (inputs.metrics_port, inputs.metrics_fd) == (None, None)
    assert inputs.group is None


def test_two_runs_started_together_hold_distinct_metrics_ports(tmp_path):
    """`evokube run` binds each process's /metrics socket before the process starts and hands
    it over, so a second run started meanwhile (`evokube sweep --parallel`) gets other ports
    instead of finding the first one's free and losing the race to bind it."""
    with local._listening(0) as probe:
        preferred = probe.getsockname()[1]
    one = local._metrics_sockets(preferred, 2)
    two = local._metrics_sockets(preferred, 2)
    try:
        ports = [s.getsockname()[1] for s in (*one, *two)]
        assert ports[0] == preferred
        assert len(set(ports)) == 4
    finally:
        for sock in (*one, *two):
            sock.close()


def test_a_trainer_serves_its_metrics_on_the_socket_it_inherited():
    """What the trainer does with EVOKUBE_METRICS_FD: /metrics on that very socket."""
    metrics = TrainerMetrics("demo", "default", 0)
    metrics.record_checkpoint(1234.0)
    sock = local._listening(0)
    port = sock.getsockname()[1]
    metrics.serve_on(sock.detach())
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    assert 'evokube_checkpoint_last_success_timestamp_seconds{experiment="demo"' in text
    assert "1234.0" in text
