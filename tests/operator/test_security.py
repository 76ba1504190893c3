"""What a trainer pod may do, and who may touch an experiment: docs/security.md's claims.

The pure builders first (every accelerator's security context, the writable
paths, the NetworkPolicy); then the real API server judges: its PodSecurity
admission, the chart's admission policies (applied by the `operator`
fixture as `helm template` renders them) and RBAC.
"""

import json

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from evokube_operator import api
from evokube_operator.api import NO_TOKEN, REASON_PROGRESS_NOT_REPORTED
from evokube_operator.cli import parse_args
from evokube_operator.desired import builders
from evokube_operator.reading.spec import parse_spec
from tests.helm.chart import ADMISSION_TEMPLATE, documents, render, trainer_token_mode
from tests.operator.conftest import (
    GROUP,
    OPERATOR_NAMESPACE,
    PLURAL,
    REPO,
    VERSION,
    apply_quotas,
    documented_tenant_quotas,
    experiment_manifest,
    stand_in,
)
from tests.operator.factories import GPU, TPU, experiment

TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
MONITORING = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
CPU = {"type": "cpu"}


def pod_spec(accelerator, trainer_token=api.TOKEN_HOST_0, **spec):
    exp = experiment(accelerator=accelerator, **spec)
    job = builders.job(exp, parse_spec(exp.spec), 0, trainer_token=trainer_token)
    return job["spec"]["template"]["spec"]


# -- pure ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("accelerator", [CPU, GPU, TPU])
def test_every_pod_drops_all_capabilities_and_has_a_read_only_root(accelerator):
    pod = pod_spec(accelerator)
    assert pod["containers"][0]["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
    }
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert "hostNetwork" not in pod and "hostPID" not in pod and "hostIPC" not in pod


@pytest.mark.parametrize(("accelerator", "user"), [(CPU, 1000), (GPU, 1000), (TPU, None)])
def test_cpu_and_gpu_pods_run_as_the_trainer_user_tpu_pods_as_the_images(accelerator, user):
    security = pod_spec(accelerator)["securityContext"]
    assert security.get("runAsUser") == user
    assert security.get("runAsNonRoot", False) is (user is not None)


def test_the_trainer_writes_only_to_its_scratch_volume_and_checkpoints():
    pod = pod_spec(CPU)
    (container,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    # HOME (caches of JAX, XLA, CUDA, Triton, matplotlib) and tempfiles land on an emptyDir.
    assert env["HOME"] == api.SCRATCH_DIR == "/tmp"
    assert volumes[mounts["/tmp"]] == {"name": "scratch", "emptyDir": {}}
    # The XLA compilation cache goes under the checkpoint location (trainer.train).
    assert volumes[mounts["/checkpoints"]]["emptyDir"] == {}
    read_only = {m["mountPath"] for m in container["volumeMounts"] if m.get("readOnly")}
    assert set(mounts) - read_only == {"/tmp", "/checkpoints"}


@pytest.mark.parametrize("mode", [api.TOKEN_HOST_0, api.TOKEN_NONE])
def test_no_pod_gets_a_token_from_the_builder(mode):
    pod = pod_spec(CPU, mode)
    assert pod["automountServiceAccountToken"] is False
    assert not any(TOKEN_DIR in m["mountPath"] for m in pod["containers"][0]["volumeMounts"])
    assert api.TOKEN_VOLUME not in {v["name"] for v in pod["volumes"]}


def test_every_host_gets_the_token_volume_from_the_builder_where_no_policy_can():
    """--trainer-token=every-host (no MutatingAdmissionPolicy served): the template mounts it."""
    pod = pod_spec(CPU, api.TOKEN_EVERY_HOST)
    assert pod["automountServiceAccountToken"] is False
    mounts = {m["mountPath"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts[TOKEN_DIR] == {"name": api.TOKEN_VOLUME, "mountPath": TOKEN_DIR, "readOnly": True}
    assert builders.token_volume() in pod["volumes"]


def test_the_network_policy_admits_the_gang_and_the_metrics_peers_only():
    exp = experiment(metricsPort=9200)
    policy = builders.network_policy(
        exp, parse_spec(exp.spec), builders.NetworkAccess(metrics_from=(MONITORING,))
    )
    gang = {"evokube.io/experiment": "demo", "app.kubernetes.io/managed-by": "evokube-operator"}
    assert policy["metadata"]["name"] == "demo"
    assert policy["metadata"]["ownerReferences"] == [builders.owner_reference(exp)]
    assert policy["spec"] == {
        "podSelector": {"matchLabels": gang},
        "policyTypes": ["Ingress"],
        "ingress": [
            {"from": [{"podSelector": {"matchLabels": gang}}]},
            {"from": [MONITORING], "ports": [{"port": 9200, "protocol": "TCP"}]},
        ],
    }
    # The Service selects exactly the pods the policy protects.
    assert builders.service(exp, parse_spec(exp.spec))["spec"]["selector"] == gang


def test_without_metrics_peers_no_rule_admits_everyone():
    exp = experiment()
    policy = builders.network_policy(exp, parse_spec(exp.spec), builders.NetworkAccess())
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": {
        "evokube.io/experiment": "demo", "app.kubernetes.io/managed-by": "evokube-operator",
    }}}]}]  # fmt: skip
    assert all(rule.get("from") for rule in policy["spec"]["ingress"])


