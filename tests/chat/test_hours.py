"""Opening hours (KEFU_BUSINESS_HOURS, lib.business_hours) in the one availability truth
(chat.availability), and an expected wait that means something: capped by the day's longest
observed wait, unknown when the queue is not moving."""

from __future__ import annotations

import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from channels.db import database_sync_to_async
from django.utils import timezone

from chat import availability
from chat.models import Conversation, ConversationStatus
from lib import business_hours

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_console
from test_console import handed_off

make_agent = test_console.make_agent

BERLIN = {
    "tz": "Europe/Berlin",
    "mon": ["09:00-12:30", "13:30-18:00"],
    "tue": ["09:00-18:00"],
    "wed": ["09:00-18:00"],
    "thu": ["09:00-18:00"],
    "fri": ["09:00-18:00"],
    "closed": ["2026-12-25"],
}
SHANGHAI = {"tz": "Asia/Shanghai", "mon": ["09:00-21:00"], "sat": ["10:00-16:00"]}


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_open_and_back_at_in_the_stores_time_zone():
    bh = business_hours.parse(BERLIN)
    # Monday 7 Dec 2026, 08:30 UTC = 09:30 in Berlin (CET, UTC+1): open.
    assert bh.is_open(utc(2026, 12, 7, 8, 30))
    # 12:00 UTC = 13:00 Berlin: the lunch break; back at 13:30 Berlin = 12:30 UTC.
    assert not bh.is_open(utc(2026, 12, 7, 12, 0))
    assert bh.next_open(utc(2026, 12, 7, 12, 0)) == utc(2026, 12, 7, 12, 30)
    # Thursday 24 Dec, 18:30 Berlin: Friday 25th is closed, the weekend too: back Monday 28th, 09:00.
    assert bh.next_open(utc(2026, 12, 24, 17, 30)) == utc(2026, 12, 28, 8, 0)
    # Summer time: 09:00 in Berlin is 07:00 UTC.
    assert bh.next_open(utc(2026, 7, 6, 6, 0)) == utc(2026, 7, 6, 7, 0)


def test_the_same_instant_in_another_stores_time_zone():
    bh = business_hours.parse(SHANGHAI)
    # Monday 7 Dec 2026, 02:00 UTC = 10:00 in Shanghai: open there, while Berlin sleeps.
    assert bh.is_open(utc(2026, 12, 7, 2, 0))
    assert not business_hours.parse(BERLIN).is_open(utc(2026, 12, 7, 2, 0))
    # Monday 21:30 Shanghai: back Saturday 10:00 Shanghai = 02:00 UTC.
    assert bh.next_open(utc(2026, 12, 7, 13, 30)) == utc(2026, 12, 12, 2, 0)


@pytest.mark.parametrize(
    ("config", "says"),
    [
        ({"tz": "Mars/Olympus", "mon": ["09:00-17:00"]}, "not an IANA time zone"),
        ({"mon": ["17:00-09:00"]}, "ends before it starts"),
        ({"mon": ["9-17"]}, "is not HH:MM"),
        ({"monday": ["09:00-17:00"]}, "unknown keys ['monday']"),
        ({"mon": ["09:00-17:00"], "closed": ["25.12.2026"]}, "closed:"),
        ({"tz": "UTC"}, "no weekday has opening hours"),
    ],
)
def test_bad_hours_are_named(config, says):
    with pytest.raises(ValueError, match=None) as e:
        business_hours.parse(config)
    assert says in str(e.value)


def test_unset_is_always_open(settings):
    settings.KEFU_BUSINESS_HOURS = {}
    assert availability.opening() == (None, None)
    assert availability.closed_notice(locale="en", time_zone="") is None


def test_the_shopper_is_told_when_the_team_is_back_in_their_own_time_zone_and_language(settings):
    settings.KEFU_BUSINESS_HOURS = BERLIN
    night = utc(2026, 12, 7, 23, 0)  # Tuesday 00:00 in Berlin, 07:00 in Shanghai
    assert availability.opening(night) == (False, "2026-12-08T08:00:00Z")
    en = availability.closed_notice(locale="en", time_zone="America/New_York", now=night)
    assert "back on Tuesday 8 December at 03:00 (America/New_York time)" in en
    zh = availability.closed_notice(locale="zh", time_zone="Asia/Shanghai", now=night)
    assert "客服将于12月8日周二 16:00（Asia/Shanghai 时间）回来" in zh
    # No time zone from the widget: the store's own, named.
    assert "at 09:00 (Europe/Berlin time)" in availability.closed_notice(locale="es", time_zone="", now=night)
    assert availability.opening(utc(2026, 12, 8, 9, 0)) == (True, None)


