"""The desired objects, checked without a cluster: pure functions of the experiment."""

import copy

import pytest
import yaml

from evokube_operator import api
from evokube_operator.desired import builders
from evokube_operator.reading.spec import parse_spec
from evokube_operator.rules import failure
from tests.operator.factories import GPU, TPU, experiment


def build_job(attempt=0, deadline=None, **spec_overrides):
    exp = experiment(**spec_overrides)
    return builders.job(exp, parse_spec(exp.spec), attempt, deadline)


def pod_spec(job):
    return job["spec"]["template"]["spec"]


def env_of(job):
    return {
        e["name"]: e.get("value", e.get("valueFrom")) for e in pod_spec(job)["containers"][0]["env"]
    }


def test_names_are_deterministic_and_short_enough():
    name = "a" * 52  # the CRD's maximum
    assert builders.job_name(name, 12) == f"{name}-12"
    assert builders.coordinator_address("demo", 3, 8476) == "demo-3-0.demo:8476"
    # Indexed Job pods are named <job>-<index>: a DNS label of at most 63 characters.
    assert len(f"{builders.job_name(name, 99999)}-4095") <= 63
    assert builders.service_name("demo") == "demo"
    assert builders.trainer_account_name("demo") == "demo-trainer"


ACCELERATORS = [
    # (accelerator, hosts, node selector, extended resources, toleration keys)
    ({"type": "cpu", "devicesPerHost": 4}, 1, {}, {}, []),
    ({"type": "cpu", "hosts": 3}, 3, {}, {}, []),
    (
        GPU,
        2,
        {api.GPU_PRODUCT_SELECTOR: "nvidia-h100-80gb"},
        {api.GPU_RESOURCE: 8},
        [api.GPU_RESOURCE],
    ),
    ({"type": "gpu", "gpu": {"count": 1}}, 1, {}, {api.GPU_RESOURCE: 1}, [api.GPU_RESOURCE]),
    (
        TPU,
        4,
        {
            api.TPU_ACCELERATOR_SELECTOR: "tpu-v5-lite-podslice",
            api.TPU_TOPOLOGY_SELECTOR: "4x4",
        },
        {api.TPU_RESOURCE: 4},
        [api.TPU_RESOURCE],
    ),
    (
        {"type": "tpu", "tpu": {"type": "tpu-v5p-slice", "topology": "2x2x4"}},
        4,
        {api.TPU_ACCELERATOR_SELECTOR: "tpu-v5p-slice", api.TPU_TOPOLOGY_SELECTOR: "2x2x4"},
        {api.TPU_RESOURCE: 4},
        [api.TPU_RESOURCE],
    ),
    (
        {
            "type": "tpu",
            "tpu": {"type": "tpu-v5-lite-device", "topology": "2x4", "chipsPerHost": 8},
        },
        1,
        {api.TPU_ACCELERATOR_SELECTOR: "tpu-v5-lite-device", api.TPU_TOPOLOGY_SELECTOR: "2x4"},
        {api.TPU_RESOURCE: 8},
        [api.TPU_RESOURCE],
    ),
]


@pytest.mark.parametrize(
    ("accelerator", "hosts", "selector", "resources", "tolerated"), ACCELERATORS
)
def test_accelerator_decides_hosts_placement_and_resources(
    accelerator, hosts, selector, resources, tolerated
):
    job = build_job(accelerator=accelerator)
    spec = job["spec"]
    assert spec["completions"] == spec["parallelism"] == hosts
    assert pod_spec(job).get("nodeSelector", {}) == selector
    container = pod_spec(job)["containers"][0]
    for kind in ("requests", "limits"):
        assert container.get("resources", {}).get(kind, {}) == resources
    assert [t["key"] for t in pod_spec(job).get("tolerations", [])] == tolerated
    for toleration in pod_spec(job).get("tolerations", []):
        assert toleration == {
            "key": toleration["key"],
            "operator": "Exists",
            "effect": "NoSchedule",
        }
    assert env_of(job)[api.ENV_NUM_PROCESSES] == str(hosts)


