"""Exclusive placement and the TPU host environment (placement.py).

The pure part first: which gangs are exclusive, the terms their pods get, how they merge
with the user's affinity, TPU_WORKER_ID and TPU_WORKER_HOSTNAMES. Then the real
kube-scheduler on the test cluster's two TPU slices of the same shape
(tests/cluster/nodes.yaml: pools tpu and tpu-b, 4 hosts of 4 chips each): two gangs get
one slice each, a third waits whole; a gang that would fit only as two halves never splits.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from evokube_operator import api
from evokube_operator.desired import builders
from evokube_operator.reading import placement
from evokube_operator.reading.spec import SpecError, parse_spec
from tests.cluster.controlplane import HERE as CLUSTER_DIR
from tests.operator.conftest import (
    GROUP,
    PLURAL,
    VERSION,
    K8s,
    apply_quotas,
    documented_tenant_quotas,
    experiment_manifest,
    release_gangs,
    stand_in,
)
from tests.operator.factories import GPU, TPU, experiment

REQUIRED = placement.REQUIRED
SLICE_LABEL = placement.DEFAULT_TOPOLOGY_KEY
INDEX_FIELD = f"metadata.annotations['{api.COMPLETION_INDEX_ANNOTATION}']"


def build(attempt=0, namespace="ns", **spec):
    exp = experiment(namespace=namespace, **spec)
    return builders.job(exp, parse_spec(exp.spec), attempt)


def pod_template(job):
    return job["spec"]["template"]


def env_of(job):
    return {e["name"]: e for e in pod_template(job)["spec"]["containers"][0]["env"]}


def selects(selector: dict, labels: dict) -> bool:
    """A label selector's matchExpressions, evaluated as the scheduler does."""
    for expr in selector.get("matchExpressions", []):
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


# -- which gangs are exclusive ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("spec_placement", "accelerator", "hosts", "key"),
    [
        ({}, "tpu", 4, SLICE_LABEL),  # a multi-host slice: exclusive by default
        ({}, "tpu", 1, None),  # a single host is a slice by itself
        ({}, "gpu", 2, None),  # GPU and CPU pools are not slices: opt in
        ({}, "cpu", 2, None),
        ({"exclusive": False}, "tpu", 4, None),
        ({"exclusive": True}, "gpu", 2, SLICE_LABEL),
        ({"exclusive": True}, "cpu", 1, SLICE_LABEL),
        ({"topologyKey": "nvidia.com/gpu.clique"}, "gpu", 2, "nvidia.com/gpu.clique"),  # opts in
        ({"topologyKey": "kubernetes.io/hostname"}, "tpu", 4, "kubernetes.io/hostname"),
        (
            {"exclusive": True, "topologyKey": "kubernetes.io/hostname"},
            "tpu",
            1,
            "kubernetes.io/hostname",
        ),
    ],
)
def test_tpu_slices_are_exclusive_by_default_and_others_opt_in(
    spec_placement, accelerator, hosts, key
):
    assert placement.exclusive_topology_key(spec_placement, accelerator, hosts) == key


def test_parse_spec_resolves_placement_and_refuses_what_is_not_one():
    assert parse_spec(experiment(accelerator=TPU).spec).exclusive_topology_key == SLICE_LABEL
    assert parse_spec(experiment(accelerator=GPU).spec).exclusive_topology_key is None
    opted = experiment(accelerator=GPU, placement={"topologyKey": "nvidia.com/gpu.clique"})
    assert parse_spec(opted.spec).exclusive_topology_key == "nvidia.com/gpu.clique"
    for bad, field in [
        ({"exclusive": "yes"}, "spec.placement.exclusive"),
        ({"exclusive": 1}, "spec.placement.exclusive"),
        ({"topologyKey": 5}, "spec.placement.topologyKey"),
        ("everywhere", "spec.placement"),
    ]:
        with pytest.raises(SpecError, match=field):
            parse_spec(experiment(accelerator=TPU, placement=bad).spec)


