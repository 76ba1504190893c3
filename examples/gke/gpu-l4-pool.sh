#!/usr/bin/env bash
# docs/quickstart.md, step 2 (GPU): one node with 2 NVIDIA L4 GPUs and GKE's driver. GKE labels
# it cloud.google.com/gke-accelerator=nvidia-l4 and taints it nvidia.com/gpu;
# examples/gke/gpu-l4.yaml selects that label and asks for 2 nvidia.com/gpu.
set -euo pipefail
cd "$(dirname "$0")/../.."
source examples/gke/env.sh

gcloud container node-pools create gpu-l4 \
  --project="$PROJECT" --cluster="$CLUSTER" --location="$ZONE" --node-locations="$ZONE" \
  --machine-type=g2-standard-24 \
  --accelerator=type=nvidia-l4,count=2,gpu-driver-version=latest --num-nodes=1
