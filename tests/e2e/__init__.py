"""End-to-end: the chart, the operator and real trainer processes on one machine."""
