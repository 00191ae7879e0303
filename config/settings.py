"""Settings for gpushare, read from environment variables (docs/CONFIGURATION.md lists them).

The defaults run a fresh checkout: a SQLite file under var/ and a local Redis.
"""

import logging
from pathlib import Path
from typing import Any

import dj_database_url
import django_stubs_ext

from config.dumpable import forbid_dumps
from config.files_storage import files_storage_config
from config.secret_key import secret_key
from config.sqlite import sqlite_options
from plumbing.env import env_bool, env_float, env_int, env_list, env_numbers, env_str
from plumbing.json_logs import log_format
from plumbing.redis import check_cluster_settings, sentinel_broker_url, sentinel_tls, ssl_options

# Lets generic admin/serializer classes be subscripted at run time, as the type hints do.
django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("GPUSHARE_VAR_DIR", str(BASE_DIR / "var")))

# False: each process that loads these settings clears its dumpable flag, so that no other
# process of its user (an engine) reads its environment or memory (config/dumpable.py).
# True lets a debugger or profiler of the same user attach (py-spy, gdb).
GPUSHARE_DUMPABLE = env_bool("GPUSHARE_DUMPABLE", False)
if not GPUSHARE_DUMPABLE:
    forbid_dumps()

# DJANGO_SECRET_KEY, else a random key made once on this machine (config/secret_key.py).
SECRET_KEY = secret_key(env_str("DJANGO_SECRET_KEY", ""), VAR_DIR / "secret_key")
DEBUG = env_bool("DJANGO_DEBUG", False)
# Served over HTTPS (TLS ended by a proxy that sets X-Forwarded-Proto): cookies only over
# HTTPS, HSTS, plain HTTP redirected. The probes and Prometheus call the pods over plain
# HTTP, so /healthz, /readyz, /metrics and /metrics/cluster are not redirected.
HTTPS = env_bool("DJANGO_HTTPS", False)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = SECURE_SSL_REDIRECT = HTTPS
SECURE_HSTS_SECONDS = 365 * 24 * 3600 if HTTPS else 0
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_HSTS_PRELOAD = HTTPS
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https") if HTTPS else None
SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^readyz$", r"^metrics$", r"^metrics/cluster$"]
# Messages are kept in the server-side session, not in a cookie: the admin's message that
# shows a new API key once would otherwise travel, readable, in the browser's cookie.
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "staff",
    "audit",
    "tenants",
    "billing",
    "scheduler",
    "telemetry",
    "console",
    "portal",
    "mozilla_django_oidc",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Serves the admin, console and API-docs assets from the web process. It must be async
    # capable (WhiteNoise is not): one sync middleware makes Django run every async view in a
    # thread of its own, so a streaming request would hold a thread for its whole life.
    "servestatic.middleware.ServeStaticMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    # Who changes what, for the audit log (audit/context.py).
    "audit.middleware.AuditActorMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"

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

WSGI_APPLICATION = "config.wsgi.application"
ASGI_APPLICATION = "config.asgi.application"

