# Quick start: `make demo` and `make test`. Both create or update .venv first.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.fedprivopt-installed
# torch first, pinned to the CPU wheel this machine has; then the package with its dev and
# examples extras (scikit-learn for examples/digits).
TORCH  ?= torch==2.13.0

export FLWR_TELEMETRY_ENABLED = 0
export FLWR_DISABLE_UPDATE_CHECK = 1
# Python keeps the package's and the tests' compiled modules in __pycache__ (ignored by git).
# With PYTHONDONTWRITEBYTECODE set (the development machine sets it) every process compiled the
# package again and every pytest worker rewrote every test module: measured 0.5-0.8 s of CPU per
# command, Ray actor and ClientApp process, and a worker's collection 20.2 s against 9.3 s.
unexport PYTHONDONTWRITEBYTECODE

DEMO_CONFIG     ?= simulations/stackoverflow-tp-fedsgd.toml
DEMO_OUT        ?= runs/demo
DEMO_SIGMAS     ?= 0.4744,0.7584
DEMO_SEEDS      ?= 3
DEMO_JOBS       ?= 2

# The reproduction of the papers' comparison (docs/EXPERIMENTS.md): every strategy at the preset's
# tuned hyperparameters, 3 seeds, equal epsilon; and the equal-effort sweep that tuned them.
REPRO_CONFIG ?= simulations/adadps-paper.toml
REPRO_OUT    ?= runs/reproduce
REPRO_SEEDS  ?= 3
# two runs at a time hardly help the paper preset's 4.5M-parameter runs on 2 cores: 3 min 48 s
# (another process running) against about 4 min one at a time (quiet, an earlier session); each
# run's dense server passes use both cores already
REPRO_JOBS   ?= 1
SWEEP        ?= experiments/adadps-paper.sweep.toml
SWEEP_EMA    ?= experiments/adadps-paper-ema.sweep.toml
SWEEP_FROZEN ?= experiments/adadps-paper-frozen-bias.sweep.toml
SWEEP_STAGE7 ?= experiments/adadps-paper-stage7.sweep.toml
SWEEP_OUT    ?= runs/sweep

.PHONY: venv demo test lint bench reproduce sweep clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check $(TORCH)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,examples]'
	touch $(STAMP)

demo: venv
	@echo "== Privacy accounting: the demo's two noise levels (400 users, q = 0.05, 400 rounds of DP-FedSGD) =="
	$(VENV)/bin/fedprivopt epsilon --noise-multiplier 0.4744 --sample-rate 0.05 --rounds 400 --delta 0.0025
	$(VENV)/bin/fedprivopt epsilon --noise-multiplier 0.7584 --sample-rate 0.05 --rounds 400 --delta 0.0025
	@echo "== Compare every strategy at equal epsilon on synthetic StackOverflow tag prediction (fast engine, $(DEMO_SEEDS) seeds, $(DEMO_JOBS) runs at a time) =="
	$(VENV)/bin/fedprivopt compare $(DEMO_CONFIG) --noise-multipliers $(DEMO_SIGMAS) --seeds $(DEMO_SEEDS) --jobs $(DEMO_JOBS) --out $(DEMO_OUT) --metric eval_accuracy --overwrite --quiet
	@echo "Report: $(DEMO_OUT)/report.md (plots: $(DEMO_OUT)/metric_vs_round.png, $(DEMO_OUT)/privacy_utility.png)"

reproduce: venv
	$(VENV)/bin/fedprivopt compare $(REPRO_CONFIG) --seeds $(REPRO_SEEDS) --jobs $(REPRO_JOBS) --out $(REPRO_OUT) --metric eval_accuracy --overwrite --quiet
	@echo "Report: $(REPRO_OUT)/report.md"

sweep: venv
	$(PY) experiments/sweep.py $(SWEEP) --out $(SWEEP_OUT) --jobs 2
	$(PY) experiments/sweep.py $(SWEEP_EMA) --out $(SWEEP_OUT)-ema --jobs 2
	$(PY) experiments/sweep.py $(SWEEP_FROZEN) --out $(SWEEP_OUT)-frozen --jobs 2
	$(PY) experiments/sweep.py $(SWEEP_FROZEN:.sweep.toml=-nonprivate.sweep.toml) --out $(SWEEP_OUT)-frozen-nonprivate --jobs 2
	$(PY) experiments/sweep.py $(SWEEP_STAGE7) --out $(SWEEP_OUT)-stage7 --jobs 2
	$(PY) experiments/sweep.py $(SWEEP_STAGE7:stage7.sweep.toml=stage8.sweep.toml) --out $(SWEEP_OUT)-stage8 --jobs 2

# Two pytest-xdist workers, whole files to one worker (module fixtures are built once): most of
# the suite's slow tests wait on processes (Flower's SuperLink, SuperNodes and ClientApps poll
# every 3 s; Ray starts), so on the 2-core CI machine the two overlap. TEST_WORKERS=0 runs serially.
# The slowest files go first (tests/conftest.py, SLOWEST_FILES), so that no worker runs one alone
# at the end.
TEST_WORKERS ?= 2

test: venv
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

lint: venv
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

bench: venv
	$(PY) benchmarks/run.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
