#!/usr/bin/env bash
# docs/quickstart.md, step 6: delete the experiments, then the cluster and its node pools.
set -euo pipefail
cd "$(dirname "$0")/../.."
source examples/gke/env.sh

kubectl delete erlx --all --wait
gcloud container clusters delete "$CLUSTER" --project="$PROJECT" --location="$ZONE" --quiet
