# kefu — the two commands: `make run` (serve the app on embedded defaults) and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000
export HOST PORT

.PHONY: install run test worker beat migrate demo-data check fix clean

# Creates .venv and installs the project with its pinned dependencies (constraints.txt).
# A second call with nothing to do returns at once (the stamp is newer than both files).
install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ".[dev]"
	@touch $(STAMP)

migrate: install
	$(PY) manage.py migrate --noinput

# The demo store's FAQ, only into an empty FAQ (KEFU_LOAD_DEMO_FAQ=false skips it), and its demo
# orders when the demo store adapter is on (the default).
demo-data: migrate
	@if [[ "$${KEFU_LOAD_DEMO_FAQ:-true}" != "false" ]]; then $(PY) manage.py import_faq --if-empty routing/demo/faq_demo.jsonl; fi
	@if [[ "$${KEFU_STORE_ADAPTER:-demo}" == "demo" ]]; then $(PY) manage.py load_demo_orders --if-empty; fi
	@if [[ "$${KEFU_LOAD_DEMO_CATALOG:-true}" != "false" ]]; then $(PY) manage.py import_products --if-empty store/demo/products.jsonl; fi

# Serves http://$(HOST):$(PORT)/ with Daphne. DATABASE_URL, REDIS_URL, OPENAI_* etc. from the environment.
run: demo-data
	exec $(VENV)/bin/daphne -b $(HOST) -p $(PORT) config.asgi:application

# Celery processes (need REDIS_URL; without it tasks run eagerly inside the web process).
worker: install
	@test -n "$$REDIS_URL" || { echo "make worker needs REDIS_URL (without it, tasks run eagerly in the web process)"; exit 2; }
	exec $(VENV)/bin/celery -A config worker --loglevel=INFO

beat: install
	@test -n "$$REDIS_URL" || { echo "make beat needs REDIS_URL"; exit 2; }
	exec $(VENV)/bin/celery -A config beat --loglevel=INFO

# The whole suite. Redis, PostgreSQL and Chromium are used where they are (REDIS_URL,
# TEST_DATABASE_URL, /usr/bin/chromium); tests that need a missing one are skipped with the reason.
# PYTEST_WORKERS processes (pytest-xdist) take whole test files, so a file's module fixtures (live
# servers, workers) start once; PYTEST_WORKERS=0 runs in one process. Default two per core: most
# tests wait on the servers, workers and browsers they start (a full run used ~45% of 2 cores with
# one process per core; 13 min with two per core against 21.6 min with one, same machine).
PYTEST_WORKERS ?= $(shell echo $$(( $$(nproc) * 2 )))
# One thread per native math pool (lib/native_threads.py) in every test process and the servers
# the tests start, set before pytest loads anything: set later, four workers' spinning pools on
# two cores made the router's warm-up take 50 s instead of 15 s per worker, past the 120 s timeout.
NATIVE_THREADS := OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=$${OPENBLAS_NUM_THREADS:-1} MKL_NUM_THREADS=$${MKL_NUM_THREADS:-1}
test: install
	$(NATIVE_THREADS) $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

# Lint, format, types and the import contracts of docs/architecture.md. Runs before every commit and in CI.
check: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

# Rewrites what the formatter and the linter's safe fixes can mend.
fix: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

clean:
	rm -rf $(VENV) staticfiles .pytest_cache