DATABASES = {
    "default": dj_database_url.parse(env_str("DATABASE_URL", f"sqlite:///{VAR_DIR / 'db.sqlite3'}"))
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # A connection pool per process, not persistent connections: under ASGI each request's
    # sync work runs in a thread of its own, and persistent connections would pile up one
    # per thread until PostgreSQL refuses more.
    DATABASES["default"]["OPTIONS"] = {
        "pool": {
            "min_size": env_int("DATABASE_POOL_MIN", 2),
            "max_size": env_int("DATABASE_POOL_MAX", 20),
            "timeout": env_float("DATABASE_POOL_TIMEOUT_S", 10.0),
        }
    }
elif DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    DATABASES["default"]["OPTIONS"] = sqlite_options(env_float("DATABASE_SQLITE_TIMEOUT_S", 20.0))
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "static"
STATICFILES_DIRS = [BASE_DIR / "static"]

LOGIN_URL = "/admin/login/"

# The tenant portal (/portal/) and its single sign-on (docs/SSO.md). Staff sign in with a
# password at /admin/login/; tenants' people through the OpenID Connect provider when
# OIDC_RP_CLIENT_ID is set, else with the password they chose on an invitation's link.
GPUSHARE_PORTAL_INVITATION_DAYS = env_int("GPUSHARE_PORTAL_INVITATION_DAYS", 7)
OIDC_RP_CLIENT_ID = env_str("OIDC_RP_CLIENT_ID", "")
OIDC_RP_CLIENT_SECRET = env_str("OIDC_RP_CLIENT_SECRET", "")
OIDC_RP_SIGN_ALGO = env_str("OIDC_RP_SIGN_ALGO", "RS256")
OIDC_RP_SCOPES = env_str("OIDC_RP_SCOPES", "openid email")
OIDC_OP_AUTHORIZATION_ENDPOINT = env_str("OIDC_OP_AUTHORIZATION_ENDPOINT", "")
OIDC_OP_TOKEN_ENDPOINT = env_str("OIDC_OP_TOKEN_ENDPOINT", "")
OIDC_OP_USER_ENDPOINT = env_str("OIDC_OP_USER_ENDPOINT", "")
OIDC_OP_JWKS_ENDPOINT = env_str("OIDC_OP_JWKS_ENDPOINT", "")
OIDC_OP_LOGOUT_ENDPOINT = env_str("OIDC_OP_LOGOUT_ENDPOINT", "")
# A claim naming the tenants (slugs; a string or a list) a person belongs to, and the role
# it gives them; empty: people join tenants by invitation only.
GPUSHARE_OIDC_TENANT_CLAIM = env_str("GPUSHARE_OIDC_TENANT_CLAIM", "")
GPUSHARE_OIDC_TENANT_ROLE = env_str("GPUSHARE_OIDC_TENANT_ROLE", "member")
LOGIN_REDIRECT_URL = "/portal/"
LOGIN_REDIRECT_URL_FAILURE = "/portal/login/?failed=1"
AUTHENTICATION_BACKENDS = [
    "django.contrib.auth.backends.ModelBackend",
    "portal.sso.TenantOidcBackend",
]

# plain: a line of text; json: a JSON object a line (plumbing.json_logs), for a log pipeline.
GPUSHARE_LOG_FORMAT = log_format()
LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    # A line written about a request ends with its id, tenant and engine, those known
    # (plumbing.request_ids); a JSON line has them as fields.
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s%(request_tag)s"},
        "json": {"()": "plumbing.json_logs.JsonFormatter"},
    },
    "filters": {"request_id": {"()": "plumbing.request_ids.RequestIdFilter"}},
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": GPUSHARE_LOG_FORMAT,
            "filters": ["request_id"],
        }
    },
    "root": {"handlers": ["console"], "level": env_str("GPUSHARE_LOG_LEVEL", "INFO")},
    # A line per engine call (every request's /tokenize and generation) is noise, and CPU on
    # the request path; failures are logged by the platform's own code.
    "loggers": {name: {"level": "WARNING"} for name in ("httpx", "httpcore")},
}
if GPUSHARE_LOG_FORMAT == "json":
    # Python's warnings are written as log lines (logger `py.warnings`), not as text of their own.
    logging.captureWarnings(True)
    # uvicorn writes its own lines (the web's start, each request's access line) through
    # handlers of its own, in its own format: in JSON they go through the console's instead.
    LOGGING["loggers"] |= {
        name: {"handlers": ["console"], "propagate": False}
        for name in ("uvicorn", "uvicorn.error", "uvicorn.access")
    }

# --- Redis: the fair queue, live state, Celery's broker ---------------------------------
REDIS_URL = env_str("REDIS_URL", "redis://127.0.0.1:6379/0")
# Under Redis Sentinel (host:port, comma-separated) the sentinels say where the primary of
# the service GPUSHARE_REDIS_SENTINEL_MASTER is; REDIS_URL then gives only the database,
# credentials and TLS options (plumbing/redis.py). Empty: REDIS_URL's host is the Redis.
GPUSHARE_REDIS_SENTINELS = env_list("GPUSHARE_REDIS_SENTINELS", [])
GPUSHARE_REDIS_SENTINEL_MASTER = env_str("GPUSHARE_REDIS_SENTINEL_MASTER", "mymaster")
GPUSHARE_REDIS_SENTINEL_PASSWORD = env_str("GPUSHARE_REDIS_SENTINEL_PASSWORD", "")
# The sentinels are reached over TLS, with REDIS_URL's `ssl_*` options (plumbing/redis.py).
GPUSHARE_REDIS_SENTINEL_TLS = env_bool("GPUSHARE_REDIS_SENTINEL_TLS", False)
# REDIS_URL names one node of a Redis Cluster; the clients route every command to its
# slot's primary (plumbing/redis.py). Celery's broker cannot be a cluster: CELERY_BROKER_URL
# must then name a Redis (or sentinels) of its own.
GPUSHARE_REDIS_CLUSTER = env_bool("GPUSHARE_REDIS_CLUSTER", False)
# The fair queue's writes wait for this many replicas to acknowledge them (WAIT) before the
# platform acts on them: a write a promoted replica lacks then ran nothing and lost no
# answer (docs/decisions/0013-fence-the-fair-queue-with-wait.md). 0: no wait.
GPUSHARE_REDIS_REPLICAS_ACK = env_int("GPUSHARE_REDIS_REPLICAS_ACK", 0)
GPUSHARE_REDIS_REPLICAS_ACK_TIMEOUT_MS = env_int("GPUSHARE_REDIS_REPLICAS_ACK_TIMEOUT_MS", 1000)

