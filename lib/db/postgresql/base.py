"""Django's PostgreSQL backend with a health check that costs no round trip while the connection
is quiet (``ENGINE = "lib.db.postgresql"``; everything else is Django's own backend).

``CONN_HEALTH_CHECKS`` makes Django run ``SELECT 1`` before the first query of every request
cycle, and Channels' ``database_sync_to_async`` starts a cycle at every call: profiled under
bench/load.py, that was 5-6 ``SELECT 1`` a chat message, a quarter of its statements.

A PostgreSQL connection that is idle between cycles receives nothing unless something happened
to it: a restarted or shut-down server, ``pg_terminate_backend`` or an idle-session timeout send
an ``ErrorResponse`` and close the socket, which makes it readable (the error, or EOF); so does a
reset connection. So the check here first polls the socket without waiting (no system call
beyond ``poll``, no bytes read). Quiet: the connection is used as it is. Readable, hung up or in
error, or psycopg already knows it is closed or broken: Django's own check runs (``SELECT 1``,
the connection is closed and reopened when it fails; a harmless notice is read by it and the
connection kept).

What it cannot see, and neither could ``SELECT 1`` quickly: a peer that vanished without a
packet (a cut cable) is found by the first query's TCP timeout, as before.
"""

from __future__ import annotations

import select
from typing import Any

from django.db.backends.postgresql.base import DatabaseWrapper as PostgresDatabaseWrapper

__all__ = ["DatabaseWrapper"]

_TROUBLE = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP | select.POLLNVAL


class DatabaseWrapper(PostgresDatabaseWrapper):
    """Django's PostgreSQL ``DatabaseWrapper`` whose pre-use health check polls the socket first."""

    def connection_is_quiet(self) -> bool:
        """True when the open connection has received nothing, has no error and no hang-up on its
        socket and psycopg holds it for open and idle: nothing says it stopped working."""
        conn = self.connection
        if conn is None or conn.closed or conn.broken:
            return False
        try:
            poller = select.poll()
            poller.register(conn.fileno(), _TROUBLE)
            return not poller.poll(0)
        except (OSError, ValueError):
            return False

    def close_if_health_check_failed(self) -> None:
        """Django's check (``SELECT 1``, close when it fails) only when the socket is not quiet."""
        wrapper: Any = self  # django-stubs do not declare the health-check attributes
        if self.connection is None or not wrapper.health_check_enabled or wrapper.health_check_done:
            return
        if self.connection_is_quiet():
            wrapper.health_check_done = True
            return
        super().close_if_health_check_failed()
