"""Exit codes: the trainer's half of the contract with the operator (docs/architecture.md)."""

SUCCESS = 0
# EX_TEMPFAIL: preempted (SIGTERM), a peer lost, an infrastructure error. The
# operator restarts the whole gang from the newest checkpoint.
RETRIABLE = 75
# EX_CONFIG: a bad manifest or configuration, or training diverged. Restarting
# cannot help; the operator fails the experiment at once.
PERMANENT = 78


class RetriableError(RuntimeError):
    """Training stopped for a reason a restart from checkpoint can fix."""


class PermanentError(RuntimeError):
    """Training cannot succeed with this manifest; do not restart."""