# -- the terms ------------------------------------------------------------------------------
def test_gang_keys_name_one_job_across_namespaces_and_are_label_values():
    key = placement.gang_key("team-a", "exp-0")
    assert key == placement.gang_key("team-a", "exp-0")  # deterministic: a restart agrees
    assert len(key) == 40 and key.isalnum() and key.islower()  # a valid label value
    assert key != placement.gang_key("team-b", "exp-0")  # the same Job name elsewhere
    assert key != placement.gang_key("team-a", "exp-1")  # the next attempt


def test_a_tpu_gang_keeps_to_one_slice_and_has_it_to_itself():
    job = build(attempt=2, namespace="team-a", accelerator=TPU)
    labels = pod_template(job)["metadata"]["labels"]
    gang = labels[placement.GANG_LABEL]
    assert gang == placement.gang_key("team-a", "demo-2")
    affinity = pod_template(job)["spec"]["affinity"]
    assert set(affinity) == {"podAffinity", "podAntiAffinity"}
    (together,) = affinity["podAffinity"][REQUIRED]
    (alone,) = affinity["podAntiAffinity"][REQUIRED]
    assert together["topologyKey"] == alone["topologyKey"] == SLICE_LABEL
    # The gang's own pods attract it (the first pod matches its own term, so it may start
    # anywhere) and never repel it; any other evokube gang's pods of its namespace repel it.
    assert selects(together["labelSelector"], labels)
    assert not selects(alone["labelSelector"], labels)
    other = {**labels, placement.GANG_LABEL: placement.gang_key("team-b", "demo-2")}
    assert not selects(together["labelSelector"], other)
    assert selects(alone["labelSelector"], other)
    assert not selects(alone["labelSelector"], {"app": "not-ours"})  # others' pods: no matter
    # Neither term names namespaces: both hold in the pod's own (another tenant's gang is not
    # kept off, and cannot keep this one off either).
    for term in (together, alone):
        assert "namespaceSelector" not in term and "namespaces" not in term


def test_every_trainer_pod_carries_its_gang_so_exclusive_gangs_see_it():
    for accelerator in (TPU, GPU, {"type": "cpu"}):
        job = build(accelerator=accelerator)
        labels = pod_template(job)["metadata"]["labels"]
        assert labels[placement.GANG_LABEL] == placement.gang_key("ns", "demo-0")
    assert "affinity" not in pod_template(build(accelerator=GPU))["spec"]  # not exclusive


def test_the_users_affinity_is_kept_and_ours_added():
    user = {
        "nodeAffinity": {
            REQUIRED: {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                ]
            }
        },
        "podAffinity": {
            REQUIRED: [
                {"labelSelector": {"matchLabels": {"cache": "warm"}}, "topologyKey": "rack"}
            ],
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 10, "podAffinityTerm": {"topologyKey": "zone"}}
            ],
        },
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 5, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname"}}
            ]
        },
    }
    before = copy.deepcopy(user)
    merged = placement.pod_affinity(user, "g", "example.com/slice")
    assert user == before  # not mutated
    assert merged["nodeAffinity"] == user["nodeAffinity"]
    together, alone = placement.exclusive_terms("g", "example.com/slice")
    assert merged["podAffinity"][REQUIRED] == [*user["podAffinity"][REQUIRED], together]
    assert merged["podAntiAffinity"][REQUIRED] == [alone]
    for kind in ("podAffinity", "podAntiAffinity"):
        preferred = "preferredDuringSchedulingIgnoredDuringExecution"
        assert merged[kind][preferred] == user[kind][preferred]
    assert placement.pod_affinity(user, "g", None) == user
    assert placement.pod_affinity(None, "g", None) is None
    assert placement.pod_affinity({}, "g", None) is None


HOST = "kubernetes.io/hostname"


