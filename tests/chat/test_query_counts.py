"""Query-count guards (issue 39, item 4; Zulip's ``assert_database_query_count`` habit): one
shopper message end to end over the real shopper socket, from its frame to ``stream.end`` and
the work after it (cache store, ledger rows), must not send more SQL statements
than today's count.

Counted with ``tests/queries.py``, which sees every thread's statements: the answer's database
work runs in asgiref's and the event loop's worker threads, never on the test's own.

What each guard measures: a later message of a warm conversation (the socket said hello and one
message of the same kind was answered and settled before), as four of the five messages of
``bench/load.py``'s conversations are. So the conversation's creation, the first load of a
cache scope's vector index and the first upstream connection are out of the count.

Settings, as the other chat tests run (embedded defaults: SQLite, in-memory layer and exact
store, eager Celery) with these changes, each so that a count does not depend on the clock:

- ``KEFU_SUMMARY_MIN_TURNS`` at its production default (2), summaries on (the suite switches them
  off): no answer here asks "is a summary due?" (issue 29 item 3: a remote answer knows it from
  its own prompt's history, and any other answer never causes one), and no prompt here leaves a
  turn out, so no summary is made.
- ``KEFU_CACHE_INDEX_REFRESH_MS`` one hour: the vector index's change-log read and the
  ``has_verified`` read happen at most once per process per interval (5 s by default), not per
  answer; left at 5 s they land in a measured answer or not depending on how loaded the
  machine is.
- ``KEFU_ANSWER_LEASE_S`` ten minutes: a streaming answer renews its lease every third of it
  (one UPDATE per 5 s by default), so a slow machine would add renewals.
- first-token and total timeouts of 15 and 30 s: a loaded machine missing the ``remote``
  fixture's 2 s would fall back to the next tier, with a ledger row and budget statements more.
- Cache audits and near-miss judges stay off as in the suite: sampled (5% of semantic hits) or
  calls to the upstream off the answer's path, not statements of the answer.

On failure, the message lists every statement with its thread and the kefu frame that sent it.

PostgreSQL is not counted here: pytest-django binds the in-process application to the SQLite
test database, and the suite's PostgreSQL fixtures serve a Daphne subprocess, whose statements
a helper in this process cannot see.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from channels.db import database_sync_to_async

from cache_layer import services as cache_services
from cache_layer.exact_store import LocalExactStore, set_exact_store
from cache_layer.models import CachedAnswer
from chat import answering
from chat import tasks as chat_tasks
from chat.models import Conversation, Message
from routing import tasks as routing_tasks
from routing.models import UpstreamCall
from routing.upstream import ledger
from tests.fake_openai import Behaviour
from tests.queries import Captured, all_threads_queries, uncounted

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

# --- Budgets: statements per answer, measured on this commit's code ---------------------------------
# A budget may rise only in a commit that says why and what it buys (issue 39's rule). When a change
# sends fewer statements, lower the budget in the same commit, so the saving cannot be lost again.
# Re-measured after issue 39's item 1 (language detection, the socket's per-frame work): each
# answer sends exactly its budget (7, 8, 9, 24), so one statement more fails.

#: A FAQ answer, 7: the message stored and claimed (BEGIN, UPDATE conversation: next seq,
#: INSERT message, UPDATE conversation: claim); the answer stored (BEGIN, UPDATE conversation: next
#: seq, INSERT message). No summary check (issue 29 item 3: was 9 with its 2 SELECTs).
FAQ_ANSWER_BUDGET = 7
#: An exact cache hit, 8: the FAQ answer's 7 and the cache row's hit (UPDATE cached answer).
EXACT_HIT_BUDGET = 8
#: A semantic cache hit, 9: the FAQ answer's 7, SELECT of the candidate cached answers, UPDATE of
#: the hit's row.
SEMANTIC_HIT_BUDGET = 9
#: A remote answer (the simple tier, a third turn: not stored in the answer cache), 24: the message stored and
#: claimed (4); the prompt's history (SELECT conversation, SELECT messages: they also tell whether
#: the prompt leaves out turns no summary covers); the budget reserved
#: (SELECT counters, BEGIN, INSERT ... ON CONFLICT counters, UPDATE counters, INSERT hold); the
#: streaming row (BEGIN, UPDATE conversation: next seq, SELECT conversation: status and epoch,
#: INSERT message, UPDATE conversation: claim); the fence's SELECT of the owner epoch; the ledger's
#: INSERT upstream call; the row finished (UPDATE message, SELECT message); the budget settled
#: (BEGIN, SELECT hold, DELETE hold, UPDATE counters). No summary check (issue 29 item 3: 2 SELECTs)
#: and no cache store: an answer made with earlier turns is never stored (issue 29 item 2: 7
#: statements, the store's BEGIN, SELECT existing, INSERT answer, INSERT grounds, INSERT change,
#: and its size bound's SELECT expired, SELECT COUNT(*)). It was 33 with both.
REMOTE_ANSWER_BUDGET = 24
#: Not per answer: a cache store deletes old change-log rows at most once a minute per process
#: (``cache_layer.services.trim_change_log``: its BEGIN and DELETE). Whether the measured answer
#: is the one that does it depends on the clock, so those statements are bounded apart.
CHANGE_LOG_TRIM_STATEMENTS = 2

FAQ_WARM_UP = "how many days do I have to send an item back?"
FAQ_Q = "can I pay by card?"
FAQ_A = "We accept Visa, Mastercard, PayPal and Apple Pay."

LAMP_Q = "Does the walnut floor lamp come with a dimmer switch?"
LAMP_A = "Yes, it has an inline dimmer."
LAMP_PARAPHRASE = "Does the floor lamp in walnut come with a dimmer switch?"
TABLE_Q = "Does the oak side table come in white?"
TABLE_A = "Yes, the oak side table also comes in white."
TABLE_PARAPHRASE = "Does the side table in oak come in white?"
COVER_Q = "Is the linen armchair cover machine washable?"
COVER_A = "Yes, at 30 degrees on a gentle cycle."

#: The longest wait for an answer's after-end work, seconds (a loaded machine; never slept).
SETTLE_S = 60.0


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


# --- The guards --------------------------------------------------------------------------------------


@pytest.fixture
def guarded(settings: Any, remote: Any, routing_guards: None) -> Iterator[Any]:
    """The settings above, a fresh in-memory exact store (the process's own keeps other tests'
    keys, whose rows are gone: a stale key costs an UPDATE that finds nothing) and no remembered
    ``has_verified`` answer. Yields the fake upstream."""
    settings.KEFU_SUMMARY_MIN_TURNS = 2
    settings.KEFU_CACHE_INDEX_REFRESH_MS = 3_600_000.0
    settings.KEFU_ANSWER_LEASE_S = 600.0
    settings.KEFU_LLM_FIRST_TOKEN_TIMEOUT_S = 15.0
    settings.KEFU_LLM_TOTAL_TIMEOUT_S = 30.0
    set_exact_store(LocalExactStore())
    cache_services.forget_verified()
    yield remote
    set_exact_store(None)
    cache_services.forget_verified()


async def settle(conversation_id: str) -> None:
    """Wait until the answer's work after ``stream.end`` ended: the conversation's answering loop
    (summary check started, cache store, near-miss judge started) and the background work it
    handed off (summary check, audits and judges, ledger rows). Conditions, never a fixed sleep."""
    cid = uuid.UUID(conversation_id)
    deadline = time.monotonic() + SETTLE_S
    while not answering.is_idle(cid):
        assert time.monotonic() < deadline, f"the answering loop of {cid} did not end in {SETTLE_S} s"
        await asyncio.sleep(0.01)
    await chat_tasks.drain()
    await routing_tasks.drain()
    await ledger.flush()


async def answered(shopper: Any, text: str) -> dict[str, Any]:
    """Say ``text``, wait for its ``stream.end`` and for the work after it; the ``stream.end``."""
    await shopper.say(text)
    end = (await shopper.until("stream.end", timeout=SETTLE_S))[-1]
    await settle(shopper.conversation)
    return end


async def measured(shopper: Any, text: str) -> tuple[dict[str, Any], Captured]:
    """:func:`answered`, its statements captured from the message frame to the settled end."""
    with all_threads_queries() as captured:
        end = await answered(shopper, text)
    return end, captured


def assert_within(captured: Captured, budget: int, what: str, *, periodic: int = 0) -> None:
    """At most ``budget`` statements (besides at most ``periodic`` of the change-log trim)."""
    statements = captured.snapshot()
    trim = [s for s in statements if "trim_change_log" in s.origin]
    counted = len(statements) - len(trim)
    assert counted <= budget and len(trim) <= periodic, (
        f"{what} sent {counted} statements, its budget is {budget} (plus {len(trim)} of the change-log "
        f"trim, at most {periodic}). A budget may rise only in a commit that says why and what it buys "
        f"(issue 39).\n{captured.report()}"
    )


@database_sync_to_async
def bot_row(message_id: int) -> Message:
    return Message.objects.get(pk=message_id)


async def seed_cache(make_client: Any, upstream: Any) -> None:
    """Two remote answers, stored in the answer cache, each the first message of a conversation
    of its own (an answer made with earlier turns is never stored: issue 29)."""
    upstream.push(Behaviour(text=LAMP_A), Behaviour(text=TABLE_A))
    for q in (LAMP_Q, TABLE_Q):
        seeder = await make_client()
        await seeder.hello()
        end = await answered(seeder, q)
        assert end["route"] == "llm.simple", end
    stored = await database_sync_to_async(lambda: sorted(CachedAnswer.objects.values_list("question", flat=True)))()
    assert stored == sorted([LAMP_Q, TABLE_Q])


async def test_faq_answer(make_client, faq, guarded):
    shopper = await make_client()
    await shopper.hello()
    assert (await answered(shopper, FAQ_WARM_UP))["route"] == "faq"

    end, captured = await measured(shopper, FAQ_Q)

    assert end["route"] == "faq" and end["text"] == FAQ_A, end
    row = await bot_row(end["id"])
    assert row.state == "done" and row.route == "faq" and row.text == FAQ_A
    assert_within(captured, FAQ_ANSWER_BUDGET, "a FAQ answer")


async def test_exact_cache_hit(make_client, faq, guarded):
    await seed_cache(make_client, guarded)
    calls = len(guarded.requests)
    shopper = await make_client()
    await shopper.hello()
    assert (await answered(shopper, LAMP_Q))["route"] == "cache.exact"

    end, captured = await measured(shopper, TABLE_Q.lower().rstrip("?"))

    assert end["route"] == "cache.exact" and end["text"] == TABLE_A, end
    assert len(guarded.requests) == calls  # neither reached the upstream
    row = await bot_row(end["id"])
    assert row.state == "done" and row.route == "cache.exact" and row.text == TABLE_A
    assert_within(captured, EXACT_HIT_BUDGET, "an exact cache hit")


async def test_semantic_cache_hit(make_client, faq, guarded):
    await seed_cache(make_client, guarded)
    calls = len(guarded.requests)
    shopper = await make_client()
    await shopper.hello()
    assert (await answered(shopper, LAMP_PARAPHRASE))["route"] == "cache.semantic"

    end, captured = await measured(shopper, TABLE_PARAPHRASE)

    assert end["route"] == "cache.semantic" and end["text"] == TABLE_A, end
    assert len(guarded.requests) == calls
    row = await bot_row(end["id"])
    assert row.state == "done" and row.route == "cache.semantic" and row.text == TABLE_A
    assert_within(captured, SEMANTIC_HIT_BUDGET, "a semantic cache hit")


async def test_remote_answer(make_client, faq, guarded):
    # Two answers first: the second is the first to look up a non-empty cache scope, which reads
    # once per scope and interval whether any of its entries is verified (has_verified): warm-up.
    guarded.push(
        Behaviour(text=LAMP_A),
        Behaviour(text=TABLE_A),
        Behaviour(text=COVER_A, prompt_tokens=900, completion_tokens=12),
    )
    shopper = await make_client()
    await shopper.hello()
    for q in (LAMP_Q, TABLE_Q):
        assert (await answered(shopper, q))["route"] == "llm.simple"

    end, captured = await measured(shopper, COVER_Q)

    assert end["route"] == "llm.simple" and end["model"] == "fake-simple" and end["text"] == COVER_A, end
    row = await bot_row(end["id"])
    assert row.state == "done" and row.route == "llm.simple" and row.text == COVER_A and row.prompt_tokens == 900
    calls = await database_sync_to_async(
        lambda: list(UpstreamCall.objects.filter(message__seq=row.reply_to_seq, message__conversation=row.conversation))
    )()
    assert [(c.tier, c.outcome, c.prompt_tokens) for c in calls] == [("simple", "ok", 900)]
    # Made with two earlier turns: this shopper's alone, never stored (issue 29; a clean remake,
    # off in tests, would store one off this path).
    assert not await database_sync_to_async(CachedAnswer.objects.filter(question=COVER_Q).exists)()
    assert_within(captured, REMOTE_ANSWER_BUDGET, "a remote answer", periodic=CHANGE_LOG_TRIM_STATEMENTS)
