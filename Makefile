# One-command set-up: `make serve` (install, build the demo archive, start TorchServe) and
# `make test` (install, lint, type-check, the whole suite).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install mar serve stop test lint typecheck unit integration clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

mar: install
	./build_mar.sh

model_store/gnn.mar:
	$(MAKE) mar

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

clean:
	rm -rf model_store .serve .mypy_cache .ruff_cache .pytest_cache
