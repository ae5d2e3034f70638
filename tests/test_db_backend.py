"""The PostgreSQL backend (lib.db.postgresql): a quiet connection is reused without a SELECT 1,
and a connection the server ended is found and replaced before the next query, with no error."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from django.db.backends.postgresql.base import DatabaseWrapper as DjangoPostgres
from django.db.utils import ConnectionHandler

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def pg_wrapper(pg_database: str, django_db_blocker: Any) -> Iterator[Any]:
    """A connection of the project's backend to a fresh database, as settings.py configures it
    (outside pytest-django's test database, hence the unblock)."""
    url = urlsplit(pg_database)
    handler = ConnectionHandler(
        {
            "default": {
                "ENGINE": "lib.db.postgresql",
                "NAME": url.path.lstrip("/"),
                "USER": url.username or "",
                "PASSWORD": url.password or "",
                "HOST": url.hostname or "",
                "PORT": str(url.port or 5432),
                "CONN_MAX_AGE": 600,
                "CONN_HEALTH_CHECKS": True,
            }
        }
    )
    wrapper = handler["default"]
    with django_db_blocker.unblock():
        yield wrapper
        wrapper.close()


def backend_pid(wrapper: Any) -> int:
    with wrapper.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


@pytest.fixture
def select_ones(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the health-check round trips (Django's ``is_usable``: one SELECT 1 each)."""
    calls: list[int] = []
    original = DjangoPostgres.is_usable

    def counted(self: Any) -> bool:
        calls.append(1)
        return original(self)

    monkeypatch.setattr(DjangoPostgres, "is_usable", counted)
    return calls


def test_a_quiet_connection_is_reused_without_a_round_trip(pg_wrapper, select_ones):
    pid = backend_pid(pg_wrapper)
    for _ in range(3):  # what database_sync_to_async does around each call
        pg_wrapper.close_if_unusable_or_obsolete()
        assert backend_pid(pg_wrapper) == pid
    assert select_ones == []


def test_a_connection_the_server_ended_is_replaced_before_the_next_query(pg_wrapper, pg_url, select_ones):
    pid = backend_pid(pg_wrapper)
    pg_wrapper.close_if_unusable_or_obsolete()
    with psycopg.connect(pg_url, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone() == (True,)
    deadline = time.monotonic() + 20
    while pg_wrapper.connection_is_quiet():  # the server's goodbye is on its way
        assert time.monotonic() < deadline, "the terminated connection never became readable"
        time.sleep(0.02)
    new_pid = backend_pid(pg_wrapper)  # no error: checked, closed and reopened first
    assert new_pid != pid
    assert select_ones == [1]


def test_settings_put_postgresql_urls_on_this_backend():
    env = {k: v for k, v in os.environ.items() if k not in ("DJANGO_SETTINGS_MODULE", "REDIS_URL")}
    code = "import django; django.setup(); from django.conf import settings; print(settings.DATABASES['default']['ENGINE'])"
    for url, engine in (
        ("postgres://u@127.0.0.1:5432/kefu", "lib.db.postgresql"),
        ("sqlite:///kefu.sqlite3", "django.db.backends.sqlite3"),
    ):
        done = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env={**env, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "config.settings", "KEFU_NO_WARMUP": "1"},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.stdout.strip() == engine, done.stderr
