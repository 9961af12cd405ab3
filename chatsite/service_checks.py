"""Start-up checks: a configured service that cannot be reached stops the process
with one line naming the variable, instead of a traceback on the first request."""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor

from chatsite.env import ConfigError
from conversations.ops.model_settings import check_fit


def check_database() -> None:
    from django.conf import settings
    from django.db import connection

    if not settings.DATABASE_URL:
        return
    try:
        connection.ensure_connection()
    except Exception as exc:  # any driver error means the same thing to an operator
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"DATABASE_URL: cannot connect to the database ({first_line})") from None
    finally:
        connection.close()


def check_redis() -> None:
    from django.conf import settings

    if not settings.REDIS_URL:
        return
    import redis

    try:
        client = redis.Redis.from_url(settings.REDIS_URL, socket_connect_timeout=3, socket_timeout=3)
        client.ping()
        client.close()
    except Exception as exc:
        raise ConfigError(f"REDIS_URL: cannot connect to Redis ({exc})") from None


def check_models_fit() -> None:
    """The served models' weights and KV pools fit ENGINE_MEMORY_GB (the machine's memory)."""
    from django.conf import settings

    try:
        check_fit(settings.ENGINE_MODEL_LIST, settings.ENGINE_MEMORY_GB)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def exit_if_unreachable() -> None:
    import django

    def checks() -> None:
        django.setup()
        check_models_fit()
        check_database()
        check_redis()

    try:
        # In a thread: the ORM refuses to connect from inside a running event loop,
        # which is where an ASGI server (or an async test) imports chatsite.asgi.
        with ThreadPoolExecutor(max_workers=1) as pool:
            pool.submit(checks).result()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(1)
