"""One module per rule, each a pure function of what was observed.

failure: what a failed gang means (restart, preemption, or the end).
success: when a gang has finished training.
startup: how long a gang may take to start, by phase.
refusal: what an API server's refusal of a write means.
deadline: spec.activeDeadlineSeconds.
timer: seconds left of a limit (the deadline, spec.ttlSecondsAfterFinished).
"""
