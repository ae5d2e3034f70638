"""Celery tasks of chat (found by ``app.autodiscover_tasks()`` in config/celery.py), and how they
are enqueued. Each task takes ids only and calls a function of chat; each is enqueued when the
surrounding transaction commits.

Embedded defaults run Celery eagerly: a task then runs inside the caller's thread, which is why
the answering loop enqueues through :func:`maybe_summarise_async` (a worker thread it never waits
for)."""

from __future__ import annotations

import uuid

from celery import shared_task
from django.db import DatabaseError, transaction

from lib.background import Background
from routing import services as router

from . import mail
from .identity import used_tokens_purge
from .retention import conversations_purge
from .summary import conversation_summarise, summary_work


@shared_task(name="chat.tasks.purge_used_identity_tokens", ignore_result=True)
def purge_used_identity_tokens() -> int:
    """Forget the spent ids of identity tokens that expired (``chat.identity.used_tokens_purge``);
    returns how many went. On the beat schedule (``CELERY_BEAT_SCHEDULE``, hourly)."""
    return used_tokens_purge()


@shared_task(name="chat.tasks.purge_old_conversations", ignore_result=True)
def purge_old_conversations() -> int:
    """Delete the conversations idle longer than ``KEFU_RETENTION_DAYS`` (``chat.retention``;
    nothing when it is 0); returns how many. Daily on the beat schedule."""
    return conversations_purge().conversations


@shared_task(name="chat.tasks.summarise_conversation", ignore_result=True)
def summarise_conversation(conversation_id: str) -> str | None:
    """Fold the turns that left the prompt window into the conversation's rolling summary
    (``chat.summary.conversation_summarise``: the ``simple`` tier, a ledger row per attempt).

    ``conversation_id``: the ``chat.Conversation`` UUID as a string (JSON payload). Returns the
    new summary, or None when nothing was due, no model is configured or the call failed.
    Enqueued by :func:`maybe_summarise_async` after a remote answer whose prompt left out turns
    no summary covers (or by :func:`maybe_summarise`)."""
    return conversation_summarise(conversation_id=uuid.UUID(str(conversation_id)))


def maybe_summarise(*, conversation_id: uuid.UUID) -> bool:
    """Enqueue ``chat.tasks.summarise_conversation`` when the current transaction commits if the
    conversation has turns due for the summary (:func:`summary_work`). Returns whether it was
    enqueued. Synchronous; with eager Celery the summary itself runs here (use
    :func:`maybe_summarise_async` from the event loop)."""
    if not router.summaries_on() or summary_work(conversation_id=conversation_id) is None:
        return False
    transaction.on_commit(lambda: summarise_conversation.delay(str(conversation_id)), robust=True)
    return True


_background = Background("summarising a conversation")
# Conversations whose summary check (and, eager, summary) runs in this process now: one at a time,
# the next answer checks again (another summary meanwhile would repeat the same upstream call).
_summarising: set[uuid.UUID] = set()


async def maybe_summarise_async(*, conversation_id: uuid.UUID) -> None:
    """Enqueue ``chat.tasks.summarise_conversation`` for the answering loop, after an answer whose
    prompt left out turns no summary covers (``Answer.summary_due``): returns at once; the
    enqueue and (eager Celery) the summary run in a worker thread that nothing waits for, so the
    next message never waits for a summary. No "is a summary due?" query here: the task reads the
    turns anyway (:func:`summary_work`) and returns when none are due. No-op when summaries are
    off, or while this process is still enqueueing (or, eager, making) one for the conversation.
    :func:`drain` waits for those threads (tests, shutdown)."""
    if not router.summaries_on() or conversation_id in _summarising:
        return
    _summarising.add(conversation_id)

    def run() -> None:
        try:
            summarise_conversation.delay(str(conversation_id))
        finally:
            _summarising.discard(conversation_id)

    _background.start(run)


async def drain() -> None:
    """Wait until every summary handed off by :func:`maybe_summarise_async` on this loop has ended."""
    await _background.drain()


@shared_task(
    name="chat.tasks.send_email",
    ignore_result=True,
    autoretry_for=(DatabaseError,),
    retry_backoff=5,
    max_retries=5,
)
def send_email(email_id: int, attempt: int) -> str:
    """Send e-mail row ``email_id`` under its claim ``attempt`` (``chat.mail.email_send``);
    returns the outcome (``sent``, ``retry``, ``failed``, ``deferred``, ``skipped``, ``lost``).
    A database error is retried by Celery (same claim); a refused send is retried by the row
    itself (``chat.mail``), so a retry never sends twice."""
    return mail.email_send(int(email_id), int(attempt)).outcome


def dispatch_due_emails() -> int:
    """Owe the agents' digest when it is due (``chat.mail.digest_owed``), then claim every
    e-mail row due (``chat.mail.due_emails``) and hand each to
    :func:`send_email` (a Celery worker with ``REDIS_URL``; eager, here, otherwise). Returns how
    many this call claimed. Blocking: the sweeper runs it in a worker thread, never on the loop."""
    claimed = 0
    mail.digest_owed()
    for email_id in mail.due_emails():
        attempt = mail.email_claim(email_id)
        if attempt is not None:
            claimed += 1
            send_email.delay(email_id, attempt)
    return claimed


@shared_task(name="chat.tasks.send_due_emails", ignore_result=True)
def send_due_emails() -> int:
    """On the beat schedule (every 10 s): :func:`dispatch_due_emails`, for when no web process
    sweeps (every process's sweeper does the same, ``chat.sweeper``)."""
    return dispatch_due_emails()
