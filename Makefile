# MindPipe: the two commands a newcomer needs.
#   make demo  - create .venv, install, run the main job end to end on the CPU
#   make test  - create .venv if needed, install with dev extras, run the whole test suite
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# torch's CPU wheel: installed first when torch is not importable, so pip does not pull a CUDA build.
TORCH_CPU := torch==2.13.0

.PHONY: demo test lint install install-dev clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.torch: | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q $(TORCH_CPU)
	touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch
	$(PIP) install -q -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	$(PIP) install -q -e ".[dev]"
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

# The closed loop on this CPU: profile gpt-mini -> tune -> run tuned and default plans -> calibrate
# -> re-tune -> results/report.md (about 3 minutes on 2 cores after the install).
demo: install
	$(VENV)/bin/mindpipe demo --out results

# Whole test files spread over TEST_WORKERS processes (pytest-xdist; module fixtures stay shared),
# handed out in collection order, which tests/conftest.py starts with the files of slow tests
# (xdist's default order, most tests first, leaves those to run last, one worker idle).
# Every multi-rank test launches its own ranks, so more workers than cores only adds contention.
# Tests marked `alone` compare real CPU timings (calibration fits): they run after,
# one at a time, so another worker's ranks cannot skew what they measure.
TEST_WORKERS ?= 2
test: install-dev
	$(VENV)/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not alone"
	$(VENV)/bin/python -m pytest -q -m alone

# mypy sees the package as it is installed (mindpipe.traces = traces/, ...: pyproject's package-dir),
# which an editable install hides from it: a tree of links under .venv gives it that layout.
MYPY_TREE := $(VENV)/mypy-tree
lint: install-dev
	$(VENV)/bin/ruff check .
	rm -rf $(MYPY_TREE) && mkdir -p $(MYPY_TREE)/mindpipe
	for f in mindpipe/*.py mindpipe/cli; do ln -s "$(CURDIR)/$$f" $(MYPY_TREE)/mindpipe/; done
	for d in traces simulator tuner executor; do ln -s "$(CURDIR)/$$d" $(MYPY_TREE)/mindpipe/$$d; done
	cd $(MYPY_TREE) && "$(CURDIR)/$(VENV)/bin/mypy" --config-file "$(CURDIR)/pyproject.toml" --cache-dir "$(CURDIR)/.mypy_cache"

clean:
	rm -rf $(VENV) results .pytest_cache .mypy_cache .ruff_cache