@pytest.mark.parametrize(
    ("affinity", "field"),
    [
        (
            {"podAntiAffinity": {REQUIRED: [{"topologyKey": HOST, "namespaceSelector": {}}]}},
            f"podAntiAffinity.{REQUIRED}[0].namespaceSelector",
        ),
        (
            {"podAffinity": {REQUIRED: [{"topologyKey": HOST, "namespaces": ["team-b"]}]}},
            f"podAffinity.{REQUIRED}[0].namespaces",
        ),
        (
            {
                "podAntiAffinity": {
                    placement.PREFERRED: [
                        {
                            "weight": 1,
                            "podAffinityTerm": {
                                "topologyKey": HOST,
                                "namespaceSelector": {"matchLabels": {"team": "b"}},
                            },
                        }
                    ]
                }
            },
            f"podAntiAffinity.{placement.PREFERRED}[0].podAffinityTerm.namespaceSelector",
        ),
    ],
)
def test_the_operator_refuses_stored_terms_that_reach_other_namespaces(affinity, field):
    """The CRD refuses them (tests/bad_manifests.py); this is for an experiment stored before."""
    with pytest.raises(SpecError) as refused:
        parse_spec(experiment(affinity=affinity).spec)
    assert str(refused.value).startswith(f"spec.affinity.{field}: ")
    own = {"podAntiAffinity": {REQUIRED: [{"topologyKey": HOST, "namespaces": []}]}}
    assert parse_spec(experiment(affinity=own).spec).affinity == own


def test_a_user_topology_key_and_an_opt_out_reach_the_job():
    key = "cloud.google.com/gce-topology-subblock"
    job = build(accelerator=TPU, placement={"topologyKey": key})
    affinity = pod_template(job)["spec"]["affinity"]
    assert affinity["podAffinity"][REQUIRED][0]["topologyKey"] == key
    assert (
        "affinity"
        not in pod_template(build(accelerator=TPU, placement={"exclusive": False}))["spec"]
    )


# -- the TPU host environment ----------------------------------------------------------------
def test_a_multi_host_tpu_gang_gets_its_worker_id_and_host_names():
    job = build(attempt=3, accelerator=TPU)
    env = env_of(job)
    worker_id = env[placement.ENV_TPU_WORKER_ID]
    assert worker_id["valueFrom"]["fieldRef"]["fieldPath"] == INDEX_FIELD
    assert env[api.ENV_PROCESS_ID]["valueFrom"] == worker_id["valueFrom"]  # the same rank
    hostnames = env[placement.ENV_TPU_WORKER_HOSTNAMES]["value"].split(",")
    assert hostnames == [f"demo-3-{i}.demo" for i in range(4)]
    # The same stable names as the coordinator's: host 0 first, under the headless Service.
    assert env[api.ENV_COORDINATOR]["value"] == f"{hostnames[0]}:8476"
    assert pod_template(job)["spec"]["subdomain"] == builders.service_name("demo")
    names = [e["name"] for e in pod_template(job)["spec"]["containers"][0]["env"]]
    assert len(names) == len(set(names))


@pytest.mark.parametrize(
    "accelerator",
    [
        {
            "type": "tpu",
            "tpu": {"type": "tpu-v5-lite-device", "topology": "2x4", "chipsPerHost": 8},
        },
        GPU,
        {"type": "cpu", "hosts": 2},
    ],
    ids=["single-host tpu", "gpu", "cpu"],
)
def test_other_gangs_get_no_tpu_worker_variables(accelerator):
    env = env_of(build(accelerator=accelerator))
    assert placement.ENV_TPU_WORKER_ID not in env
    assert placement.ENV_TPU_WORKER_HOSTNAMES not in env


# -- on the real scheduler --------------------------------------------------------------------
TPU_SLICE = {"type": "tpu", "tpu": {"type": "tpu-v5-lite-podslice", "topology": "4x4"}}
UNSCHEDULABLE_TIMEOUT = 2


def tpu_slices() -> dict[str, list[str]]:
    """The test cluster's 4x4 slices: node pool label -> node names (nodes.yaml)."""
    pools = yaml.safe_load(Path(CLUSTER_DIR / "nodes.yaml").read_text())["pools"]
    return {
        spec["labels"][SLICE_LABEL]: [f"{pool}-{i}" for i in range(spec["count"])]
        for pool, spec in pools.items()
        if spec["labels"].get(api.TPU_TOPOLOGY_SELECTOR) == "4x4"
    }


@pytest.fixture
def impatient(cluster, api, operator, operator_kubeconfig, namespace):
    """The session's operator pauses; one that reports unschedulable pods at once replaces it."""
    with stand_in(
        cluster,
        api,
        operator,
        operator_kubeconfig,
        namespace,
        "placement",
        f"--unschedulable-timeout-seconds={UNSCHEDULABLE_TIMEOUT}",
    ) as k8s:
        yield k8s


