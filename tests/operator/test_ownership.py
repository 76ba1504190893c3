"""Names and ownership on the real control plane: the operator takes over nothing it did not
create for the very experiment, a checkpoint claim must opt in, and a Job deleted by hand
starts the next attempt under a new name (docs/operator.md, "Names and ownership")."""

import pytest
import yaml
from kubernetes import client

from evokube_operator import api as evokube
from evokube_operator.cluster.kube import ApiError, Kube
from evokube_operator.desired import builders
from evokube_operator.reading.ownership import NameConflict
from evokube_operator.reading.spec import Experiment
from tests.operator.conftest import experiment_manifest, stand_in, suspended_experiment
from tests.operator.test_operator import assert_everything_owned_is_gone

pytestmark = pytest.mark.cluster

ONE_CPU_HOST = {"type": "cpu"}
WORKLOAD_IDENTITY = "iam.gke.io/gcp-service-account"
LABEL_H = f"{evokube.LABEL_EXPERIMENT}=h"


def foreign_objects(k8s, namespace):
    """What a namespace held before anyone named an experiment after it."""
    k8s.core.create_namespaced_service_account(
        namespace,
        {
            "metadata": {
                "name": "ml-trainer",
                "annotations": {WORKLOAD_IDENTITY: "ml@project.iam.gserviceaccount.com"},
            }
        },
    )
    k8s.rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "secret-reader"},
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}],
        },
    )
    k8s.rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "ml-trainer-secrets"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": "secret-reader",
            },
            "subjects": [{"kind": "ServiceAccount", "name": "ml-trainer", "namespace": namespace}],
        },
    )
    k8s.core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "postgres", "labels": {"app": "postgres"}},
            "spec": {
                "clusterIP": "None",
                "selector": {"app": "postgres"},
                "ports": [{"name": "pg", "port": 5432}],
            },
        },
    )
    k8s.core.create_namespaced_config_map(
        namespace, {"metadata": {"name": "app-0-manifest"}, "data": {"config.yaml": "debug: false"}}
    )
    k8s.batch.create_namespaced_job(
        namespace,
        {
            "metadata": {"name": "batch-0", "labels": {"team": "data"}},
            "spec": {
                "suspend": True,  # no pods: only its name matters here
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [{"name": "main", "image": "busybox"}],
                    }
                },
            },
        },
    )


FOREIGN = [
    # (kind, name, reader)
    ("ServiceAccount", "ml-trainer", lambda k8s: k8s.core.read_namespaced_service_account),
    ("RoleBinding", "ml-trainer-secrets", lambda k8s: k8s.rbac.read_namespaced_role_binding),
    ("Service", "postgres", lambda k8s: k8s.core.read_namespaced_service),
    ("ConfigMap", "app-0-manifest", lambda k8s: k8s.core.read_namespaced_config_map),
    ("Job", "batch-0", lambda k8s: k8s.batch.read_namespaced_job),
]


def fingerprint(k8s, namespace, objects=FOREIGN):
    """Each foreign object as the API server has it: resourceVersion, labels, annotations,
    owners, and the content (selector, data, subjects)."""
    out = {}
    for kind, name, reader in objects:
        obj = k8s.api_client.sanitize_for_serialization(reader(k8s)(name, namespace))
        meta = obj["metadata"]
        out[kind, name] = (
            meta["resourceVersion"],
            meta.get("labels"),
            meta.get("annotations"),
            meta.get("ownerReferences"),
            obj.get("spec", {}).get("selector"),
            obj.get("data"),
            obj.get("subjects"),
        )
    return out


def blocked(k8s, namespace, name):
    condition = k8s.condition(namespace, name, evokube.COND_BLOCKED)
    return condition if condition and condition["status"] == "True" else None


