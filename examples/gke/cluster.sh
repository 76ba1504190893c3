#!/usr/bin/env bash
# docs/quickstart.md, step 1: a GKE Standard cluster (Dataplane V2 enforces the
# NetworkPolicy evokube gives each experiment), and kubectl's credentials for it.
set -euo pipefail
cd "$(dirname "$0")/../.."
source examples/gke/env.sh

gcloud services enable container.googleapis.com --project="$PROJECT"
gcloud container clusters create "$CLUSTER" \
  --project="$PROJECT" --location="$ZONE" \
  --release-channel=regular --enable-dataplane-v2 \
  --machine-type=e2-standard-4 --num-nodes=2
gcloud container clusters get-credentials "$CLUSTER" --project="$PROJECT" --location="$ZONE"
