#!/bin/sh
# The dependency layer of every image target (Dockerfile): a virtual environment in
# /opt/evokube with the dependencies of evokube[EXTRA] under constraints.txt, installed
# through the metadata-only stand-in wheel, which then goes again with the rest of
# /tmp/metadata. Usage: install-dependencies.sh EXTRA
set -eu
extra=${1:-}
case "$extra" in
  operator|trainer|cuda|tpu) ;;
  *) echo "EXTRA must be operator, trainer, cuda or tpu (docker build --build-arg EXTRA=...), got '$extra'" >&2
     exit 2 ;;
esac
python3 -m venv /opt/evokube
pip install -c /tmp/metadata/constraints.txt "$(echo /tmp/metadata/evokube-*.whl)[$extra]"
pip uninstall --yes evokube
rm -r /tmp/metadata