def test_experiments_named_after_foreign_objects_take_over_none_of_them(k8s, namespace):
    foreign_objects(k8s, namespace)
    k8s.wait(  # the Job controller writes its status once; nobody else should write it
        lambda: any(
            c.type == "Suspended"
            for c in k8s.batch.read_namespaced_job("batch-0", namespace).status.conditions or ()
        ),
        "the Job controller to see batch-0 suspended",
    )
    before = fingerprint(k8s, namespace)
    for name in ("ml", "postgres", "app", "batch"):
        k8s.apply(experiment_manifest(name, namespace, accelerator=ONE_CPU_HOST))

    for name, taken in [
        ("ml", "ServiceAccount/ml-trainer"),
        ("postgres", "Service/postgres"),
        ("app", "ConfigMap/app-0-manifest"),  # its first attempt's manifest
    ]:
        condition = k8s.wait(lambda n=name: blocked(k8s, namespace, n), f"{name} to be Blocked")
        assert condition["reason"] == evokube.REASON_NAME_CONFLICT
        assert taken in condition["message"]
    condition = k8s.wait(lambda: blocked(k8s, namespace, "batch"), "batch to be Blocked")
    assert (condition["reason"], "Job/batch-0" in condition["message"]) == (
        evokube.REASON_NAME_CONFLICT,
        True,
    )
    for name in ("ml", "postgres", "batch", "app"):
        status = k8s.status(namespace, name)
        assert status["phase"] == evokube.PENDING
        assert "jobName" not in status and "jobUID" not in status
        k8s.wait_event(namespace, name, evokube.REASON_NAME_CONFLICT)
        assert not k8s.pods(namespace, name)  # no trainer ever ran as ml-trainer
    assert [j.metadata.name for j in k8s.jobs(namespace, "batch")] == []
    assert [j.metadata.name for j in k8s.jobs(namespace, "app")] == []
    assert fingerprint(k8s, namespace) == before
    # Nothing binds the foreign ml-trainer (or a blocked experiment's account) to a Role.
    bindings = {b.metadata.name for b in k8s.rbac.list_namespaced_role_binding(namespace).items}
    assert bindings == {"ml-trainer-secrets", "app-trainer", "batch-trainer"}

    # Renaming or removing the foreign object lets the experiment start.
    k8s.core.delete_namespaced_service("postgres", namespace)
    k8s.batch.delete_namespaced_job("batch-0", namespace, propagation_policy="Background")
    k8s.core.delete_namespaced_config_map("app-0-manifest", namespace)
    for name in ("postgres", "batch", "app"):
        status = k8s.wait_running_gang(namespace, name, 1, timeout=60)
        assert status["jobName"] == f"{name}-0"
        cleared = k8s.condition(namespace, name, evokube.COND_BLOCKED)
        assert (cleared["status"], cleared["reason"]) == ("False", evokube.REASON_UNBLOCKED)
    assert blocked(k8s, namespace, "ml")

    # Deleting the experiments lets the garbage collector take only what they owned.
    k8s.cluster.kubectl("delete", "erlx", "--all", "-n", namespace, "--wait=true")
    for name in ("postgres", "batch", "app"):
        assert_everything_owned_is_gone(k8s, namespace, name)
    survivors = [f for f in FOREIGN if f[1] not in ("postgres", "batch-0", "app-0-manifest")]
    after = fingerprint(k8s, namespace, survivors)
    assert after == {(kind, name): before[kind, name] for kind, name, _ in survivors}


def test_a_checkpoint_claim_is_mounted_only_once_it_opts_in(k8s, namespace):
    checkpoint = {"location": "/ckpt", "volumeClaimName": "ckpt"}
    k8s.apply(experiment_manifest("c", namespace, accelerator=ONE_CPU_HOST, checkpoint=checkpoint))
    condition = k8s.wait(lambda: blocked(k8s, namespace, "c"), "c to be Blocked")
    assert condition["reason"] == evokube.REASON_CLAIM_NOT_ALLOWED
    assert "ckpt does not exist" in condition["message"]
    claim = {
        "metadata": {"name": "ckpt"},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }
    k8s.core.create_namespaced_persistent_volume_claim(namespace, claim)
    k8s.wait(
        lambda: "lacks the label" in (blocked(k8s, namespace, "c") or {}).get("message", ""),
        "the claim's missing label to be named",
    )
    assert evokube.LABEL_CHECKPOINT_CLAIM in blocked(k8s, namespace, "c")["message"]
    assert not k8s.jobs(namespace, "c")
    label = {"metadata": {"labels": {evokube.LABEL_CHECKPOINT_CLAIM: "true"}}}
    k8s.core.patch_namespaced_persistent_volume_claim("ckpt", namespace, label)
    k8s.wait(lambda: k8s.jobs(namespace, "c"), "the Job of c", timeout=60)
    (job,) = k8s.jobs(namespace, "c")
    volumes = {v.name: v for v in job.spec.template.spec.volumes}
    assert volumes["checkpoints"].persistent_volume_claim.claim_name == "ckpt"
    cleared = k8s.condition(namespace, "c", evokube.COND_BLOCKED)
    assert (cleared["status"], cleared["reason"]) == ("False", evokube.REASON_UNBLOCKED)


def test_a_checkpoint_location_in_another_namespaces_folder_is_refused(
    cluster, api, operator, operator_kubeconfig, namespace
):
    """Each namespace's experiments get <default>/<namespace>/<name> in the shared bucket; a
    location naming another namespace's folder (here in another spelling the CRD admits: s3://
    for gs://, another case) blocks the experiment, which records nothing and starts no pod."""
    default = "gs://team-bucket/evokube"
    theirs = "s3://team-bucket/Evokube/other-team/victim"
    with stand_in(
        cluster,
        api,
        operator,
        operator_kubeconfig,
        namespace,
        "locations",
        f"--default-checkpoint-location={default}",
    ) as k8s:
        checkpoint = {"location": theirs}
        k8s.apply(experiment_manifest("t", namespace, checkpoint=checkpoint))
        condition = k8s.wait(lambda: blocked(k8s, namespace, "t"), "t to be Blocked")
        assert condition["reason"] == evokube.REASON_LOCATION_NOT_ALLOWED
        assert condition["message"].startswith(f"spec.checkpoint.location: {theirs} reaches")
        k8s.wait_event(namespace, "t", evokube.REASON_LOCATION_NOT_ALLOWED)
        assert "checkpointLocation" not in k8s.status(namespace, "t")
        assert not k8s.jobs(namespace, "t")

        # Under the namespace's own folder, the gang starts.
        mine = f"{default}/{namespace}/t-elsewhere"
        k8s.patch_spec(namespace, "t", {"checkpoint": {"location": mine}})
        status = k8s.wait_running_gang(namespace, "t", 1, timeout=60)
        assert status["checkpointLocation"] == mine
        cleared = k8s.condition(namespace, "t", evokube.COND_BLOCKED)
        assert (cleared["status"], cleared["reason"]) == ("False", evokube.REASON_UNBLOCKED)


