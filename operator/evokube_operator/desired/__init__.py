"""Desired objects, pure functions of the spec: the attempt's Job, ConfigMap and Service
(builders) and a multislice gang's JobSet (jobset)."""
