#!/usr/bin/env bash
# docs/quickstart.md, step 3: kube-prometheus-stack (release kps, namespace monitoring), then
# evokube with examples/gke/evokube-values.yaml. In this order: the chart renders its
# ServiceMonitor and PodMonitor only when the cluster already serves their API.
set -euo pipefail
cd "$(dirname "$0")/../.."

helm repo add prometheus-community https://prometheus-community.github.io/helm-charts
helm repo update prometheus-community
helm install kps prometheus-community/kube-prometheus-stack \
  -n monitoring --create-namespace --wait
helm install evokube ./helm/evokube -n evokube-system --create-namespace \
  --values examples/gke/evokube-values.yaml --wait
