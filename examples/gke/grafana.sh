#!/usr/bin/env bash
# docs/quickstart.md, step 5: the chart's dashboard ConfigMap, Grafana's admin password, and
# Grafana on http://localhost:3000 (until Ctrl-C).
set -euo pipefail

kubectl -n monitoring get configmap evokube-dashboard
kubectl -n monitoring get secret kps-grafana -o jsonpath='{.data.admin-password}' | base64 -d
echo
kubectl -n monitoring port-forward service/kps-grafana 3000:80
