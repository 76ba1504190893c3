"""Names the operator shares with the CRD, the trainer and users: one place, documented.

Every label, annotation, environment variable, exit code, phase, condition
type and condition reason the operator reads or writes is a constant here, so
that docs/operator.md, the tests and the code cannot drift apart.
"""

from typing import Final

# -- the ERLExperiment API ----------------------------------------------------
GROUP: Final = "evokube.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "ERLExperiment"
PLURAL: Final = "erlexperiments"

# -- labels on everything the operator creates ----------------------------------
LABEL_EXPERIMENT: Final = "evokube.io/experiment"  # the owning experiment's name
LABEL_ATTEMPT: Final = "evokube.io/attempt"  # gang attempt number (Jobs and pods)
LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "evokube-operator"
APP_NAME: Final = "evokube-trainer"
# podLabels under this prefix are copied onto the Job too (Kueue's Job integration reads them).
KUEUE_LABEL_PREFIX: Final = "kueue.x-k8s.io/"

# -- Kubernetes' own keys the operator reads -----------------------------------
JOB_NAME_LABEL: Final = "batch.kubernetes.io/job-name"
JOB_UID_LABEL: Final = "batch.kubernetes.io/controller-uid"
COMPLETION_INDEX_ANNOTATION: Final = "batch.kubernetes.io/job-completion-index"
DISRUPTION_TARGET: Final = "DisruptionTarget"  # pod condition: evicted or preempted

# -- node selectors, resources and taints of GKE accelerator pools ----------------
TPU_ACCELERATOR_SELECTOR: Final = "cloud.google.com/gke-tpu-accelerator"
TPU_TOPOLOGY_SELECTOR: Final = "cloud.google.com/gke-tpu-topology"
TPU_RESOURCE: Final = "google.com/tpu"
GPU_PRODUCT_SELECTOR: Final = "cloud.google.com/gke-accelerator"
GPU_RESOURCE: Final = "nvidia.com/gpu"

# -- the trainer container -------------------------------------------------------
CONTAINER: Final = "trainer"
TRAINER_COMMAND: Final = ("evokube-train",)
MANIFEST_DIR: Final = "/etc/evokube"
MANIFEST_FILE: Final = "experiment.yaml"
DEFAULT_CHECKPOINT_DIR: Final = "/checkpoints"
TRAINER_UID: Final = 1000  # non-root user of the trainer images

# Environment variables of the operator/trainer contract (docs/architecture.md).
ENV_MANIFEST: Final = "EVOKUBE_MANIFEST"
ENV_EXPERIMENT: Final = "EVOKUBE_EXPERIMENT"
ENV_NAMESPACE: Final = "EVOKUBE_NAMESPACE"
ENV_COORDINATOR: Final = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES: Final = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID: Final = "JAX_PROCESS_ID"
ENV_CHECKPOINT_DIR: Final = "EVOKUBE_CHECKPOINT_DIR"
ENV_METRICS_PORT: Final = "EVOKUBE_METRICS_PORT"
ENV_ATTEMPT: Final = "EVOKUBE_ATTEMPT"
ENV_XLA_FLAGS: Final = "XLA_FLAGS"
ENV_REPORT_STATUS: Final = "EVOKUBE_REPORT_STATUS"

# -- exit codes of the trainer ------------------------------------------------------
EXIT_SUCCESS: Final = 0
EXIT_RETRIABLE: Final = 75  # EX_TEMPFAIL: preempted, peer lost, infrastructure error
EXIT_PERMANENT: Final = 78  # EX_CONFIG: bad manifest or configuration, diverged

# -- status.phase ---------------------------------------------------------------------
PENDING: Final = "Pending"
RUNNING: Final = "Running"
RESTARTING: Final = "Restarting"
SUCCEEDED: Final = "Succeeded"
FAILED: Final = "Failed"
SUSPENDED: Final = "Suspended"
FINISHED_PHASES: Final = frozenset({SUCCEEDED, FAILED})

# -- status.conditions: types -----------------------------------------------------------
COND_RUNNING: Final = "Running"  # True while every host's pod runs
COND_RESTARTING: Final = "Restarting"  # True from a gang failure until every new pod runs
COND_SUSPENDED: Final = "Suspended"  # True while spec.suspend keeps the gang away
COND_SUCCEEDED: Final = "Succeeded"  # final
COND_FAILED: Final = "Failed"  # final

# -- status.conditions: reasons (also the reasons of the Events) --------------------------
REASON_WAITING_FOR_HOSTS: Final = "WaitingForHosts"
# The next gang's Job waits until the pods of an earlier one (or of a namesake) have stopped.
REASON_WAITING_FOR_PREVIOUS_PODS: Final = "WaitingForPreviousPods"
REASON_ALL_HOSTS_RUNNING: Final = "AllHostsRunning"
REASON_JOB_SUSPENDED: Final = "JobSuspended"  # an admission controller (Kueue) holds the Job
REASON_RETRIABLE_FAILURE: Final = "RetriableFailure"
REASON_PREEMPTED: Final = "Preempted"
REASON_RECOVERED: Final = "Recovered"
REASON_SUSPENDED: Final = "Suspended"
REASON_RESUMED: Final = "Resumed"
REASON_COMPLETED: Final = "Completed"
REASON_FINISHED: Final = "Finished"
REASON_PERMANENT_FAILURE: Final = "PermanentFailure"
REASON_MAX_RESTARTS: Final = "MaxRestartsExceeded"
REASON_DEADLINE: Final = "DeadlineExceeded"
REASON_INVALID_SPEC: Final = "InvalidSpec"
# Event-only reasons.
REASON_JOB_CREATED: Final = "JobCreated"
REASON_EXPIRED: Final = "Expired"
