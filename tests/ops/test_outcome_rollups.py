"""Outcomes in Ops' rollups (ops.rollup, ops.cells.window_outcomes, chat.outcomes.OutcomeTally):
read from the hourly rollups they are the raw rows' figures, open resolutions settle with time
and no re-roll, and a late rating, score, message or recontact reaches an hour rolled long ago at
the next 5-minute run."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from chat.models import Conversation, ConversationStatus, Message
from chat.outcomes import outcomes_summary, settle_time
from chat.services.messages import csat_record, feedback_record
from ops import selectors as ops
from ops.cells import HOUR, epoch, floor_to, window_outcomes
from ops.models import AnswerRollup, ConversationOutcome, OutcomeRollup, RolledHour
from ops.rollup import conversations_rescore, hours_roll, recent_roll

pytestmark = pytest.mark.django_db

NOW = timezone.now()
T0 = floor_to(NOW, HOUR) - timedelta(days=6)  # every hour from here to the current one is rolled


def conversation(
    start: datetime, *turns: tuple[Any, ...], customer: str = "", csat: int | None = None, status: str = "bot"
) -> uuid.UUID:
    """A conversation started at ``start`` with ``turns``: ``(minutes after start, role, route,
    rating, faq_entry_id)``; its ``updated_at`` is its last message's time, as in production."""
    conv = Conversation.objects.create(token_hash="x" * 64, customer_id=customer, csat_score=csat, status=status)
    last = start
    for seq, (minutes, role, route, rating, faq) in enumerate(turns, start=1):
        m = Message.objects.create(
            conversation=conv, seq=seq, role=role, text="t", route=route, rating=rating, faq_entry_id=faq
        )
        last = start + timedelta(minutes=minutes)
        Message.objects.filter(pk=m.pk).update(created_at=last)
    Conversation.objects.filter(pk=conv.pk).update(created_at=start, updated_at=last, last_seq=len(turns))
    return conv.pk


def asked(minutes: float = 0) -> tuple[Any, ...]:
    return (minutes, "shopper", "", "", None)


def answered(minutes: float = 0.1, *, route: str = "faq", rating: str = "", faq: int | None = 7) -> tuple[Any, ...]:
    return (minutes, "bot", route, rating, faq if route == "faq" else None)


def rolled(start: datetime, end: datetime, at: datetime) -> dict[str, Any]:
    return window_outcomes(start, end).summary(at)


def raw(start: datetime, end: datetime, at: datetime) -> dict[str, Any]:
    return outcomes_summary(since=start, until=end, now=at)


@pytest.fixture
def week(settings: Any) -> dict[str, uuid.UUID]:
    """Conversations over six days: settled ones of every kind, and ones still open today."""
    settings.KEFU_SESSION_IDLE_S = 3600
    h = timedelta(hours=1)
    day = 24 * 60
    return {
        "assumed": conversation(T0 + 5 * h, asked(), answered()),
        "confirmed": conversation(T0 + 5 * h + timedelta(minutes=20), asked(), answered(rating="up")),
        "happy": conversation(T0 + 30 * h, asked(), answered(), csat=5, status=ConversationStatus.CLOSED),
        "unhappy": conversation(T0 + 30 * h, asked(), answered(), csat=2, status=ConversationStatus.CLOSED),
        "handed": conversation(T0 + 50 * h, asked(), answered(route="handoff")),
        "recontact": conversation(T0 + 70 * h, asked(), answered(faq=7), asked(day), answered(day + 0.1, faq=7)),
        "unanswered": conversation(T0 + 71 * h, asked(), csat=3, status=ConversationStatus.CLOSED),
        # Still in their 72-hour window at NOW: open, and settling at different hours.
        "open_a": conversation(floor_to(NOW, HOUR) - 40 * h, asked(), answered(rating="up")),
        "open_b": conversation(floor_to(NOW, HOUR) - 20 * h + timedelta(minutes=35), asked(), answered()),
        "open_c": conversation(floor_to(NOW, HOUR) - 2 * h, asked(), answered(route="llm.simple")),
    }


def test_rolled_outcomes_are_the_raw_rows_figures_now_and_as_they_settle(week: dict[str, uuid.UUID]) -> None:
    end = floor_to(NOW, HOUR)
    start = T0 - timedelta(minutes=30)  # a partial first hour: read raw
    written = hours_roll(T0, end)
    assert written == 6 * 24
    assert RolledHour.objects.filter(outcomes_at__isnull=False).count() == written
    now = timezone.now()
    figures = rolled(start, end, now)
    assert figures == raw(start, end, now)
    assert figures["conversations"] == 9  # "unanswered" has no bot answer; its score still counts
    assert figures["open"] == 3
    assert figures["unresolved_by_reason"] == {"handoff": 1, "thumbs_down": 0, "low_csat": 1, "recontact": 1}
    assert figures["csat"]["distribution"] == {"1": 0, "2": 1, "3": 1, "4": 0, "5": 1}

    # The open ones are stored with the hour they settle; settled ones with 0.
    settles = sorted(
        OutcomeRollup.objects.filter(state__startswith="resolved", settles__gt=0).values_list("settles", flat=True)
    )
    first_answer = Message.objects.filter(conversation_id=week["open_a"], role="bot").get().created_at
    assert settles[0] == epoch(settle_time(first_answer, timedelta(hours=72)))
    assert len(settles) == 3

    # Time passes, nothing is re-rolled: each open resolution settles on the hour, as raw.
    for later in (32, 33, 53, 54, 71, 72, 200):
        at = end + timedelta(hours=later)
        assert rolled(start, end, at) == raw(start, end, at), later
    assert rolled(start, end, end + timedelta(hours=33))["open"] == 2
    assert rolled(start, end, end + timedelta(hours=72))["open"] == 0

    # The whole summary, through the page's reader, both ways.
    assert (
        ops.summary(start=start, end=end)["outcomes"]
        == ops.summary(start=start, end=end, use_rollups=False)["outcomes"]
    )


