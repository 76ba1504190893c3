# shellcheck shell=bash
# The names every step of docs/quickstart.md uses; the scripts here source this file.
# us-central1-a offers both TPU v5e and NVIDIA L4 machines.

export PROJECT="${PROJECT:?set PROJECT to your Google Cloud project id}"
export ZONE="${ZONE:-us-central1-a}"
export CLUSTER="${CLUSTER:-evokube}"
