"""One truth about availability: whether anyone from the team is online, where a waiting shopper
stands in the agents' queue and about how long they will wait.

Every place that tells a shopper about people uses :func:`of_conversation` / :func:`of_queue`:
the ``availability`` object of the ``conversation`` and ``status`` frames, the ``availability``
frame that follows the queue as it moves, the widget's header and the stored system notices
(``chat.handoff``). Shape (docs/protocol.md, availability)::

    {"agents_online": int,            # agents with a live console lease (chat.presence)
     "queue_position": int | None,    # 1 = next to be taken; None unless waiting_agent
     "expected_wait_s": int | None,   # None when unknown (see expected_wait_s)
     "contact_saved": bool}           # the shopper left an e-mail address

How the wait is estimated (:func:`expected_wait_s`): by Little's law (L = λW; J. D. C. Little,
"A Proof for the Queuing Formula L = λW", Operations Research 9(3), 1961), a shopper with P
conversations to be taken before and including theirs waits about P / λ, where λ is the rate at
which agents took conversations from the queue over the last ``WINDOW_S`` (one hour). With fewer
than ``MIN_TAKEN`` take-overs in that hour the rate says too little and the wait is None
(unknown): the widget then shows the position alone. With no agent online nobody will take it:
None as well, and the widget offers the e-mail form.
"""

from __future__ import annotations

import logging
import math
import uuid
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Any

from channels.db import database_sync_to_async
from django.utils import timezone

from . import presence
from .models import Conversation, ConversationStatus

log = logging.getLogger(__name__)

#: The take-over rate is measured over this many seconds (1 hour).
WINDOW_S = 3600
#: Fewer take-overs than this in the window: the wait is unknown.
MIN_TAKEN = 3
#: The estimate is rounded up to this many seconds: a shopper is told minutes, not seconds.
ROUND_S = 30


@dataclass(frozen=True)
class Availability:
    """What a shopper is told about people; see the module docstring for the fields."""

    agents_online: int
    queue_position: int | None = None
    expected_wait_s: int | None = None
    contact_saved: bool = False

    def as_dict(self) -> dict[str, Any]:
        """The ``availability`` object of the frames (module docstring)."""
        return asdict(self)


def expected_wait_s(*, position: int, taken_in_window: int, agents_online: int) -> int | None:
    """Seconds a shopper at queue ``position`` (1 = next) will wait, about: ``position / λ`` with
    ``λ = taken_in_window / WINDOW_S`` take-overs a second (Little's law, module docstring), rounded
    up to ``ROUND_S``. None when no agent is online or fewer than ``MIN_TAKEN`` were taken."""
    if agents_online <= 0 or taken_in_window < MIN_TAKEN or position <= 0:
        return None
    wait = position * WINDOW_S / taken_in_window
    return int(math.ceil(wait / ROUND_S) * ROUND_S)


def _taken_in_window() -> int:
    since = timezone.now() - timedelta(seconds=WINDOW_S)
    return Conversation.objects.filter(queue_taken_at__gt=since, sandbox=False).count()


def _waiting() -> list[tuple[uuid.UUID, bool]]:
    """The queue in the order agents take it (longest wait first, as the console lists it; no bot
    test's conversation)."""
    rows = (
        Conversation.objects.filter(status=ConversationStatus.WAITING_AGENT, sandbox=False)
        .order_by("waiting_since", "updated_at")
        .values_list("id", "contact_email")
    )
    return [(cid, bool(email)) for cid, email in rows]


def of_queue() -> dict[uuid.UUID, Availability]:
    """Availability of every waiting conversation (three queries, whatever the queue's length).
    Blocking."""
    online = presence.agents_online()
    taken = _taken_in_window()
    return {
        cid: Availability(
            agents_online=online,
            queue_position=i,
            expected_wait_s=expected_wait_s(position=i, taken_in_window=taken, agents_online=online),
            contact_saved=saved,
        )
        for i, (cid, saved) in enumerate(_waiting(), start=1)
    }


def of_conversation(conversation_id: uuid.UUID) -> Availability:
    """Availability as conversation ``conversation_id``'s shopper should see it now (a position
    and a wait only while it waits for an agent). Blocking; raises ``Conversation.DoesNotExist``."""
    status, email = Conversation.objects.values_list("status", "contact_email").get(pk=conversation_id)
    if status == ConversationStatus.WAITING_AGENT:
        mine = of_queue().get(conversation_id)
        if mine is not None:
            return mine
    return Availability(agents_online=presence.agents_online(), contact_saved=bool(email))


async def status_frame(conversation_id: uuid.UUID, status: str, *, agent: str = "") -> dict[str, Any]:
    """A ``status`` frame with its ``availability`` object (docs/protocol.md): the one place the
    frame is built, so every status change tells the shopper the same truth."""
    frame: dict[str, Any] = {"type": "status", "status": status}
    if agent:
        frame["agent"] = agent
    try:
        frame["availability"] = (await database_sync_to_async(of_conversation)(conversation_id)).as_dict()
    except Exception:  # the status change must still reach the shopper; the next frame corrects it
        log.exception("reading the availability of conversation %s failed", conversation_id)
    return frame
