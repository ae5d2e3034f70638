"""One truth about availability: whether anyone from the team is online, where a waiting shopper
stands in the agents' queue and about how long they will wait.

Every place that tells a shopper about people uses :func:`of_conversation` / :func:`of_queue`:
the ``availability`` object of the ``conversation`` and ``status`` frames, the ``availability``
frame that follows the queue as it moves, the widget's header and the stored system notices
(``chat.handoff``). Shape (docs/protocol.md, availability)::

    {"agents_online": int,            # agents with a live console lease (chat.presence)
     "queue_position": int | None,    # 1 = next to be taken; None unless waiting_agent
     "expected_wait_s": int | None,   # None when unknown (see expected_wait_s)
     "contact_saved": bool,           # the shopper left an e-mail address
     # only when KEFU_BUSINESS_HOURS is set (lib.business_hours):
     "open": bool,                    # within the store's opening hours now
     "opens_at": str | None}          # when closed: the next opening, ISO 8601 UTC (None: none within a year)

How the wait is estimated (:func:`expected_wait_s`): by Little's law (L = λW; J. D. C. Little,
"A Proof for the Queuing Formula L = λW", Operations Research 9(3), 1961), a shopper with P
conversations to be taken before and including theirs waits about P / λ, where λ is the rate at
which agents took conversations from the queue over the last ``WINDOW_S`` (one hour). With fewer
than ``MIN_TAKEN`` take-overs in that hour the rate says too little and the wait is None
(unknown), and so it is when the queue is not moving (no take-over in the last
``MOVING_WINDOW_S``, 30 min): the widget then says "we'll reply here or by e-mail". The estimate
is never more than the longest wait a shopper actually had over the last ``LONGEST_WINDOW_S`` (a
day): a queue that never clears cannot promise 200 minutes. With no agent online nobody will take
it: None as well, and the widget offers the e-mail form.

Opening hours (``KEFU_BUSINESS_HOURS``, :func:`hours`): outside them, with nobody online, the
widget says when the team is back (``opens_at``, shown in the shopper's own time zone and
language) and offers the e-mail form, and a handoff queues and says so (:func:`closed_notice`). An
agent online outside hours still counts as online: hours never hide a person who is there.
"""

from __future__ import annotations

import json
import logging
import math
import uuid
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from channels.db import database_sync_to_async
from django.conf import settings
from django.db.models import Count, DurationField, ExpressionWrapper, F, Max, Q
from django.utils import timezone

from lib import business_hours

from . import presence
from .models import Conversation, ConversationStatus

log = logging.getLogger(__name__)

#: The take-over rate is measured over this many seconds (1 hour).
WINDOW_S = 3600
#: Fewer take-overs than this in the window: the wait is unknown.
MIN_TAKEN = 3
#: The estimate is rounded up to this many seconds: a shopper is told minutes, not seconds.
ROUND_S = 30
#: No take-over in this many seconds: the queue is not moving, the wait is unknown (30 min).
MOVING_WINDOW_S = 1800
#: The estimate never exceeds the longest wait observed over this many seconds (a day).
LONGEST_WINDOW_S = 24 * 3600


