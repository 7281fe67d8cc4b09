# The README's two commands: `make run` (the main job) and `make test` (all tests).
# Both create .venv from requirements.txt when it is missing, and never re-install otherwise.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
OOCGNN := $(VENV)/bin/oocgnn
STAMP := $(VENV)/.installed

.PHONY: run test venv notebooks clean-runs help data-small browser lab

help:
	@echo "make run     - generate the small synthetic graph, train in memory and through mmap,"
	@echo "               write figures/00_time_to_accuracy.{csv,png}"
	@echo "make test    - run every test (pytest), notebooks and the JupyterLab browser test included"
	@echo "               (runs make browser first)"
	@echo "make lab     - start JupyterLab on notebooks/ with the project's kernel (the venv)"
	@echo "make browser - install Debian's chromium + chromium-driver for the browser test (apt, as root)"

venv: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

# (re)made when missing, damaged or written by an older store format
data-small: | $(STAMP)
	@$(OOCGNN) info data/small >/dev/null 2>&1 || \
	  $(OOCGNN) prepare synthetic --preset small --out data/small --force

NOTEBOOKS := $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))

run: $(STAMP) data-small
	$(OOCGNN) info data/small
	$(OOCGNN) train data/small --policy inmemory --epochs 5 --out runs/small-inmemory --force
	$(OOCGNN) train data/small --policy mmap --memory-budget 32MB --epochs 5 --out runs/small-mmap --force
	$(OOCGNN) report runs/small-inmemory runs/small-mmap --out figures/00_time_to_accuracy
	@mkdir -p notebooks/executed
	@for nb in $(NOTEBOOKS); do \
	  echo "papermill $$nb -> notebooks/executed/$$(basename $$nb)"; \
	  PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VENV)/bin/papermill --cwd notebooks $$nb notebooks/executed/$$(basename $$nb) || exit 1; \
	done

# unit tests (the JupyterLab browser test included), then every notebook under nbval (headline
# numbers checked, timings ignored)
test: $(STAMP) browser
	$(PY) -m pytest -q tests $(if $(NOTEBOOKS),--nbval $(NOTEBOOKS) --nbval-cell-timeout=900)

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
