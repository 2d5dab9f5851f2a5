# Sandman: the two commands that matter are `make up` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
SANDMAN := $(VENV)/bin/sandman
PYTEST_ARGS ?=
KWOK_NODES ?= 3

.PHONY: all venv build-kube daemon images up down status test test-unit lint bench clean

all: test

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

# Kubernetes, etcd and kwok from the Go module proxy, cached in ~/.cache/sandman.
build-kube: venv
	$(SANDMAN) cluster build

# The in-sandbox daemon's runtime tree (its own Python 3.11 and the daemon's
# bytecode; docs/performance.md); the build is cached in ~/.cache/sandman/daemon
# and redone only when daemon/ changes.
daemon: venv
	$(VENV)/bin/python -m sandman.harness.images.daemon_binary --out dist/sandmand

# Sandman's component images (controller, scheduler, daemon) at the release
# version, into the layer cache; `sandman image push --registry R` pushes them.
images: venv build-kube
	$(SANDMAN) image build --no-push controller scheduler daemon

# A local cluster (real control plane + kwok nodes + a real node with kube-proxy,
# CoreDNS and kube-router) running Sandman in-cluster: the component images are
# built, pushed to the node's registry and applied through
# manifests/overlays/local. UP_FLAGS=--host-components runs them as host
# processes instead (quick iteration, same manifests).
UP_FLAGS ?=
up: venv
	$(SANDMAN) cluster up --real-node --deploy --kwok-nodes $(KWOK_NODES) $(UP_FLAGS)
	$(SANDMAN) image build tiny swe
	$(SANDMAN) demo

down: venv
	$(SANDMAN) cluster down

status: venv
	$(SANDMAN) cluster status

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Every tier, in two pytest sessions with a cluster each: unit + integration on
# kwok nodes with Sandman's components as host processes (no real node: quick,
# and the tests there drive components directly), then e2e on the real node
# with Sandman installed in-cluster from its manifests (the path users take).
# Both run even if the first fails; any failure, or "no tests collected" (5),
# fails the target. Single files: run .venv/bin/pytest PATH directly.
test: venv lint build-kube
	@status=0; \
	SANDMAN_TEST_REAL_NODE=0 SANDMAN_TEST_HOST_COMPONENTS=1 \
	  $(VENV)/bin/pytest -m "unit or integration" $(PYTEST_ARGS) || status=$$?; \
	$(VENV)/bin/pytest -m e2e $(PYTEST_ARGS) || status=$$?; \
	exit $$status

test-unit: venv
	$(VENV)/bin/pytest -m unit $(PYTEST_ARGS)

bench: venv
	$(SANDMAN) bench all --json out/bench.json

clean:
	rm -rf $(VENV) build dist *.egg-info out