# --- Celery ---------------------------------------------------------------------------
# Fairness is decided by our own queue in Redis; Celery only carries "run the next job of
# pool P" to a worker. So: no prefetch (a prefetched message would be run out of order),
# acks late and re-delivered if the worker dies, JSON only.
# Under Sentinel, kombu's sentinel transport, on the same sentinels, database and password.
CELERY_BROKER_URL = env_str(
    "CELERY_BROKER_URL",
    sentinel_broker_url(REDIS_URL, GPUSHARE_REDIS_SENTINELS)
    if GPUSHARE_REDIS_SENTINELS
    else REDIS_URL,
)
# A rediss:// broker verifies the server's certificate as redis-py does: kombu takes a
# rediss:// URL without `ssl_*` options as one that verifies nothing, so its options are
# spelled out (the URL's own, over redis-py's default of requiring the certificate). A
# sentinel:// broker's primary takes REDIS_URL's.
CELERY_BROKER_USE_SSL = ssl_options(
    REDIS_URL if CELERY_BROKER_URL.startswith("sentinel://") else CELERY_BROKER_URL
)
check_cluster_settings(
    cluster=GPUSHARE_REDIS_CLUSTER,
    redis_url=REDIS_URL,
    broker_url=CELERY_BROKER_URL,
    sentinels=GPUSHARE_REDIS_SENTINELS,
)
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, Any] = {
    # Well above the longest job, or Redis re-delivers a job that is still running.
    "visibility_timeout": env_int("CELERY_VISIBILITY_TIMEOUT_S", 6 * 3600),
    # How long a worker's BRPOP for messages waits before it is sent again (kombu's default:
    # 1 s). A message ends the wait at once; a shorter wait has an idle worker ask Redis
    # for nothing every second (docs/decisions/0007-periodic-work-on-each-workers-ticker.md).
    "polling_interval": env_float("CELERY_BROKER_POLLING_INTERVAL_S", 5.0),
}
if CELERY_BROKER_URL.startswith("sentinel://"):
    CELERY_BROKER_TRANSPORT_OPTIONS["master_name"] = GPUSHARE_REDIS_SENTINEL_MASTER
    _sentinel_kwargs: dict[str, Any] = {}
    if GPUSHARE_REDIS_SENTINEL_PASSWORD:
        _sentinel_kwargs["password"] = GPUSHARE_REDIS_SENTINEL_PASSWORD
    if (_tls := sentinel_tls(REDIS_URL, GPUSHARE_REDIS_SENTINEL_TLS)) is not None:
        _sentinel_kwargs.update(ssl=True, **_tls)
    if _sentinel_kwargs:
        CELERY_BROKER_TRANSPORT_OPTIONS["sentinel_kwargs"] = _sentinel_kwargs
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TIMEZONE = TIME_ZONE
# Beat keeps its schedule in memory: it sends only the telemetry rollup (every few minutes;
# the frequent jobs run on the workers' ticker, workers.periodic), so nothing is lost by
# forgetting the last run times on a restart, and a file-backed schedule costs beat more CPU.
# It wakes when an entry is due, not in a busy loop for the 10 ms before (config/beat.py;
# docs/decisions/0007-periodic-work-on-each-workers-ticker.md).
CELERY_BEAT_SCHEDULER = "config.beat:PunctualScheduler"

# --- REST framework -------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        # First: its `Bearer` is what a 401 asks for (WWW-Authenticate).
        "config.authentication.StaffBearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # Each view's permission by method, held by a staff role (staff/roles.py).
    "DEFAULT_PERMISSION_CLASSES": ["staff.access.RolePermission"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
    "EXCEPTION_HANDLER": "plumbing.errors.admin_exception_handler",
}

SPECTACULAR_SETTINGS = {
    "TITLE": "gpushare API",
    "DESCRIPTION": (
        "Admin API (staff token or session) for tenants, API keys and quotas, and the "
        "OpenAI-compatible API (tenant API keys)."
    ),
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # A tenant's token budget and a money budget share their periods: one enum in the schema.
    "ENUM_NAME_OVERRIDES": {"BudgetPeriodEnum": "tenants.models.BudgetPeriod"},
    # Served from the sidecar package: the UI works with no internet access.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # The inference endpoints are served outside DRF (config/asgi.py): a hook describes them.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "api.schema.add_inference_paths",
    ],
}

# --- Tenants and keys -------------------------------------------------------------------
# The request classes a new tenant may send unless the operator says otherwise. interactive
# (weight 8 of 12) takes the others' share, so it is granted, not given; offline runs only
# on capacity nobody else uses.
GPUSHARE_DEFAULT_CLASSES = env_list("GPUSHARE_DEFAULT_CLASSES", ["standard", "offline"])
# Prefix of every tenant API key, so people and secret scanners can spot one.
GPUSHARE_API_KEY_PREFIX = "gs-"
# A key's last_used_at is written at most this often, to keep the request path read-only.
GPUSHARE_KEY_TOUCH_INTERVAL_S = env_int("GPUSHARE_KEY_TOUCH_INTERVAL_S", 60)
# How long a web process trusts a key (and its tenant's policy) it has looked up: the request
# path then skips the database. A revocation made elsewhere takes effect within this time.
GPUSHARE_AUTH_CACHE_S = env_float("GPUSHARE_AUTH_CACHE_S", 5.0)

