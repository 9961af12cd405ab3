"""One settings module, driven by the environment (the healthchecks style).

With no variables set: SQLite (WAL), the in-memory channel layer, eager Celery,
and the inference engine on the CPU. DATABASE_URL switches to PostgreSQL,
REDIS_URL to the Redis channel layer and a Redis Celery broker.
"""

from __future__ import annotations

from pathlib import Path

import dj_database_url

from chatsite import secret_key
from chatsite.engine_settings import engine_options
from chatsite.env import ConfigError, env_bool, env_float, env_int, env_list, env_str, env_url
from conversations.ops import files
from conversations.ops.model_settings import LOAD_MODES, ModelEntry, parse_models

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("VAR_DIR", str(BASE_DIR / "var")))
try:
    # Owner-only (0700): it holds the database and the secret key. Refused if others could write to it.
    files.prepare_data_dir(VAR_DIR)
except OSError as exc:
    raise ConfigError(f"VAR_DIR: {exc}") from None

DEBUG = env_bool("DEBUG", False)
SECRET_KEY = env_str("SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG and env_bool("REQUIRE_SECRET_KEY", False):
        raise ConfigError("SECRET_KEY must be set when REQUIRE_SECRET_KEY is true")
    # Generated once and kept (mode 0600) in the data directory: no key lives in the repository.
    SECRET_KEY = secret_key.load_or_create(VAR_DIR)
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
    # The request's user and client, for audit entries written by signal receivers.
    "conversations.audit.context.AuditContextMiddleware",
    # Single sign-on sessions checked with the identity provider when due.
    "conversations.accounts.sso.refresh.SsoRefreshMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "chatsite.security.ContentSecurityPolicyMiddleware",
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
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    try:
        # Created 0600 before SQLite opens it: its -wal and -shm files take the same mode.
        files.prepare_sqlite_database(DATABASES["default"]["NAME"])
    except OSError as exc:
        raise ConfigError(f"{'DATABASE_URL' if DATABASE_URL else 'SQLITE_PATH'}: {exc}") from None
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Channels and Celery ------------------------------------------------------
REDIS_URL = env_url("REDIS_URL", ("redis", "rediss", "unix"))
if REDIS_URL:
    _REDIS_LAYER = {
        # channels_redis's layer, read by one task per process so that a consumer's
        # disconnect cannot lose another's message (conversations.cluster.channel_layer).
        "BACKEND": "conversations.cluster.channel_layer.PumpedRedisChannelLayer",
        "CONFIG": {
            # redis-py 6+ defaults to a 5 s socket timeout, the same length as the layer's
            # blocking BZPOPMIN, so idle receives would race it and fail: allow longer.
            "hosts": [{"address": REDIS_URL, "socket_timeout": 30}],
            "capacity": 1000,
            "expiry": 60,
        },
    }
    CHANNEL_LAYERS = {
        "default": _REDIS_LAYER,
        # Each process's own channel (conversations.cluster.process_loop) on a layer instance
        # of its own (its own Redis list and reader): tabs' traffic never delays or touches it.
        "cluster": _REDIS_LAYER,
    }
    CELERY_BROKER_URL = REDIS_URL
    CELERY_TASK_ALWAYS_EAGER = False
    # Shared by every process: login-failure and API rate-limit counters live here.
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "chatsite",
            "OPTIONS": {"socket_connect_timeout": 3, "socket_timeout": 3},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "conversations.cluster.memory_layer.LeanInMemoryChannelLayer"}}
    CELERY_BROKER_URL = "memory://"
    CELERY_TASK_ALWAYS_EAGER = True
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A task is acknowledged after it ran, so a worker that dies mid-task leaves it to another.
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1

