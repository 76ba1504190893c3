# evokube images: one Dockerfile, one image stage, built once per extra (docs/images.md).
# `make images` builds every image under its name (the Makefile's IMAGES table); one by hand:
#
#   docker build --build-arg EXTRA=trainer -t ghcr.io/evokube/trainer-cpu:0.1.0 .
#
# EXTRA has no default: a build without it fails instead of guessing. BASE_IMAGE:
# any Debian-like image with Python >= 3.11 and its venv module. The image is the
# base, the user, a layer of dependencies that only changes with EXTRA,
# pyproject.toml, constraints.txt or docker/install-dependencies.sh, and a small
# layer with evokube itself.
ARG BASE_IMAGE=python:3.12-slim-bookworm

# The user evokube, UID/GID 1000, which the operator runs CPU and GPU trainer pods as.
FROM ${BASE_IMAGE} AS python
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/evokube/bin:$PATH \
    HOME=/home/evokube
RUN groupadd --gid 1000 evokube \
    && useradd --uid 1000 --gid 1000 --create-home --home-dir /home/evokube \
        --shell /usr/sbin/nologin evokube
WORKDIR /home/evokube

# A stand-in wheel with evokube's metadata and no code, beside the tested
# versions (constraints.txt) and the script that installs them: the dependency
# layers depend on these three files alone.
FROM python AS metadata
WORKDIR /src
COPY pyproject.toml constraints.txt docker/install-dependencies.sh ./
RUN mkdir -p operator/evokube_contract operator/evokube_operator operator/evokube_sweeps \
    trainer/evokube_trainer crds \
    && touch README.md crds/erlexperiments.evokube.io.yaml crds/erlsweeps.evokube.io.yaml \
    && python3 -m venv /tmp/build \
    && /tmp/build/bin/pip wheel --no-deps --wheel-dir /metadata . \
    && cp constraints.txt install-dependencies.sh /metadata/

# The real evokube wheel.
FROM python AS wheel
WORKDIR /src
COPY pyproject.toml README.md ./
COPY crds/ crds/
COPY operator/ operator/
COPY trainer/ trainer/
RUN python3 -m venv /tmp/build \
    && /tmp/build/bin/pip wheel --no-deps --wheel-dir /wheels .

# The image: a virtual environment in /opt/evokube (owned by root, read-only to
# the user) with the extra's dependencies, then evokube on top. (The wheels are
# copied, not bind-mounted: Debian's podman 4.3 cannot mount from a cached
# stage.) RUN_AS: the image's user; TPU images keep root (libtpu opens the TPU
# device files, which GKE's device plugin leaves to root: docs/security.md). The
# operator sets the user of CPU and GPU trainer pods itself, and the chart runs
# the operator with `command: [evokube-operator]`; the default command trains.
FROM python AS image
ARG EXTRA
ARG RUN_AS=1000:1000
COPY --from=metadata /metadata /tmp/metadata
RUN sh /tmp/metadata/install-dependencies.sh "${EXTRA}"
COPY --from=wheel /wheels /tmp/wheels
RUN pip install --no-deps /tmp/wheels/evokube-*.whl && rm -r /tmp/wheels
USER ${RUN_AS}
EXPOSE 8080 8476 9100
CMD ["evokube-train"]