def test_the_wait_is_capped_by_the_longest_observed_and_unknown_when_the_queue_stands_still():
    # 3 taken in the hour: 1,200 s each; the 5th in line would wait 6,000 s...
    assert availability.expected_wait_s(position=5, taken_in_window=3, agents_online=1) == 6000
    # ...but nobody waited more than 900 s today: never promised more.
    assert availability.expected_wait_s(position=5, taken_in_window=3, agents_online=1, longest_s=900) == 900
    # No take-over in 30 min: unknown, however many in the hour.
    assert availability.expected_wait_s(position=1, taken_in_window=9, agents_online=2, moving=False) is None


@database_sync_to_async
def taken(minutes_ago: float, waited_minutes: float) -> None:
    taken_at = timezone.now() - timedelta(minutes=minutes_ago)
    Conversation.objects.create(
        token_hash="x" * 64,
        status=ConversationStatus.CLOSED,
        queue_taken_at=taken_at,
        queue_waited_from=taken_at - timedelta(minutes=waited_minutes),
    )


@pytest.mark.django_db(transaction=True)
async def test_the_queue_tells_a_capped_wait_then_unknown_once_it_stops_moving(make_client, make_agent, faq):
    alice = await make_agent("alice", "Alice")
    for _ in range(3):
        await taken(minutes_ago=10, waited_minutes=2)  # three in 10 min ago, each after 2 min
    shoppers = [await make_client() for _ in range(4)]
    for s in shoppers:
        await s.hello()
        await handed_off(s)
    queue = await database_sync_to_async(availability.of_queue)()
    # 4th in line: 4 x 1,200 s by the rate, but nobody waited more than 120 s today.
    assert queue[uuid_of(shoppers[3])].expected_wait_s == 120
    # Alice takes the first: its own wait is recorded for the cap.
    await alice.send({"type": "take_over", "conversation": shoppers[0].conversation})
    await shoppers[0].until("status")
    row = await database_sync_to_async(Conversation.objects.get)(pk=shoppers[0].conversation)
    assert row.queue_waited_from is not None and row.queue_waited_from <= row.queue_taken_at
    # Nobody taken for 30 min: the wait is unknown (the widget: "we'll reply here or by e-mail").
    await database_sync_to_async(Conversation.objects.exclude(queue_taken_at=None).update)(
        queue_taken_at=timezone.now() - timedelta(minutes=31)
    )
    queue = await database_sync_to_async(availability.of_queue)()
    assert {a.expected_wait_s for a in queue.values()} == {None}


def uuid_of(shopper: Any) -> Any:
    import uuid

    return uuid.UUID(shopper.conversation)


@pytest.mark.django_db(transaction=True)
async def test_a_handoff_outside_hours_queues_and_says_when_the_team_is_back(make_client, make_agent, faq, settings):
    today = timezone.now().astimezone(ZoneInfo("Asia/Tokyo")).date()
    every_day = {d: ["09:00-17:00"] for d in business_hours.DAYS}
    settings.KEFU_BUSINESS_HOURS = {
        "tz": "Asia/Tokyo",
        **every_day,
        "closed": [str(today), str(today + timedelta(days=1))],
    }
    shopper = await make_client()
    frame = await shopper.hello(time_zone="Europe/London")
    back = datetime.combine(today + timedelta(days=2), datetime.min.time(), ZoneInfo("Asia/Tokyo")) + timedelta(hours=9)
    assert frame["availability"]["open"] is False
    assert frame["availability"]["opens_at"] == back.astimezone(UTC).isoformat().replace("+00:00", "Z")
    status = (await handed_off(shopper))[-1]
    assert status["status"] == "waiting_agent" and status["availability"]["queue_position"] == 1
    notice = await shopper.recv()
    london = back.astimezone(ZoneInfo("Europe/London"))
    assert notice["role"] == "system" and "We're closed right now" in notice["text"]
    assert f"at {london:%H:%M} (Europe/London time)" in notice["text"]

    # An agent online outside hours counts as online: no "closed" notice, a person is there.
    await make_agent("alice", "Alice")
    other = await make_client()
    frame = await other.hello()
    assert frame["availability"]["agents_online"] == 1 and frame["availability"]["open"] is False
    await handed_off(other)
    assert await other.comm.receive_nothing(timeout=0.5)
