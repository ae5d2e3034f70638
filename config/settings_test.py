"""Settings for the test suite: the in-process app always runs on the embedded defaults
(SQLite, in-memory channel layer, local-memory cache, eager Celery), whatever the environment says.

``REDIS_URL`` and ``TEST_DATABASE_URL`` in the environment tell the tests where Redis and
PostgreSQL are; the tests that need them reach them explicitly (tests/conftest.py).
"""

import os
import tempfile

_saved = {
    k: os.environ.pop(k) for k in ("REDIS_URL", "DATABASE_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL") if k in os.environ
}
try:
    from .settings import *  # noqa: F403
finally:
    os.environ.update(_saved)

KEFU_FAQ_POLL_S = 3600.0  # tests reload the FAQ model explicitly
KEFU_PRODUCTS_POLL_S = 3600.0  # tests reload the catalog index explicitly
KEFU_REGROUP_POLL_S = 0.0  # tests call chat.regroup.check() themselves
KEFU_AGENT_SWEEP_S = 0.0  # tests run the sweep explicitly (chat.sweeper), or switch it on
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
# Background work that outlives the answer that started it (audits of sampled cache hits, judges of
# near misses, rolling summaries) is off by default in tests: left running, it would call a test's upstream after that
# test ended and write to the database while the next test sets up. Their own tests switch them on.
KEFU_CACHE_AUDIT_RATE = 0.0
KEFU_CACHE_PROMOTION = False  # the judge of near misses, likewise
KEFU_CACHE_REMAKE = False  # clean remakes of answers made with history, likewise
KEFU_SUMMARY_MIN_TURNS = 0
# Likewise the keep-warm requests to a test's upstream (its own tests switch it on).
KEFU_UPSTREAM_KEEPWARM_S = 0.0
# Django's default test database is shared-cache in-memory SQLite, where a second writer fails
# at once with "database table is locked" instead of waiting for the busy timeout as the WAL file
# the app runs on does: a summary task and a ledger row written at the same moment lost the row
# (CI failed so). The tests use a file, as the app does, so they lock as production locks. One per
# test process: a second run at the same time (a fresh clone's CI) must not share it.
DATABASES["default"]["TEST"] = {  # noqa: F405
    "NAME": os.path.join(tempfile.gettempdir(), f"kefu-test-{os.getpid()}.sqlite3"),
}
# Attachments go to a directory of this test process, never to the checkout's media/.
KEFU_ATTACHMENT_DIR = os.path.join(tempfile.gettempdir(), f"kefu-test-attachments-{os.getpid()}")
STORAGES["attachments"]["OPTIONS"] = {"location": KEFU_ATTACHMENT_DIR, "base_url": "/api/chat/attachments/"}  # noqa: F405
