#!/usr/bin/env bash
# docs/quickstart.md, step 4: check the experiment offline against the CRD, apply it, watch it.
# MANIFEST: examples/gke/tpu-v5e-8.yaml (the default) or examples/gke/gpu-l4.yaml.
set -euo pipefail
cd "$(dirname "$0")/../.."

MANIFEST="${MANIFEST:-examples/gke/tpu-v5e-8.yaml}"
.venv/bin/evokube validate "$MANIFEST"
kubectl apply -f "$MANIFEST"
kubectl get erlx --watch
