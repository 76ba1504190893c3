# Everything a fresh machine needs, from the project's own files.
#   make run    a small local experiment (the main job)
#   make test   the whole test suite (what .ci/run calls)
#   make demo   the end-to-end flow, narrated: chart, operator, a killed trainer, recovery
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
# Reinstall when pyproject.toml changes.
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)

.PHONY: setup lock system-deps cluster-binaries checkov lint test run demo cluster-up cluster-down

# Debian packages the tests use: Prometheus (tests/observability), podman,
# buildah and debootstrap (tests/images build the Dockerfile without a Docker engine).
SYSTEM_PACKAGES := prometheus podman buildah debootstrap
SYSTEM_TOOLS := prometheus promtool podman buildah debootstrap

$(STAMP): pyproject.toml constraints.txt
	rm -f $(VENV)/.installed-*
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -c constraints.txt -e '.[dev]'
	touch $@

# constraints.txt: the tested versions, regenerated from a fresh resolution of the extras.
lock:
	rm -rf .venv-lock
	$(PYTHON) -m venv .venv-lock
	.venv-lock/bin/pip install -q --upgrade pip
	.venv-lock/bin/pip install -q '.[dev]'
	{ sed -n '/^#/p' constraints.txt; .venv-lock/bin/pip freeze --exclude-editable | grep -v '^evokube'; } > constraints.new
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
	rm -rf $(CHECKOV_VENV)
	$(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/pip install -q --upgrade pip
	$(CHECKOV_VENV)/bin/pip install -q checkov==$(CHECKOV_VERSION)
	touch $@

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
	bash tests/cluster/build.sh
	EVOKUBE_KUBE_MINOR=$(OLDEST_MINOR) bash tests/cluster/build.sh kubernetes

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: setup system-deps cluster-binaries checkov lint
	$(VENV)/bin/pytest
	EVOKUBE_KUBE_MINOR=$(OLDEST_MINOR) $(VENV)/bin/pytest $(OLDEST_MINOR_SUITES)

cluster-up: setup cluster-binaries
	$(VENV)/bin/python -m tests.cluster up

cluster-down: setup
	$(VENV)/bin/python -m tests.cluster down

run: setup
	$(VENV)/bin/evokube run examples/pendulum-cemrl.yaml

# SCENARIO: killed-trainer (default), killed-trainer-gs, evicted-trainer, killed-operator or all.
demo: setup cluster-binaries
	$(VENV)/bin/python -m tests.e2e $(SCENARIO)