def test_the_network_policy_is_one_of_the_static_objects_unless_turned_off():
    exp = experiment()
    spec = parse_spec(exp.spec)
    kinds = [o["kind"] for o in builders.static_objects(exp, spec, builders.NetworkAccess())]
    assert kinds[-1] == "NetworkPolicy"
    assert "NetworkPolicy" not in [o["kind"] for o in builders.static_objects(exp, spec, None)]


def test_the_command_line_sets_the_network_access():
    options, _ = parse_args([])
    assert options.network_access == builders.NetworkAccess(metrics_from=())
    options, _ = parse_args(["--metrics-from", json.dumps([MONITORING])])
    assert options.network_access == builders.NetworkAccess(metrics_from=(MONITORING,))
    options, _ = parse_args(["--no-network-policy"])
    assert options.network_access is None
    for bad in ("{", "{}", "[1]", "[{}]"):
        with pytest.raises(SystemExit):
            parse_args(["--metrics-from", bad])


# -- on the real API server ---------------------------------------------------------------------
def enforce(k8s, namespace, level):
    k8s.core.patch_namespace(
        namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": level}}}
    )


def pods_by_index(k8s, namespace, name, job):
    pods = k8s.running_pods(namespace, name, job)
    return {int(p.metadata.labels["batch.kubernetes.io/job-completion-index"]): p for p in pods}


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("accelerator", "hosts", "level"),
    [
        ({"type": "cpu", "hosts": 2}, 2, "restricted"),
        ({**GPU, "hosts": 2}, 2, "restricted"),
        (
            {"type": "tpu", "tpu": {"type": "tpu-v5-lite-podslice", "topology": "4x4"}},
            4,
            "baseline",
        ),
    ],
    ids=["cpu", "gpu", "tpu"],
)
def test_pod_security_admits_the_gang_and_the_token_goes_where_the_chart_says(
    k8s, cluster, namespace, accelerator, hosts, level
):
    """Host 0 alone where a MutatingAdmissionPolicy is served (Kubernetes 1.36+); every host
    before (the next test: only host 0's token may write)."""
    holders = {0} if trainer_token_mode(cluster) == api.TOKEN_HOST_0 else set(range(hosts))
    enforce(k8s, namespace, level)
    k8s.apply(experiment_manifest("guarded", namespace, accelerator=accelerator))
    status = k8s.wait_running_gang(namespace, "guarded", hosts)
    pods = pods_by_index(k8s, namespace, "guarded", status["jobName"])
    assert sorted(pods) == list(range(hosts))
    for index, pod in pods.items():
        (container,) = pod.spec.containers
        assert container.security_context.read_only_root_filesystem is True
        assert container.security_context.capabilities.drop == ["ALL"]
        assert pod.spec.automount_service_account_token is False
        mounts = {m.mount_path: m for m in container.volume_mounts}
        token_volumes = [v for v in pod.spec.volumes if v.projected is not None]
        if index in holders:  # the chart's MutatingAdmissionPolicy, or the Job's template
            assert mounts[TOKEN_DIR].read_only is True
            (volume,) = token_volumes
            assert mounts[TOKEN_DIR].name == volume.name == "evokube-api-access"
            token, ca, namespace_file = volume.projected.sources
            assert (
                token.service_account_token.path,
                token.service_account_token.expiration_seconds,
            ) == ("token", 3600)
            assert ca.config_map.name == "kube-root-ca.crt"
            assert namespace_file.downward_api.items[0].field_ref.field_path == "metadata.namespace"
        else:
            assert TOKEN_DIR not in mounts and not token_volumes


