"""Escalation: a conversation goes to the agents' queue with a packet that tells the agent why,
what happened so far and what the bot already told the shopper.

Packet shape (stored in ``Conversation.handoff_packet``, sent in the console's ``handoff`` and
``history`` frames)::

    {
      "rule": "asked_for_person" | "no_answer" | "remote_failed" | "asked_again" | "bot_handoff",
      "via": "button",            # only when the shopper pressed "talk to a person" (ask_person)
      "reason": str,              # the router's own words (Decision.reason)
      "route": str,               # route of the answer that escalated (handoff, or faq when the
                                  # shopper asked for a person and the FAQ answered first)
      "matched": str,             # the words that matched the request-a-person rules ("" if none)
      "shopper_request": {"seq": int, "text": str},   # the message that escalated
      "summary": str,             # a few lines, at most ~400 code points (English)
      "facts": {"shopper": int, "bot": int, "first": str, "latest": str, "routes": [str]},
                                  # what the summary says, for agents in their language
                                  # (chat.staff_text.packet_for_staff)
      "bot_told": [{"seq": int, "route": str, "text": str, "cut": bool}],  # last 5 bot answers
      "at": str                   # ISO 8601, UTC
    }
"""

from __future__ import annotations

import uuid
from typing import Any

from channels.db import database_sync_to_async
from django.utils import timezone

from lib import sandbox
from routing import services as router

from . import assignment, availability, events, presence, services
from .models import Conversation, ConversationStatus, Message, Role
from .selectors import console_rows

NO_AGENT_NOTICE = {
    "en": "No one from our team is online right now. Your conversation is in the queue and a person "
    "will reply here as soon as one is available; you can also leave your e-mail address below. "
    "Meanwhile I'll keep helping with what I can.",
    "zh": "目前没有人工客服在线。您的对话已在排队，客服上线后会在这里回复您；您也可以在下方留下邮箱。"
    "在此之前我会继续尽力为您解答。",
}
BOT_TOLD_MAX = 5
SNIPPET = 140


def no_agent_notice(*, conversation_id: uuid.UUID, locale: str) -> str | None:
    """The stored notice of a handoff when no agent is online (None when one is: hours never
    hide a person who is there): outside opening hours, when the team is back in the shopper's
    time zone and language (``availability.closed_notice``); else :data:`NO_AGENT_NOTICE`. Blocking."""
    if presence.agents_online() > 0:
        return None
    if availability.hours() is not None:
        zone = Conversation.objects.filter(pk=conversation_id).values_list("time_zone", flat=True).first() or ""
        closed = availability.closed_notice(locale=locale, time_zone=zone)
        if closed is not None:
            return closed
    return NO_AGENT_NOTICE.get(locale, NO_AGENT_NOTICE["en"])


def _snippet(text: str, n: int = SNIPPET) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def matched_request(text: str) -> str:
    """The words of ``text`` that match routing's request-a-person rules, or ""."""
    return router.person_request_words(text)


def rule_of(*, text: str, route: str, reason: str) -> str:
    """Why the conversation escalates, as a stable code (see the module docstring)."""
    if matched_request(text):
        return "asked_for_person"
    if reason.startswith("remote model failed"):
        return "remote_failed"
    if reason.startswith("asked again after"):  # routing.decide.repeat
        return "asked_again"
    if route == "handoff":
        return "no_answer"
    return "bot_handoff"


def build_packet(*, conversation_id: uuid.UUID, message: Message, route: str, reason: str) -> dict[str, Any]:
    """The escalation packet for ``message`` (the shopper message whose answer escalated), from the
    current session's messages only (``Conversation.session_from_seq``)."""
    session_from = (
        Conversation.objects.filter(pk=conversation_id).values_list("session_from_seq", flat=True).first() or 0
    )
    rows = list(
        Message.objects.filter(conversation_id=conversation_id, seq__gt=session_from, seq__lte=message.seq + 1)
        .exclude(role=Role.SYSTEM)
        .order_by("seq")
        .values("seq", "role", "text", "route", "cut")
    )
    shopper = [r for r in rows if r["role"] == Role.SHOPPER]
    bots = [r for r in rows if r["role"] == Role.BOT and r["text"]]
    lines = [f"{len(shopper)} shopper message(s), {len(bots)} bot answer(s)."]
    if shopper:
        lines.append(f"First asked: “{_snippet(shopper[0]['text'], 110)}”")
    if len(shopper) > 1:
        lines.append(f"Latest: “{_snippet(shopper[-1]['text'], 110)}”")
    routes = sorted({b["route"] for b in bots if b["route"]})
    facts = {
        "shopper": len(shopper),
        "bot": len(bots),
        "first": _snippet(shopper[0]["text"], 110) if shopper else "",
        "latest": _snippet(shopper[-1]["text"], 110) if len(shopper) > 1 else "",
        "routes": routes,
    }
    if routes:
        lines.append("Bot answered via " + ", ".join(routes) + ".")
    return {
        "rule": rule_of(text=message.text, route=route, reason=reason),
        "reason": reason,
        "route": route,
        "matched": matched_request(message.text),
        "shopper_request": {"seq": message.seq, "text": message.text[:2000]},
        "summary": "\n".join(lines)[:400],
        "facts": facts,
        "bot_told": [
            {"seq": b["seq"], "route": b["route"], "text": _snippet(b["text"], 400), "cut": b["cut"]}
            for b in bots[-BOT_TOLD_MAX:]
        ],
        "at": timezone.now().isoformat(),
    }