def test_a_job_deleted_by_hand_starts_the_next_attempt_as_a_preemption(k8s, cluster, namespace):
    k8s.apply(experiment_manifest("h", namespace, accelerator=ONE_CPU_HOST))
    k8s.wait_running_gang(namespace, "h", 1)
    k8s.wait(lambda: k8s.status(namespace, "h").get("jobUID"), "the Job's uid in status")
    cluster.kubectl("delete", "job", "h-0", "-n", namespace, "--wait=false")
    status = k8s.wait(
        lambda: (s := k8s.status(namespace, "h")).get("jobName") == "h-1" and s, "attempt 1"
    )
    assert (status.get("restarts", 0), status["preemptions"]) == (0, 1)
    # The Restarting condition says JobDeleted until the new gang runs (then Recovered);
    # the Event, posted just after that status write, stays.
    k8s.wait_event(namespace, "h", evokube.REASON_JOB_DELETED)
    events = k8s.core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.name=h,reason={evokube.REASON_JOB_DELETED}"
    ).items
    assert [e.type for e in events] == ["Normal"] and "Job h-0" in events[0].message
    status = k8s.wait_running_gang(namespace, "h", 1, timeout=60)
    assert [j.metadata.name for j in k8s.jobs(namespace, "h")] == ["h-1"]
    manifests = k8s.core.list_namespaced_config_map(namespace, label_selector=LABEL_H).items
    assert [m.metadata.name for m in manifests] == ["h-1-manifest"]  # h-0's went with its Job
    assert status["jobUID"] == k8s.batch.read_namespaced_job("h-1", namespace).metadata.uid


def test_owned_objects_are_written_only_when_this_experiment_controls_them(k8s, namespace):
    """kube.Kube.create_owned on the API server itself, as the operator uses it."""
    exp = Experiment.from_body(suspended_experiment(k8s, namespace, "own"))  # no objects yet
    kube = Kube(k8s.cluster.api_client())
    try:
        account = builders.service_account(exp)
        created, fresh = kube.create_owned(account, exp.uid)
        assert fresh and created["metadata"]["ownerReferences"][0]["uid"] == exp.uid
        again, fresh = kube.create_owned(account, exp.uid)
        assert not fresh and again["metadata"]["uid"] == created["metadata"]["uid"]
        # The apply is guarded by the resourceVersion read: a change in between fails it.
        stale = {**account, "metadata": {**account["metadata"], "resourceVersion": "1"}}
        with pytest.raises(ApiError) as refused:
            kube.apply(stale)
        assert refused.value.status == 409
        # Another experiment's object (or anybody's) under the name is left alone.
        role = builders.role(exp)
        k8s.rbac.create_namespaced_role(
            namespace,
            client.V1Role(metadata=client.V1ObjectMeta(name=role["metadata"]["name"])),
        )
        version = k8s.rbac.read_namespaced_role("own-trainer", namespace).metadata.resource_version
        with pytest.raises(NameConflict):
            kube.create_owned(role, exp.uid)
        found = k8s.rbac.read_namespaced_role("own-trainer", namespace)
        assert found.metadata.resource_version == version and not found.rules
        assert kube.create_owned_all([role, account], exp.uid)[0].name == "own-trainer"
    finally:
        kube.close()


def test_an_attempts_manifest_left_by_an_earlier_try_is_adopted_as_the_spec_is_now(k8s, namespace):
    """The operator may stop between an attempt's manifest and its Job (or the API server
    refuse the Job): the next reconcile takes up the ConfigMap this experiment owns, applied
    with the spec as it is, instead of Blocked on its own object."""
    exp = Experiment.from_body(suspended_experiment(k8s, namespace, "again"))  # attempt 0 next
    earlier = builders.manifest_config_map(exp, 0)
    earlier["data"] = {evokube.MANIFEST_FILE: "written before an edit\n"}
    kube = Kube(k8s.cluster.api_client())
    try:
        created, fresh = kube.create_owned(earlier, exp.uid)
    finally:
        kube.close()
    assert fresh
    k8s.patch_spec(namespace, "again", {"suspend": False})
    status = k8s.wait_running_gang(namespace, "again", 1)
    assert status["jobName"] == "again-0"
    found = k8s.core.read_namespaced_config_map("again-0-manifest", namespace)
    assert found.metadata.uid == created["metadata"]["uid"]
    manifest = yaml.safe_load(found.data[evokube.MANIFEST_FILE])
    assert manifest["spec"] == k8s.experiment(namespace, "again")["spec"]