TPU_SLICE = {"type": "tpu", "tpu": {"type": "tpu-v5-lite-podslice", "topology": "4x4"}}


@pytest.mark.cluster
def test_a_tpu_gang_is_refused_where_restricted_is_enforced(k8s, namespace):
    """TPU pods run as root (libtpu): "baseline" is the most they meet."""
    enforce(k8s, namespace, "restricted")
    k8s.apply(experiment_manifest("rooted", namespace, accelerator=TPU_SLICE))
    job = builders.job_name("rooted", 0)
    refusals = k8s.wait(
        lambda: [
            e
            for e in k8s.core.list_namespaced_event(
                namespace, field_selector=f"involvedObject.kind=Job,involvedObject.name={job}"
            ).items
            if e.reason == "FailedCreate" and 'PodSecurity "restricted' in e.message
        ],
        "the Job controller's FailedCreate event naming PodSecurity restricted",
    )
    assert "runAsNonRoot" in refusals[0].message, refusals[0].message
    assert not k8s.pods(namespace, "rooted")


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("field", "key"),
    [
        # Would loosen what PodSecurity judges.
        ("podAnnotations", "container.apparmor.security.beta.kubernetes.io/trainer"),
        ("podAnnotations", "seccomp.security.alpha.kubernetes.io/pod"),
        # Would claim host 0's token for every host (the Job controller sets it anyway).
        ("podLabels", "batch.kubernetes.io/job-completion-index"),
    ],
    ids=["apparmor", "seccomp", "completion-index"],
)
def test_labels_and_annotations_that_would_loosen_security_are_refused(k8s, namespace, field, key):
    manifest = experiment_manifest("loose", namespace, **{field: {key: "0"}})
    run = k8s.apply(manifest, check=False)
    assert run.returncode != 0 and f"spec.{field}" in run.stderr, run.stderr


def trainer_client(k8s, cluster, namespace, name, pod):
    """The token host 0 gets: the experiment's trainer account, bound to host 0's pod."""
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(
            audiences=[],
            bound_object_ref=client.V1BoundObjectReference(
                api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid
            ),
        )
    )
    token = k8s.core.create_namespaced_service_account_token(
        builders.trainer_account_name(name), namespace, request
    ).status.token
    return cluster.api_client(token)


@pytest.mark.cluster
def test_the_trainer_may_write_progress_and_result_but_cannot_forge_the_rest_of_status(
    k8s, cluster, namespace
):
    k8s.apply(experiment_manifest("honest", namespace, accelerator={"type": "cpu"}))
    status = k8s.wait_running_gang(namespace, "honest", 1)
    host0 = pods_by_index(k8s, namespace, "honest", status["jobName"])[0]
    trainer = trainer_client(k8s, cluster, namespace, "honest", host0)
    try:
        custom = client.CustomObjectsApi(trainer)

        def patch(body):
            return custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, "honest", {"status": body}
            )

        for forged, fields in [
            ({"phase": "Succeeded", "restarts": -7}, "status.phase, status.restarts"),
            ({"jobName": "honest-9"}, "status.jobName"),
            ({"conditions": [], "progress": {"generation": 1}}, "status.conditions"),
        ]:
            with pytest.raises(ApiException) as refused:
                patch(forged)
            assert refused.value.status in (403, 422), refused.value.body
            message = json.loads(refused.value.body)["message"]
            assert f"only the evokube operator may change {fields}" in message, message
        patch({"progress": {"generation": 7, "bestFitness": 2.5}})
        patch({"result": RESULT})
    finally:
        trainer.close()
    after = k8s.status(namespace, "honest")
    assert after["phase"] == "Running" and after.get("restarts", 0) == 0
    assert after["progress"] == {"generation": 7, "bestFitness": 2.5}
    assert after["result"] == RESULT
    # The operator's own status writes still go through (a retriable exit, a gang restart)
    # and leave the trainer's fields alone.
    k8s.exit_pod(namespace, host0.metadata.name, 75)
    k8s.wait(lambda: k8s.status(namespace, "honest").get("restarts") == 1, "the restart")
    assert k8s.status(namespace, "honest")["result"] == RESULT


RESULT = {"bestReturn": -150.5, "generation": 6, "policyURI": "/checkpoints/policies/best"}


