"""Observation in, plan out, pure: an experiment's (decide) and a sweep's (sweep_plan)."""
