"""The trainer's progress and result reports reach a real ERLExperiment, with least
privilege."""

import json
import logging
import math
import os
import subprocess
import sys

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from evokube_trainer.runtime.status import (
    GROUP,
    PLURAL,
    VERSION,
    StatusReporter,
    max_hyperparameters,
)
from tests.cluster.controlplane import wait_until

pytestmark = pytest.mark.cluster


def experiment(name):
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ERLExperiment",
        "metadata": {"name": name},
        "spec": {
            "image": "trainer:test",
            "algorithm": {"name": "openes"},
            "environment": {"name": "gymnax/Pendulum-v1"},
            "population": {"size": 4},
            "stopping": {"maxGenerations": 5},
            # Suspended: the operator writes its phase once and starts nothing, so what the
            # operator owns in status holds still while the trainer's reports arrive.
            "suspend": True,
        },
    }


@pytest.fixture
def trainer_token(crd, api, operator, namespace):
    """Two suspended experiments the operator has marked so, and a ServiceAccount token that
    may patch only `mine`'s status."""
    custom = client.CustomObjectsApi(api)
    for name in ("mine", "other"):
        custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, experiment(name))
    wait_until(lambda: phase_of(api, namespace, "mine") == "Suspended", 30, "the operator's phase")
    core, rbac = client.CoreV1Api(api), client.RbacAuthorizationV1Api(api)
    core.create_namespaced_service_account(
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="trainer"))
    )
    rbac.create_namespaced_role(
        namespace,
        client.V1Role(
            metadata=client.V1ObjectMeta(name="trainer"),
            rules=[
                client.V1PolicyRule(
                    api_groups=[GROUP],
                    resources=[f"{PLURAL}/status"],
                    resource_names=["mine"],
                    verbs=["get", "patch"],
                )
            ],
        ),
    )
    rbac.create_namespaced_role_binding(
        namespace,
        client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="trainer"),
            role_ref=client.V1RoleRef(
                api_group="rbac.authorization.k8s.io", kind="Role", name="trainer"
            ),
            subjects=[
                client.RbacV1Subject(kind="ServiceAccount", name="trainer", namespace=namespace)
            ],
        ),
    )
    return core.create_namespaced_service_account_token(
        "trainer", namespace, client.AuthenticationV1TokenRequest(spec={"audiences": []})
    ).status.token


# status.progress.seeds as SeedProgress writes it: a replica not evaluated yet has no evalReturn.
SEEDS = [
    {"seed": 4, "bestFitness": -150.5, "fitness": -160.0, "evalReturn": -170.25},
    {"seed": 5, "bestFitness": -151.0, "fitness": -151.0},
]


def phase_of(api, namespace, name):
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    return obj.get("status", {}).get("phase")


def reporter_as_trainer(cluster, namespace, token, name, min_interval_s):
    """A StatusReporter for experiment `name` that talks to the API server with `token`."""
    return StatusReporter(
        name,
        namespace,
        min_interval_s=min_interval_s,
        api_client_factory=lambda: cluster.api_client(token),
    )


def progress_of(api, namespace, name):
    obj = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, name
    )
    return obj.get("status", {}).get("progress")


def test_progress_reaches_the_experiment_with_a_least_privilege_token(
    cluster, api, namespace, trainer_token
):
    # The operator's own status fields (its phase) must survive the trainer's patches.
    reporter = reporter_as_trainer(cluster, namespace, trainer_token, "mine", 0.2)
    reporter.report(
        generation=3,
        envSteps=1200,
        bestFitness=-150.5,
        meanFitness=-400.0,
        evalReturn=None,
        lastCheckpoint=2,
        hyperparameters={"actorLearningRate": 0.001, "explorationNoise": 0.2},  # pbt's
        seeds=SEEDS,
    )
    reporter.close()
    progress = progress_of(api, namespace, "mine")
    assert progress["generation"] == 3 and progress["bestFitness"] == -150.5
    assert progress["seeds"] == SEEDS
    assert progress["hyperparameters"] == {"actorLearningRate": 0.001, "explorationNoise": 0.2}
    assert "evalReturn" not in progress and progress["updatedAt"].endswith("Z")
    status = client.CustomObjectsApi(api).get_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "mine"
    )["status"]
    assert status["phase"] == "Suspended"

    # The same token is refused on another experiment ...
    with cluster.api_client(trainer_token) as sa_api, pytest.raises(ApiException) as refused:
        client.CustomObjectsApi(sa_api).patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, PLURAL, "other", {"status": {"progress": {}}}
        )
    assert refused.value.status == 403