# --- Background jobs (conversations.tasks) ---------------------------------------
# Titles: after a conversation's first answer a live site process's engine writes a short one.
TITLES_FROM_MODEL = env_bool("TITLES_FROM_MODEL", True)
TITLE_REPLY_SECONDS = env_float("TITLE_REPLY_SECONDS", 20.0)  # wait for a site process to answer
TITLE_RETRY_SECONDS = env_float("TITLE_RETRY_SECONDS", 60.0)  # then try again this much later
TITLE_MAX_RETRIES = env_int("TITLE_MAX_RETRIES", 10)
# Export and import.
IMPORT_MAX_BYTES = env_int("IMPORT_MAX_BYTES", 20_000_000)
IMPORT_MAX_MESSAGES = env_int("IMPORT_MAX_MESSAGES", 100_000)
IMPORT_MAX_CONVERSATIONS = env_int("IMPORT_MAX_CONVERSATIONS", 10_000)
EXPORT_INLINE_MAX_MESSAGES = env_int("EXPORT_INLINE_MAX_MESSAGES", 2_000)  # larger: a task
DATA_JOB_RETENTION_HOURS = env_float("DATA_JOB_RETENTION_HOURS", 24.0)
# Housekeeping (celery beat): how often each job runs (seconds) and what it keeps.
ORPHAN_SWEEP_SECONDS = env_float("ORPHAN_SWEEP_SECONDS", 300.0)
PURGE_SWEEP_SECONDS = env_float("PURGE_SWEEP_SECONDS", 3600.0)
DELETED_CONVERSATION_RETENTION_DAYS = env_float("DELETED_CONVERSATION_RETENTION_DAYS", 30.0)
API_REQUEST_RETENTION_DAYS = env_float("API_REQUEST_RETENTION_DAYS", 90.0)
# Audit log entries older than this are deleted by the housekeeping sweep; 0 keeps them all.
AUDIT_RETENTION_DAYS = env_float("AUDIT_RETENTION_DAYS", 365.0)
SESSION_SWEEP_SECONDS = env_float("SESSION_SWEEP_SECONDS", 86400.0)
# Temporary chats: purged once their tab closes them (at the next sweep) and at the latest
# this long after they were started.
TEMPORARY_CHAT_MAX_AGE_SECONDS = env_float("TEMPORARY_CHAT_MAX_AGE_SECONDS", 3600.0)
TEMPORARY_CHAT_SWEEP_SECONDS = env_float("TEMPORARY_CHAT_SWEEP_SECONDS", 300.0)
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")  # beat's own state, not in the repo
CELERY_BEAT_SCHEDULE = {
    "interrupt-orphan-answers": {
        "task": "conversations.tasks.interrupt_orphan_answers",
        "schedule": ORPHAN_SWEEP_SECONDS,
    },
    "purge-deleted-conversations": {
        "task": "conversations.tasks.purge_deleted_conversations",
        "schedule": PURGE_SWEEP_SECONDS,
    },
    "purge-temporary-conversations": {
        "task": "conversations.tasks.purge_temporary_conversations",
        "schedule": TEMPORARY_CHAT_SWEEP_SECONDS,
    },
    "prune-api-requests": {"task": "conversations.tasks.prune_api_requests", "schedule": PURGE_SWEEP_SECONDS},
    "prune-audit-log": {"task": "conversations.tasks.prune_audit_log", "schedule": PURGE_SWEEP_SECONDS},
    "prune-data-jobs": {"task": "conversations.tasks.prune_data_jobs", "schedule": PURGE_SWEEP_SECONDS},
    "clear-expired-sessions": {
        "task": "conversations.tasks.clear_expired_sessions",
        "schedule": SESSION_SWEEP_SECONDS,
    },
}


# --- Inference engine ----------------------------------------------------------
ENGINE = engine_options()  # chatsite.engine_settings reads each ENGINE_* variable
ENGINE_PRELOAD = env_bool("ENGINE_PRELOAD", False)


