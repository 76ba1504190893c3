"""One module per policy, each a pure function of what was observed.

failure: what a failed gang means (restart, preemption, or the end).
success: when a gang has finished training.
deadline: spec.activeDeadlineSeconds.
timer: seconds left of a limit (the deadline, spec.ttlSecondsAfterFinished).
"""
