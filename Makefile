# Two commands for a newcomer: `make demo` and `make test`. Each creates .venv on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# checkov pins its own HCL parser: it lives in a venv of its own.
CHECKOV := .venv-checkov/bin/checkov

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

$(CHECKOV):
	$(PYTHON) -m venv .venv-checkov
	.venv-checkov/bin/pip install --quiet --upgrade pip
	.venv-checkov/bin/pip install --quiet checkov==3.3.30

lint: $(STAMP)
	$(PY) -m ruff check .

typecheck: $(STAMP)
	$(PY) -m mypy

unit: $(STAMP) $(CHECKOV)
	$(PY) -m pytest

test: lint typecheck unit

bench: $(STAMP)
	$(PY) -m benchmarks

clean:
	rm -rf $(VENV) .venv-checkov .cache demo-output .pytest_cache .mypy_cache .ruff_cache
