# Everything a fresh machine needs, from the project's own files.
#   make run    a small local experiment (the main job)
#   make test   the whole test suite (what .ci/run calls)
#   make demo   the end-to-end flow, narrated: chart, operator, a killed trainer, recovery
#   make images the operator and trainer images (make push: to REGISTRY; docs/images.md)
#   make cluster    evokube on a cluster on this machine, until `make cluster-down`
SHELL := /bin/bash
PYTHON ?= python3
# When make started (read once, as it parses): `make test` prints its own time at the end.
MAKE_STARTED := $(shell date +%s)
# $(call timed,LABEL,COMMAND): run COMMAND, then print how long it took.
timed = (start=$$(date +%s); $(2); status=$$?; \
	echo "[make] $(1): $$(( $$(date +%s) - start )) s"; exit $$status)
VENV := .venv
# Reinstall when pyproject.toml changes.
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)

.PHONY: setup lock system-deps cluster-binaries checkov lint test run demo cluster cluster-down \
	images push

# Debian packages the tests use: Prometheus (tests/observability), podman,
# buildah and debootstrap (tests/images build the Dockerfile without a Docker engine),
# shellcheck (tests/quickstart lints the quickstart's scripts).
SYSTEM_PACKAGES := prometheus podman buildah debootstrap shellcheck
SYSTEM_TOOLS := prometheus promtool podman buildah debootstrap shellcheck

$(STAMP): pyproject.toml constraints.txt
	@$(call timed,python packages,rm -f $(VENV)/.installed-* && $(PYTHON) -m venv $(VENV) && \
	  $(VENV)/bin/pip install -q --upgrade pip && \
	  $(VENV)/bin/pip install -q -c constraints.txt -e '.[dev]' && touch $@)

# constraints.txt: the tested versions, from a fresh resolution (not an install) of the
# dev extras with the accelerator ones (cuda, tpu), one consistent set; like pip freeze,
# it leaves out evokube, pip, setuptools and wheel.
lock:
	rm -rf .venv-lock
	$(PYTHON) -m venv .venv-lock
	.venv-lock/bin/pip install -q --upgrade pip
	.venv-lock/bin/pip install -q --dry-run --ignore-installed --report .venv-lock/resolved.json \
	  '.[dev,cuda,tpu]'
	{ sed -n '/^#/p' constraints.txt; .venv-lock/bin/python -c 'import json, sys; \
	  pins = [(p["metadata"]["name"], p["metadata"]["version"]) for p in json.load(sys.stdin)["install"]]; \
	  skip = {"evokube", "pip", "setuptools", "wheel"}; \
	  print(*(f"{n}=={v}" for n, v in sorted(pins, key=lambda p: p[0].lower()) if n not in skip), sep="\n")' \
	  < .venv-lock/resolved.json; } > constraints.new
	mv constraints.new constraints.txt
	rm -rf .venv-lock

setup: $(STAMP)

# checkov (tests/helm/test_scan.py scans the chart and the operator's Jobs) in a
# virtual environment of its own: its many pinned dependencies never meet the
# project's. Installed once per version.
CHECKOV_VERSION := 3.3.30
CHECKOV_VENV := .venv-checkov
CHECKOV_STAMP := $(CHECKOV_VENV)/.installed-$(CHECKOV_VERSION)

$(CHECKOV_STAMP):
	@$(call timed,checkov,rm -rf $(CHECKOV_VENV) && $(PYTHON) -m venv $(CHECKOV_VENV) && \
	  $(CHECKOV_VENV)/bin/pip install -q --upgrade pip && \
	  $(CHECKOV_VENV)/bin/pip install -q checkov==$(CHECKOV_VERSION) && touch $@)

checkov: $(CHECKOV_STAMP)

# Installs them when one is missing (CI runs as root on a fresh Debian machine).
system-deps:
	@for tool in $(SYSTEM_TOOLS); do command -v $$tool >/dev/null || missing=1; done; \
	if [ -n "$$missing" ]; then \
	  apt-get update && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y --no-install-recommends $(SYSTEM_PACKAGES); \
	fi

# The oldest Kubernetes minor the chart supports (docs/helm.md): its own pinned build, and
# what differs between minors runs on it too: the chart, the trainer's token, and one whole
# experiment through `helm install` with its progress and result (the whole of tests/e2e
# adds about 12 minutes: `make test OLDEST_MINOR_SUITES="tests/helm tests/e2e"`).
OLDEST_MINOR := $(shell sed -n 's/^KUBERNETES_OLDEST_VERSION=v\([0-9]*\.[0-9]*\).*/\1/p' tests/cluster/versions.env)
OLDEST_MINOR_SUITES ?= tests/helm tests/operator/test_security.py tests/runtime/test_status.py \
  tests/e2e/test_e2e.py::test_a_killed_trainer_restarts_the_gang_from_its_checkpoint_to_the_target

