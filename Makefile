# The two commands of the quick start: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench browser

# The browser tests drive Debian's Chromium (never a browser download of Playwright's own).
CHROMIUM := /usr/bin/chromium

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tether demo

lint: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports --no-cache

$(CHROMIUM):
	@echo "Chromium is missing: installing Debian's package (the browser tests need it)"
	@if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium

browser: $(CHROMIUM)

# Bytecode is compiled once up front: the tests start hundreds of `tether` processes, and
# where PYTHONDONTWRITEBYTECODE is set each would compile every module again. The tiers
# can run in parallel (`make test TEST_WORKERS=4`, pytest-xdist); on these 2-core machines
# four workers measured no faster than one (1283 s against about 1100 s), CPU-bound by the
# `tether` processes the tests start, so the default stays serial.
TEST_WORKERS ?= 0
test: lint browser
	$(PY) -m compileall -q src tests/support
	$(PY) -m pytest -q -n $(TEST_WORKERS)

bench: $(STAMP)
	$(PY) benchmarks/step_overhead.py
