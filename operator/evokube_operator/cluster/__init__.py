"""The operator's I/O with the cluster: the API client (kube), leader election (leader)
and its Prometheus metrics (metrics)."""