def slice_of_node(k8s: K8s, node: str) -> str:
    return k8s.core.read_node(node).metadata.labels[SLICE_LABEL]


def bound_slices(k8s: K8s, pods) -> list[str]:
    return [slice_of_node(k8s, p.spec.node_name) for p in pods if p.spec.node_name]


def blocked(k8s: K8s, namespace: str, name: str, reason: str, timeout: float = 30):
    def found():
        cond = k8s.condition(namespace, name, "Blocked")
        return cond if cond and (cond["status"], cond["reason"]) == ("True", reason) else None

    return k8s.wait(found, f"{namespace}/{name} to be Blocked ({reason})", timeout)


def delete_experiment(k8s: K8s, namespace: str, name: str) -> None:
    k8s.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    k8s.wait(lambda: not k8s.pods(namespace, name), f"the pods of {name} to be gone")


@pytest.mark.cluster
def test_two_gangs_get_a_slice_each_and_a_third_waits_whole(impatient, namespace):
    k8s = impatient
    slices = tpu_slices()
    assert len(slices) == 2  # two slices of the same shape
    for name in ("a", "b"):
        k8s.apply(experiment_manifest(name, namespace, accelerator=TPU_SLICE))
    placed = {}
    for name in ("a", "b"):
        status = k8s.wait_running_gang(namespace, name, 4, timeout=60)
        pods = k8s.running_pods(namespace, name, status["jobName"])
        assert len({p.spec.node_name for p in pods}) == 4
        (placed[name],) = set(bound_slices(k8s, pods))  # every host on one slice
        job = status["jobName"]
        for pod in pods:
            env = {e.name: e for e in pod.spec.containers[0].env}
            assert env["TPU_WORKER_HOSTNAMES"].value == ",".join(
                f"{job}-{i}.{name}" for i in range(4)
            )
            assert env["TPU_WORKER_ID"].value_from.field_ref.field_path == INDEX_FIELD
    assert placed["a"] != placed["b"]
    assert set(placed.values()) == set(slices)

    # Both slices are taken: the third gang waits, none of its pods bound anywhere.
    k8s.apply(experiment_manifest("c", namespace, accelerator=TPU_SLICE))
    cond = blocked(k8s, namespace, "c", "Unschedulable")
    assert "cannot be scheduled" in cond["message"]
    pods = k8s.pods(namespace, "c")
    assert len(pods) == 4
    assert not [p.metadata.name for p in pods if p.spec.node_name]
    assert {p.status.phase for p in pods} == {"Pending"}
    status = k8s.status(namespace, "c")
    assert status["phase"] == "Pending"
    running = k8s.condition(namespace, "c", "Running")
    assert (running["status"], running["reason"]) == ("False", "WaitingForHosts")

    # A slice frees up: the whole gang takes it.
    delete_experiment(k8s, namespace, "a")
    status = k8s.wait_running_gang(namespace, "c", 4, timeout=60)
    pods = k8s.running_pods(namespace, "c", status["jobName"])
    assert set(bound_slices(k8s, pods)) == {placed["a"]}
    cond = k8s.condition(namespace, "c", "Blocked")
    assert (cond["status"], cond["reason"]) == ("False", "Unblocked")


def blocker(name: str, node: str) -> client.V1Pod:
    """A pod of other software holding all 4 chips of one TPU host."""
    container = client.V1Container(
        name="main",
        image="registry.invalid/other:1",
        resources=client.V1ResourceRequirements(limits={api.TPU_RESOURCE: "4"}),
    )
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1PodSpec(
            containers=[container],
            restart_policy="Never",
            node_selector={"kubernetes.io/hostname": node},
            tolerations=[client.V1Toleration(key=api.TPU_RESOURCE, operator="Exists")],
        ),
    )


