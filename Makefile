# Two commands for a newcomer: `make demo` and `make test`. Each creates .venv on first use.
# `make check` is the fast tier for a change in progress: lint, types, tests/unit and tests/beam.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# checkov pins its own HCL parser: it lives in a venv of its own.
CHECKOV := .venv-checkov/bin/checkov
# The reference library (ml-goodput-measurement), for differential tests and side-by-side
# benchmarks: ml_goodput_measurement/ has taken its import path, so it lives in a venv of its own
# too, driven through tools/reference_runner (its pins: tools/reference_runner/requirements.txt).
REFERENCE_VENV := .venv-reference
REFERENCE := $(REFERENCE_VENV)/.installed-stamp
# The HTML report is tested in Debian's chromium, driven by playwright (no browser download).
CHROMIUM := /usr/bin/chromium

# The tests of the emitter's recorder, worker and transports: what make test runs twice.
PURE_PYTHON_TESTS := tests/unit/test_emitter*.py tests/unit/test_delivery.py tests/unit/test_compat.py

.PHONY: install demo check test lint typecheck bench soak clean $(REFERENCE_VENV)

install: $(STAMP)

# The four distributions of this repository (see the README), editable; never the reference, which
# shares ml_goodput_measurement's import path (older checkouts installed it here).
# Quiet but for a line per stage. Setuptools says, for each distribution built from its own folder,
# that an editable install of it is one ("Editable installation": information, nothing to act on).
$(STAMP): pyproject.toml emitter/pyproject.toml emitter/setup.py emitter/_lane.c goodput_schemas/pyproject.toml ml_goodput_measurement/pyproject.toml
	@echo "installing into $(VENV): the four distributions, Beam, JAX and the test tools (up to 4 minutes the first time)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip uninstall --quiet --quiet --yes ml-goodput-measurement   # mostly not there: no warning
	PYTHONWARNINGS="ignore:Editable installation" $(PY) -m pip install --quiet \
		-e ./goodput_schemas -e ./emitter -e ./ml_goodput_measurement -e '.[test,demo]'
	touch $(STAMP)
	@echo "installed: the goodput command is $(VENV)/bin/goodput (. $(VENV)/bin/activate puts it on PATH)"

demo: $(STAMP)
	$(PY) -m pipeline.demo
	@echo "next: . $(VENV)/bin/activate, then the README's quick start (goodput query, goodput report, ...)"

$(CHECKOV):
	$(PYTHON) -m venv .venv-checkov
	.venv-checkov/bin/pip install --quiet --upgrade pip
	.venv-checkov/bin/pip install --quiet checkov==3.3.30

$(REFERENCE_VENV): $(REFERENCE)

$(REFERENCE): tools/reference_runner/requirements.txt
	$(PYTHON) -m venv $(REFERENCE_VENV)
	$(REFERENCE_VENV)/bin/pip install --quiet --upgrade pip
	$(REFERENCE_VENV)/bin/pip install --quiet -r tools/reference_runner/requirements.txt
	touch $(REFERENCE)

$(CHROMIUM):
	@if [ "$$(id -u)" = 0 ]; then \
		apt-get install -y -qq --no-install-recommends chromium >/dev/null \
		|| (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium >/dev/null); \
	else echo "chromium is not installed (apt-get install chromium, as root): the browser test will skip"; fi

lint: $(STAMP)
	$(PY) -m ruff check .

typecheck: $(STAMP)
	$(PY) -m mypy

check: lint typecheck $(REFERENCE)
	$(PY) -m pytest -n auto --dist loadfile tests/unit tests/beam

# Everything, tests/e2e too (stand-ins, subprocesses, the browser, Terraform, installs, the soak):
# what CI runs. One worker per core, each test file whole on one worker (its module fixtures once).
# Then the emitter's unit tests again on its Python fast path (emitter/lane.py), which runs where
# emitter/_lane.c is not built.
test: lint typecheck $(CHECKOV) $(CHROMIUM) $(REFERENCE)
	$(PY) -m pytest -n auto --dist loadfile
	GOODPUT_EMITTER_PURE_PYTHON=1 $(PY) -m pytest -n auto --dist loadfile $(PURE_PYTHON_TESTS)

bench: $(STAMP) $(REFERENCE)
	$(PY) -m benchmarks

# Thirty minutes of fleet traffic with random faults (make test runs a 90 s version of it).
SOAK_S ?= 1800
soak: $(STAMP)
	GOODPUT_SOAK_S=$(SOAK_S) $(PY) -m pytest -s -p no:cacheprovider tests/e2e/test_soak.py

clean:
	rm -rf $(VENV) .venv-checkov $(REFERENCE_VENV) .cache demo-output .pytest_cache .mypy_cache .ruff_cache