# Several models in one process (conversations.ops.model_settings says the forms): each has its own
# engine, built from ENGINE with its path and its share of ENGINE_KV_CACHE_GB.
def _engine_models() -> list[ModelEntry]:
    try:
        return parse_models(
            env_str("ENGINE_MODELS", ""),
            env_str("ENGINE_MODEL", ""),
            ENGINE["kv_cache_gb"],
            kv_gb=env_str("ENGINE_MODEL_KV_GB", ""),
            kv_shares=env_str("ENGINE_MODEL_KV_SHARES", ""),
            descriptions=env_str("ENGINE_MODEL_DESCRIPTIONS", ""),
            staff_models=env_str("ENGINE_STAFF_MODELS", ""),
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


ENGINE_MODEL_LIST = _engine_models()
# Models and adapters only staff may use (until groups decide access): names, comma separated.
ENGINE_STAFF_MODELS = env_str("ENGINE_STAFF_MODELS", "")
ENGINE_MODELS_LOAD = env_str("ENGINE_MODELS_LOAD", "first_use")
if ENGINE_MODELS_LOAD not in LOAD_MODES:
    raise ConfigError(
        f"ENGINE_MODELS_LOAD: expected one of {', '.join(LOAD_MODES)}, got {ENGINE_MODELS_LOAD!r}"
    )
# A model nobody used for this many seconds is unloaded (0: never); it loads again when asked for.
ENGINE_MODEL_IDLE_UNLOAD_S = env_float("ENGINE_MODEL_IDLE_UNLOAD_S", 0.0)
# The memory the models' weights and KV pools must fit together at start (0: the machine's).
ENGINE_MEMORY_GB = env_float("ENGINE_MEMORY_GB", 0.0)
# The model (a name from ENGINE_MODELS) that writes conversation titles; empty: the first.
TITLE_MODEL = env_str("TITLE_MODEL", "")
# LoRA adapters served on a base model: "name=/path/to/peft/dir" (on the first model) or
# "name=base:/path"; admins add more at run time (/v1/load_lora_adapter). At most
# ENGINE_MAX_LORAS adapters are resident per model; the least recently used goes to host memory.
ENGINE_LORA_MODULES = env_str("ENGINE_LORA_MODULES", "")
ENGINE_MAX_LORAS = env_int("ENGINE_MAX_LORAS", 4)
# Documents (conversations.documents): an embedding model directory (a Hugging Face encoder) for
# /v1/embeddings and retrieval; empty: the served model's mean-pooled last hidden state.
EMBEDDING_MODEL = env_str("EMBEDDING_MODEL", "")
DOCUMENT_MAX_BYTES = env_int("DOCUMENT_MAX_BYTES", 10_000_000)  # one uploaded file
DOCUMENT_USER_MAX_BYTES = env_int("DOCUMENT_USER_MAX_BYTES", 100_000_000)  # all of one user's files
DOCUMENT_USER_MAX_FILES = env_int("DOCUMENT_USER_MAX_FILES", 200)
DOCUMENT_MAX_PAGES = env_int("DOCUMENT_MAX_PAGES", 2_000)  # PDF pages read; more is refused
# Uploads one user may make per hour (each is read and embedded in the background); 0: no limit.
DOCUMENT_UPLOADS_PER_HOUR = env_int("DOCUMENT_UPLOADS_PER_HOUR", 30)
# A running answer's new tokens reach its stream (SSE chunk, websocket delta) at most this
# often; its first and last tokens go at once. 0 = after every engine step.
ENGINE_STREAM_INTERVAL_MS = env_float("ENGINE_STREAM_INTERVAL_MS", 30.0)
# A server process's threads (the event loop, the engine, the database threads) share one
# GIL; one that wants it waits for the holder to let go, at most this long (Python's
# default: 5 ms). Every token the engine thread hands the event loop pays that wait.
GIL_SWITCH_INTERVAL_MS = env_float("GIL_SWITCH_INTERVAL_MS", 1.0)
# A served process runs full garbage collections when its engine is idle, and at least this
# often (seconds) under constant load; 0 leaves them to CPython's own schedule.
GC_FULL_MAX_INTERVAL_S = env_float("GC_FULL_MAX_INTERVAL_S", 300.0)
# Tests only: the dotted path of a callable returning load_model's (model, tokenizer, config)
# triple, used instead of loading ENGINE["model"] (e.g. a scripted reasoning model for
# real server processes, which cannot be patched from the test).
ENGINE_LOADER = env_str("ENGINE_LOADER", "")
# /metrics is open to staff sessions, and to "Authorization: Bearer <token>" when this is set.
METRICS_TOKEN = env_str("METRICS_TOKEN", "")
# How long an answer keeps generating after its last watcher disconnected.
GENERATION_GRACE_SECONDS = env_float("GENERATION_GRACE_SECONDS", 30.0)
# Seconds the connection of the thread running the chat's database calls is kept
# (conversations.ops.db_thread); 0: one per call, as in every other thread.
DB_THREAD_CONN_MAX_AGE = env_float("DB_THREAD_CONN_MAX_AGE", 300.0)
# How often a streaming answer's partial text is written to the database.
PARTIAL_SAVE_SECONDS = env_float("PARTIAL_SAVE_SECONDS", 2.0)
# SIGTERM: live answers are saved as interrupted and background work is cut short; the
# process is gone at most this long after the signal (keep it under the supervisor's kill timeout).
SHUTDOWN_TIMEOUT_SECONDS = env_float("SHUTDOWN_TIMEOUT_SECONDS", 8.0)
# The largest websocket message the server sends: Daphne's --websocket_max_message_size (1 MiB
# unless Daphne is started with another; keep the two equal). A tab gets the thread in pages of
# at most CHAT_THREAD_PAGE_MESSAGES (and about a third of this), newest first; a text over an
# eighth of it is sent cut, the page fetching the rest over HTTP.
WEBSOCKET_MAX_MESSAGE_BYTES = env_int("WEBSOCKET_MAX_MESSAGE_BYTES", 1024 * 1024)
CHAT_THREAD_PAGE_MESSAGES = env_int("CHAT_THREAD_PAGE_MESSAGES", 100)
# Answers one user may have being written at once, over the whole site.
MAX_LIVE_PER_USER = env_int("MAX_LIVE_PER_USER", 4)
# Tools through MCP in the chat (conversations.chat.tool_loop): rounds of calls per answer,
# and the characters of one tool result the model gets.
CHAT_TOOL_MAX_ROUNDS = env_int("CHAT_TOOL_MAX_ROUNDS", 5)
CHAT_TOOL_OUTPUT_MAX_CHARS = env_int("CHAT_TOOL_OUTPUT_MAX_CHARS", 8000)
# Calls one answer may make (the rest get an error result, unrun), and stdio tool servers
# (each a process; the built-in one a Python running django.setup()) running at once per
# server process: more calls wait for a slot within their server's timeout.
CHAT_TOOL_MAX_CALLS = env_int("CHAT_TOOL_MAX_CALLS", 8)
# The streamable-HTTP MCP servers the site may reach, as URL prefixes (comma-separated; same
# scheme, host and port, a path at or below): a server row with any other URL is refused when
# saved and never contacted. Empty: no HTTP servers. (Stdio servers are a superuser's alone.)
MCP_HTTP_ALLOWED_URLS = env_list("MCP_HTTP_ALLOWED_URLS", [])
CHAT_TOOL_MAX_PROCESSES = env_int("CHAT_TOOL_MAX_PROCESSES", 4)
# Several processes (REDIS_URL set): the Redis key prefix of the process registry (processes
# with the same prefix act as one site), and how much busier than the least-loaded process
# (running + waiting requests) a conversation's last process may be and still get its next turn.
CLUSTER_PREFIX = env_str("CLUSTER_PREFIX", "chatsite")
AFFINITY_MAX_EXTRA_LOAD = env_int("AFFINITY_MAX_EXTRA_LOAD", 8)
# Whether this process advertises itself, listens for forwarded answers and fails over dead
# processes' answers (conversations.cluster.process_loop). Off only in a process that is no server
# of the site, such as the test runner's (its in-process consumers still relay and route).
CLUSTER_ADVERTISE = env_bool("CLUSTER_ADVERTISE", True)
# An answer forwarded to another process that this one has not claimed within this many
# seconds is taken back and generated here (conversations.cluster.handoff).
CLUSTER_ACK_SECONDS = env_float("CLUSTER_ACK_SECONDS", 3.0)
API_MAX_BODY_BYTES = env_int("API_MAX_BODY_BYTES", 1_000_000)
# Requests per API key per minute (a key's own limit, set in the admin, wins).
API_RATE_LIMIT_PER_MINUTE = env_int("API_RATE_LIMIT_PER_MINUTE", 60)
# Completions one API request may ask for: n x number of prompts.
API_MAX_SEQUENCES_PER_REQUEST = env_int("API_MAX_SEQUENCES_PER_REQUEST", 16)
# Structured outputs and tools: a grammar (JSON schema, regex, EBNF) that does not compile
# within this many seconds is a 400.
API_GRAMMAR_COMPILE_TIMEOUT = env_float("API_GRAMMAR_COMPILE_TIMEOUT", 10.0)
# Tool calls one chat completion choice may make when parallel calls are allowed (the grammar
# ends the answer after this many; a model's family may allow fewer).
API_TOOL_MAX_PARALLEL_CALLS = env_int("API_TOOL_MAX_PARALLEL_CALLS", 8)
# Caps checked before a grammar compiles (conversations.api.grammar_limits): a JSON schema's
# size (tools' parameters too) and a regex's or EBNF's counted repetition ({n}, {n,m}).
API_GRAMMAR_MAX_SCHEMA_BYTES = env_int("API_GRAMMAR_MAX_SCHEMA_BYTES", 65_536)
API_GRAMMAR_MAX_REPEAT = env_int("API_GRAMMAR_MAX_REPEAT", 1000)
# Prefix-cache privacy: each user's KV blocks after the shared system prompt (chat, titles,
# API calls) are salted with the user, so time to first token cannot tell whether another
# user sent the same text (conversations/chat/cache_salt.py).
# Off for single-user deployments that want cross-conversation sharing of everything.
PREFIX_CACHE_SALT = env_bool("PREFIX_CACHE_SALT", True)
DATA_UPLOAD_MAX_MEMORY_SIZE = max(API_MAX_BODY_BYTES, 2_621_440)
# The largest request body the server receives at all (chatsite.body_limit): by default the
# largest any view accepts, an import file plus its form's framing. Daphne would otherwise
# take in a body of any size before Django could look at it.
IMPORT_FORM_OVERHEAD_BYTES = 65_536
REQUEST_MAX_BODY_BYTES = env_int(
    "REQUEST_MAX_BODY_BYTES",
    max(IMPORT_MAX_BYTES + IMPORT_FORM_OVERHEAD_BYTES, DATA_UPLOAD_MAX_MEMORY_SIZE, API_MAX_BODY_BYTES),
)

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
ALLOW_SIGNUP = env_bool("ALLOW_SIGNUP", True)
# Sign-in with a username and password (the site's and the admin's pages). Off for an SSO-only
# site; signup is then closed too.
ALLOW_LOCAL_LOGIN = env_bool("ALLOW_LOCAL_LOGIN", True)
# Single sign-on with an OpenID Connect provider (conversations.accounts.sso), on when the
# issuer is set: its endpoints come from {issuer}/.well-known/openid-configuration.
OIDC_ISSUER = env_str("OIDC_ISSUER", "")
OIDC_PROVIDER_NAME = env_str("OIDC_PROVIDER_NAME", "your organisation")  # "Sign in with …"
OIDC_RP_CLIENT_ID = env_str("OIDC_CLIENT_ID", "")
OIDC_RP_CLIENT_SECRET = env_str("OIDC_CLIENT_SECRET", "")
OIDC_RP_SCOPES = env_str("OIDC_SCOPES", "openid email profile")
OIDC_RP_SIGN_ALGO = env_str("OIDC_SIGN_ALGO", "RS256")
OIDC_USE_PKCE = True
# Claims mapped to the user: the new account's username, e-mail and names; the groups claim
# (empty: groups are not taken from the provider) sets the user's groups at every sign-in and refresh.
OIDC_USERNAME_CLAIM = env_str("OIDC_USERNAME_CLAIM", "preferred_username")
OIDC_EMAIL_CLAIM = env_str("OIDC_EMAIL_CLAIM", "email")
OIDC_FIRST_NAME_CLAIM = env_str("OIDC_FIRST_NAME_CLAIM", "given_name")
OIDC_LAST_NAME_CLAIM = env_str("OIDC_LAST_NAME_CLAIM", "family_name")
OIDC_GROUPS_CLAIM = env_str("OIDC_GROUPS_CLAIM", "groups")
# How often a signed-in SSO user's session is checked with the provider (a refresh-token
# exchange): a user deactivated there is signed out here at the next check.
OIDC_REFRESH_SECONDS = env_float("OIDC_REFRESH_SECONDS", 900.0)
OIDC_TIMEOUT = 10
if not ALLOW_LOCAL_LOGIN and not OIDC_ISSUER:
    raise ConfigError("ALLOW_LOCAL_LOGIN=false needs single sign-on (OIDC_ISSUER), or nobody could sign in")
if OIDC_ISSUER and not (OIDC_RP_CLIENT_ID and OIDC_RP_CLIENT_SECRET):
    raise ConfigError("OIDC_ISSUER needs OIDC_CLIENT_ID and OIDC_CLIENT_SECRET")
AUTHENTICATION_BACKENDS = [
    *(["django.contrib.auth.backends.ModelBackend"] if ALLOW_LOCAL_LOGIN else []),
    *(["conversations.accounts.sso.backend.SsoBackend"] if OIDC_ISSUER else []),
]
# Share links open for signed-in users of the site only, unless this lets anyone with the link read them.
ALLOW_PUBLIC_SHARES = env_bool("ALLOW_PUBLIC_SHARES", False)
# Each share copies a whole branch: live share links per user (a revoked one frees its place),
# and new shares (and, counted apart, continued copies of shares) per user per hour. 0: no cap.
SHARE_MAX_PER_USER = env_int("SHARE_MAX_PER_USER", 100)
SHARES_PER_HOUR = env_int("SHARES_PER_HOUR", 30)
# Failed logins for one username from one client within the window; more answer 429.
LOGIN_FAILURE_LIMIT = env_int("LOGIN_FAILURE_LIMIT", 10)
LOGIN_FAILURE_WINDOW = env_int("LOGIN_FAILURE_WINDOW", 900)

# --- Security headers and cookies ------------------------------------------------------
# Django's database sessions, their read prepared once (conversations.accounts.sessions).
SESSION_ENGINE = "conversations.accounts.sessions"
SESSION_COOKIE_HTTPONLY = True
SECURE_COOKIES = env_bool("SECURE_COOKIES", False)
SESSION_COOKIE_SECURE = SECURE_COOKIES
CSRF_COOKIE_SECURE = SECURE_COOKIES
if SECURE_COOKIES:
    # Behind a TLS-terminating proxy that sets X-Forwarded-Proto (and strips a client's own).
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_HSTS_SECONDS = env_int("HSTS_SECONDS", 31_536_000)
    # Opt-ins (check --deploy's W005, W021): they bind every subdomain to HTTPS, and a
    # preloaded domain is baked into browsers for months.
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("HSTS_INCLUDE_SUBDOMAINS", False)
    SECURE_HSTS_PRELOAD = env_bool("HSTS_PRELOAD", False)
# Off by default: local runs serve plain HTTP. Behind a TLS proxy it needs SECURE_COOKIES too
# (the proxy header), or every request looks like HTTP and redirects forever.
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
# Probes and scrapes reach each process directly over HTTP; a redirect to the public HTTPS
# address would land on whichever process the proxy picks.
SECURE_REDIRECT_EXEMPT = [r"^health$", r"^healthz$", r"^livez$", r"^metrics$"]
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# Sent with every HTML page (chatsite.security). Scripts only from this origin (no inline
# ones), images only from it and data: (a Markdown image in an answer cannot call out).
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self' 'unsafe-inline'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'self'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)

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

STATIC_ROOT.mkdir(exist_ok=True)
