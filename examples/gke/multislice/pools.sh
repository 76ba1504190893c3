#!/usr/bin/env bash
# docs/multislice.md: two TPU v5e-16 slices for examples/gke/multislice/tpu-v5e-16x2.yaml, each
# a node pool of 4 ct5lp-hightpu-4t hosts in a 4x4 topology. GKE labels every node with
# cloud.google.com/gke-tpu-accelerator=tpu-v5-lite-podslice, cloud.google.com/gke-tpu-topology=4x4
# and its pool's cloud.google.com/gke-nodepool, the label JobSet's exclusive placement gives
# each slice to itself; then JobSet itself, the version the tests run.
set -euo pipefail
cd "$(dirname "$0")/../../.."
source examples/gke/env.sh

for pool in tpu-v5e-16-a tpu-v5e-16-b; do
  gcloud container node-pools create "$pool" \
    --project="$PROJECT" --cluster="$CLUSTER" --location="$ZONE" --node-locations="$ZONE" \
    --machine-type=ct5lp-hightpu-4t --tpu-topology=4x4 --num-nodes=4
done
kubectl apply --server-side \
  -f https://github.com/kubernetes-sigs/jobset/releases/download/v0.11.1/manifests.yaml
