"""Settings for the test suite: the in-process app always runs on the embedded defaults
(SQLite, in-memory channel layer, local-memory cache, eager Celery), whatever the environment says.

``REDIS_URL`` and ``TEST_DATABASE_URL`` in the environment tell the tests where Redis and
PostgreSQL are; the tests that need them reach them explicitly (tests/conftest.py).
"""

import os

_saved = {
    k: os.environ.pop(k) for k in ("REDIS_URL", "DATABASE_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL") if k in os.environ
}
try:
    from .settings import *  # noqa: F403
finally:
    os.environ.update(_saved)

KEFU_FAQ_POLL_S = 3600.0  # tests reload the FAQ model explicitly
KEFU_REGROUP_POLL_S = 0.0  # tests call chat.regroup.check() themselves
KEFU_AGENT_SWEEP_S = 0.0  # tests run the sweep explicitly (chat.sweeper), or switch it on
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Background work that outlives the answer that started it (audits of sampled cache hits, rolling
# summaries) is off by default in tests: left running, it would call a test's upstream after that
# test ended and write to the database while the next test sets up. Their own tests switch them on.
KEFU_CACHE_AUDIT_RATE = 0.0
KEFU_SUMMARY_MIN_TURNS = 0
# Django's test database is shared-cache in-memory SQLite, where a connection that reads a table
# makes another connection's write to it fail at once ("database table is locked"), instead of
# waiting as the file database the app runs on does (WAL). Summary threads read a conversation
# while the next message is stored (CI failed so once); read_uncommitted makes readers take no
# table locks in shared-cache mode (https://www.sqlite.org/sharedcache.html, section 2.2.1).
DATABASES["default"]["OPTIONS"]["init_command"] = (  # noqa: F405
    DATABASES["default"]["OPTIONS"].get("init_command", "") + " PRAGMA read_uncommitted = 1;"  # noqa: F405
)
