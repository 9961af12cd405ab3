"""A real Daphne server in a subprocess, on the test database, serving a tiny model.

The in-memory channel layer and mocks do not cross processes, so the server is
configured through the environment (a tiny random-weight model) rather than patched.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import httpx
from django.conf import settings

from tests.support.processes import stop_process, wait_until_answering

ROOT = Path(__file__).resolve().parents[1]
# Every live site's /metrics token: /healthz shows the engine's figures only to callers /metrics admits.
METRICS_TOKEN = "live-site-metrics-token"
METRICS_AUTH = {"Authorization": f"Bearer {METRICS_TOKEN}"}


@dataclass
class LiveSite:
    url: str
    process: subprocess.Popen
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")


# The listen queue Makefile and Procfile give Daphne (Twisted's default is 50): a burst of
# connections to a busy event loop would otherwise lose SYNs, each retried a second later.
LISTEN_BACKLOG = 1024


def daphne_argv(port: int, *options: str) -> list[str]:
    """Daphne on 127.0.0.1:``port`` as the Makefile starts it, with ``options``."""
    daphne = Path(sys.executable).with_name("daphne")
    endpoint = f"tcp:port={port}:interface=127.0.0.1:backlog={LISTEN_BACKLOG}"
    return [str(daphne), "-e", endpoint, *options, "chatsite.asgi:application"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def database_env() -> dict[str, str]:
    """Point the server at the database pytest-django created for this run."""
    db = settings.DATABASES["default"]
    if db["ENGINE"] == "django.db.backends.postgresql":
        auth = db["USER"] + (f":{db['PASSWORD']}" if db.get("PASSWORD") else "")
        return {"DATABASE_URL": f"postgresql://{auth}@{db['HOST']}:{db['PORT'] or 5432}/{db['NAME']}"}
    return {"SQLITE_PATH": str(db["NAME"])}


def launch_live_site(
    model_dir: Path, log_dir: Path, *, without: tuple[str, ...] = (), **extra_env: str
) -> LiveSite:
    """Start Daphne; :func:`wait_until_ready` waits for its engine. By default each site
    gets its own process-registry prefix, so it is a site of its own on a shared Redis.
    ``without``: environment variables the site must not see (``REDIS_URL``: eager Celery)."""
    port = free_port()
    # No model-written titles unless a test asks: they would rename conversations mid-test.
    # Test clients reuse one key for many calls; the rate limit has its own tests.
    env = {
        "TITLES_FROM_MODEL": "false",
        "API_RATE_LIMIT_PER_MINUTE": "100000",
        # fp32 products on purpose: these sites' tests compare embeddings and prompt
        # log-probs with transformers' fp32 (the bf16 default has its own site test,
        # tests/chat/test_cpu_matmul_default.py).
        "ENGINE_CPU_MATMUL": "fp32",
        "ENGINE_KV_CACHE_DTYPE": "model",
        **os.environ,
        **database_env(),
        "CLUSTER_PREFIX": f"test-{uuid.uuid4().hex[:8]}",
        "METRICS_TOKEN": METRICS_TOKEN,
        **extra_env,
    }
    env.update(ENGINE_MODEL=str(model_dir), ENGINE_PRELOAD="true", DJANGO_SETTINGS_MODULE="chatsite.settings")
    for name in ("DJANGO_ALLOW_ASYNC_UNSAFE", *without):
        env.pop(name, None)
    log_path = log_dir / f"daphne-{port}.log"
    process = subprocess.Popen(
        daphne_argv(port),
        cwd=ROOT,
        env=env,
        stdout=log_path.open("w"),
        stderr=subprocess.STDOUT,
    )
    return LiveSite(url=f"http://127.0.0.1:{port}", process=process, log_path=log_path)


def start_live_site(model_dir: Path, log_dir: Path, **extra_env: str) -> LiveSite:
    return wait_until_ready(launch_live_site(model_dir, log_dir, **extra_env))


def start_slow_live_site(model_dir: Path, log_dir: Path, step_seconds: float = 0.01) -> LiveSite:
    """A live site whose every forward pass takes at least ``step_seconds``: the tiny model
    alone finishes long answers before a test can act on them mid-way."""
    return start_live_site(
        model_dir,
        log_dir,
        ENGINE_LOADER="tests.support.slow_model.slow_tiny_model",
        SLOW_MODEL_STEP_SECONDS=str(step_seconds),
    )


def health_details(url: str, timeout: float = 10) -> dict:
    """/healthz's details (the engine's state and stats, the process) for a live site."""
    return httpx.get(f"{url}/healthz", headers=METRICS_AUTH, timeout=timeout).json()["details"]


def wait_until_ready(site: LiveSite) -> LiveSite:
    def engine_ready() -> bool:
        engine = health_details(site.url, timeout=2)["engine"]
        if engine["state"] == "error":
            raise RuntimeError(f"engine failed to load: {engine}")
        return bool(engine["ready"])

    wait_until_answering(
        site.process, engine_ready, name="daphne", log=site.log, seconds=120, interval=0.5, stop_timeout=15
    )
    return site


def stop_live_site(site: LiveSite) -> None:
    stop_process(site.process, 15)
