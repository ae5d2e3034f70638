"""Outcomes computed from known rows (chat/outcomes.py): resolved only when nothing says otherwise,
confirmed apart from assumed, recontacts on the same topic caught within the window, and the ops
summary's rates and CSAT figures exact."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from chat.models import Conversation, Message
from chat.outcomes import conversation_outcomes, outcomes_summary

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
NOW = T0 + timedelta(days=10)  # every window (72 h) has passed
SINCE, UNTIL = T0 - timedelta(hours=1), T0 + timedelta(days=1)


def conversation(
    *turns: tuple[Any, ...], customer: str = "", csat: int | None = None, start: datetime = T0
) -> uuid.UUID:
    """A conversation started at ``start`` with ``turns``: ``(minutes after start, role, route,
    rating, faq_entry_id)``."""
    conv = Conversation.objects.create(token_hash="x" * 64, customer_id=customer, csat_score=csat)
    Conversation.objects.filter(pk=conv.pk).update(created_at=start)
    for seq, (minutes, role, route, rating, faq) in enumerate(turns, start=1):
        m = Message.objects.create(
            conversation=conv, seq=seq, role=role, text="t", route=route, rating=rating, faq_entry_id=faq
        )
        Message.objects.filter(pk=m.pk).update(created_at=start + timedelta(minutes=minutes))
    return conv.pk


def asked(minutes: float = 0) -> tuple[Any, ...]:
    return (minutes, "shopper", "", "", None)


def answered(minutes: float = 0.1, *, route: str = "faq", rating: str = "", faq: int | None = 7) -> tuple[Any, ...]:
    return (minutes, "bot", route, rating, faq if route == "faq" else None)


def states(**kw: Any) -> dict[uuid.UUID, tuple[str, tuple[str, ...]]]:
    return {
        o.conversation_id: (o.state, o.reasons)
        for o in conversation_outcomes(since=SINCE, until=UNTIL, now=kw.pop("now", NOW), **kw)
    }


def test_each_signal_decides_the_outcome() -> None:
    plain = conversation(asked(), answered())
    thumbs_up = conversation(asked(), answered(rating="up"))
    happy = conversation(asked(), answered(), csat=5)
    unhappy = conversation(asked(), answered(), csat=2)
    neutral = conversation(asked(), answered(), csat=3)
    handed = conversation(asked(), answered(route="handoff"))
    agent = conversation(asked(), answered(), (5, "agent", "", "", None))
    down = conversation(asked(), answered(rating="down"), csat=1)
    never_answered = conversation(asked())
    got = states()
    assert got == {
        plain: ("resolved_assumed", ()),
        thumbs_up: ("resolved_confirmed", ()),
        happy: ("resolved_confirmed", ()),
        unhappy: ("unresolved", ("low_csat",)),
        neutral: ("resolved_assumed", ()),
        handed: ("unresolved", ("handoff",)),
        agent: ("unresolved", ("handoff",)),
        down: ("unresolved", ("thumbs_down", "low_csat")),
    }
    assert never_answered not in got


def test_a_recontact_on_the_same_topic_within_the_window_unresolves(settings: Any) -> None:
    settings.KEFU_SESSION_IDLE_S = 3600
    day = 24 * 60
    same = conversation(asked(), answered(faq=7), asked(day), answered(day + 0.1, faq=7))
    other_topic = conversation(asked(), answered(faq=7), asked(day), answered(day + 0.1, faq=9))
    to_a_person = conversation(asked(), answered(faq=7), asked(day), answered(day + 0.1, route="handoff"))
    too_late = conversation(asked(), answered(faq=7), asked(4 * day), answered(4 * day + 0.1, faq=7))
    same_session = conversation(asked(), answered(faq=7), asked(30), answered(30.1, faq=7))
    got = states()
    assert got[same] == ("unresolved", ("recontact",))
    assert got[other_topic] == ("resolved_assumed", ())
    # No topic to compare: a recontact is never excused for want of a label.
    assert got[to_a_person] == ("unresolved", ("handoff", "recontact"))
    assert got[too_late] == ("resolved_assumed", ())  # after the 72 h window
    assert got[same_session] == ("resolved_assumed", ())  # a follow-up, not a recontact


def test_a_verified_customer_coming_back_in_a_new_conversation_is_a_recontact() -> None:
    first = conversation(asked(), answered(faq=7), customer="cust-1")
    conversation(asked(), answered(faq=7), customer="cust-1", start=T0 + timedelta(hours=30))
    elsewhere = conversation(asked(), answered(faq=7), customer="cust-2")
    conversation(asked(), answered(faq=8), customer="cust-2", start=T0 + timedelta(hours=30))
    got = states()
    assert got[first] == ("unresolved", ("recontact",))
    assert got[elsewhere] == ("resolved_assumed", ())


def test_a_conversation_is_open_until_its_window_passes() -> None:
    conv = conversation(asked(), answered(rating="up"))
    assert states(now=T0 + timedelta(hours=71))[conv] == ("open", ())
    assert states(now=T0 + timedelta(hours=73))[conv] == ("resolved_confirmed", ())
    # A bad sign needs no waiting.
    bad = conversation(asked(), answered(rating="down"))
    assert states(now=T0 + timedelta(minutes=5))[bad] == ("unresolved", ("thumbs_down",))


def test_the_summary_counts_rates_and_csat_exactly() -> None:
    conversation(asked(), answered(rating="up"), csat=5)  # confirmed
    conversation(asked(), answered(), csat=4)  # confirmed
    conversation(asked(), answered())  # assumed
    conversation(asked(), answered(route="handoff"), csat=1)  # unresolved: handoff, low_csat
    conversation(asked(), answered(rating="down"))  # unresolved: thumbs_down
    conversation(asked(), answered(), start=T0 + timedelta(hours=2))  # assumed too: NOW is 10 days on
    summary = outcomes_summary(since=SINCE, until=UNTIL, now=NOW)
    assert summary == {
        "conversations": 6,
        "open": 0,
        "settled": 6,
        "resolved_confirmed": 2,
        "resolved_assumed": 2,
        "unresolved": 2,
        "unresolved_by_reason": {"handoff": 1, "thumbs_down": 1, "low_csat": 1, "recontact": 0},
        "resolution_rate": 4 / 6,
        "confirmed_resolution_rate": 2 / 6,
        "csat": {
            "responses": 3,
            "average": 10 / 3,
            "distribution": {"1": 1, "2": 0, "3": 0, "4": 1, "5": 1},
            "satisfied_share": 2 / 3,
        },
    }


def test_conversations_read_a_chunk_at_a_time_give_the_same_outcomes(monkeypatch: Any) -> None:
    """A month holds hundreds of thousands of conversations: they are read CHUNK at a time (one
    query's parameters stay bounded); a recontact in a conversation of another chunk still counts."""
    from chat import outcomes

    first = conversation(asked(), answered(faq=7), customer="cust-1")
    later = conversation(asked(), answered(faq=7), customer="cust-1", start=T0 + timedelta(hours=30))
    plain = conversation(asked(), answered(rating="up"))
    whole = states()
    monkeypatch.setattr(outcomes, "CHUNK", 1)
    assert states() == whole
    assert whole[first] == ("unresolved", ("recontact",)) and whole[plain] == ("resolved_confirmed", ())
    assert later not in whole  # it started after the window: only its recontact counts