def test_the_job_is_one_indexed_all_or_nothing_gang():
    job = build_job(attempt=2)
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["backoffLimit"] == 0
    assert "activeDeadlineSeconds" not in spec
    assert job["metadata"]["name"] == "demo-2"
    assert job["metadata"]["labels"][api.LABEL_ATTEMPT] == "2"
    rules = spec["podFailurePolicy"]["rules"]
    assert rules[failure.RULE_PERMANENT_EXIT] == {
        "action": "FailJob",
        "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [78]},
    }
    assert rules[failure.RULE_DISRUPTION] == {
        "action": "FailJob",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    pod = pod_spec(job)
    assert pod["subdomain"] == "demo"
    assert pod["restartPolicy"] == "Never"  # required by a pod failure policy
    assert pod["serviceAccountName"] == "demo-trainer"
    assert pod["containers"][0]["command"] == ["evokube-train"]
    assert {v["name"] for v in pod["volumes"]} == {"manifest", "scratch", "checkpoints"}


def test_pods_get_the_jax_distributed_contract():
    env = env_of(build_job(attempt=1, accelerator={"type": "cpu", "hosts": 2, "devicesPerHost": 4}))
    assert env == {
        api.ENV_MANIFEST: "/etc/evokube/experiment.yaml",
        api.ENV_COORDINATOR: "demo-1-0.demo:8476",
        api.ENV_NUM_PROCESSES: "2",
        api.ENV_PROCESS_ID: {
            "fieldRef": {
                "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"
            }
        },
        api.ENV_CHECKPOINT_DIR: "/checkpoints",
        api.ENV_METRICS_PORT: "9100",
        api.ENV_REPORT_STATUS: "1",
        api.ENV_HOME: api.SCRATCH_DIR,
        api.ENV_XLA_FLAGS: "--xla_force_host_platform_device_count=4",
    }
    assert api.ENV_XLA_FLAGS not in env_of(build_job(accelerator=TPU))


@pytest.mark.parametrize(
    ("accelerator", "non_root"), [({"type": "cpu"}, True), (GPU, True), (TPU, False)]
)
def test_pods_run_restricted_unless_the_accelerator_needs_root(accelerator, non_root):
    pod = pod_spec(build_job(accelerator=accelerator))
    container = pod["containers"][0]["securityContext"]
    assert container["allowPrivilegeEscalation"] is False
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["securityContext"].get("runAsNonRoot", False) is non_root
    if non_root:
        assert pod["securityContext"]["runAsUser"] == api.TRAINER_UID
        assert container["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in container


@pytest.mark.parametrize(
    ("checkpoint", "volume", "mount_path", "env"),
    [
        ({}, {"emptyDir": {}}, "/checkpoints", "/checkpoints"),
        (
            {"location": "/data/ckpt", "volumeClaimName": "shared"},
            {"persistentVolumeClaim": {"claimName": "shared"}},
            "/data/ckpt",
            "/data/ckpt",
        ),
        ({"location": "gs://bucket/runs/demo"}, None, None, "gs://bucket/runs/demo"),
    ],
)
def test_checkpoint_location_becomes_a_volume_when_it_is_a_path(
    checkpoint, volume, mount_path, env
):
    job = build_job(checkpoint=checkpoint)
    volumes = {v["name"]: v for v in pod_spec(job)["volumes"]}
    mounts = {m["name"]: m for m in pod_spec(job)["containers"][0]["volumeMounts"]}
    if volume is None:
        assert "checkpoints" not in volumes and "checkpoints" not in mounts
    else:
        assert {k: v for k, v in volumes["checkpoints"].items() if k != "name"} == volume
        assert mounts["checkpoints"]["mountPath"] == mount_path
    assert env_of(job)[api.ENV_CHECKPOINT_DIR] == env


def test_passthrough_fields_reach_the_pods_and_ours_win_conflicts():
    job = build_job(
        accelerator=TPU,
        nodeSelector={"pool": "big", api.TPU_TOPOLOGY_SELECTOR: "2x2"},
        tolerations=[
            {"key": "team", "operator": "Equal", "value": "rl", "effect": "NoSchedule"},
            {"key": api.TPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"},
        ],
        affinity={"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        priorityClassName="research-high",
        queueName="tpu-queue",
        workloadPriorityClassName="research",
        podLabels={
            "team": "rl",
            api.LABEL_EXPERIMENT: "someone-else",
        },
        podAnnotations={"note": "hi"},
        resources={"requests": {"cpu": "8", "memory": "32Gi"}, "limits": {"memory": "32Gi"}},
        imagePullPolicy="Always",
    )
    pod = pod_spec(job)
    assert pod["nodeSelector"] == {
        "pool": "big",
        api.TPU_ACCELERATOR_SELECTOR: "tpu-v5-lite-podslice",
        api.TPU_TOPOLOGY_SELECTOR: "4x4",  # the accelerator's selector wins
    }
    assert [t["key"] for t in pod["tolerations"]] == [api.TPU_RESOURCE, "team"]  # no duplicate
    # The user's affinity is kept; a TPU slice gang adds its own terms (test_placement.py).
    assert pod["affinity"]["nodeAffinity"] == {
        "preferredDuringSchedulingIgnoredDuringExecution": []
    }
    assert pod["priorityClassName"] == "research-high"
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels["team"] == "rl"
    assert labels[api.LABEL_EXPERIMENT] == "demo"  # the Service selects pods by it
    # Kueue reads the Job's labels (not the pods'), and admits the Job by unsuspending it.
    assert not any(key.startswith("kueue.x-k8s.io/") for key in labels)
    assert job["metadata"]["labels"][api.KUEUE_QUEUE_LABEL] == "tpu-queue"
    assert job["metadata"]["labels"][api.KUEUE_PRIORITY_LABEL] == "research"
    assert job["spec"]["suspend"] is True
    assert "team" not in job["metadata"]["labels"]
    annotations = job["spec"]["template"]["metadata"]["annotations"]
    assert annotations["note"] == "hi"
    container = pod["containers"][0]
    assert container["imagePullPolicy"] == "Always"
    assert container["resources"] == {
        "requests": {"cpu": "8", "memory": "32Gi", api.TPU_RESOURCE: 4},
        "limits": {"memory": "32Gi", api.TPU_RESOURCE: 4},
    }


def test_the_job_deadline_is_what_is_left_of_the_experiments():
    assert build_job(deadline=120)["spec"]["activeDeadlineSeconds"] == 120
    assert build_job(deadline=0)["spec"]["activeDeadlineSeconds"] == 1


def test_everything_is_owned_by_the_experiment_and_labelled():
    exp = experiment()
    spec = parse_spec(exp.spec)
    objects = [*builders.static_objects(exp, spec), builders.job(exp, spec, 0)]
    assert [o["kind"] for o in objects] == [
        "Service",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "Job",
    ]
    for obj in objects:
        meta = obj["metadata"]
        assert meta["namespace"] == "ns"
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "evokube.io/v1alpha1",
                "kind": "ERLExperiment",
                "name": "demo",
                "uid": exp.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert meta["labels"][api.LABEL_EXPERIMENT] == "demo"
        assert meta["labels"][api.LABEL_MANAGED_BY] == api.MANAGED_BY


def test_the_trainer_may_only_touch_its_own_experiments_status():
    exp = experiment()
    role = builders.role(exp)
    assert role["rules"] == [
        {
            "apiGroups": ["evokube.io"],
            "resources": ["erlexperiments/status"],
            "resourceNames": ["demo"],
            "verbs": ["get", "patch"],
        }
    ]
    binding = builders.role_binding(exp, parse_spec(exp.spec))
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "demo-trainer",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "demo-trainer", "namespace": "ns"}
    ]


def test_headless_service_publishes_hosts_before_they_are_ready():
    svc = builders.service(experiment(), parse_spec(experiment().spec))
    assert svc["metadata"]["name"] == "demo"
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"][api.LABEL_EXPERIMENT] == "demo"
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {
        "coordinator": 8476,
        "metrics": 9100,
    }


def test_the_attempts_config_map_carries_the_manifest_the_trainer_reads_from_its_file():
    exp = experiment(podLabels={"a": "b"}, podAnnotations={"team": "rl"})
    job = builders.job(exp, parse_spec(exp.spec), 2)
    manifest = builders.manifest_config_map(exp, 2)
    assert manifest["metadata"]["name"] == builders.manifest_name(job["metadata"]["name"])
    assert manifest["metadata"]["name"] == "demo-2-manifest"
    assert manifest["metadata"]["ownerReferences"] == job["metadata"]["ownerReferences"]
    assert manifest["metadata"]["labels"] == job["metadata"]["labels"]  # no queue: the same
    document = yaml.safe_load(manifest["data"][api.MANIFEST_FILE])
    assert document == {
        "apiVersion": "evokube.io/v1alpha1",
        "kind": "ERLExperiment",
        "metadata": {"name": "demo", "namespace": "ns"},
        "spec": dict(exp.spec),
    }
    # The pods mount it; the template carries only the user's annotations, not the spec.
    template = job["spec"]["template"]
    assert template["metadata"]["annotations"] == {"team": "rl"}
    volume = next(v for v in template["spec"]["volumes"] if v["name"] == "manifest")
    assert volume["configMap"] == {
        "name": "demo-2-manifest",
        "items": [{"key": api.MANIFEST_FILE, "path": api.MANIFEST_FILE}],
    }
    (container,) = template["spec"]["containers"]
    mount = next(m for m in container["volumeMounts"] if m["name"] == "manifest")
    assert mount["mountPath"] == api.MANIFEST_DIR
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env[api.ENV_MANIFEST] == f"{api.MANIFEST_DIR}/{api.MANIFEST_FILE}"


def test_a_queued_attempts_config_map_carries_no_kueue_label():
    exp = experiment(queueName="team-a")
    labels = builders.manifest_config_map(exp, 0)["metadata"]["labels"]
    assert api.KUEUE_QUEUE_LABEL in builders.job(exp, parse_spec(exp.spec), 0)["metadata"]["labels"]
    assert api.KUEUE_QUEUE_LABEL not in labels and labels[api.LABEL_ATTEMPT] == "0"


def test_a_pod_template_without_annotations_of_the_user_has_none():
    exp = experiment()
    assert (
        "annotations"
        not in builders.job(exp, parse_spec(exp.spec), 0)["spec"]["template"]["metadata"]
    )


def test_an_edited_spec_reaches_the_next_attempts_manifest_only():
    exp = experiment()
    edited = experiment(resources={"requests": {"memory": "8Gi"}})
    first = builders.manifest_config_map(exp, 0)["data"][api.MANIFEST_FILE]
    second = builders.manifest_config_map(edited, 1)["data"][api.MANIFEST_FILE]
    assert "8Gi" not in first
    assert "8Gi" in second


def test_builders_are_pure_and_idempotent():
    exp = experiment(accelerator=TPU, podLabels={"x": "y"}, tolerations=[{"key": "k"}])
    before = copy.deepcopy(exp.spec)
    spec = parse_spec(exp.spec)
    first = [*builders.static_objects(exp, spec), builders.job(exp, spec, 1, 30)]
    second = [*builders.static_objects(exp, spec), builders.job(exp, spec, 1, 30)]
    assert first == second
    assert exp.spec == before
