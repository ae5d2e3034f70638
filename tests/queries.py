"""Counting the SQL statements of a block of work on every thread (Zulip's ``queries_captured``).

kefu's answer does its database work off the test's thread: Channels' ``database_sync_to_async``
runs each call in an asgiref worker thread, the answering loop's after-work (summary check, cache
audits, judges of near misses) runs in the event loop's default executor, and the ledger's rows
are written by tasks of their own that hop to threads too. Django's
``CaptureQueriesContext(connection)`` watches one connection, and a connection belongs to one
thread, so it sees none of that. ``all_threads_queries()`` sees it all; see its docstring for how.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.db.backends.utils import CursorWrapper

ROOT = Path(__file__).resolve().parent.parent
#: Where a statement "comes from": the innermost frame in one of kefu's own packages.
KEFU_PACKAGES = tuple(str(ROOT / p) + "/" for p in ("chat", "routing", "cache_layer", "lib", "ops", "store", "config"))

_uncounted: contextvars.ContextVar[bool] = contextvars.ContextVar("kefu_queries_uncounted", default=False)


@dataclass(frozen=True)
class Statement:
    """One statement sent through Django: ``thread`` (its name), ``sql``, ``alias`` (the
    database) and ``origin`` (``path:line function`` of kefu's innermost frame that sent it)."""

    thread: str
    alias: str
    sql: str
    origin: str

    def __str__(self) -> str:
        return f"[{self.thread}] {self.sql}\n        from {self.origin}"


@dataclass
class Captured:
    """The statements of a block, in the order they were sent (a list under a lock: threads
    append at once)."""

    statements: list[Statement] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, statement: Statement) -> None:
        with self.lock:
            self.statements.append(statement)

    def __len__(self) -> int:
        with self.lock:
            return len(self.statements)

    def snapshot(self) -> list[Statement]:
        with self.lock:
            return list(self.statements)

    def report(self) -> str:
        """Every statement, numbered, one per entry: for an assertion's message."""
        rows = self.snapshot()
        lines = [f"{len(rows)} statement(s):"]
        lines += [f"{i:3d}. {s}" for i, s in enumerate(rows, 1)]
        return "\n".join(lines)


_active: list[Captured] = []
_active_lock = threading.Lock()
# Django's own methods, kept at import: a thread already inside a wrapper when the last capture
# ends still finds them (the class attributes are put back then).
_EXECUTE = CursorWrapper.execute
_EXECUTEMANY = CursorWrapper.executemany


def _origin() -> str:
    for frame in reversed(traceback.extract_stack()[:-3]):
        if frame.filename.startswith(KEFU_PACKAGES):
            return f"{Path(frame.filename).relative_to(ROOT)}:{frame.lineno} {frame.name}"
    return "(no kefu frame)"


def _record(wrapper: CursorWrapper, sql: Any) -> None:
    if _uncounted.get():
        return
    with _active_lock:
        targets = list(_active)
    if not targets:
        return
    statement = Statement(
        thread=threading.current_thread().name, alias=wrapper.db.alias, sql=str(sql), origin=_origin()
    )
    for captured in targets:
        captured.add(statement)


def _execute(self: CursorWrapper, sql: Any, params: Any = None) -> Any:
    _record(self, sql)
    return _EXECUTE(self, sql, params)


def _executemany(self: CursorWrapper, sql: Any, param_list: Any) -> Any:
    _record(self, sql)
    return _EXECUTEMANY(self, sql, param_list)


@contextlib.contextmanager
def all_threads_queries() -> Iterator[Captured]:
    """Capture every statement that any thread sends through Django while the block runs.

    How: ``CursorWrapper.execute`` and ``executemany`` are wrapped at class level (Django's
    ``CursorDebugWrapper`` calls them through ``super()``), so every cursor of every connection
    of every thread goes through the wrapper, including connections that worker threads opened
    before the block and keep open (``CONN_MAX_AGE``). The alternative, a
    ``connection.execute_wrapper`` on each connection, cannot reach those: a connection lives in
    its thread's ``asgiref.local.Local``, and ``connections.all()`` lists only the calling
    thread's, so it would need the ``connection_created`` signal and would miss every connection
    already open in a pool thread — exactly the ones a warm server uses.

    What counts: each statement Django's cursor sends (``BEGIN IMMEDIATE`` of a SQLite write
    transaction and savepoints included, as they are statements). Not counted, because they do
    not go through a Django cursor: the driver's own ``COMMIT``/``ROLLBACK`` (``connection.commit``),
    the connection's set-up on connect, and PostgreSQL's health-check ``SELECT 1``.

    The test's own reads inside the block are left out with :func:`uncounted`. Nested and
    concurrent captures each see every statement."""
    captured = Captured()
    with _active_lock:
        if not _active:
            CursorWrapper.execute = _execute  # type: ignore[method-assign]
            CursorWrapper.executemany = _executemany  # type: ignore[method-assign]
        _active.append(captured)
    try:
        yield captured
    finally:
        with _active_lock:
            _active.remove(captured)
            if not _active:
                CursorWrapper.execute = _EXECUTE  # type: ignore[method-assign]
                CursorWrapper.executemany = _EXECUTEMANY  # type: ignore[method-assign]


@contextlib.contextmanager
def uncounted() -> Iterator[None]:
    """Statements sent from this block (and from the ``database_sync_to_async`` calls it makes:
    asgiref carries the context into its worker thread) are not captured: a test's own checks."""
    token = _uncounted.set(True)
    try:
        yield
    finally:
        _uncounted.reset(token)