# --- Memory units -------------------------------------------------------------------------
GPUSHARE_UNIT_BYTES = 256 * 1024 * 1024

# --- Readiness --------------------------------------------------------------------------
GPUSHARE_READY_TIMEOUT_S = env_float("GPUSHARE_READY_TIMEOUT_S", 2.0)

# --- Engines ----------------------------------------------------------------------------
# This node's name: devices are recorded per node and an engine is started on its device's
# node. Empty: the host name.
GPUSHARE_NODE_NAME = env_str("GPUSHARE_NODE_NAME", "")
# vLLM lives in its own virtual environment (scripts/setup_vllm.sh builds it under the cache
# folder). Empty: use the newest complete one there.
GPUSHARE_CACHE_DIR = Path(
    env_str("GPUSHARE_CACHE_DIR", str(Path.home() / ".cache" / "gpushare"))
).expanduser()
GPUSHARE_VLLM_PYTHON = env_str("GPUSHARE_VLLM_PYTHON", "")
# Without an NVIDIA GPU the CPU engine stands in for one; its capacity is this KV space.
GPUSHARE_CPU_KVCACHE_GIB = env_int("GPUSHARE_CPU_KVCACHE_GIB", 2)
# Engine logs and process ids.
GPUSHARE_ENGINE_DIR = Path(env_str("GPUSHARE_ENGINE_DIR", str(VAR_DIR / "engines")))
# Where a node keeps the LoRA adapters its engines load, copied from the files storage
# (scheduler.adapters.storage): the engines read them there.
GPUSHARE_ADAPTER_DIR = Path(env_str("GPUSHARE_ADAPTER_DIR", str(GPUSHARE_ENGINE_DIR / "adapters")))
# The most bytes one adapter's files may hold when it is registered.
GPUSHARE_ADAPTER_MAX_BYTES = env_int("GPUSHARE_ADAPTER_MAX_BYTES", 2 * 1024**3)
# The demo model scripts/make_tiny_model.py generates.
GPUSHARE_DEMO_MODEL_DIR = Path(
    env_str("GPUSHARE_DEMO_MODEL_DIR", str(VAR_DIR / "models" / "tiny-llama"))
)
GPUSHARE_ENGINE_START_TIMEOUT_S = env_float("GPUSHARE_ENGINE_START_TIMEOUT_S", 300.0)
GPUSHARE_ENGINE_DRAIN_TIMEOUT_S = env_float("GPUSHARE_ENGINE_DRAIN_TIMEOUT_S", 60.0)
GPUSHARE_ENGINE_STOP_TIMEOUT_S = env_float("GPUSHARE_ENGINE_STOP_TIMEOUT_S", 30.0)
# Per HTTP call to an engine (health, metrics, the warm-up generation); generation streams
# use their own, longer, read timeout.
GPUSHARE_ENGINE_HTTP_TIMEOUT_S = env_float("GPUSHARE_ENGINE_HTTP_TIMEOUT_S", 10.0)
GPUSHARE_ENGINE_GENERATE_TIMEOUT_S = env_float("GPUSHARE_ENGINE_GENERATE_TIMEOUT_S", 300.0)
# A job runs on the engine of its pool that ran its tenant's (or cache group's) latest job,
# where that engine can run it at once, so its prefix is found in that engine's cache
# (docs/DISPATCH.md, Prefix-cache affinity). Off: on the engine with the most free KV.
GPUSHARE_CACHE_AFFINITY = env_bool("GPUSHARE_CACHE_AFFINITY", True)
# Caps each engine's KV cache at this many blocks (vLLM's --num-gpu-blocks-override); 0: the
# cache its footprint gives. For benchmarks and tests that need a small cache.
GPUSHARE_ENGINE_KV_BLOCKS = env_int("GPUSHARE_ENGINE_KV_BLOCKS", 0)
# A stream picked for an engine is streamed by the web process that holds its client, from
# the engine itself, not relayed token by token through a worker and Redis
# (scheduler/online/granted.py). Off where the web cannot reach the engines' addresses.
GPUSHARE_WEB_STREAMS_FROM_ENGINE = env_bool("GPUSHARE_WEB_STREAMS_FROM_ENGINE", True)
# /health checks a ready engine may miss in a row before it is failed and its process
# stopped: one miss is often a stall (a machine short of CPU), not a dead engine.
GPUSHARE_ENGINE_HEALTH_MISSES = env_int("GPUSHARE_ENGINE_HEALTH_MISSES", 3)
# The user engines run as (a name or uid), where the engine agent runs as root (the node's
# container): an engine then cannot read the platform's files, its processes' environment or
# memory. Empty: the agent's own user. Its primary group is the engine's; it gets the
# supplementary groups GPUSHARE_ENGINE_GROUPS (names or gids; the GPUs' device group where
# the devices are not open to all) and no others.
GPUSHARE_ENGINE_USER = env_str("GPUSHARE_ENGINE_USER", "")
GPUSHARE_ENGINE_GROUPS = env_list("GPUSHARE_ENGINE_GROUPS", [])
# Set: an engine's own /metrics (vLLM's series) also answers `Authorization: Bearer <this>`,
# for Prometheus's scrape of each engine; it opens no other route. Empty: only the engine's
# key opens /metrics (as every route but /health).
GPUSHARE_ENGINE_METRICS_TOKEN = env_str("GPUSHARE_ENGINE_METRICS_TOKEN", "")


