"""Agent presence as leases: who is online, and what happens when an agent vanishes.

Each agent console socket holds a lease (:class:`~chat.models.AgentLease`) that its heartbeats
(every ``KEFU_AGENT_HEARTBEAT_S``, 10 s) move ``KEFU_AGENT_LEASE_S`` (30 s) ahead. "Agents online"
counts the agents with a live lease, the same in every process, and a killed process's leases
just run out (the cache counter this replaces stayed high for a day). A closed socket keeps its
lease until it expires: a reload of the console is not a leave.

An agent whose leases all ran out is gone: ``chat.sweeper`` gives their conversations back.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from .models import AgentLease

log = logging.getLogger(__name__)

GONE_NOTICE = {
    "queue": {
        "en": "{agent} had to leave. Your conversation is back in the queue for the next person on our "
        "team; I'll keep helping in the meantime.",
        "zh": "{agent} 暂时离开了。您的对话已重新排队，等待下一位客服；在此期间我会继续为您解答。",
    },
    "bot": {
        "en": "{agent} had to leave. I'm here to help in the meantime.",
        "zh": "{agent} 暂时离开了。在此期间由我继续为您解答。",
    },
}


def gone_notice(*, agent: str, action: str, locale: str) -> str:
    """The system message a shopper gets when their agent ``agent`` left (``action``: ``queue``
    or ``bot``), in ``locale`` (English when it has no text)."""
    texts = GONE_NOTICE[action]
    return texts.get(locale, texts["en"]).format(agent=agent or "Our agent")


def lease_open(*, agent_id: int, channel_name: str) -> None:
    """Start the lease of a new console socket (blocking)."""
    expires = timezone.now() + timedelta(seconds=settings.KEFU_AGENT_LEASE_S)
    AgentLease.objects.update_or_create(
        channel_name=channel_name, defaults={"agent_id": agent_id, "expires_at": expires}
    )


def lease_renew(*, channel_name: str) -> bool:
    """A heartbeat: move the socket's lease ``KEFU_AGENT_LEASE_S`` ahead. False when it has none
    (it ran out and was swept: the caller opens a new one). Blocking."""
    expires = timezone.now() + timedelta(seconds=settings.KEFU_AGENT_LEASE_S)
    return bool(AgentLease.objects.filter(channel_name=channel_name).update(expires_at=expires))


def agents_online() -> int:
    """Agents with a live lease now (0 or more; two consoles of one agent count once). Blocking."""
    return AgentLease.objects.filter(expires_at__gt=timezone.now()).values("agent_id").distinct().count()


def gone_agents(agent_ids: list[int]) -> set[int]:
    """Of ``agent_ids``, those with no live lease (their last one ran out). Blocking."""
    live = set(
        AgentLease.objects.filter(agent_id__in=agent_ids, expires_at__gt=timezone.now()).values_list(
            "agent_id", flat=True
        )
    )
    AgentLease.objects.filter(expires_at__lte=timezone.now() - timedelta(hours=1)).delete()  # tidy up
    return set(agent_ids) - live
