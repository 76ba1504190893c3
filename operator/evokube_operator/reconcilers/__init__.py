"""Plans carried out against the API server: an experiment's (reconcile), a sweep's
(sweep_reconcile), and the loop that runs them (controller)."""