# Pinned control-plane binaries, built once into ~/.cache/evokube (a no-op when cached).
cluster-binaries:
	@$(call timed,cluster binaries,bash tests/cluster/build.sh && \
	  EVOKUBE_KUBE_MINOR=$(OLDEST_MINOR) bash tests/cluster/build.sh kubernetes)

lint: setup
	@$(call timed,lint,$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .)

# Two workers (pytest-xdist), each with its own control plane and operator: a serial run
# keeps about 1.2 of 2 cores busy (most tests wait on trainers, controllers and the API
# server), and took 57 minutes. --dist loadfile keeps a file's tests, and its module
# fixtures, in one worker.
TEST_WORKERS ?= 2
test: setup system-deps cluster-binaries checkov lint
	@$(call timed,pytest,$(VENV)/bin/pytest -n $(TEST_WORKERS) --dist loadfile) && \
	  $(call timed,pytest on Kubernetes $(OLDEST_MINOR),\
	    EVOKUBE_KUBE_MINOR=$(OLDEST_MINOR) $(VENV)/bin/pytest $(OLDEST_MINOR_SUITES)); \
	  status=$$?; echo "[make] make test: $$(( $$(date +%s) - $(MAKE_STARTED) )) s in all"; \
	  exit $$status

# The pinned control plane, kwok's fake TPU and GPU pools, the chart's operator, trainer
# pods run as local processes, and Prometheus (`make system-deps`): tests/e2e/laptop_cluster.py.
# It prints the KUBECONFIG to export; everything runs until `make cluster-down`.
cluster: setup cluster-binaries
	$(VENV)/bin/python -m tests.e2e.laptop_cluster up

cluster-down: setup
	$(VENV)/bin/python -m tests.e2e.laptop_cluster down

run: setup
	$(VENV)/bin/evokube run examples/pendulum-cemrl.yaml

# SCENARIO: killed-trainer (default), killed-trainer-gs, evicted-trainer, killed-operator or all.
demo: setup cluster-binaries
	$(VENV)/bin/python -m tests.e2e $(SCENARIO)

# -- images (docs/images.md) ---------------------------------------------------------------
# Every image the docs, examples and chart name, one row each: name/EXTRA/user (RUN_AS).
# The TPU image keeps root: libtpu opens device files that GKE leaves to root.
# tests/images/test_names.py reads this set back from `make -n images`.
IMAGES := operator/operator/1000:1000 trainer-cpu/trainer/1000:1000 \
	trainer-cuda/cuda/1000:1000 trainer-tpu/tpu/0:0
IMAGE_NAMES := $(foreach row,$(IMAGES),$(firstword $(subst /, ,$(row))))
# Field $2 (2: EXTRA, 3: user) of image $1's row.
image_field = $(word $2,$(subst /, ,$(filter $1/%,$(IMAGES))))

REGISTRY ?= ghcr.io/evokube
# The project's version, which is also the chart's appVersion (the operator image's default tag).
TAG ?= $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# Empty: the Dockerfile's BASE_IMAGE. BUILD_FLAGS: more flags for `build` (e.g. --isolation=chroot).
BASE_IMAGE ?=
BUILD_FLAGS ?=
# docker when its engine answers, else podman, else buildah; name one (with its global
# flags) to choose. Worked out once, on first use.
CONTAINER_TOOL ?= $(eval CONTAINER_TOOL := $(or \
	$(shell docker info >/dev/null 2>&1 && echo docker),\
	$(notdir $(firstword $(shell command -v podman buildah))),\
	$(error none of docker, podman or buildah works here)))$(CONTAINER_TOOL)

.PHONY: $(IMAGE_NAMES:%=image-%) $(IMAGE_NAMES:%=push-%)
images: $(IMAGE_NAMES:%=image-%)
push: $(IMAGE_NAMES:%=push-%)

$(IMAGE_NAMES:%=image-%): image-%:
	$(CONTAINER_TOOL) build $(BUILD_FLAGS) $(if $(BASE_IMAGE),--build-arg=BASE_IMAGE=$(BASE_IMAGE)) \
	  --build-arg=EXTRA=$(call image_field,$*,2) --build-arg=RUN_AS=$(call image_field,$*,3) \
	  --tag=$(REGISTRY)/$*:$(TAG) .

$(IMAGE_NAMES:%=push-%): push-%: image-%
	$(CONTAINER_TOOL) push $(REGISTRY)/$*:$(TAG)