@pytest.fixture
def every_host_policy(cluster, namespace):
    """The chart's policy for servers without MutatingAdmissionPolicy (rendered for the oldest
    supported minor), bound to `namespace`: on any server, as on that one."""
    objects = [
        o
        for o in documents(
            render(
                cluster,
                "tokens",
                OPERATOR_NAMESPACE,
                show_only=[ADMISSION_TEMPLATE],
                kube_version="1.35.0",
            )
        )
        if o["metadata"]["name"] == "tokens-evokube-trainer-token"
    ]
    assert [o["kind"] for o in objects] == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    objects[1]["spec"]["matchResources"] = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    }
    text = yaml.safe_dump_all(objects)
    cluster.kubectl("apply", "-f", "-", input=text)
    yield
    cluster.kubectl("delete", "-f", "-", input=text, check=False)


@pytest.mark.cluster
def test_where_every_host_holds_a_token_only_host_0s_may_write_status(
    k8s, cluster, namespace, every_host_policy
):
    k8s.apply(experiment_manifest("gang", namespace, accelerator={"type": "cpu", "hosts": 4}))
    status = k8s.wait_running_gang(namespace, "gang", 4)
    pods = pods_by_index(k8s, namespace, "gang", status["jobName"])
    progress = {"status": {"progress": {"generation": 3, "bestFitness": 0.5}}}

    def patch(index):
        trainer = trainer_client(k8s, cluster, namespace, "gang", pods[index])
        try:
            return client.CustomObjectsApi(trainer).patch_namespaced_custom_object_status(
                GROUP, VERSION, namespace, PLURAL, "gang", progress
            )
        finally:
            trainer.close()

    def refused(index) -> str | None:
        try:
            patch(index)
        except ApiException as err:
            assert err.status in (403, 422), err.body
            return json.loads(err.body)["message"]
        return None

    for index in (1, 2, 3):  # a new policy takes a moment to reach the API server's admission
        message = k8s.wait(lambda i=index: refused(i), f"host {index}'s write refused")
        assert f"pod {pods[index].metadata.name} may not change the status" in message
        assert f"only host 0 of Job {status['jobName']}" in message
    patch(0)
    assert k8s.status(namespace, "gang")["progress"] == {"generation": 3, "bestFitness": 0.5}


@pytest.mark.cluster
def test_without_a_token_each_experiment_is_told_progress_is_not_reported(
    cluster, api, operator, operator_kubeconfig, namespace
):
    """admission.trainerToken false: the chart runs the operator with --trainer-token=none."""
    with stand_in(
        cluster, api, operator, operator_kubeconfig, namespace, "tokenless", "--trainer-token=none"
    ) as k8s:
        k8s.apply(experiment_manifest("quiet", namespace))
        k8s.wait_event(namespace, "quiet", REASON_PROGRESS_NOT_REPORTED)
        (event,) = k8s.core.list_namespaced_event(
            namespace,
            field_selector=f"involvedObject.name=quiet,reason={REASON_PROGRESS_NOT_REPORTED}",
        ).items
        assert (event.type, event.message) == ("Warning", NO_TOKEN)


@pytest.mark.cluster
def test_the_trainer_role_is_get_and_patch_of_its_own_status(k8s, namespace):
    k8s.apply(experiment_manifest("small", namespace))
    k8s.wait_phase(namespace, "small", "Running")
    role = k8s.rbac.read_namespaced_role("small-trainer", namespace)
    assert [(r.api_groups, r.resources, r.resource_names, r.verbs) for r in role.rules] == [
        ([api.GROUP], ["erlexperiments/status"], ["small"], ["get", "patch"])
    ]


@pytest.mark.cluster
def test_the_experiments_network_policy_selects_its_gang(k8s, namespace):
    k8s.apply(experiment_manifest("fenced", namespace, accelerator={"type": "cpu", "hosts": 2}))
    status = k8s.wait_running_gang(namespace, "fenced", 2)
    networking = client.NetworkingV1Api(k8s.api_client)
    policy = networking.read_namespaced_network_policy("fenced", namespace)
    (owner,) = policy.metadata.owner_references
    assert (owner.kind, owner.name, owner.controller) == ("ERLExperiment", "fenced", True)
    selector = ",".join(f"{k}={v}" for k, v in policy.spec.pod_selector.match_labels.items())
    selected = k8s.core.list_namespaced_pod(namespace, label_selector=selector).items
    gang = k8s.running_pods(namespace, "fenced", status["jobName"])
    assert {p.metadata.name for p in selected} == {p.metadata.name for p in gang}
    assert policy.spec.policy_types == ["Ingress"]
    # The session's operator runs without --metrics-from: the gang's own rule only.
    (rule,) = policy.spec.ingress
    (peer,) = rule._from
    assert peer.pod_selector.match_labels == policy.spec.pod_selector.match_labels
    assert peer.namespace_selector is None and rule.ports is None


