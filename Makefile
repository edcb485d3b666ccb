# Quick start: `make demo` and `make test`. Both create or update .venv first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.fedprivopt-installed
# torch first, pinned to the CPU wheel this machine has; then the package with its dev extras.
TORCH  ?= torch==2.13.0

export FLWR_TELEMETRY_ENABLED = 0
export FLWR_DISABLE_UPDATE_CHECK = 1

.PHONY: venv demo test lint bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check $(TORCH)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

demo: venv
	@echo "== Privacy of the AdaDPS federated setting (400 users, 20 per round, sigma 0.3, 40 rounds) =="
	$(VENV)/bin/fedprivopt epsilon --noise-multiplier 0.3 --sample-rate 0.05 --rounds 40 --delta 0.0025
	$(VENV)/bin/fedprivopt epsilon --noise-multiplier 0.3 --sample-rate 0.05 --rounds 40 --delta 0.0025 --accountant pld
	$(VENV)/bin/fedprivopt epsilon --noise-multiplier 0.3 --rounds 40 --delta 0.0025 --sampling fixed --population 400 --cohort 20
	@echo "== Noise needed for epsilon 8 at delta 1e-6 over 1500 rounds of 100 of 342,477 users =="
	$(VENV)/bin/fedprivopt calibrate --target-epsilon 8 --delta 1e-6 --population 342477 --cohort 100 --rounds 1500

test: venv
	$(PY) -m ruff check .
	$(PY) -m pytest -q

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: venv
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
