# The README's two commands: `make run` (the main job, then the notebooks as reports) and `make test`
# (every test but the accuracy acceptance set, which `make test-all` adds).
# Both create .venv from requirements.txt when it is missing, and never re-install otherwise.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
OOCGNN := $(VENV)/bin/oocgnn
STAMP := $(VENV)/.installed

.PHONY: run test test-all test-slow venv notebooks clean-runs help data-small browser lab xlarge gpu-check

help:
	@echo "make run      - prepare small (METIS, 256 parts), train in memory and every out-of-core policy at one"
	@echo "                budget (figures/00_time_to_accuracy.{csv,png}), then execute every notebook as a"
	@echo "                papermill report into notebooks/executed/ (leaves the git tree clean)"
	@echo "make test     - every test but the accuracy acceptance set, on 2 workers (pytest-xdist), the browser"
	@echo "                test and every notebook under nbval included (a report make run executed on the"
	@echo "                same code is checked without running the notebook again)"
	@echo "make test-slow - the accuracy acceptance set alone (-m slow: tests/test_accuracy.py, ~15 min)"
	@echo "make test-all - both"
	@echo "make lab      - start JupyterLab on notebooks/ with the project's kernel (the venv)"
	@echo "make notebooks - re-execute the source notebooks in place (their stored outputs) and figures/"
	@echo "make browser  - install Debian's chromium + chromium-driver for the browser test (apt, as root)"
	@echo "make xlarge   - beyond RAM: prepare data/xlarge-fennel-4096 once (28.7 GB of features, more than 24 GB"
	@echo "                of RAM; ~7 min, 29 GiB of disk + ~5 GB temporary) and train every policy on it under"
	@echo "                a 4GB budget (benchmarks/train.py; ~1 h on 2 cores), executed reads checked against the"
	@echo "                simulation; table in data/bench/train-xlarge.csv. Never run by make test or CI"
	@echo "make gpu-check - on a GPU machine: the CUDA tests, then every main policy trained on the GPU on medium"
	@echo "                (stages, copy/compute overlap, reads vs the disk), ~5 min; output in OUT (default"
	@echo "                data/gpu-check). Uses .venv when there is one, else python3 (PYTHON=...); installs nothing"

venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))
SMALL := data/small-metis-256
# the main job's settings: every policy fits ~40 % of small's feature file at batch 256 (macrobatch's
# union of one batch needs 36 MiB); 2 epochs reach the accuracy inmemory reaches
COMPARE := --memory-budget 40MB --batch-size 256 --epochs 2 --lr 0.005 --eval-every 39 --max-eval-nodes 1000
# tests on 2 workers; the notebooks after them in one process (a notebook's cells share a kernel: xdist's
# loadgroup did not keep them on one worker, and a notebook nbval executes failed from its second cell)
XDIST := -n 2
PYTEST_NOTEBOOKS := $(if $(NOTEBOOKS),--nbval $(NOTEBOOKS) --nbval-cell-timeout=900)

# beyond RAM (issue 34): the store is made once by benchmarks/train.py (never by tests or CI)
XLARGE_POLICIES := inmemory,mmap,hierbatching,outre,ginex,macrobatch,marius,composed
xlarge: $(STAMP)
	$(PY) benchmarks/train.py --preset xlarge --parts 4096 --budget 4GB --steps 40 --limit mmap \
	  --policies $(XLARGE_POLICIES) --check-simulated --csv data/bench/train-xlarge.csv

# on a GPU machine (issue 40): needs no venv (a GPU box has its own torch); never run by make test or CI
gpu-check:
	bash benchmarks/gpu_check.sh $(OUT)

# (re)made when missing, damaged or written by an older store format; the notebooks reuse it
data-small: | $(STAMP)
	@$(OOCGNN) info $(SMALL) >/dev/null 2>&1 || \
	  $(OOCGNN) prepare synthetic --preset small --partitioner metis --parts 256 --out $(SMALL) --force --quiet

run: $(STAMP) data-small
	$(OOCGNN) info $(SMALL)
	$(OOCGNN) compare $(SMALL) $(COMPARE) --out runs/compare-small --figure figures/00_time_to_accuracy --no-progress
	$(PY) -m oocgnn.reports --jobs 2 $(NOTEBOOKS)

# every test but the accuracy acceptance set (-m slow), the JupyterLab browser test included, and every
# notebook under nbval (checked from the reports `make run` left when they are current)
test: $(STAMP) browser
	$(PY) -m pytest -q $(XDIST) -m "not slow" tests
	$(PY) -m pytest -q -p no:xdist $(PYTEST_NOTEBOOKS)

# the accuracy acceptance set alone (tests/test_accuracy.py: real datasets, learnability, out-of-core
# against in-memory accuracy on small and amazon_photo, bf16): ~15 min on 2 cores
test-slow: $(STAMP)
	$(PY) -m pytest -q $(XDIST) -m slow tests

# every test
test-all: $(STAMP) browser
	$(PY) -m pytest -q $(XDIST) tests
	$(PY) -m pytest -q -p no:xdist $(PYTEST_NOTEBOOKS)

# re-execute the source notebooks in place (the outputs nbval checks) and strip volatile metadata
notebooks: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) notebooks/refresh.py

clean-runs:
	rm -rf runs

# the browser test drives a real headless Chromium: Debian's, with its driver (no browser download).
# Installed with apt-get when missing and we are root; otherwise tests/test_lab.py skips and says why.
browser:
	@if command -v chromedriver >/dev/null && { command -v chromium >/dev/null || command -v chromium-browser >/dev/null; }; then \
	  true; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing chromium and chromium-driver (apt-get) for the browser test"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) || \
	    echo "could not install chromium; tests/test_lab.py will skip"; \
	else \
	  echo "no chromium/chromedriver and no root apt-get: tests/test_lab.py will skip (install chromium and chromium-driver)"; \
	fi

# JupyterLab on the project from the venv: the notebooks run with the project's kernel on the default data
lab: $(STAMP)
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VENV)/bin/jupyter lab --ServerApp.root_dir=$(CURDIR)/notebooks
