"""Names the operator shares with the CRD, the trainer and users: one place, documented.

Every label, annotation, environment variable, exit code, phase, condition
type and condition reason the operator reads or writes is a constant here, so
that docs/operator.md, the tests and the code cannot drift apart. Those the
trainer shares are defined in evokube_contract and only re-exported here.
"""

from typing import Final

# The operator/trainer contract (the API's group and kind, the pods' labels, annotations and
# ports, the trainer's environment, files and exit codes) lives in evokube_contract, which the
# trainer imports too; the operator reaches it through this module.
from evokube_contract import (  # noqa: F401
    API_VERSION,
    COMPLETION_INDEX_ANNOTATION,
    CONTAINER,
    COORDINATOR_PORT,
    ENV_CHECKPOINT_DIR,
    ENV_COORDINATOR,
    ENV_HOME,
    ENV_MANIFEST,
    ENV_METRICS_PORT,
    ENV_NUM_PROCESSES,
    ENV_PROCESS_ID,
    ENV_REPORT_STATUS,
    ENV_TPU_WORKER_HOSTNAMES,
    ENV_TPU_WORKER_ID,
    ENV_XLA_FLAGS,
    EXIT_PERMANENT,
    EXIT_RETRIABLE,
    EXIT_SUCCESS,
    GROUP,
    JOB_INDEX_LABEL,
    KIND,
    LABEL_ATTEMPT,
    LABEL_EXPERIMENT,
    MANIFEST_DIR,
    MANIFEST_FILE,
    MANIFEST_PATH,
    METRICS_PORT,
    PLURAL,
    SCRATCH_DIR,
    TRAINER_COMMAND,
    VERSION,
)

# -- labels on everything the operator creates ----------------------------------
LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
MANAGED_BY: Final = "evokube-operator"
APP_NAME: Final = "evokube-trainer"
# Kueue's Job integration: the LocalQueue and WorkloadPriorityClass of a Job (spec.queueName,
# spec.workloadPriorityClassName), and the label of a Workload naming its Job's uid.
KUEUE_QUEUE_LABEL: Final = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY_LABEL: Final = "kueue.x-k8s.io/priority-class"
KUEUE_JOB_UID_LABEL: Final = "kueue.x-k8s.io/job-uid"
KUEUE_GROUP: Final = "kueue.x-k8s.io"
KUEUE_VERSION: Final = "v1beta2"

# -- names of the trainer pods' ports (the container's and the headless Service's) -------------
COORDINATOR_PORT_NAME: Final = "coordinator"
METRICS_PORT_NAME: Final = "metrics"  # what the chart's PodMonitor scrapes

# -- Kubernetes' own keys the operator reads -----------------------------------
JOB_NAME_LABEL: Final = "batch.kubernetes.io/job-name"
JOB_UID_LABEL: Final = "batch.kubernetes.io/controller-uid"
# JobSet's labels on the pods of a multislice gang (jobset.py): the set, and the pod's slice.
JOBSET_NAME_LABEL: Final = "jobset.sigs.k8s.io/jobset-name"
JOBSET_UID_LABEL: Final = "jobset.sigs.k8s.io/jobset-uid"
DISRUPTION_TARGET: Final = "DisruptionTarget"  # pod condition: evicted or preempted

# -- node selectors, resources and taints of GKE accelerator pools ----------------
TPU_ACCELERATOR_SELECTOR: Final = "cloud.google.com/gke-tpu-accelerator"
TPU_TOPOLOGY_SELECTOR: Final = "cloud.google.com/gke-tpu-topology"
TPU_RESOURCE: Final = "google.com/tpu"
GPU_PRODUCT_SELECTOR: Final = "cloud.google.com/gke-accelerator"
GPU_RESOURCE: Final = "nvidia.com/gpu"