# --- Scheduler --------------------------------------------------------------------------
# Dispatch shares between the request classes, in the order interactive, standard, offline:
# weighted, never strict priority, so no class starves.
GPUSHARE_SCHED_CLASS_WEIGHTS = [
    float(w) for w in env_list("GPUSHARE_SCHED_CLASS_WEIGHTS", ["8", "3", "1"])
]
# How long a request may wait in the queue before it is answered with a timeout error;
# offline's is the batch window.
GPUSHARE_SCHED_QUEUE_TIMEOUTS_S = {
    "interactive": env_float("GPUSHARE_SCHED_TIMEOUT_INTERACTIVE_S", 30.0),
    "standard": env_float("GPUSHARE_SCHED_TIMEOUT_STANDARD_S", 300.0),
    "offline": env_float("GPUSHARE_SCHED_TIMEOUT_OFFLINE_S", 24 * 3600.0),
}
# A picked job's lease; the worker renews it while it streams, the reaper requeues it after.
GPUSHARE_SCHED_LEASE_S = env_float("GPUSHARE_SCHED_LEASE_S", 120.0)
# How long a finished job's record (its summary, not its body) and event list stay in Redis:
# while the platform may still ask for them (a waiter reading its last event, the batch
# feeder recovering a line's answer that the database missed). The durable record is the
# ledger's row in the database; Redis holds what is in flight.
GPUSHARE_SCHED_KEEP_S = env_int("GPUSHARE_SCHED_KEEP_S", 600)
GPUSHARE_SCHED_KEY_PREFIX = env_str("GPUSHARE_SCHED_KEY_PREFIX", "gs:fq:")
# A worker's picker of a pool with nothing to run waits this long for new work (handed to it
# through Redis, without a Celery message) before it ends.
GPUSHARE_DISPATCH_IDLE_S = env_float("GPUSHARE_DISPATCH_IDLE_S", 60.0)
# Requests an engine may hold in its own waiting queue beyond its seats, per seat: a freed
# seat is refilled at the engine's next step instead of after a release, a pick and a call
# (docs/decisions/0002-a-queue-inside-each-engine.md). 0 sends no more than the seats.
GPUSHARE_ENGINE_QUEUED_PER_SEAT = env_float("GPUSHARE_ENGINE_QUEUED_PER_SEAT", 1.0)
# The offline gate (fairqueue/lua/lib.lua `offline_gate`): once the samplers' load
# closed it, it reopens only below offline_load_threshold minus this margin (no flapping);
# offline work leaves this share of an engine's seats (rounded up) free for online work
# arriving, and takes at most the rest of what online work leaves free.
GPUSHARE_OFFLINE_GATE_MARGIN = env_float("GPUSHARE_OFFLINE_GATE_MARGIN", 0.1)
GPUSHARE_OFFLINE_RESERVE_PER_SEAT = env_float("GPUSHARE_OFFLINE_RESERVE_PER_SEAT", 0.25)
# Seats by class (docs/ARCHITECTURE.md, Seats by class and latency targets): a time to first
# token target per class (ms; interactive and standard, e.g. "interactive=300"), held on each
# engine by bounding the seats of the classes below it; or a fixed number of seats those
# classes may hold ("interactive=4"). None set: every class may take every seat (full
# throughput). `manage.py pool targets` overrides both for one pool.
GPUSHARE_TTFT_TARGETS_MS = env_numbers("GPUSHARE_TTFT_TARGETS_MS", {})
GPUSHARE_FIXED_SEATS_BELOW = env_numbers("GPUSHARE_FIXED_SEATS_BELOW", {})
# The controllers: the share of a class's times to first token to be within its target, the
# seats a bound moves by per miss, and how long a class goes unmeasured before its bound lapses.
GPUSHARE_TARGET_QUANTILE = env_float("GPUSHARE_TARGET_QUANTILE", 0.995)
GPUSHARE_TARGET_STEP = env_float("GPUSHARE_TARGET_STEP", 1.0)
GPUSHARE_TARGET_IDLE_S = env_float("GPUSHARE_TARGET_IDLE_S", 30.0)
# What a request reserves of its engine's KV before it runs (docs/ARCHITECTURE.md, Reserving
# KV): `predict`, its prompt and the output its tenant's answers reach at
# GPUSHARE_OUTPUT_QUANTILE (growing while it generates past that), or `worst`, its prompt and
# every token it may generate. `manage.py pool reservation` sets a pool's own.
GPUSHARE_KV_RESERVATION = env_str("GPUSHARE_KV_RESERVATION", "predict")
GPUSHARE_OUTPUT_QUANTILE = env_float("GPUSHARE_OUTPUT_QUANTILE", 0.95)
# The most engine calls one worker process holds at once (a safety bound: the engines' seats
# and KV budgets, enforced by the fair queue, are what bound them in practice). Beyond it the
# process stops picking and the pool's other workers are summoned.
GPUSHARE_WORKER_MAX_RUNS = env_int("GPUSHARE_WORKER_MAX_RUNS", 1024)
# How long a worker that stops (warm shutdown) lets its running jobs finish before it gives
# them back to the queue.
GPUSHARE_WORKER_DRAIN_S = env_float("GPUSHARE_WORKER_DRAIN_S", 30.0)