def test_the_best_policy_reaches_status_result_beside_progress(
    cluster, api, namespace, trainer_token
):
    custom = client.CustomObjectsApi(api)
    reporter = reporter_as_trainer(cluster, namespace, trainer_token, "mine", 0.2)
    first = {"bestReturn": -900.25, "generation": 2, "policyURI": "gs://b/x/policies/best"}
    reporter.report(generation=2, envSteps=800)
    reporter.report_result(**first)  # one patch carries both
    wait_until(lambda: progress_of(api, namespace, "mine"), 10, "the first patch")
    reporter.report(generation=3, envSteps=1200)  # progress alone: result stays
    reporter.close()
    status = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "mine")[
        "status"
    ]
    assert status["result"] == first
    assert status["progress"]["generation"] == 3 and status["phase"] == "Suspended"

    better = {"bestReturn": -150.0, "generation": 9, "policyURI": "gs://b/x/policies/best"}
    reporter = reporter_as_trainer(cluster, namespace, trainer_token, "mine", 0.2)
    reporter.report_result(**better)
    reporter.close()
    status = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "mine")[
        "status"
    ]
    assert status["result"] == better and status["progress"]["generation"] == 3


def test_an_oversized_hyperparameters_patch_is_refused_naming_the_field(
    cluster, api, namespace, trainer_token
):
    # The attack: status.progress.hyperparameters grew an object to 1.15 MB.
    huge = {f"h{i:05d}{'x' * 50}": 1.0 for i in range(20000)}  # about 1.2 MB of JSON
    with cluster.api_client(trainer_token) as sa_api, pytest.raises(ApiException) as refused:
        client.CustomObjectsApi(sa_api).patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            "mine",
            {"status": {"progress": {"hyperparameters": huge}}},
        )
    assert refused.value.status == 422
    causes = json.loads(refused.value.body)["details"]["causes"]
    assert "status.progress.hyperparameters" in {c.get("field") for c in causes}
    assert "hyperparameters" not in (progress_of(api, namespace, "mine") or {})


def test_the_reporter_sends_only_finite_hyperparameters_within_the_bound(
    cluster, api, namespace, trainer_token
):
    reporter = reporter_as_trainer(cluster, namespace, trainer_token, "mine", 0.2)
    many = {f"h{i:02d}": float(i) for i in range(max_hyperparameters() + 4)}
    reporter.report(generation=4, meanFitness=math.nan, hyperparameters={**many, "a": math.inf})
    reporter.close()
    progress = progress_of(api, namespace, "mine")
    assert reporter.failures == 0 and progress["generation"] == 4
    assert "meanFitness" not in progress  # NaN: left out, not the whole patch refused
    kept = progress["hyperparameters"]
    assert len(kept) == max_hyperparameters() and "a" not in kept
    assert all(math.isfinite(v) for v in kept.values())


def test_reports_are_rate_limited_and_failures_never_raise(
    cluster, api, namespace, trainer_token, caplog
):
    reporter = reporter_as_trainer(cluster, namespace, trainer_token, "mine", 2.0)
    for generation in range(1, 51):
        reporter.report(generation=generation, envSteps=generation * 10)
    wait_until(
        lambda: (progress_of(api, namespace, "mine") or {}).get("generation"), 10, "the first patch"
    )
    reporter.report(generation=51, envSteps=510)
    reporter.close()
    assert reporter.patches_sent <= 3  # 51 reports within the interval: first + last
    assert progress_of(api, namespace, "mine")["generation"] == 51

    # A reporter for an experiment it may not touch logs and carries on.
    denied = reporter_as_trainer(cluster, namespace, trainer_token, "other", 0.1)
    with caplog.at_level(logging.WARNING):
        denied.report(generation=1)
        denied.close()
    assert denied.failures >= 1 and denied.patches_sent == 0
    assert "could not report progress" in caplog.text


def test_without_a_token_the_reporter_says_so_once_and_training_goes_on(tmp_path):
    """Hosts 1..N-1, or host 0 where the chart's token policy is not installed: no credentials."""
    script = (
        "import logging, time\n"
        "logging.basicConfig()\n"
        "from evokube_trainer.runtime.status import StatusReporter\n"
        "reporter = StatusReporter('mine', 'ns', min_interval_s=0.01)\n"
        "for generation in range(1, 4):\n"
        "    reporter.report(generation=generation)\n"
        "    time.sleep(0.1)\n"
        "reporter.close()\n"
        "print(reporter.disabled, reporter.failures, reporter.patches_sent)\n"
    )
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        # In a pod, but no token mounted at /var/run/secrets/kubernetes.io/serviceaccount.
        "KUBERNETES_SERVICE_HOST": "10.0.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
        "KUBECONFIG": str(tmp_path / "absent"),
    }
    run = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["True", "0", "0"]
    assert run.stderr.count("progress is not reported to ns/mine: no API credentials") == 1
