"""The same settings module picks its backends from the environment."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROBE = (
    "import django, json; django.setup(); from django.conf import settings as s;"
    "print(json.dumps({'db': s.DATABASES['default']['ENGINE'], 'layer': s.CHANNEL_LAYERS['default']['BACKEND'],"
    "'eager': s.CELERY_TASK_ALWAYS_EAGER, 'propagates': s.CELERY_TASK_EAGER_PROPAGATES,"
    "'broker': s.CELERY_BROKER_URL, 'conn_max_age': s.DATABASES['default']['CONN_MAX_AGE'],"
    "'device': s.ENGINE['device'], 'options': s.DATABASES['default'].get('OPTIONS', {}),"
    "'cache': s.CACHES['default']['BACKEND']}))"
)


def probe(**env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    clean.update(env, DJANGO_SETTINGS_MODULE="chatsite.settings")
    return subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=clean, capture_output=True, text=True)


def run_manage(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    clean.update(env)
    return subprocess.run(
        [sys.executable, "manage.py", *args], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=60
    )


def test_no_variables_means_sqlite_in_memory_layer_eager_celery_and_cpu():
    result = probe()
    assert result.returncode == 0, result.stderr
    chosen = json.loads(result.stdout)
    assert chosen["db"] == "django.db.backends.sqlite3"
    assert "journal_mode=WAL" in chosen["options"]["init_command"]
    assert chosen["options"]["timeout"] > 0
    assert chosen["layer"] == "conversations.cluster.memory_layer.LeanInMemoryChannelLayer"
    assert chosen["eager"] is True and chosen["propagates"] is True
    assert chosen["device"] == "cpu"
    assert chosen["conn_max_age"] == 0
    assert chosen["cache"] == "django.core.cache.backends.locmem.LocMemCache"


def test_database_url_switches_to_postgresql_and_redis_url_to_redis_layer_and_broker():
    result = probe(DATABASE_URL="postgresql://u@db.invalid:5432/x", REDIS_URL="redis://cache.invalid:6379/0")
    assert result.returncode == 0, result.stderr
    chosen = json.loads(result.stdout)
    assert chosen["db"] == "django.db.backends.postgresql"
    assert chosen["conn_max_age"] == 0
    assert chosen["layer"] == "conversations.cluster.channel_layer.PumpedRedisChannelLayer"
    assert chosen["eager"] is False
    assert chosen["broker"] == "redis://cache.invalid:6379/0"
    # Login failures and API rate limits are then counted in Redis, across processes.
    assert chosen["cache"] == "django.core.cache.backends.redis.RedisCache"


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("DATABASE_URL", "postgresql://nobody@127.0.0.1:1/nothing"),
        ("REDIS_URL", "redis://127.0.0.1:1/0"),
        ("DATABASE_URL", ""),
        ("DATABASE_URL", "mysql://x@y/z"),
    ],
)
def test_unreachable_or_bad_service_url_fails_with_one_line_naming_the_variable(variable, value):
    result = run_manage("migrate", "--check", **{variable: value})
    assert result.returncode != 0
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert variable in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("value", "expected"), [("", 0.001), ("2.5", 0.0025)], ids=["default", "set"])
def test_a_server_process_hands_the_gil_over_at_the_configured_interval(value: str, expected: float):
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "REDIS_URL"}}
    env.pop("GIL_SWITCH_INTERVAL_MS", None)
    if value:
        env["GIL_SWITCH_INTERVAL_MS"] = value
    code = "import chatsite.asgi, sys; print(sys.getswitchinterval())"
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert float(result.stdout.split()[-1]) == pytest.approx(expected)