@pytest.mark.cluster
def test_a_gang_that_fits_only_as_two_half_slices_never_splits(impatient, namespace):
    k8s = impatient
    slices = tpu_slices()
    # Other software holds 2 hosts of each slice: 4 free hosts, 2 on each.
    names = []
    for nodes in slices.values():
        for node in nodes[:2]:
            names.append(f"other-{node}")
            k8s.core.create_namespaced_pod(namespace, blocker(names[-1], node))
    try:
        k8s.wait(
            lambda: all(
                k8s.core.read_namespaced_pod(n, namespace).status.phase == "Running" for n in names
            ),
            "the other software's pods to run",
        )

        # Without exclusive placement the scheduler takes the 4 free hosts: half of each slice.
        k8s.apply(
            experiment_manifest(
                "loose", namespace, accelerator=TPU_SLICE, placement={"exclusive": False}
            )
        )
        status = k8s.wait_running_gang(namespace, "loose", 4, timeout=60)
        pods = k8s.running_pods(namespace, "loose", status["jobName"])
        assert sorted(bound_slices(k8s, pods)) == sorted([*slices] * 2)
        delete_experiment(k8s, namespace, "loose")

        # An exclusive gang (the default on TPU) never spans the two: it waits for one slice.
        k8s.apply(experiment_manifest("whole", namespace, accelerator=TPU_SLICE))
        cond = blocked(k8s, namespace, "whole", "Unschedulable")
        assert "didn't match pod affinity rules" in cond["message"]
        # Its first pod took a free host; the second the other free host of that slice; the
        # last two stay Pending beside the 2 free hosts of the other slice.
        pods = k8s.wait(
            lambda: (
                (found := k8s.pods(namespace, "whole"))
                and len([p for p in found if p.spec.node_name]) == 2
                and found
            ),
            "2 pods of whole to be bound",
        )
        assert len(pods) == 4
        assert len(set(bound_slices(k8s, pods))) == 1
        assert k8s.status(namespace, "whole")["phase"] == "Pending"
    finally:
        release_gangs(k8s, namespace)
        for name in names:
            k8s.core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        k8s.wait(
            lambda: not k8s.core.list_namespaced_pod(namespace).items,
            "the other software's pods to be gone",
        )


def pod_scheduled(pod) -> client.V1PodCondition | None:
    return next((c for c in pod.status.conditions or [] if c.type == "PodScheduled"), None)


@pytest.mark.cluster
def test_an_exclusive_gang_keeps_only_its_own_namespaces_gangs_off_its_pool(
    k8s, namespace, other_namespace
):
    """Issue 22's attack: a one-pod CPU gang, exclusive on the node pool all CPU nodes share,
    kept every other namespace's gangs off all of them. Its terms hold in its own namespace
    now: another tenant's gangs, exclusive or not, run beside it; its namespace's other
    gangs stay off; and the quotas docs/security.md recommends per tenant (one refuses pods
    with cross-namespace terms) admit it."""
    apply_quotas(k8s, namespace, documented_tenant_quotas())  # cross-namespace terms: none
    k8s.apply(experiment_manifest("hog", namespace, placement={"exclusive": True}))
    hog = k8s.wait_running_gang(namespace, "hog", 1, timeout=60)
    (pod,) = k8s.running_pods(namespace, "hog", hog["jobName"])
    pool = slice_of_node(k8s, pod.spec.node_name)

    # Another tenant's gangs, one at a time (its exclusive gang would keep its loose one off).
    two_hosts = {"type": "cpu", "hosts": 2}
    for name, spec_placement in (("loose", {}), ("exclusive", {"exclusive": True})):
        k8s.apply(
            experiment_manifest(
                name, other_namespace, accelerator=two_hosts, placement=spec_placement
            )
        )
        status = k8s.wait_running_gang(other_namespace, name, 2, timeout=60)
        pods = k8s.running_pods(other_namespace, name, status["jobName"])
        assert set(bound_slices(k8s, pods)) == {pool}  # beside the hog
        delete_experiment(k8s, other_namespace, name)

    # The hog's own namespace: one slice, one gang.
    k8s.apply(experiment_manifest("second", namespace, placement={"exclusive": True}))
    refused = k8s.wait(
        lambda: next(
            (
                c
                for p in k8s.pods(namespace, "second")
                if (c := pod_scheduled(p)) and c.status == "False"
            ),
            None,
        ),
        "the second gang's pod to be found unschedulable",
    )
    assert "didn't match pod anti-affinity rules" in refused.message
