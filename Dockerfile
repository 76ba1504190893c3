# evokube images: one Dockerfile, four targets (docs/images.md).
#
#   docker build --target operator     -t ghcr.io/evokube/operator:0.1.0 .      Kopf operator, no JAX
#   docker build --target trainer-cuda -t ghcr.io/evokube/trainer-cuda:0.1.0 .  jax[cuda12]; the node brings the driver
#   docker build --target trainer-tpu  -t ghcr.io/evokube/trainer-tpu:0.1.0 .   jax[tpu] (libtpu)
#   docker build --target trainer-cpu  -t ghcr.io/evokube/trainer-cpu:0.1.0 .   CPU JAX (the default target)
#
# BASE_IMAGE: any Debian-like image with Python >= 3.11 and its venv module.
# Each image is the base, the user, a layer of dependencies that only changes
# with pyproject.toml, constraints.txt or docker/install-dependencies.sh, and a
# small layer with evokube itself.
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
RUN mkdir -p operator/evokube_contract operator/evokube_operator trainer/evokube_trainer crds \
    && touch README.md crds/erlexperiments.evokube.io.yaml \
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

# Each target: a virtual environment in /opt/evokube (owned by root, read-only
# to the user) with the extra's dependencies, then evokube on top. The targets
# differ only in the extra, the user and what they run: the steps are the same
# script (docker/install-dependencies.sh) and the same wheel. (The wheels are
# copied, not bind-mounted: Debian's podman 4.3 cannot mount from a cached
# stage.) A Dockerfile cannot run one stage with different build arguments per
# target, so each target names its extra here.
FROM python AS operator
COPY --from=metadata /metadata /tmp/metadata
RUN sh /tmp/metadata/install-dependencies.sh operator
COPY --from=wheel /wheels /tmp/wheels
RUN pip install --no-deps /tmp/wheels/evokube-*.whl && rm -r /tmp/wheels
USER 1000:1000
EXPOSE 8080
ENTRYPOINT ["evokube-operator"]

FROM python AS trainer-cuda
COPY --from=metadata /metadata /tmp/metadata
RUN sh /tmp/metadata/install-dependencies.sh cuda
COPY --from=wheel /wheels /tmp/wheels
RUN pip install --no-deps /tmp/wheels/evokube-*.whl && rm -r /tmp/wheels
USER 1000:1000
EXPOSE 8476 9100
CMD ["evokube-train"]

FROM python AS trainer-tpu
COPY --from=metadata /metadata /tmp/metadata
RUN sh /tmp/metadata/install-dependencies.sh tpu
COPY --from=wheel /wheels /tmp/wheels
RUN pip install --no-deps /tmp/wheels/evokube-*.whl && rm -r /tmp/wheels
# TPU pods keep the image's user: libtpu opens the TPU device files, which
# GKE's device plugin leaves to root (docs/security.md). They still cannot
# escalate privileges nor hold any capability; the evokube user is there for
# volumes it should own.
# hadolint ignore=DL3002
USER 0:0
EXPOSE 8476 9100
CMD ["evokube-train"]

FROM python AS trainer-cpu
COPY --from=metadata /metadata /tmp/metadata
RUN sh /tmp/metadata/install-dependencies.sh trainer
COPY --from=wheel /wheels /tmp/wheels
RUN pip install --no-deps /tmp/wheels/evokube-*.whl && rm -r /tmp/wheels
USER 1000:1000
EXPOSE 8476 9100
CMD ["evokube-train"]
