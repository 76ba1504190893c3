"""Exit codes: the trainer's half of the contract with the operator (docs/architecture.md)."""

from evokube_contract import EXIT_PERMANENT, EXIT_RETRIABLE, EXIT_SUCCESS

SUCCESS = EXIT_SUCCESS
# EX_TEMPFAIL: preempted (SIGTERM), a peer lost, an infrastructure error. The
# operator restarts the whole gang from the newest checkpoint.
RETRIABLE = EXIT_RETRIABLE
# EX_CONFIG: a bad manifest or configuration, or training diverged. Restarting
# cannot help; the operator fails the experiment at once.
PERMANENT = EXIT_PERMANENT


class RetriableError(RuntimeError):
    """Training stopped for a reason a restart from checkpoint can fix."""


class PermanentError(RuntimeError):
    """Training cannot succeed with this manifest; do not restart."""
