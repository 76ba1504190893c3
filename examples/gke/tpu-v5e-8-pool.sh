#!/usr/bin/env bash
# docs/quickstart.md, step 2 (TPU): one TPU v5e-8 slice, a single host of 8 chips in a 2x4
# topology. GKE labels the node cloud.google.com/gke-tpu-accelerator=tpu-v5-lite-podslice and
# cloud.google.com/gke-tpu-topology=2x4 (from the machine type: a single-host pool takes no
# --tpu-topology) and taints it google.com/tpu; examples/gke/tpu-v5e-8.yaml selects those.
set -euo pipefail
cd "$(dirname "$0")/../.."
source examples/gke/env.sh

gcloud container node-pools create tpu-v5e-8 \
  --project="$PROJECT" --cluster="$CLUSTER" --location="$ZONE" --node-locations="$ZONE" \
  --machine-type=ct5lp-hightpu-8t --num-nodes=1