# --- Online path ----------------------------------------------------------------------
# Largest JSON body the OpenAI-compatible API accepts (413 above it).
GPUSHARE_MAX_BODY_BYTES = env_int("GPUSHARE_MAX_BODY_BYTES", 4 * 1024 * 1024)
# Largest body of every other request (config/asgi.py, `body_limit_of`): the tenant API's
# other calls, the admin API, the console's and Django admin's forms; a batch input's upload
# has GPUSHARE_BATCH_MAX_FILE_BYTES. Bounded before anything reads it, login included, so that
# nobody makes the web spool a body it never reads.
GPUSHARE_MAX_OTHER_BODY_BYTES = env_int("GPUSHARE_MAX_OTHER_BODY_BYTES", 1024 * 1024)
DATA_UPLOAD_MAX_MEMORY_SIZE = GPUSHARE_MAX_OTHER_BODY_BYTES
# Redis connections one web event loop holds at most: commands in flight (admissions'
# scripts, cancels, an inbox's read per pool waited on); waiting requests hold none. A command
# beyond them waits for one to come back.
GPUSHARE_WEB_REDIS_CONNECTIONS = env_int("GPUSHARE_WEB_REDIS_CONNECTIONS", 100)
# Prompts whose UTF-8 bound is at most this many tokens are not counted by the engine's
# /tokenize: the bound (plus a margin) is reserved instead. 0 counts every prompt exactly.
GPUSHARE_COUNT_PROMPTS_ABOVE_TOKENS = env_int("GPUSHARE_COUNT_PROMPTS_ABOVE_TOKENS", 1024)
# The most online requests of one tenant that may wait in one pool's fair queue (0: no limit):
# past it a request is refused with 429, so that one tenant's flood cannot fill Redis and the
# web with waiting requests.
GPUSHARE_TENANT_MAX_WAITING = env_int("GPUSHARE_TENANT_MAX_WAITING", 1024)
# The most sequences one request may run: n samples of each of its prompts (a completion's
# prompt may be a list). Each takes an engine seat and its own KV reservation.
GPUSHARE_MAX_SEQUENCES_PER_REQUEST = env_int("GPUSHARE_MAX_SEQUENCES_PER_REQUEST", 64)
# The most one answer not streamed (or one event of a stream) may take: a request whose answer
# could pass it is refused before it runs, and an answer that passes it anyway is ended.
GPUSHARE_MAX_ANSWER_BYTES = env_int("GPUSHARE_MAX_ANSWER_BYTES", 32 * 1024 * 1024)
# How long a request's body may take to arrive whole (plumbing/body_deadline.py): a 200 MB
# batch upload needs 2 MB/s to make it.
GPUSHARE_BODY_TIMEOUT_S = env_float("GPUSHARE_BODY_TIMEOUT_S", 120.0)
GPUSHARE_HOUSEKEEPING_INTERVAL_S = env_float("GPUSHARE_HOUSEKEEPING_INTERVAL_S", 2.0)
# Housekeeping's engine sync and the batch feeder read their rows only when a save changed
# them (plumbing/change_marks.py), and at least this often whatever happened.
GPUSHARE_CHANGE_RECHECK_S = env_float("GPUSHARE_CHANGE_RECHECK_S", 30.0)
# Finished requests reach the usage ledger in bulk, this often.
GPUSHARE_USAGE_FLUSH_INTERVAL_S = env_float("GPUSHARE_USAGE_FLUSH_INTERVAL_S", 1.0)
# The worker processes' task modules (workers/ is not a Django app: nothing imports it).
CELERY_IMPORTS: list[str] = ["workers.tasks", "workers.periodic"]
CELERY_BEAT_SCHEDULE: dict[str, dict[str, object]] = {}

