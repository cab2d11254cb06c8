# Two commands do all set-up on a fresh machine:
#   make demo   - set up, then run the main job on the bundled defaults
#   make test   - set up, then run the whole test suite
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup demo test test-fast lint bench notebooks clean reproduce figures test-browser notebooks-full

setup: $(STAMP)

# On a machine without CUDA, torch==2.13.0 is installed first: an unpinned torch would pull
# a multi-GB CUDA build. GPU machines keep (or get) their own CUDA build through the loose floor.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@if command -v nvidia-smi >/dev/null 2>&1; then \
		echo "CUDA machine: keeping pip's torch resolution"; \
	else \
		$(PY) -m pip install -q torch==2.13.0; \
	fi
	$(PY) -m pip install -q -e '.[dev,notebooks]'
	touch $(STAMP)

# The main job on bundled defaults: the mixed H100+A100 testbed, a 7B model, 128K tokens.
# Plan it (and every baseline), then check the plan numerically and train a few steps under it
# on this machine (spawned CPU ranks, a proxy model, the plan scaled to a short sequence). Then a
# real run: the uneven plan of the emulated cpu-4 cluster, trained on the bundled text (run directory
# out/run-text: metrics, summary with measured vs predicted step time, loss.png), and the planned plan
# measured against the best DP x symmetric baseline and DP = 1 on the same emulation (out/dp.txt).
DEMO_ARGS ?= --cluster testbed-8 --model llama2-7b --seq-len 128K --recompute auto
demo: setup
	@mkdir -p out
	$(VENV)/bin/hexiseq info testbed-8 --model llama2-7b
	$(VENV)/bin/hexiseq plan $(DEMO_ARGS) --out out/plan.json
	$(VENV)/bin/hexiseq verify --plan out/plan.json
	@rm -rf out/run-testbed out/run-text
	$(VENV)/bin/hexiseq run --plan out/plan.json --steps 3 --out out/run-testbed
	@# A real run on the emulated cluster cpu-4 (4 CPU ranks, each emulating its device and the link between the
	@# nodes: data/clusters/README.md), so that predicted and measured step times compare like with like
	$(VENV)/bin/hexiseq plan --cluster cpu-4 --model tiny --seq-len 256 --out out/plan-cpu-4.json
	$(VENV)/bin/hexiseq run --plan out/plan-cpu-4.json --model tiny --data data/text/tinyshakespeare.txt \
		--steps 12 --lr 3e-3 --warmup-steps 2 --out out/run-text --plot
	@# This machine calibrated (cpu-4, short), then the joint plan against the best DP x symmetric baseline, the
	@# best one with equal shares and DP = 1, each measured on the emulation and predicted by the step model
	@# with the calibration's figures (the ones the plans were chosen by: bench_dp's doc)
	$(PY) benchmarks/bench_dp.py --clusters cpu-4 --seq-len 1024 --global-batch 4 --steps 4 --trials 1 --quick --out out/dp.txt

# Two passes. First every test that times nothing, on pytest-xdist workers (one per core, at most 4);
# then the ones marked `serial` (they assert on wall time or wait on timeouts) alone, so that no other
# test's load enters their clocks. TEST_WORKERS=0 runs the first pass in this process.
TEST_WORKERS ?= auto
test: setup
	$(PY) -m pytest -q -ra -n $(TEST_WORKERS) --maxprocesses 4 -m "not serial" --durations=30
	$(PY) -m pytest -q -ra -m serial --durations=10

# Lint and format (ruff, configured in pyproject.toml) and the layer contracts (import-linter, .importlinter;
# tests/test_architecture.py runs them inside `make test` too). .ci/run calls this.
lint: setup
	$(VENV)/bin/ruff check hexiseq tests benchmarks .ci
	$(VENV)/bin/ruff format --check hexiseq tests benchmarks .ci
	$(VENV)/bin/lint-imports

test-fast: setup
	$(PY) -m pytest -q -ra -m "not slow"

bench: setup
	@for f in benchmarks/bench_*.py; do echo "== $$f"; $(PY) $$f || exit 1; done

notebooks: setup
	$(VENV)/bin/jupyter lab notebooks/

# The paper's experiments on the cost model (issue 13): every cell of data/scenarios/ -> data/results/
# (results.csv, figures/, paper_comparison.md). REPRODUCE_ARGS=--quick for the small grid (out/reproduce-quick).
REPRODUCE_ARGS ?=
reproduce: setup
	$(VENV)/bin/hexiseq reproduce $(REPRODUCE_ARGS)

# The README's pictures: the results' figures redrawn from data/results/ and the explorer's picture.
figures: setup
	$(PY) -m hexiseq.reproduce.readme

# Notebook 01 in a real browser: JupyterLab + Debian's chromium driven by Playwright (no browser
# download; .ci/run installs chromium). Screenshots in out/browser/.
test-browser: setup
	$(PY) -m pip install -q playwright
	HEXISEQ_BROWSER_TEST=1 $(PY) -m pytest -q -ra -s tests/browser

# Every notebook at full size (the tests run the quick versions); executed copies in out/notebooks/.
notebooks-full: setup
	$(PY) benchmarks/bench_notebooks.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
