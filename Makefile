# Two commands for a newcomer: `make demo` and `make test`. Each creates .venv on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: install demo test lint typecheck unit bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[pipeline,test]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/simulated_job.py --output demo-output/events.jsonl
	rm -f demo-output/goodput.duckdb
	$(PY) -m pipeline --events=demo-output/events.jsonl --duckdb=demo-output/goodput.duckdb

lint: $(STAMP)
	$(PY) -m ruff check .

typecheck: $(STAMP)
	$(PY) -m mypy

unit: $(STAMP)
	$(PY) -m pytest

test: lint typecheck unit

bench: $(STAMP)
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) demo-output .pytest_cache .mypy_cache .ruff_cache
