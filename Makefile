# One-command set-up: `make serve` (install, build the demo archive, start TorchServe),
# `make test` (install, lint, type-check, the whole suite) and `make test-quick` (unit tests).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install mar serve stop test test-quick lint typecheck unit integration bench bench-full demo-report clean \
	redis-server \
	audit \
	status register set-default scale unregister resume

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

mar: install
	./build_mar.sh

# Rebuilt whenever the code or the demo graph changes, so `make serve` never serves a stale archive.
SERVED_CODE := $(shell find graph_assets model handler archive_build -name '*.py' -not -path '*/__pycache__/*')
model_store/gnn.mar: $(VENV)/.installed build_mar.sh $(SERVED_CODE) $(wildcard graph_assets/demo/*)
	./build_mar.sh

serve: install model_store/gnn.mar
	scripts/serve.sh start

# Restart with the versions, default version and worker counts the server had when it stopped.
resume: install
	scripts/serve.sh resume

stop:
	scripts/serve.sh stop

# Management shortcuts for the `make serve` server (token read from .serve/key_file.json):
#   make register MAR=gnn_v2.0.mar   make set-default VERSION=2.0   make scale WORKERS=2
#   make unregister VERSION=1.0      make status
# A server on other ports: MANAGEMENT=http://127.0.0.1:9081 (gnnctl.py --management).
MODEL ?= gnn
GNNCTL := $(BIN)/python scripts/gnnctl.py $(if $(MANAGEMENT),--management $(MANAGEMENT))
status:
	$(GNNCTL) status $(MODEL)
register:
	$(GNNCTL) register $(MAR) --workers $(or $(WORKERS),1)
set-default:
	$(GNNCTL) set-default $(MODEL) $(VERSION)
scale:
	$(GNNCTL) scale $(MODEL) $(WORKERS) $(if $(VERSION),--version $(VERSION))
unregister:
	$(GNNCTL) unregister $(MODEL) $(VERSION)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

# The unit tests, the inner loop: in parallel, one pytest-xdist worker per core, each test file
# on one worker (its module fixtures are built once); then the few marked `serial`, whose time
# bounds a busy neighbour could break, alone. Each run prints its 15 slowest tests.
test-quick unit: install redis-server
	$(BIN)/pytest tests/unit -q -n auto --dist loadfile -m "not serial" --durations=15
	$(BIN)/pytest tests/unit -q -p no:xdist -m serial --durations=15

integration: install redis-server
	$(BIN)/pytest tests/integration -q --durations=15

test: install lint typecheck unit integration

# The Redis update log is tested against a real redis-server (Debian's redis-server is 7.0):
# installed here when missing and running as root, else the one command to run is printed.
redis-server:
	@command -v redis-server >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server; \
	  else \
	    echo "redis-server is missing; install it with: sudo apt-get install -y redis-server"; \
	    exit 1; \
	  fi; }

# Benchmarks (docs/benchmarks.md): every system and baseline measured in one run, then the
# tables and plots regenerated from its results. `make bench` is the quick profile (< 10 min).
$(VENV)/.bench-installed: $(VENV)/.installed pyproject.toml
	$(BIN)/pip install --quiet -e '.[dev,bench]'
	touch $@

bench: $(VENV)/.bench-installed
	$(BIN)/python -m bench.experiments.suite --profile quick
	$(BIN)/python -m bench.report.benchmarks docs/bench-results/results-quick.json

bench-full: $(VENV)/.bench-installed
	$(BIN)/python -m bench.experiments.suite --profile full
	$(BIN)/python -m bench.report.benchmarks docs/bench-results/results-full.json

# Known vulnerabilities in the installed (pinned) dependencies; needs a vulnerability database
# (PyPI's JSON API or OSV) on the network. --strict fails when a package could not be checked,
# so an unreachable database never passes as "no findings". Triage: docs/security.md.
audit: install
	$(BIN)/pip-audit --strict --skip-editable --progress-spinner off --desc on

# Demo-graph report: test accuracy per architecture and served-vs-full-graph exactness.
demo-report: install
	$(BIN)/python -m bench.report.demo

clean:
	rm -rf model_store .serve .mypy_cache .ruff_cache .pytest_cache
