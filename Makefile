# The two commands of the quick start: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test check lint bench browser pgbouncer

# The browser tests drive Debian's Chromium (never a browser download of Playwright's own).
CHROMIUM := /usr/bin/chromium

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@# An editable install writes no bytecode; where PYTHONDONTWRITEBYTECODE is set, every
	@# `tether` command would compile tether's modules again at start (about 0.25 s).
	$(PY) -m compileall -q src
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

# The PgBouncer tests run Debian's pgbouncer as a process of their own, on a free port.
# The package enables a system service on port 6432 where an init system runs; it is
# stopped and disabled, so installing it leaves nothing listening.
PGBOUNCER := /usr/sbin/pgbouncer

$(PGBOUNCER):
	@echo "pgbouncer is missing: installing Debian's package (the PgBouncer tests need it)"
	@if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq pgbouncer && \
	  { $$SUDO systemctl disable --now pgbouncer.service >/dev/null 2>&1; \
	    $$SUDO service pgbouncer stop >/dev/null 2>&1; true; }

pgbouncer: $(PGBOUNCER)

# Bytecode is compiled once up front, and the tests write theirs (PYTHONDONTWRITEBYTECODE
# is dropped for them): they start hundreds of `tether` processes, and pytest rewrites the
# asserts of every test module and of its plugins' packages (all of hypothesis and
# schemathesis) in each of its worker processes, which without a cache took 11 s of
# collection each instead of 5.5 s. The tiers run in parallel (pytest-xdist, work
# stealing, so a worker left with long tests hands the rest to the others): the tests
# mostly wait on processes and PostgreSQL, so three workers keep the two cores busy.
# Measured on a quiet 2-core machine: 866 s serial, 618 s with -n 2, 395 s with -n 3
# --dist worksteal. The suite grew to about 1,100 s on CI by 2026-12-07; the tests' tether
# processes are now forked from a server that imported tether once
# (tests/support/forkserver.py), which took the acceptance tier from 1,020 s of CPU to 360:
# the whole suite took 840 s with -n 3 while other work loaded the machine (load 5-9).
# `make test TEST_WORKERS=0` runs the suite in one process.
TEST_WORKERS ?= 3
test: lint browser pgbouncer
	$(PY) -m compileall -q src tests/support
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal

# The inner loop: lint and types, then the tests that start no process of their own (no
# `tether` CLI, server, PgBouncer or browser) on both backends. tests/conftest.py marks the
# others `processes` by what they use, and --no-processes leaves them out and fails any
# test that starts a process all the same. The tests marked `slow` (soak, property and
# rate-window tests of seconds each) are left to `make test`. The tests mostly wait on
# PostgreSQL, so a fourth worker keeps the two cores busier. mypy's cache makes lint a few
# seconds after its first run.
CHECK_WORKERS ?= 4
check: lint
	env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest -q -n $(CHECK_WORKERS) --dist worksteal --no-processes -m 'not slow'

bench: $(STAMP)
	$(PY) benchmarks/step_overhead.py
