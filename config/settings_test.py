"""Settings for the test suite: the in-process app always runs on the embedded defaults
(SQLite, in-memory channel layer, local-memory cache, eager Celery), whatever the environment says.

``REDIS_URL`` and ``TEST_DATABASE_URL`` in the environment tell the tests where Redis and
PostgreSQL are; the tests that need them reach them explicitly (tests/conftest.py).
"""
import os

_saved = {k: os.environ.pop(k) for k in ("REDIS_URL", "DATABASE_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL") if k in os.environ}
try:
    from .settings import *  # noqa: F403
finally:
    os.environ.update(_saved)

KEFU_FAQ_POLL_S = 3600.0  # tests reload the FAQ model explicitly
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# A file database, not Django's shared-cache in-memory SQLite: answering runs database work in
# several threads at once (the answering loop, background ledger rows, summaries, audits), and
# shared-cache SQLite answers a concurrent writer with "table is locked" at once instead of
# waiting. A file with WAL and a busy timeout behaves like the embedded default the app runs on.
import tempfile as _tempfile  # noqa: E402

if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":  # noqa: F405
    DATABASES["default"]["TEST"] = {  # noqa: F405
        "NAME": os.path.join(_tempfile.gettempdir(), f"kefu-test-{os.getpid()}.sqlite3"),
    }