# -- what experiment authors may use in their spec ------------------------------------
# A PersistentVolumeClaim may be an experiment's checkpoint volume only with this label set to
# "true", by someone allowed to edit claims (experiment authors must not mount any claim).
LABEL_CHECKPOINT_CLAIM: Final = "evokube.io/checkpoint-claim"
# The same for a ServiceAccount that spec.serviceAccountName names: running as any account of the
# namespace would hand the author that account's rights (and cloud identity).
LABEL_TRAINER_ACCOUNT: Final = "evokube.io/trainer-account"
# Namespace annotations listing, comma-separated, the Secrets and ConfigMaps experiments may
# reference (env, envFrom, volumes, imagePullSecrets): set by whoever may edit the namespace, so
# that an author who may not read Secrets cannot mount one into their own image. The operator
# reads namespaces, never Secrets.
ANNOTATION_TRAINER_SECRETS: Final = "evokube.io/trainer-secrets"
ANNOTATION_TRAINER_CONFIGMAPS: Final = "evokube.io/trainer-configmaps"
DEFAULT_CHECKPOINT_DIR: Final = "/checkpoints"
TRAINER_UID: Final = 1000  # non-root user of the trainer images

# -- status.phase ---------------------------------------------------------------------
PENDING: Final = "Pending"
RUNNING: Final = "Running"
RESTARTING: Final = "Restarting"
SUCCEEDED: Final = "Succeeded"
FAILED: Final = "Failed"
SUSPENDED: Final = "Suspended"
QUEUED: Final = "Queued"  # the Job waits for admission by Kueue (spec.queueName)
# An ERLSweep's phase when it cannot expand, or the API server refuses one of its children.
INVALID: Final = "Invalid"
FINISHED_PHASES: Final = frozenset({SUCCEEDED, FAILED})

# -- status.conditions: types -----------------------------------------------------------
COND_RUNNING: Final = "Running"  # True while every host's pod runs
COND_RESTARTING: Final = "Restarting"  # True from a gang failure until every new pod runs
COND_SUSPENDED: Final = "Suspended"  # True while spec.suspend keeps the gang away
# True while the Job waits for admission by its queue, with Kueue's reason and message;
# False (reason Admitted) once admitted.
COND_QUEUED: Final = "Queued"
COND_SUCCEEDED: Final = "Succeeded"  # final
COND_FAILED: Final = "Failed"  # final
# True while something a person must fix keeps the gang from starting or going on.
COND_BLOCKED: Final = "Blocked"
# True (a warning, nothing stops) while checkpoints go to an emptyDir, which a gang restart
# loses: no spec.checkpoint.location, no claim, no --default-checkpoint-location.
COND_CHECKPOINTS_EPHEMERAL: Final = "CheckpointsEphemeral"
# An ERLSweep's: True (final for its generation) when it cannot expand or a child is refused.
COND_INVALID: Final = "Invalid"
# True while the API server refuses the whole status (a sweep's summary too large, say): what
# could be written (phase, counts, conditions) is, the rest is left out.
COND_STATUS_INCOMPLETE: Final = "StatusIncomplete"
# True while reconciles fail with an error no API answer explains (a bug, or an input the
# operator did not foresee): it names the error; the operator retries with backoff.
COND_RECONCILE_FAILING: Final = "ReconcileFailing"