def test_a_settle_time_is_the_first_whole_hour_at_or_after_the_windows_end() -> None:
    on_the_hour = floor_to(NOW, HOUR)
    assert settle_time(on_the_hour, timedelta(hours=72)) == on_the_hour + timedelta(hours=72)
    assert settle_time(on_the_hour + timedelta(seconds=1), timedelta(hours=72)) == on_the_hour + timedelta(hours=73)


def test_late_signals_reach_hours_rolled_days_ago_at_the_next_run(week: dict[str, uuid.UUID]) -> None:
    end = floor_to(NOW, HOUR)
    hours_roll(T0, end)
    before = rolled(T0, end, timezone.now())
    assert before["unresolved_by_reason"]["thumbs_down"] == 0

    # 1. A thumbs-down today on an answer given five days ago.
    answer = Message.objects.get(conversation_id=week["assumed"], role="bot")
    feedback_record(conversation_id=week["assumed"], message_id=answer.pk, rating="down")
    # 2. A satisfaction score today for a conversation closed days ago.
    csat_record(conversation_id=week["happy"], score=1)
    # 3. A verified customer's conversation of 30 hours ago, and a new one now on the same topic.
    old = conversation(end - timedelta(hours=30), asked(), answered(faq=9), customer="cust-1")
    hours_roll(end - timedelta(hours=31), end)
    # 4. A shopper comes back to an open conversation on the same topic, a day after.
    Message.objects.create(conversation_id=week["open_b"], seq=3, role="shopper", text="again?")
    Message.objects.create(conversation_id=week["open_b"], seq=4, role="bot", text="a", route="faq", faq_entry_id=7)
    conversation(timezone.now(), asked(), answered(faq=9), customer="cust-1")

    stale = rolled(T0, end, timezone.now())
    assert stale["unresolved_by_reason"]["thumbs_down"] == 0  # not yet re-rolled
    assert stale != raw(T0, end, timezone.now())

    recent_roll(hours=3)
    now = timezone.now()
    after = rolled(T0, end, now)
    assert after == raw(T0, end, now)
    assert after["unresolved_by_reason"] == {"handoff": 1, "thumbs_down": 1, "low_csat": 2, "recontact": 3}
    assert after["csat"]["distribution"]["1"] == 1 and after["csat"]["distribution"]["5"] == 0
    # The rated answer's own hour was re-rolled whole: its rating is in the answers' rollup too.
    hour = epoch(floor_to(answer.created_at, HOUR))
    assert AnswerRollup.objects.get(hour=hour, route="faq").rated_down == 1
    assert Conversation.objects.filter(pk=old).exists()


def test_hours_rolled_before_outcomes_were_kept_are_read_raw(week: dict[str, uuid.UUID]) -> None:
    end = floor_to(NOW, HOUR)
    hours_roll(T0, end)
    # As after the upgrade that added outcome rollups: the hours are rolled, their outcomes not.
    RolledHour.objects.update(outcomes_at=None, csat_2=0, csat_3=0, csat_5=0)
    OutcomeRollup.objects.all().delete()
    now = timezone.now()
    assert rolled(T0, end, now) == raw(T0, end, now)
    assert rolled(T0, end, now)["conversations"] == 9


def test_a_rescore_changes_only_its_conversations_rows_and_regroups_their_hours(week: dict[str, uuid.UUID]) -> None:
    hour = epoch(T0 + timedelta(hours=5))
    assumed, confirmed = week["assumed"], week["confirmed"]
    assert conversations_rescore([assumed]) == 0  # its hour is not rolled up yet: nothing to re-group
    hours_roll(T0, T0 + timedelta(hours=6))
    rows = {r.conversation_id: r.state for r in ConversationOutcome.objects.filter(hour=hour)}
    assert rows == {assumed: "resolved_assumed", confirmed: "resolved_confirmed"}
    # Behind the rollup's back, the assumed one gets a thumbs-down and the confirmed one a bad score.
    Message.objects.filter(conversation_id=assumed, role="bot").update(rating="down")
    Conversation.objects.filter(pk=confirmed).update(csat_score=1)
    # A reading older than the hour's last one writes nothing.
    assert conversations_rescore([assumed], read_at=timezone.now() - timedelta(hours=1)) == 0
    # Only the assumed one is scored again: the hour's other conversation keeps its stored verdict,
    # while the hour's CSAT counts are read afresh.
    assert conversations_rescore([assumed]) == 1
    got = dict(ConversationOutcome.objects.filter(hour=hour).values_list("conversation_id", "reasons"))
    assert got == {assumed: "thumbs_down", confirmed: ""}
    keys = set(OutcomeRollup.objects.filter(hour=hour).values_list("state", "reasons", "settles", "conversations"))
    assert keys == {("unresolved", "thumbs_down", 0, 1), ("resolved_confirmed", "", 0, 1)}
    assert RolledHour.objects.get(hour=hour).csat_1 == 1
    assert conversations_rescore([assumed, confirmed]) == 1  # one hour, both conversations
    now = timezone.now()
    span = (T0 + timedelta(hours=5), T0 + timedelta(hours=6))
    assert rolled(*span, now) == raw(*span, now)
    assert rolled(*span, now)["unresolved_by_reason"] == {"handoff": 0, "thumbs_down": 1, "low_csat": 1, "recontact": 0}