def _escalate(
    *, conversation_id: uuid.UUID, message: Message, route: str, reason: str, locale: str
) -> services.Escalation:
    packet = build_packet(conversation_id=conversation_id, message=message, route=route, reason=reason)
    notice = no_agent_notice(conversation_id=conversation_id, locale=locale)
    return services.conversation_escalate(
        conversation_id=conversation_id, reason=reason, packet=packet, no_agent_notice=notice
    )


async def escalate(*, conversation_id: uuid.UUID, message: Message, route: str, reason: str, locale: str) -> None:
    """Queue the conversation for an agent after the answer to ``message`` ended, then publish:
    ``status`` ``waiting_agent`` to the conversation (after every handoff answer, as before);
    when it newly entered the queue, a ``handoff`` frame to every agent console and, if no agent
    is online, the stored ``system`` notice to the shopper. The bot keeps answering meanwhile."""
    esc = await database_sync_to_async(_escalate)(
        conversation_id=conversation_id, message=message, route=route, reason=reason, locale=locale
    )
    await _published(conversation_id, esc)


def _asked_by_button(*, conversation_id: uuid.UUID, locale: str) -> services.Escalation:
    """Escalate for the ``ask_person`` frame: the packet of the session's latest shopper message
    (``shopper_request`` ``{"seq": 0, "text": ""}`` when there is none yet), rule
    ``asked_for_person``, ``via`` ``button``."""
    session_from = (
        Conversation.objects.filter(pk=conversation_id).values_list("session_from_seq", flat=True).first() or 0
    )
    latest = (
        Message.objects.filter(conversation_id=conversation_id, seq__gt=session_from, role=Role.SHOPPER)
        .order_by("-seq")
        .first()
    )
    reason = "shopper pressed talk to a person"
    if latest is None:
        latest = Message(conversation_id=conversation_id, seq=0, role=Role.SHOPPER, text="")
    packet = build_packet(conversation_id=conversation_id, message=latest, route="handoff", reason=reason)
    packet.update(rule="asked_for_person", via="button")
    notice = no_agent_notice(conversation_id=conversation_id, locale=locale)
    return services.conversation_escalate(
        conversation_id=conversation_id, reason=reason, packet=packet, no_agent_notice=notice
    )


async def escalate_on_request(*, conversation_id: uuid.UUID, locale: str) -> None:
    """The shopper pressed "talk to a person" (the ``ask_person`` frame): the conversation enters
    the agents' queue at once, whatever the bot is doing, and the frames of :func:`escalate` are
    published. Nothing when an agent holds it or it is closed; already waiting: only its packet
    is renewed. Raises what the database raises."""
    esc = await database_sync_to_async(_asked_by_button)(conversation_id=conversation_id, locale=locale)
    await _published(conversation_id, esc)


async def _published(conversation_id: uuid.UUID, esc: services.Escalation) -> None:
    """Publish an escalation's frames (see :func:`escalate`)."""
    if esc.status != ConversationStatus.WAITING_AGENT:
        return  # an agent took it over (or it closed) meanwhile: nothing to queue
    await events.publish(
        conversation_id, await availability.status_frame(conversation_id, ConversationStatus.WAITING_AGENT.value)
    )
    if esc.notice is not None:
        await events.publish(conversation_id, events.message_frame(esc.notice))
    if esc.entered and not sandbox.active():  # a bot test's handoff alerts no agent (lib.sandbox)
        # Assigned first (KEFU_AUTO_ASSIGN): the row then names the assignee, and only their
        # console alerts (chat.assignment).
        assigned = await assignment.auto_assign_now(conversation_id)
        row = await database_sync_to_async(conversation_row)(conversation_id=conversation_id)
        if row is not None:
            await events.publish_agents(
                {"type": "handoff", "conversation": row["id"], "info": row, "packet": esc.packet}
            )
        await assignment.publish(assigned)


def conversation_row(*, conversation_id: uuid.UUID) -> dict[str, Any] | None:
    """One row of the console list (``chat.selectors.console_rows`` shape), or None."""
    rows = console_rows(queryset=Conversation.objects.filter(pk=conversation_id))
    return rows[0] if rows else None