# --- Batches --------------------------------------------------------------------------
# Uploaded JSONL files and batch outputs, one folder (or key prefix) per tenant: on this
# machine's disk under GPUSHARE_BATCH_FILES_DIR, or in an S3-compatible bucket when
# GPUSHARE_FILES_S3_BUCKET is set. Web and workers on different machines share no disk, so a
# multi-machine deployment sets the bucket. Credentials come from boto3's usual chain
# (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, AWS_PROFILE, an instance or pod role).
GPUSHARE_BATCH_FILES_DIR = Path(env_str("GPUSHARE_BATCH_FILES_DIR", str(VAR_DIR / "files")))
GPUSHARE_FILES_S3_BUCKET = env_str("GPUSHARE_FILES_S3_BUCKET", "")
# Another S3-compatible service than AWS (MinIO, Ceph, R2...): its URL.
GPUSHARE_FILES_S3_ENDPOINT_URL = env_str("GPUSHARE_FILES_S3_ENDPOINT_URL", "")
GPUSHARE_FILES_S3_REGION = env_str("GPUSHARE_FILES_S3_REGION", "")
# A folder of the bucket the files go under (a bucket shared with other data).
GPUSHARE_FILES_S3_PREFIX = env_str("GPUSHARE_FILES_S3_PREFIX", "")
STORAGES: dict[str, dict[str, Any]] = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "gpushare_files": files_storage_config(
        bucket=GPUSHARE_FILES_S3_BUCKET,
        endpoint_url=GPUSHARE_FILES_S3_ENDPOINT_URL,
        region=GPUSHARE_FILES_S3_REGION,
        prefix=GPUSHARE_FILES_S3_PREFIX,
    ),
}
GPUSHARE_BATCH_MAX_FILE_BYTES = env_int("GPUSHARE_BATCH_MAX_FILE_BYTES", 200 * 1024 * 1024)
# What one tenant's files may take in all (its uploads refused past it), and how many of its
# batches may be active at once (validating, in progress, finalizing, cancelling).
GPUSHARE_TENANT_MAX_STORED_BYTES = env_int("GPUSHARE_TENANT_MAX_STORED_BYTES", 10 * 1024**3)
GPUSHARE_TENANT_MAX_ACTIVE_BATCHES = env_int("GPUSHARE_TENANT_MAX_ACTIVE_BATCHES", 16)
# The most ledger rows one `GET /v1/usage` reads: a longer range is refused (400 bad_period).
GPUSHARE_USAGE_MAX_ROWS = env_int("GPUSHARE_USAGE_MAX_ROWS", 500_000)

# Money (docs/PRICES.md): the currency prices and budgets are in (a label: nothing converts),
# how often the budget check compares spend with the budgets, and the budget webhooks'
# signing secret (empty: unsigned) and timeout.
GPUSHARE_CURRENCY = env_str("GPUSHARE_CURRENCY", "USD")
GPUSHARE_BUDGET_CHECK_INTERVAL_S = env_float("GPUSHARE_BUDGET_CHECK_INTERVAL_S", 60.0)
GPUSHARE_BUDGET_WEBHOOK_SECRET = env_str("GPUSHARE_BUDGET_WEBHOOK_SECRET", "")
GPUSHARE_BUDGET_WEBHOOK_TIMEOUT_S = env_float("GPUSHARE_BUDGET_WEBHOOK_TIMEOUT_S", 5.0)
# Budget alerts' email: Django's SMTP backend when DJANGO_EMAIL_HOST is set, else the
# console backend (the alert is written to the worker's log).
EMAIL_HOST = env_str("DJANGO_EMAIL_HOST", "")
EMAIL_BACKEND = (
    "django.core.mail.backends.smtp.EmailBackend"
    if EMAIL_HOST
    else "django.core.mail.backends.console.EmailBackend"
)
EMAIL_PORT = env_int("DJANGO_EMAIL_PORT", 587)
EMAIL_HOST_USER = env_str("DJANGO_EMAIL_HOST_USER", "")
EMAIL_HOST_PASSWORD = env_str("DJANGO_EMAIL_HOST_PASSWORD", "")
EMAIL_USE_TLS = env_bool("DJANGO_EMAIL_USE_TLS", True)
DEFAULT_FROM_EMAIL = env_str("DJANGO_DEFAULT_FROM_EMAIL", "gpushare@localhost")
GPUSHARE_BATCH_MAX_LINES = env_int("GPUSHARE_BATCH_MAX_LINES", 50_000)
# Lines of one batch in the fair queue (waiting or running) at once: the rest wait in the
# database, so a 50,000-line file never sits in Redis whole.
GPUSHARE_BATCH_WINDOW = env_int("GPUSHARE_BATCH_WINDOW", 64)
# What the completion window "24h" lasts, in seconds; tests shorten it to see expiry.
GPUSHARE_BATCH_COMPLETION_WINDOW_S = env_float("GPUSHARE_BATCH_COMPLETION_WINDOW_S", 24 * 3600.0)
GPUSHARE_BATCH_FEED_INTERVAL_S = env_float("GPUSHARE_BATCH_FEED_INTERVAL_S", 2.0)
# A line whose job ended in Redis without its result reaching the database is fed again
# after this long (its worker died between the engine's answer and the write).
GPUSHARE_BATCH_LOST_GRACE_S = env_float("GPUSHARE_BATCH_LOST_GRACE_S", 10.0)
CELERY_IMPORTS.append("workers.batch_tasks")

