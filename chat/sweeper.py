"""What a vanished agent or a dead process left behind: conversations held by an agent who is
gone go back to the queue or the bot, and answers left streaming are finished and asked again.

An agent whose console leases all ran out (``chat.presence``) is gone. Every process sweeps for
them every ``KEFU_AGENT_SWEEP_S`` seconds (5; 0 turns the sweeper off), from the first socket it
serves: each conversation such an agent held goes back to the queue
(``KEFU_AGENT_GONE_ACTION=queue``, the default: status ``waiting_agent``, the bot helps meanwhile)
or to the bot (``bot``). The shopper is told with a stored system message, and what they sent
since anyone last replied is answered. The release is a conditional UPDATE, so of several
sweeping processes exactly one releases a conversation and tells the shopper.

The same sweep finishes answers left ``streaming`` by a process that died mid-answer
(:func:`finish_orphaned_answers`): the shopper sees the partial answer marked interrupted, and
the question is answered again.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import uuid
import weakref

from channels.db import database_sync_to_async
from django.conf import settings
from django.core.cache import cache

from lib.background import Background
from routing import services as router

from . import answering, assignment, availability, events, services, shopper_presence, streams, tasks
from .models import ConversationStatus

log = logging.getLogger(__name__)


async def release_gone_agents() -> int:
    """Release every conversation held by a gone agent (module docstring) and tell each shopper;
    the number released by this call."""
    released = await database_sync_to_async(services.conversations_of_gone_agents)(
        action=settings.KEFU_AGENT_GONE_ACTION
    )
    for back, notice in released:
        change = back.change
        log.info("agent gone: conversation %s back to %s", change.conversation_id, change.status)
        await events.publish_owner_change(
            conversation_id=change.conversation_id, status=change.status, agent="", epoch=change.epoch
        )
        await events.publish(change.conversation_id, events.message_frame(notice))
        answering.answer_as_one(messages=back.unanswered, conversation=back.conversation)
    return len(released)


def _digest(state: availability.Availability) -> str:
    return hashlib.sha1(json.dumps(state.as_dict(), sort_keys=True).encode()).hexdigest()[:16]


def _told_key(conversation_id: uuid.UUID) -> str:
    return f"kefu:avail:{conversation_id.hex}"


#: How long the availability last told to a waiting shopper is remembered (seconds).
TOLD_TTL_S = 3600


def _changed(queue: dict[uuid.UUID, availability.Availability]) -> list[uuid.UUID]:
    keys = {_told_key(cid): cid for cid in queue}
    before = cache.get_many(list(keys))
    changed = {key: digest for key, cid in keys.items() if before.get(key) != (digest := _digest(queue[cid]))}
    if changed:
        cache.set_many(changed, TOLD_TTL_S)
    return [keys[key] for key in changed]


async def announce_queue() -> int:
    """Send an ``availability`` frame (``chat.availability``) to every waiting conversation whose
    availability differs from what it was last told by a sweep: the queue moved, an agent came or
    went, the take-over rate changed. Returns the number sent. The state last told is kept in the
    cache (shared by every process with ``REDIS_URL``), so one sweeping process tells each change;
    two sweeping at the same moment may both send it, and the widget just shows it again."""
    queue = await database_sync_to_async(availability.of_queue)()
    if not queue:
        return 0
    changed = await database_sync_to_async(_changed)(queue)
    for cid in changed:
        await events.publish(cid, {"type": "availability", **queue[cid].as_dict()})
    return len(changed)


INTERRUPTED = {
    "en": "The answer was interrupted. Answering your question again…",
    "zh": "回答中断了，正在重新为您解答…",
}


async def finish_orphaned_answers() -> int:
    """Finish every answer left streaming by a process that died (its lease,
    ``KEFU_ANSWER_LEASE_S``, ran out): the row is stored as cut with the text the shopper had (the
    stream buffer, when it survived), every socket gets its ``stream.end`` (``cut: true``) and an
    ``error`` ``unavailable``, a remote answer's call gets its estimated ledger row (the dead
    process never wrote one), and the question is answered again unless an agent holds the
    conversation. Each orphan is finished once however many processes sweep (a conditional
    update). The question is claimed again in the update that finishes the row, so a later
    message of the conversation waiting for this answer's end (one answer at a time, issue 29)
    is answered after the question's new answer and sees it. Returns how many this call
    finished."""
    orphans = await database_sync_to_async(services.orphaned_answers)()
    finished = 0
    for orphan in orphans:
        live = await streams.get(orphan.answer.pk)
        again = orphan.question is not None and orphan.conversation.status != ConversationStatus.AGENT
        row = await database_sync_to_async(services.orphan_finish)(
            message_id=orphan.answer.pk, text=live.text if live is not None else "", answer_again=again
        )
        if row is None:
            continue  # another process finished it
        finished += 1
        conversation = orphan.conversation
        log.warning("answer %s of %s was left streaming; finished as cut", row.pk, conversation.pk)
        try:
            await database_sync_to_async(router.answer_lost)(
                route=row.route,
                conversation_id=conversation.pk,
                question_message_id=orphan.question.pk if orphan.question is not None else None,
                question=orphan.question.text if orphan.question is not None else "",
                text=row.text,
                started_at=row.created_at,
                variant=row.variant,
            )
        except Exception:  # the cost estimate must not stop the shopper's answer
            log.exception("recording the lost call of answer %s failed", row.pk)
        await streams.end(row.pk)
        await events.publish(conversation.pk, events.stream_end_frame(row))
        text = INTERRUPTED.get(conversation.locale, INTERRUPTED["en"])
        await events.publish(conversation.pk, {"type": "error", "code": "unavailable", "message": text})
        if again and orphan.question is not None:
            answering.answer_as_one(messages=[orphan.question], conversation=conversation)
    return finished


async def answer_orphaned_claims() -> int:
    """Answer every shopper message whose claim ran out before its answer's row was written (the
    claiming process died in between: kill -9 right after it stored and claimed the message).
    Each is taken once however many processes sweep (a conditional update); returns how many."""
    taken = 0
    for orphan in await database_sync_to_async(services.orphaned_claims)():
        conversation = orphan.conversation
        if not await database_sync_to_async(services.orphan_claim_take)(
            conversation_id=conversation.pk, claim_until=orphan.claim_until
        ):
            continue
        taken += 1
        log.warning(
            "message %s of %s was claimed and never answered; answering it", orphan.question.seq, conversation.pk
        )
        answering.answer_as_one(messages=[orphan.question], conversation=conversation)
    return taken


_mail_work = Background("sending the e-mails due")


def emails_sweep() -> None:
    """Mark the shoppers with a socket open here as seen (``chat.shopper_presence``) and send the
    e-mails due (``chat.tasks.dispatch_due_emails``), in a worker thread nothing waits for; a
    sweep while the last one still runs does nothing. Returns at once."""
    if _mail_work.busy():
        return

    def run() -> None:
        shopper_presence.refresh()
        tasks.dispatch_due_emails()

    _mail_work.start(run)


_sweepers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = weakref.WeakKeyDictionary()


def ensure_sweeper() -> None:
    """Start this event loop's sweeper (idempotent; nothing when ``KEFU_AGENT_SWEEP_S`` is 0)."""
    if settings.KEFU_AGENT_SWEEP_S <= 0:
        return
    loop = asyncio.get_running_loop()
    task = _sweepers.get(loop)
    if task is None or task.done():
        _sweepers[loop] = loop.create_task(_sweep(), name="kefu-agent-sweeper")


async def _sweep() -> None:
    while True:
        await asyncio.sleep(settings.KEFU_AGENT_SWEEP_S)
        try:
            await release_gone_agents()
        except Exception:  # the task's edge: a failed sweep is logged and tried again next time
            log.exception("releasing the conversations of gone agents failed")
        try:
            await assignment.sweep()
        except Exception:  # the task's edge, as above
            log.exception("releasing or auto-assigning conversations failed")
        try:
            await finish_orphaned_answers()
        except Exception:  # the task's edge, as above
            log.exception("finishing orphaned answers failed")
        try:
            await answer_orphaned_claims()
        except Exception:  # the task's edge, as above
            log.exception("answering orphaned claims failed")
        try:
            await announce_queue()
        except Exception:  # the task's edge, as above
            log.exception("telling waiting shoppers their place in the queue failed")
        emails_sweep()


async def stop_sweeper() -> None:
    """Stop this event loop's sweeper, if any (shutdown, tests)."""
    task = _sweepers.pop(asyncio.get_running_loop(), None)
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
