"""The operator/trainer contract of docs/architecture.md: every name and number both halves use.

The operator (operator/evokube_operator, through its `api` module) and the trainer
(trainer/evokube_trainer) import these constants and nothing else of each other, and the tests
check docs/architecture.md's tables against them. Standard library only: the operator image has
no JAX, and importing this must stay free.

Each value reaches the trainer by exactly one channel:

- the manifest (the attempt's ConfigMap, mounted as the file MANIFEST_PATH): what the user
  wrote, including the experiment's name and namespace (its metadata);
- the environment (ENV_VARS): what depends on the pod, the attempt or the operator's settings
  (process id and count, coordinator, resolved checkpoint location, metrics port, ...).

Files that cannot import Python (the CRD, the Dockerfile, the chart) restate a few of these;
tests/runtime/test_contract_copies.py checks every such copy, and fails on a value written
twice in Python.
"""

import math
from types import MappingProxyType
from typing import Final

# -- the ERLExperiment API ----------------------------------------------------------------
GROUP: Final = "evokube.io"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "ERLExperiment"
PLURAL: Final = "erlexperiments"

# -- labels and annotations of the trainer pods ----------------------------------------------
LABEL_EXPERIMENT: Final = "evokube.io/experiment"  # the owning experiment's name
LABEL_ATTEMPT: Final = "evokube.io/attempt"  # gang attempt number (Jobs and pods)
# Kubernetes' own: an Indexed Job's pod's index, the trainer's process id.
COMPLETION_INDEX_ANNOTATION: Final = "batch.kubernetes.io/job-completion-index"
# JobSet's (jobset.sigs.k8s.io, api/jobset/v1alpha2): a multislice pod's slice, the index of its
# Job within the JobSet's replicated Job; the trainer's MEGASCALE_SLICE_ID.
JOB_INDEX_LABEL: Final = "jobset.sigs.k8s.io/job-index"

# -- ports of the trainer pods: spec.metricsPort's and spec.coordinatorPort's defaults ----------
METRICS_PORT: Final = 9100  # Prometheus /metrics of every process (ENV_METRICS_PORT)
COORDINATOR_PORT: Final = 8476  # jax.distributed's coordinator on host 0 (ENV_COORDINATOR)
# The megascale (DCN) coordinator's port on host 0 of slice 0, multislice only: next to the
# coordinator's (libtpu's default, 8080, is the operator's own port in the chart).
MEGASCALE_PORT: Final = 8477

# -- the trainer container and its files --------------------------------------------------------
CONTAINER: Final = "trainer"
TRAINER_COMMAND: Final = ("evokube-train",)
MANIFEST_DIR: Final = "/etc/evokube"
MANIFEST_FILE: Final = "experiment.yaml"
MANIFEST_PATH: Final = f"{MANIFEST_DIR}/{MANIFEST_FILE}"
# The root filesystem is read-only: an emptyDir here is the trainer's scratch space and its HOME.
SCRATCH_DIR: Final = "/tmp"
# Under the checkpoint location: Orbax's checkpoints, the XLA cache and the trainer's compiled
# programs, process 0's history and
# its TensorBoard event files, exported policies (policies/best/, policies/generation-<N>/;
# docs/trainer-design.md).
CHECKPOINTS_SUBDIR: Final = "checkpoints"
XLA_CACHE_SUBDIR: Final = "xla-cache"
# Serialized executables of the generation programs: a restart loads them (no tracing).
EXECUTABLES_SUBDIR: Final = "executables"
HISTORY_FILE: Final = "history.jsonl"
TENSORBOARD_SUBDIR: Final = "tensorboard"
POLICIES_SUBDIR: Final = "policies"

