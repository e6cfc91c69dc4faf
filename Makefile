# One-command set-up: `make serve` (install, build the demo archive, start TorchServe) and
# `make test` (install, lint, type-check, the whole suite).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install mar serve stop test lint typecheck unit integration bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

mar: install
	./build_mar.sh

# Rebuilt whenever the code or the demo graph changes, so `make serve` never serves a stale archive.
model_store/gnn.mar: $(VENV)/.installed build_mar.sh $(wildcard graph_assets/*.py model/*.py handler/*.py graph_assets/demo/*)
	./build_mar.sh

serve: install model_store/gnn.mar
	scripts/serve.sh start

stop:
	scripts/serve.sh stop

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

unit: install
	$(BIN)/pytest tests/unit -q

integration: install
	$(BIN)/pytest tests/integration -q

test: install lint typecheck
	$(BIN)/pytest -q

# Demo-graph report: test accuracy per architecture and served-vs-full-graph exactness.
bench: install
	$(BIN)/python -m bench.demo_report

clean:
	rm -rf model_store .serve .mypy_cache .ruff_cache .pytest_cache