@dataclass(frozen=True)
class Availability:
    """What a shopper is told about people; see the module docstring for the fields."""

    agents_online: int
    queue_position: int | None = None
    expected_wait_s: int | None = None
    contact_saved: bool = False
    open: bool | None = None  # None: no opening hours set (always open; not in the frames)
    opens_at: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The ``availability`` object of the frames (module docstring)."""
        out = asdict(self)
        if self.open is None:
            del out["open"], out["opens_at"]
        return out


def expected_wait_s(
    *,
    position: int,
    taken_in_window: int,
    agents_online: int,
    moving: bool = True,
    longest_s: float | None = None,
) -> int | None:
    """Seconds a shopper at queue ``position`` (1 = next) will wait, about: ``position / λ`` with
    ``λ = taken_in_window / WINDOW_S`` take-overs a second (Little's law, module docstring), rounded
    up to ``ROUND_S``, and never more than ``longest_s`` (the longest wait observed over the last
    day, seconds; None: none observed, no cap). None when no agent is online, fewer than
    ``MIN_TAKEN`` were taken, or the queue is not ``moving`` (no take-over in 30 min)."""
    if agents_online <= 0 or taken_in_window < MIN_TAKEN or position <= 0 or not moving:
        return None
    wait = position * WINDOW_S / taken_in_window
    if longest_s is not None:
        wait = min(wait, max(longest_s, ROUND_S))
    return int(math.ceil(wait / ROUND_S) * ROUND_S)


def _taken_in_window() -> int:
    since = timezone.now() - timedelta(seconds=WINDOW_S)
    return Conversation.objects.filter(queue_taken_at__gt=since, sandbox=False).count()


@dataclass(frozen=True)
class QueueRate:
    """The queue's recent take-overs: how many in the last hour, whether any in the last 30 min,
    and the longest wait of the day's take-overs (seconds; None when none is known)."""

    taken_in_window: int
    moving: bool
    longest_s: float | None


def _rate() -> QueueRate:
    """One query: the day's take-overs."""
    now = timezone.now()
    row = Conversation.objects.filter(queue_taken_at__gt=now - timedelta(seconds=LONGEST_WINDOW_S)).aggregate(
        taken=Count("pk", filter=Q(queue_taken_at__gt=now - timedelta(seconds=WINDOW_S))),
        last=Max("queue_taken_at"),
        longest=Max(ExpressionWrapper(F("queue_taken_at") - F("queue_waited_from"), output_field=DurationField())),
    )
    last, longest = row["last"], row["longest"]
    return QueueRate(
        taken_in_window=row["taken"] or 0,
        moving=last is not None and last > now - timedelta(seconds=MOVING_WINDOW_S),
        longest_s=longest.total_seconds() if isinstance(longest, timedelta) else None,
    )


# --- opening hours ---------------------------------------------------------------------------------

_parsed: tuple[str, business_hours.BusinessHours | None] | None = None


def hours() -> business_hours.BusinessHours | None:
    """The store's opening hours (``KEFU_BUSINESS_HOURS``, checked at start-up), or None: always open."""
    global _parsed
    raw = json.dumps(settings.KEFU_BUSINESS_HOURS, sort_keys=True)
    if _parsed is None or _parsed[0] != raw:
        _parsed = (raw, business_hours.parse(settings.KEFU_BUSINESS_HOURS))
    return _parsed[1]


def opening(now: datetime | None = None) -> tuple[bool | None, str | None]:
    """``(open, opens_at)`` of the availability object: ``(None, None)`` without opening hours;
    ``(True, None)`` within them; ``(False, ISO 8601 UTC of the next opening or None)`` outside."""
    bh = hours()
    if bh is None:
        return None, None
    now = now or timezone.now()
    if bh.is_open(now):
        return True, None
    back = bh.next_open(now)
    return False, back.astimezone(UTC).isoformat().replace("+00:00", "Z") if back else None


CLOSED_NOTICE = {
    "en": "We're closed right now; our team is back {when}. Your conversation is in the queue for "
    "them, and you can leave your e-mail address below to get the reply there. Meanwhile I'll keep "
    "helping with what I can.",
    "zh": "我们目前不在营业时间内，客服将于{when}回来。您的对话已在排队等候；您也可以在下方留下邮箱，"
    "我们会通过邮件回复您。在此之前我会继续尽力为您解答。",
}
WEEKDAYS = {
    "en": ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"),
    "zh": ("周一", "周二", "周三", "周四", "周五", "周六", "周日"),
}


def when_text(back: datetime, *, locale: str, time_zone: str) -> str:
    """``back`` in the shopper's ``time_zone`` (an IANA name; the store's own when "" or unknown)
    and language: "on Monday 8 December at 09:00 (Asia/Shanghai time)", "12月8日周一 09:00（Asia/Shanghai 时间）"."""
    try:
        zone = ZoneInfo(time_zone) if time_zone else back.tzinfo
    except (ZoneInfoNotFoundError, ValueError):
        zone = back.tzinfo
    local = back.astimezone(zone)
    name = str(getattr(zone, "key", "") or local.tzname() or "")
    if locale == "zh":
        return f"{local.month}月{local.day}日{WEEKDAYS['zh'][local.weekday()]} {local:%H:%M}（{name} 时间）"
    months = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ]
    return f"on {WEEKDAYS['en'][local.weekday()]} {local.day} {months[local.month - 1]} at {local:%H:%M} ({name} time)"


def closed_notice(*, locale: str, time_zone: str, now: datetime | None = None) -> str | None:
    """The stored notice of a handoff made outside opening hours with nobody online (module
    docstring), in ``locale`` (English for languages without it); None within hours or without
    any. Blocking (no query)."""
    bh = hours()
    now = now or timezone.now()
    if bh is None or bh.is_open(now):
        return None
    back = bh.next_open(now)
    texts = CLOSED_NOTICE.get(locale, CLOSED_NOTICE["en"])
    when = when_text(back, locale=locale if locale in CLOSED_NOTICE else "en", time_zone=time_zone) if back else ""
    return texts.format(when=when or ("soon" if locale != "zh" else "稍后"))


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
    rate = _rate()
    is_open, opens_at = opening()
    return {
        cid: Availability(
            agents_online=online,
            queue_position=i,
            expected_wait_s=expected_wait_s(
                position=i,
                taken_in_window=rate.taken_in_window,
                agents_online=online,
                moving=rate.moving,
                longest_s=rate.longest_s,
            ),
            contact_saved=saved,
            open=is_open,
            opens_at=opens_at,
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
    is_open, opens_at = opening()
    return Availability(
        agents_online=presence.agents_online(), contact_saved=bool(email), open=is_open, opens_at=opens_at
    )


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
