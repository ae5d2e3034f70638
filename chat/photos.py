"""The bot and a message that is only files (issue 33; docs/routing.md, "Photos").

Files never reach a model: the router sees a message's text alone, and a message with no text
(a photo or a PDF alone) is not asked of the router at all. The bot acknowledges it, and:

- when the conversation is **about an order or a complaint**, hands it to a person (route
  ``handoff``): an order number was named in this session's shopper messages
  (``KEFU_ORDER_NUMBER_PATTERN``), the router holds an order task for the conversation (a "where
  is my order", a cancel or a return under way; ``routing.services.conversation_task``), or the
  shopper complained about an answer in this session (``Conversation.complaint_at_seq``);
- otherwise asks what they need (route ``decline``: the bot's own words, no model).

Texts per locale; a locale without its own gets English.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from django.conf import settings

from routing import services as router

from .models import Conversation, Message, Role

PHOTO_REPLIES: dict[str, dict[str, str]] = {
    "handoff": {
        "en": "Thank you for the file. I'm passing it to a person on our team, who will look at it and reply here.",
        "zh": "感谢您发送的文件。我已将其转交给我们的客服人员，他们查看后会在这里回复您。",
    },
    "ask": {
        "en": "Thank you for the file. What can we help you with? Tell me in a few words and I'll take it from there.",
        "zh": "感谢您发送的文件。请问有什么可以帮您？请简单描述一下您的问题。",
    },
}


@dataclass(frozen=True)
class PhotoReply:
    """The bot's answer to a files-only message: its ``text``, ``route`` (``handoff`` or
    ``decline``) and ``reason`` (for agents: which rule held)."""

    text: str
    route: str
    reason: str

    @property
    def handoff(self) -> bool:
        return self.route == "handoff"


def photo_reply(*, conversation: Conversation, message: Message) -> PhotoReply:
    """What the bot answers to ``message`` (a shopper message with files and no text) of
    ``conversation`` (as claimed: its ``session_from_seq`` and complaint), by the rule of the
    module docstring. Blocking: one query for the session's texts, one for the order task."""
    locale = conversation.locale if conversation.locale in PHOTO_REPLIES["ask"] else "en"
    reason = _about_order_or_complaint(conversation=conversation, message=message)
    if reason:
        return PhotoReply(PHOTO_REPLIES["handoff"][locale], "handoff", f"file without text; {reason}")
    return PhotoReply(PHOTO_REPLIES["ask"][locale], "decline", "file without text; asked what they need")


def _about_order_or_complaint(*, conversation: Conversation, message: Message) -> str:
    """Why the conversation is about an order or a complaint ("" when it is not)."""
    if conversation.complaint_at_seq and conversation.complaint_at_seq > conversation.session_from_seq:
        return "the shopper complained about an answer"
    texts = Message.objects.filter(
        conversation_id=conversation.id,
        role=Role.SHOPPER,
        seq__gt=conversation.session_from_seq,
        seq__lte=message.seq,
    ).values_list("text", flat=True)
    pattern = re.compile(settings.KEFU_ORDER_NUMBER_PATTERN)
    if any(pattern.search(text) for text in texts):
        return "an order number was named"
    task = router.conversation_task(conversation_id=conversation.id)
    if task is not None and not task.get("expired"):
        return "an order task is under way"
    return ""
