"""The conversations of agents who vanished go back to the queue or the bot.

An agent whose console leases all ran out (``chat.presence``) is gone. Every process sweeps for
them every ``KEFU_AGENT_SWEEP_S`` seconds (5; 0 turns the sweeper off), from the first socket it
serves: each conversation such an agent held goes back to the queue
(``KEFU_AGENT_GONE_ACTION=queue``, the default: status ``waiting_agent``, the bot helps meanwhile)
or to the bot (``bot``). The shopper is told with a stored system message, and what they sent
since anyone last replied is answered. The release is a conditional UPDATE, so of several
sweeping processes exactly one releases a conversation and tells the shopper.
"""

from __future__ import annotations

import asyncio
import logging
import weakref

from channels.db import database_sync_to_async
from django.conf import settings

from . import answering, events, services

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


async def stop_sweeper() -> None:
    """Stop this event loop's sweeper, if any (shutdown, tests)."""
    task = _sweepers.pop(asyncio.get_running_loop(), None)
    if task is not None:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