@pytest.mark.cluster
def test_system_priority_classes_are_refused_by_default(k8s, operator, namespace):
    run = k8s.apply(
        experiment_manifest("vip", namespace, priorityClassName="system-node-critical"),
        check=False,
    )
    # The CRD refuses them too; the chart's policy also holds with an older CRD.
    assert run.returncode != 0 and "spec.priorityClassName" in run.stderr, run.stderr


@pytest.mark.cluster
def test_the_tenant_quotas_of_docs_security_md_bound_experiments_and_terms(k8s, namespace):
    """The recommended quotas, with room for one experiment: a second is refused, and so is
    any pod with a pod anti-affinity term reaching other namespaces."""
    quotas = documented_tenant_quotas()
    (tenant,) = [q for q in quotas if "count/erlexperiments.evokube.io" in q["spec"]["hard"]]
    tenant["spec"]["hard"]["count/erlexperiments.evokube.io"] = "1"
    apply_quotas(k8s, namespace, quotas)
    k8s.apply(experiment_manifest("one", namespace, suspend=True))
    run = k8s.apply(experiment_manifest("two", namespace, suspend=True), check=False)
    assert run.returncode != 0 and "exceeded quota: evokube-tenant" in run.stderr, run.stderr
    term = {
        "labelSelector": {"matchLabels": {"app": "x"}},
        "topologyKey": "kubernetes.io/hostname",
        "namespaceSelector": {},
    }
    pod = {
        "metadata": {"name": "reaching"},
        "spec": {
            "containers": [{"name": "c", "image": "registry.invalid/c:1"}],
            "affinity": {
                "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}
            },
        },
    }
    with pytest.raises(ApiException) as refused:
        k8s.core.create_namespaced_pod(namespace, pod)
    assert refused.value.status == 403
    assert "exceeded quota: evokube-no-cross-namespace-terms" in refused.value.body


# -- docs/security.md's `kubectl auth can-i` matrix ------------------------------------------------
def documented_matrix() -> tuple[str, list[tuple[list[str], dict[str, bool]]]]:
    """(the author Role's YAML, [(can-i arguments, {operator|trainer|author: allowed})])."""
    text = (REPO / "docs" / "security.md").read_text()
    (author_role,) = [
        block.split("```", 1)[0]
        for block in text.split("```yaml\n")[1:]
        if "name: erlexperiment-author" in block
    ]
    section = text.split("## Who can do what", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    matrix = []
    for row in rows:
        request, *answers = (cell.strip() for cell in row.strip("|").split("|"))
        allowed = [{"yes": True, "no": False}[a] for a in answers]
        matrix.append((request.strip("`").split(), dict(zip(IDENTITIES, allowed, strict=True))))
    assert len(matrix) >= 15, matrix
    return author_role, matrix


IDENTITIES = ("operator", "trainer", "author")


@pytest.mark.cluster
def test_the_can_i_matrix_of_docs_security_md(cluster, crd, operator_kubeconfig, namespace):
    """The chart's operator RBAC, the builders' trainer RBAC, the doc's author Role."""
    author_role, matrix = documented_matrix()
    exp = experiment(name="mine", namespace=namespace)
    trainer_rbac = [
        builders.service_account(exp),
        builders.role(exp),
        builders.role_binding(exp, parse_spec(exp.spec)),
    ]
    for obj in trainer_rbac:  # no owner: the garbage collector would take them at once
        del obj["metadata"]["ownerReferences"]
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(trainer_rbac))
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=author_role)
    cluster.kubectl(
        "create", "rolebinding", "alice", "-n", namespace,
        "--role=erlexperiment-author", "--user=alice",
    )  # fmt: skip
    users = {
        "operator": f"system:serviceaccount:{OPERATOR_NAMESPACE}:evokube-operator",
        "trainer": f"system:serviceaccount:{namespace}:mine-trainer",
        "author": "alice",
    }
    answers = {}
    for request, _ in matrix:
        for who, user in users.items():
            run = cluster.kubectl(
                "auth", "can-i", *request, "-n", namespace, f"--as={user}", check=False
            )
            answers[" ".join(request), who] = run.stdout.strip() == "yes"
    documented = {(" ".join(r), who): allowed for r, row in matrix for who, allowed in row.items()}
    wrong = {key: answers[key] for key in documented if answers[key] != documented[key]}
    assert not wrong, f"the API server answers differently (its answer shown): {wrong}"