# --- Telemetry and reports --------------------------------------------------------------
# How often the sampler reads GPUs and engines (seconds), and the time constant of the moving
# average of NVML's utilization.gpu (exported; the offline gate does not read it).
GPUSHARE_TELEMETRY_INTERVAL_S = env_float("GPUSHARE_TELEMETRY_INTERVAL_S", 5.0)
GPUSHARE_TELEMETRY_SMOOTHING_S = env_float("GPUSHARE_TELEMETRY_SMOOTHING_S", 30.0)
# History: raw samples for this many days, then per-minute means until the second limit,
# then per-hour means until the retention drops them.
GPUSHARE_TELEMETRY_RAW_DAYS = env_int("GPUSHARE_TELEMETRY_RAW_DAYS", 1)
GPUSHARE_TELEMETRY_MINUTE_DAYS = env_int("GPUSHARE_TELEMETRY_MINUTE_DAYS", 30)
GPUSHARE_TELEMETRY_RETENTION_DAYS = env_int("GPUSHARE_TELEMETRY_RETENTION_DAYS", 365)
GPUSHARE_TELEMETRY_ROLLUP_INTERVAL_S = env_float("GPUSHARE_TELEMETRY_ROLLUP_INTERVAL_S", 300.0)
# Set: /metrics and /metrics/cluster ask for `Authorization: Bearer <this>`; empty: they
# answer this machine only (loopback clients).
GPUSHARE_METRICS_TOKEN = env_str("GPUSHARE_METRICS_TOKEN", "")
# The commit the image was built from (the Dockerfile's build argument), for the
# `commit` label of gpushare_build_info; empty when unknown.
GPUSHARE_BUILD_COMMIT = env_str("GPUSHARE_BUILD_COMMIT", "")
CELERY_IMPORTS.append("workers.telemetry_tasks")
CELERY_BEAT_SCHEDULE["telemetry-rollup"] = {
    "task": "workers.telemetry_rollup",
    "schedule": GPUSHARE_TELEMETRY_ROLLUP_INTERVAL_S,
    "options": {"expires": GPUSHARE_TELEMETRY_ROLLUP_INTERVAL_S},
}

# --- Pools and scaling ------------------------------------------------------------------
# How often the scaler samples each pool's online queue and decides (scheduler.pools.scaling).
GPUSHARE_SCALER_INTERVAL_S = env_float("GPUSHARE_SCALER_INTERVAL_S", 10.0)
# A start or drain no worker on the engine's node carried out within this long fails (and
# its task expires), so a dead node does not hold its pool forever: above the start timeout.
GPUSHARE_SCALER_PENDING_TIMEOUT_S = env_float(
    "GPUSHARE_SCALER_PENDING_TIMEOUT_S", GPUSHARE_ENGINE_START_TIMEOUT_S + 300.0
)
CELERY_IMPORTS.append("workers.scaling_tasks")
CELERY_IMPORTS.append("workers.billing_tasks")

# --- The periodic tick ---------------------------------------------------------------
# Each worker process runs the frequent periodic jobs (ledger flush, housekeeping, batch
# feeder, telemetry sampler, scaler) from a thread of its own, each at its interval above,
# once per interval in the whole platform (workers.periodic): a Celery message costs more
# CPU than any of these jobs (docs/decisions/0007-periodic-work-on-each-workers-ticker.md).
# False: this worker leaves them to the others.
GPUSHARE_WORKER_TICK = env_bool("GPUSHARE_WORKER_TICK", True)

# --- The engine agent ------------------------------------------------------------------
# True in a node's engine agent (`python -m agent`, agent/): the one process that starts,
# drains, stops and crash-checks that node's engines, consuming gpushare.node.<node name>.
# The dispatch workers leave that queue to it and only call the engines over HTTP.
GPUSHARE_ENGINE_AGENT = env_bool("GPUSHARE_ENGINE_AGENT", False)
# How often the agent checks its node's engines (process alive, /health of ready ones).
GPUSHARE_AGENT_CHECK_INTERVAL_S = env_float("GPUSHARE_AGENT_CHECK_INTERVAL_S", 5.0)

# --- Console ----------------------------------------------------------------------------
CELERY_IMPORTS.append("workers.engine_tasks")
