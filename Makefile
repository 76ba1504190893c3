# Everything a fresh machine needs, from the project's own files.
#   make run    a small local experiment (the main job)
#   make test   the whole test suite (what .ci/run calls)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
# Reinstall when pyproject.toml changes.
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)

.PHONY: setup cluster-binaries lint test run cluster-up cluster-down

$(STAMP): pyproject.toml
	rm -f $(VENV)/.installed-*
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

setup: $(STAMP)

# Pinned control-plane binaries, built once into ~/.cache/evokube (a no-op when cached).
cluster-binaries:
	bash tests/cluster/build.sh

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: setup cluster-binaries lint
	$(VENV)/bin/pytest

cluster-up: setup cluster-binaries
	$(VENV)/bin/python -m tests.cluster up

cluster-down: setup
	$(VENV)/bin/python -m tests.cluster down

run: setup
	$(VENV)/bin/evokube run examples/pendulum-cemrl.yaml
