"""Query-count guards (issue 39, item 4; Zulip's ``assert_database_query_count`` habit). First
the helper that counts the statements of every thread (``tests/queries.py``): the answer's
database work runs in asgiref's and the event loop's worker threads, never on the test's own."""

from __future__ import annotations

import asyncio
import threading

import pytest
from channels.db import database_sync_to_async

from chat.models import Conversation, Message
from tests.queries import all_threads_queries, uncounted

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


# --- The helper itself ------------------------------------------------------------------------------


async def test_statements_of_worker_threads_are_counted(db):
    """The answer's queries run in worker threads: asgiref's (``database_sync_to_async``) and the
    event loop's default executor (``lib.background``). Each is counted, with its thread's name;
    Django's ``CaptureQueriesContext`` watches the test thread's connection, which sends none."""
    from django.db import close_old_connections

    def in_executor() -> int:
        try:
            return Message.objects.count()
        finally:
            close_old_connections()

    with all_threads_queries() as captured:
        assert await database_sync_to_async(Conversation.objects.count)() == 0
        assert await asyncio.get_running_loop().run_in_executor(None, in_executor) == 0
    first, second = captured.snapshot()
    assert 'COUNT(*) AS "__count" FROM "chat_conversation"' in first.sql
    assert 'COUNT(*) AS "__count" FROM "chat_message"' in second.sql
    here = threading.current_thread().name
    assert first.thread != here and second.thread != here
    assert first.origin == "(no kefu frame)"  # sent from the test, not from kefu's code


async def test_uncounted_checks_are_left_out(db):
    with all_threads_queries() as captured:
        with uncounted():
            await database_sync_to_async(Message.objects.count)()
        await database_sync_to_async(Conversation.objects.count)()
    assert [s.sql.count("chat_conversation") > 0 for s in captured.snapshot()] == [True]