# -- status.conditions: reasons (also the reasons of the Events) --------------------------
REASON_WAITING_FOR_HOSTS: Final = "WaitingForHosts"
# The next gang's Job waits until the pods of an earlier one (or of a namesake) have stopped.
REASON_WAITING_FOR_PREVIOUS_PODS: Final = "WaitingForPreviousPods"
REASON_ALL_HOSTS_RUNNING: Final = "AllHostsRunning"
REASON_JOB_SUSPENDED: Final = "JobSuspended"  # an admission controller (Kueue) holds the Job
REASON_ADMITTED: Final = "Admitted"  # Queued False: the queue admitted the Job
REASON_QUEUED: Final = "Queued"  # Event: the experiment went to phase Queued
REASON_NO_QUEUE: Final = "NoQueue"  # Queued False: the new attempt's Job has no queue
# Queued True before any Kueue Workload for the Job was seen (Kueue missing or not yet there).
REASON_NO_WORKLOAD: Final = "NoWorkload"
# Preemptions: Kueue suspended an admitted Job (preempted, or its pods not ready in time).
REASON_EVICTED: Final = "Evicted"
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
# Blocked: an object the experiment needs has a name taken by one it does not own.
REASON_NAME_CONFLICT: Final = "NameConflict"
# Blocked: spec.accelerator.tpu.slices > 1 and the cluster serves no jobset.x-k8s.io JobSet.
REASON_JOBSET_NOT_SERVED: Final = "JobSetNotServed"
# Blocked: the checkpoint claim is missing or not labelled LABEL_CHECKPOINT_CLAIM=true.
REASON_CLAIM_NOT_ALLOWED: Final = "ClaimNotAllowed"
# Blocked: spec.serviceAccountName is missing or not labelled LABEL_TRAINER_ACCOUNT=true.
REASON_ACCOUNT_NOT_ALLOWED: Final = "AccountNotAllowed"
# Blocked: a Secret or ConfigMap the spec references is not listed in the namespace's annotation.
REASON_REFERENCE_NOT_ALLOWED: Final = "ReferenceNotAllowed"
# Blocked: the checkpoint location lies in the operator's default location, outside the
# namespace's own folder (ownership.location_blocker).
REASON_LOCATION_NOT_ALLOWED: Final = "LocationNotAllowed"
REASON_UNBLOCKED: Final = "Unblocked"  # Blocked False: the cause is gone
REASON_STATUS_REFUSED: Final = "StatusRefused"  # StatusIncomplete True, and its Event
REASON_STATUS_WRITTEN: Final = "StatusWritten"  # StatusIncomplete False: written whole again
REASON_RECONCILE_ERROR: Final = "ReconcileError"  # ReconcileFailing True, and its Event
REASON_RECONCILED: Final = "Reconciled"  # ReconcileFailing False: a reconcile went through
REASON_EMPTYDIR_CHECKPOINTS: Final = "EmptyDirCheckpoints"  # CheckpointsEphemeral True
REASON_DURABLE_CHECKPOINTS: Final = "DurableCheckpoints"  # CheckpointsEphemeral False
# Restarting: someone else deleted the current Job; the next attempt starts (a preemption).
REASON_JOB_DELETED: Final = "JobDeleted"
# When the API server refuses an object the operator creates for the experiment (its Service,
# NetworkPolicy, ServiceAccount, Role, RoleBinding or Job: rules/refusal.py).
REASON_CREATION_REFUSED: Final = "CreationRefused"  # Failed: invalid, or a policy said no
REASON_CREATION_FAILING: Final = "CreationFailing"  # Blocked: a quota, say; tried again
# When the trainer pods cannot be created or cannot start (rules/startup.py).
REASON_POD_CREATION_REFUSED: Final = "PodCreationRefused"  # Failed: admission said no
REASON_POD_CREATION_FAILING: Final = "PodCreationFailing"  # Blocked: quota, for example
REASON_INVALID_IMAGE: Final = "InvalidImage"  # Failed: the kubelet cannot parse spec.image
REASON_IMAGE_PULL_BACKOFF: Final = "ImagePullBackOff"  # Blocked, Failed after the timeout
REASON_CONTAINER_CONFIG_ERROR: Final = "ContainerConfigError"  # Blocked: a missing Secret...
REASON_UNSCHEDULABLE: Final = "Unschedulable"  # Blocked after the timeout, never Failed
# Event-only reasons.
REASON_JOB_CREATED: Final = "JobCreated"
REASON_PROGRESS_NOT_REPORTED: Final = "ProgressNotReported"  # Warning: no host holds a token
REASON_EXPIRED: Final = "Expired"
# An ERLSweep's: a child created (Event); every child failed (condition Failed).
REASON_CHILD_CREATED: Final = "ChildCreated"
REASON_ALL_CHILDREN_FAILED: Final = "AllChildrenFailed"

# Which trainer pods hold an API token for status.progress and status.result
# (--trainer-token). The chart picks one from what the API server offers (docs/helm.md).
TOKEN_HOST_0: Final = "host-0"  # the chart's MutatingAdmissionPolicy mounts one into host 0
# The Job mounts one on every host; the chart's ValidatingAdmissionPolicy lets host 0 alone write.
TOKEN_EVERY_HOST: Final = "every-host"
TOKEN_NONE: Final = "none"  # no host: progress and result are not reported, an Event says so
TRAINER_TOKEN_MODES: Final = (TOKEN_HOST_0, TOKEN_EVERY_HOST, TOKEN_NONE)
TOKEN_VOLUME: Final = "evokube-api-access"
TOKEN_DIR: Final = "/var/run/secrets/kubernetes.io/serviceaccount"
NO_TOKEN: Final = (
    "no trainer host holds an API token (the chart's admission.trainerToken is false): "
    "status.progress and status.result stay empty (docs/security.md)"
)