# -- environment variables (docs/architecture.md's table, in its order) -------------------------
ENV_MANIFEST: Final = "EVOKUBE_MANIFEST"  # MANIFEST_PATH
ENV_COORDINATOR: Final = "JAX_COORDINATOR_ADDRESS"
ENV_NUM_PROCESSES: Final = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID: Final = "JAX_PROCESS_ID"  # COMPLETION_INDEX_ANNOTATION
ENV_CHECKPOINT_DIR: Final = "EVOKUBE_CHECKPOINT_DIR"  # status.checkpointLocation
ENV_METRICS_PORT: Final = "EVOKUBE_METRICS_PORT"
ENV_XLA_FLAGS: Final = "XLA_FLAGS"
ENV_TPU_WORKER_ID: Final = "TPU_WORKER_ID"  # read by libtpu, not by evokube
ENV_TPU_WORKER_HOSTNAMES: Final = "TPU_WORKER_HOSTNAMES"  # read by libtpu, not by evokube
# Multislice (spec.accelerator.tpu.slices > 1): libtpu joins the slices over the data-center
# network through these; the process id is global_process_id() of them.
ENV_MEGASCALE_COORDINATOR: Final = "MEGASCALE_COORDINATOR_ADDRESS"  # host 0 of slice 0
ENV_MEGASCALE_NUM_SLICES: Final = "MEGASCALE_NUM_SLICES"
ENV_MEGASCALE_SLICE_ID: Final = "MEGASCALE_SLICE_ID"  # JOB_INDEX_LABEL
ENV_MEGASCALE_PORT: Final = "MEGASCALE_PORT"  # MEGASCALE_PORT
ENV_REPORT_STATUS: Final = "EVOKUBE_REPORT_STATUS"  # "1": process 0 patches status.progress
ENV_HOME: Final = "HOME"  # SCRATCH_DIR: writable, unlike the image's home
ENV_HISTORY: Final = "EVOKUBE_HISTORY"  # set by `evokube run` only
# Set by `evokube run` only: the descriptor of a listening socket the process inherits for
# /metrics (bound to ENV_METRICS_PORT by the command, so two runs never race for a port).
ENV_METRICS_FD: Final = "EVOKUBE_METRICS_FD"
ENV_LOG_LEVEL: Final = "EVOKUBE_LOG_LEVEL"  # a logging level's name; unset: INFO (USER_ENV)
# Where the trainer writes why it failed; unset: TERMINATION_LOG (tests point it elsewhere).
ENV_TERMINATION_LOG: Final = "EVOKUBE_TERMINATION_LOG"
# A TPU gang's: libtpu's host list and multislice wiring (the trainer reads the slice pair too).
TPU_ENV: Final = (
    ENV_TPU_WORKER_ID,
    ENV_TPU_WORKER_HOSTNAMES,
    ENV_MEGASCALE_COORDINATOR,
    ENV_MEGASCALE_NUM_SLICES,
    ENV_MEGASCALE_SLICE_ID,
    ENV_MEGASCALE_PORT,
)
ENV_VARS: Final = (
    ENV_MANIFEST,
    ENV_COORDINATOR,
    ENV_NUM_PROCESSES,
    ENV_PROCESS_ID,
    ENV_CHECKPOINT_DIR,
    ENV_METRICS_PORT,
    ENV_XLA_FLAGS,
    *TPU_ENV,
    ENV_REPORT_STATUS,
    ENV_HOME,
    ENV_HISTORY,
    ENV_METRICS_FD,
    ENV_LOG_LEVEL,
    ENV_TERMINATION_LOG,
)
# Who sets what. The operator sets OPERATOR_ENV on every pod and OPERATOR_ENV_ON[type] on the
# pods of that accelerator type; spec.env may set none of them, nor a name beginning with
# ENV_PREFIX unless USER_ENV has it. The CRD's rules on spec.env say the same
# (tests/runtime/test_contract.py checks them against these).
OPERATOR_ENV: Final = (
    ENV_MANIFEST,
    ENV_COORDINATOR,
    ENV_NUM_PROCESSES,
    ENV_PROCESS_ID,
    ENV_CHECKPOINT_DIR,
    ENV_METRICS_PORT,
    ENV_REPORT_STATUS,
    ENV_HOME,
)
OPERATOR_ENV_ON: Final = MappingProxyType({"cpu": (ENV_XLA_FLAGS,), "tpu": TPU_ENV})
ENV_PREFIX: Final = "EVOKUBE_"
USER_ENV: Final = (ENV_LOG_LEVEL,)


def topology_chips(topology: str) -> int:
    """Chips in a TPU topology such as 4x4 or 2x2x4 (ValueError otherwise): a TPU gang has
    chips / chipsPerHost hosts per slice, for the operator's pods and `evokube run`'s processes."""
    dims = [int(d) for d in topology.split("x")]
    if not 2 <= len(dims) <= 3 or min(dims) < 1:
        raise ValueError(f"{topology!r} is not like 4x4 or 2x2x4")
    return math.prod(dims)


def global_process_id(process_id: int, slice_id: int, num_processes: int, num_slices: int) -> int:
    """The jax.distributed process id of host `process_id` (JAX_PROCESS_ID, the completion index
    within its slice) of slice `slice_id`: a pod cannot compute it by the downward API, so the
    operator sends both and the trainer adds them. One slice (slice 0 of 1): `process_id`."""
    return slice_id * (num_processes // num_slices) + process_id


# Kubernetes' default terminationMessagePath: the kubelet reads the container's termination
# message there, and the operator copies it into the experiment's status.
TERMINATION_LOG: Final = "/dev/termination-log"

# -- exit codes of the trainer -------------------------------------------------------------------
EXIT_SUCCESS: Final = 0  # a stopping criterion was met
EXIT_RETRIABLE: Final = 75  # EX_TEMPFAIL: preempted, peer lost, infrastructure error
EXIT_PERMANENT: Final = 78  # EX_CONFIG: bad manifest or configuration, diverged
