"""Ops' rollups (ops.rollup, ops.cells) and the charts' data (ops.charts), every figure computed
from known rows: the same answers whether read raw or rolled up, money to the micro-dollar,
percentiles within the histograms' stated bound, rates, late rows, idempotent re-rolls, the views
(/ops/api/series, /ops/export/ledger.csv), the command and the beat schedule."""

from __future__ import annotations

import csv
import io
import math
import random
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.contrib.auth.models import Permission, User
from django.core.management import call_command
from django.utils import timezone

from cache_layer.models import CacheAudit
from chat.models import Conversation, ConversationStatus, Message
from ops import charts, histogram
from ops import selectors as ops
from ops.cells import HOUR, Cell, aligned, epoch, floor_to, raw_cells, window_cells
from ops.models import AnswerRollup, CallRollup, FaqRollup, QueueSample, RolledHour
from ops.rollup import hour_write, hours_roll, recent_roll
from routing.models import FaqEntry, UpstreamCall

pytestmark = pytest.mark.django_db

UTC = ZoneInfo("UTC")


# --- the histogram and its error bound -------------------------------------------------------


def test_buckets_are_sixteen_per_doubling_from_one_millisecond() -> None:
    assert histogram.bucket(0) == 0 and histogram.bucket(0.999) == 0
    assert histogram.bucket(1) == 1 and histogram.bucket(2) == 17 and histogram.bucket(1024) == 161
    assert histogram.bucket(2**30) == histogram.TOP  # 12 days: the last bucket
    # Bucket 54 is [2^(53/16), 2^(54/16)) = [9.93, 10.37) ms; its geometric middle is reported.
    assert histogram.bucket(10) == 54 and histogram.middle(54) == pytest.approx(10.1524, abs=1e-4)
    assert round(histogram.ERROR_BOUND, 5) == 0.0219


def test_percentiles_from_buckets_are_within_the_stated_bound_of_the_exact_ones() -> None:
    rng = random.Random(16)
    values = [rng.lognormvariate(math.log(300), 1.2) for _ in range(5000)] + [0.4, 0.7]
    h = histogram.Hist()
    for v in values:
        h.add(v)
    for p in (1, 50, 90, 95, 99, 99.9):
        exact = ops.percentile(values, p)
        read = h.percentile(p)
        assert exact is not None and read is not None
        if exact >= 1:
            assert abs(read - exact) / exact <= histogram.ERROR_BOUND
        else:
            assert abs(read - exact) <= 0.5
    # The middle is moved into [min, max]: a window of alike values is exact.
    same = histogram.Hist()
    for _ in range(3):
        same.add(123.0)
    assert same.percentile(50) == 123.0 and same.percentile(99) == 123.0
    assert histogram.Hist().percentile(50) is None


def test_histograms_add_up_and_survive_storage() -> None:
    a, b = histogram.Hist(), histogram.Hist()
    for v in (5, 10, 10):
        a.add(v)
    for v in (700, 0.2):
        b.add(v)
    a.merge(b)
    assert a.n == 5 and a.lo == 0.2 and a.hi == 700
    assert a.pairs() == [(0, 1), (38, 1), (54, 2), (152, 1)]
    blob = a.to_bytes()
    # The first bucket (0) as 16 bits, then 153 counts of 32 bits, little-endian.
    assert blob is not None and len(blob) == 2 + 153 * 4 and blob[:6] == bytes([0, 0, 1, 0, 0, 0])
    stored = histogram.Hist.from_stored(blob, a.n, a.lo, a.hi)
    assert stored == a and histogram.Hist().to_bytes() is None


# --- known rows ------------------------------------------------------------------------------


def at(t: datetime, **fields: Any) -> dict[str, Any]:
    return {"created_at": t, **fields}


class Day:
    """Rows of three whole hours, ``h0`` .. ``h0 + 3 h``, two days ago (figures in the tests)."""

    def __init__(self) -> None:
        self.h0 = floor_to(timezone.now(), HOUR) - timedelta(hours=48)
        self.end = self.h0 + timedelta(hours=3)
        self.conv = Conversation.objects.create(token_hash="0" * 64, status=ConversationStatus.WAITING_AGENT)
        self.seq = 0
        self.e1 = FaqEntry.objects.create(
            intent="shipping_time", question="How long does delivery take?", answer="2-4 days"
        )
        self.e2 = FaqEntry.objects.create(intent="return_policy", question="Can I return it?", answer="30 days")

    def message(self, t: datetime, role: str, **fields: Any) -> Message:
        self.seq += 1
        m = Message.objects.create(conversation=self.conv, seq=self.seq, role=role, text="x", **fields)
        Message.objects.filter(pk=m.pk).update(created_at=t)
        return m

    def answer(self, t: datetime, route: str, *, ttft: float, **fields: Any) -> Message:
        self.message(t - timedelta(seconds=1), "shopper")
        return self.message(t, "bot", route=route, ttft_ms=ttft, **fields)

    def call(self, t: datetime, tier: str, outcome: str = "ok", **fields: Any) -> UpstreamCall:
        return UpstreamCall.objects.create(
            conversation=self.conv, tier=tier, model=f"m-{tier}", outcome=outcome, created_at=t, **fields
        )

    def audit(self, t: datetime, verdict: str) -> None:
        a = CacheAudit.objects.create(
            intent="shipping", question="q", cached_question="q", cached_answer="a", verdict=verdict
        )
        CacheAudit.objects.filter(pk=a.pk).update(created_at=t)


@pytest.fixture
def day(settings: Any) -> Day:
    settings.KEFU_TIERS = {
        **settings.KEFU_TIERS,
        "complex": settings.KEFU_TIERS["complex"].with_current(
            price_input_per_mtok=2.0, price_cached_input_per_mtok=0.5, price_output_per_mtok=8.0
        ),
    }
    d = Day()
    h0, h1 = d.h0, d.h0 + timedelta(hours=1)
    m = timedelta(minutes=1)
    # Hour 0: three FAQ answers (entry 1 twice: up and down; entry 2 once: down), two cache hits,
    # two simple-tier answers, a handoff an agent replied to 150 s later.
    d.answer(h0 + 2 * m, "faq", ttft=10, saved_usd=Decimal("0.100000"), faq_entry_id=d.e1.pk, rating="up")
    d.answer(h0 + 3 * m, "faq", ttft=20, saved_usd=Decimal("0.100000"), faq_entry_id=d.e1.pk, rating="down")
    d.answer(h0 + 4 * m, "faq", ttft=40, saved_usd=Decimal("0.100000"), faq_entry_id=d.e2.pk, rating="down")
    d.answer(h0 + 5 * m, "cache.exact", ttft=5, saved_usd=Decimal("0.250000"))
    d.answer(h0 + 6 * m, "cache.semantic", ttft=50, saved_usd=Decimal("0.250001"), rating="down")
    d.answer(h0 + 7 * m, "llm.simple", ttft=300, cost_usd=Decimal("0.300000"), rating="up")
    d.answer(h0 + 8 * m, "llm.simple", ttft=500, cost_usd=Decimal("0.500000"), cut=True)
    handoff = d.answer(h0 + 10 * m, "handoff", ttft=15)
    d.message(handoff.created_at + timedelta(seconds=1), "system")  # not an agent
    reply = d.message(h0 + 12 * m, "agent", agent_name="Alice")
    Message.objects.filter(pk=reply.pk).update(created_at=h0 + 12 * m + timedelta(seconds=30))
    d.call(h0 + 7 * m, "simple", prompt_tokens=1000, completion_tokens=200, cost_usd=Decimal("0.300000"), ttft_ms=280)
    d.call(
        h0 + 8 * m,
        "simple",
        prompt_tokens=1500,
        cached_prompt_tokens=500,
        completion_tokens=300,
        cost_usd=Decimal("0.500000"),
        ttft_ms=450,
    )
    d.call(h0 + 9 * m, "medium", "retried", error_code="server", http_status=500)
    d.call(
        h0 + 9 * m, "simple", purpose="summary", prompt_tokens=400, completion_tokens=50, cost_usd=Decimal("0.050000")
    )
    d.call(h0 + 11 * m, "simple", "failed", error_code="abandoned", prompt_tokens=100, cost_usd=Decimal("0.000123"))
    d.call(h0 + 11 * m, "complex", "fell_back", error_code="budget")
    d.call(h0 + 11 * m, "medium", "failed", error_code="timeout")
    for verdict in ("same", "same", "different", "agent_wrong", "error", "pending"):
        d.audit(h0 + 20 * m, verdict)
    QueueSample.objects.create(at=h0 + m, waiting=2, with_agent=0)
    QueueSample.objects.create(at=h0 + 30 * m, waiting=3, with_agent=1)
    # Hour 1: one medium-tier answer rated down, one FAQ answer from entry 1.
    d.answer(h1 + 5 * m, "llm.medium", ttft=800, cost_usd=Decimal("1.000000"), rating="down")
    d.answer(h1 + 6 * m, "faq", ttft=12, saved_usd=Decimal("0.100000"), faq_entry_id=d.e1.pk)
    d.call(h1 + 5 * m, "medium", prompt_tokens=2000, completion_tokens=400, cost_usd=Decimal("1.000000"), ttft_ms=700)
    # Hour 2: nothing. Outside the window: an answer just before it and one at its end.
    d.message(h0 - timedelta(seconds=1), "bot", route="faq", ttft_ms=1, saved_usd=Decimal("9"))
    d.message(d.end, "bot", route="faq", ttft_ms=1, saved_usd=Decimal("9"))
    return d


def expected_summary_figures(s: dict[str, Any]) -> None:
    """The figures of the ``day`` fixture's window, however they were read."""
    assert s["answers"]["total"] == 10 and s["shopper_messages"] == 10
    by_route = s["answers"]["by_route"]
    assert {r: v["count"] for r, v in by_route.items()} == {
        "cache.exact": 1,
        "cache.semantic": 1,
        "faq": 4,
        "handoff": 1,
        "llm.medium": 1,
        "llm.simple": 2,
    }
    assert by_route["faq"]["share"] == 0.4
    # FAQ times 10, 12, 20, 40 ms: nearest-rank p50 = 12 (its bucket [11.81, 12.34), middle
    # 12.07), p95 = p99 = 40 (middle 40.61, moved to the largest value). Within 2.2% of exact.
    assert by_route["faq"]["ttft_ms"] == {"p50": 12.1, "p95": 40.0, "p99": 40.0}
    assert by_route["llm.simple"]["ttft_ms"] == {"p50": 300.0, "p95": 500.0, "p99": 500.0}
    # Spent: the ledger, every purpose: 0.3 + 0.5 + 0.05 + 0.000123 + 1.0.
    assert s["cost_usd"] == 1.850123
    assert s["cost_by_purpose"] == {"answer": 1.800123, "summary": 0.05}
    assert s["cost_by_tier"] == {"complex": 0.0, "medium": 1.0, "simple": 0.850123}
    # Saved: 4 FAQ answers at 0.10 + 0.25 + 0.250001.
    assert s["saved_usd"] == 0.900001
    assert s["saved_share"] == pytest.approx(0.900001 / (0.900001 + 1.850123), abs=1e-12)
    assert s["cache"] == {
        "hits": 2,
        "exact": 1,
        "semantic": 1,
        "remote_answers": 3,
        "hit_rate": 0.4,
        # 4 counted (same, same, different, agent_wrong); error and pending are not.
        "audits": {"counted": 4, "false_hits": 2, "false_hit_rate": 0.5, "low": 0.15, "high": 0.85},
    }
    up = s["upstream"]
    assert up["calls"] == 8
    assert up["by_outcome"] == {"failed": 2, "fell_back": 1, "ok": 4, "retried": 1}
    assert up["stopped"] == 1 and up["budget_skips"] == 1
    # One real failure (the timeout) of the 7 attempts sent (the budget skip sent nothing).
    assert up["failure_rate"] == pytest.approx(1 / 7, abs=1e-15)
    # 280 ms: bucket [279.17, 291.53), middle 285.28 (1.9% off); 450: middle 459.4, moved to 450.
    assert up["ttft_ms"]["simple"] == {"p50": 285.3, "p95": 450.0, "p99": 450.0}
    assert up["ttft_ms"]["medium"] == {"p50": 700.0, "p95": 700.0, "p99": 700.0}
    assert s["handoffs"] == {"answers": 1, "waiting_now": 1, "with_agent_now": 0}


def test_the_same_figures_raw_and_rolled_up(day: Day) -> None:
    raw = ops.summary(start=day.h0, end=day.end, use_rollups=False)
    expected_summary_figures(raw)
    assert raw["source"] == {"rolled_hours": 0, "raw_ranges": [[day.h0.isoformat(), day.end.isoformat()]]}

    assert hours_roll(day.h0, day.end) == 3
    assert RolledHour.objects.count() == 3
    assert AnswerRollup.objects.count() == 5 + 2  # 5 routes in hour 0, 2 in hour 1, none in hour 2
    assert FaqRollup.objects.filter(hour=epoch(day.h0)).count() == 2
    rolled = ops.summary(start=day.h0, end=day.end)
    expected_summary_figures(rolled)
    assert rolled["source"] == {"rolled_hours": 3, "raw_ranges": []}
    assert {k: v for k, v in rolled.items() if k != "source"} == {k: v for k, v in raw.items() if k != "source"}

    # A window that starts and ends inside hours reads its edges raw and the rolled hour between.
    start, end = day.h0 + timedelta(minutes=6), day.h0 + timedelta(hours=1, minutes=5, seconds=30)
    edges = ops.summary(start=start, end=end)
    assert edges["source"]["rolled_hours"] == 0  # no whole hour inside: all raw
    start = day.h0 + timedelta(minutes=6)
    end = day.h0 + timedelta(hours=2, minutes=5, seconds=30)
    mixed = ops.summary(start=start, end=end)
    assert mixed["source"] == {
        "rolled_hours": 1,
        "raw_ranges": [
            [start.isoformat(), (day.h0 + timedelta(hours=1)).isoformat()],
            [(day.h0 + timedelta(hours=2)).isoformat(), end.isoformat()],
        ],
    }
    assert mixed == ops.summary(start=start, end=end, use_rollups=False) | {"source": mixed["source"]}
    # From minute 6: cache.semantic, 2 simple, handoff in hour 0; medium and faq in hour 1.
    assert mixed["answers"]["total"] == 6 and mixed["cost_usd"] == 1.850123
    assert mixed["saved_usd"] == 0.350001


def test_rolling_again_replaces_an_hour_and_late_rows_wait_for_the_next_run(day: Day) -> None:
    hours_roll(day.h0, day.end)
    first = list(CallRollup.objects.order_by("hour", "tier", "purpose", "outcome", "stop").values())
    assert hours_roll(day.h0, day.end) == 3
    again = list(CallRollup.objects.order_by("hour", "tier", "purpose", "outcome", "stop").values())
    assert [{k: v for k, v in r.items() if k != "id"} for r in again] == [
        {k: v for k, v in r.items() if k != "id"} for r in first
    ]
    assert RolledHour.objects.count() == 3

    # A ledger row written late (dated when its call began, in hour 0) and a rating given late.
    day.call(day.h0 + timedelta(minutes=59), "complex", prompt_tokens=10, cost_usd=Decimal("0.020000"))
    Message.objects.filter(route="cache.exact").update(rating="up")
    assert ops.summary(start=day.h0, end=day.end)["cost_usd"] == 1.850123  # the rolled hour, as rolled
    assert ops.summary(start=day.h0, end=day.end, use_rollups=False)["cost_usd"] == 1.870123
    # The next run re-rolls the last hours: now = hour 3 + 5 minutes, 3 hours back.
    assert recent_roll(hours=3, now=day.end + timedelta(minutes=5)) == 3
    assert ops.summary(start=day.h0, end=day.end)["cost_usd"] == 1.870123
    assert AnswerRollup.objects.get(hour=epoch(day.h0), route="cache.exact").rated_up == 1

    # A run that read the rows earlier than the one that wrote the hour writes nothing.
    stale = raw_cells(day.h0, day.h0 + timedelta(hours=1), key=aligned(HOUR))[epoch(day.h0)]
    assert hour_write(stale, read_at=timezone.now() - timedelta(hours=1)) is False
    assert hour_write(stale, read_at=timezone.now()) is True


def test_an_empty_hour_is_rolled_too_and_read_from_its_rollup(day: Day) -> None:
    hours_roll(day.h0, day.end)
    hour = day.h0 + timedelta(hours=2)
    empty = RolledHour.objects.get(hour=epoch(hour))
    assert empty.shopper_messages == 0 and not AnswerRollup.objects.filter(hour=empty.hour).exists()
    assert str(empty) == f"{hour:%Y-%m-%d %H}:00 UTC"
    window = window_cells(hour, hour + timedelta(hours=1), key=aligned(HOUR))
    assert window.rolled_hours == 1 and window.raw_ranges == []


def test_hour_rows_hold_the_queue_the_waits_and_the_audits(day: Day) -> None:
    hours_roll(day.h0, day.end)
    h = RolledHour.objects.get(hour=epoch(day.h0))
    assert (h.shopper_messages, h.handoffs_replied, h.wait_min, h.wait_max) == (8, 1, 150_000.0, 150_000.0)
    assert (h.audit_same, h.audit_different, h.audit_agent_wrong, h.audit_error) == (2, 1, 1, 1)
    assert (h.queue_samples, h.queue_waiting_max, h.queue_with_agent_max) == (2, 3, 1)
    a = AnswerRollup.objects.get(hour=epoch(day.h0), route="llm.simple")
    assert (a.answers, a.cut, a.cost_micro_usd, a.rated_up, a.rated_down, a.ttft_count) == (
        2,
        1,
        800_000,
        1,
        0,
        2,
    )
    c = CallRollup.objects.get(hour=epoch(day.h0), tier="simple", purpose="answer", outcome="ok", stop="")
    assert (c.calls, c.prompt_tokens, c.cached_prompt_tokens, c.completion_tokens, c.cost_micro_usd) == (
        2,
        2500,
        500,
        500,
        800_000,
    )
    assert CallRollup.objects.get(hour=epoch(day.h0), tier="simple", outcome="failed").stop == "abandoned"
    f = FaqRollup.objects.get(hour=epoch(day.h0), faq_entry_id=day.e1.pk)
    assert (f.answers, f.rated_up, f.rated_down) == (2, 1, 1)


# --- the charts' data ------------------------------------------------------------------------


@pytest.mark.parametrize("rolled", [False, True])
def test_hourly_series(day: Day, rolled: bool) -> None:
    if rolled:
        hours_roll(day.h0, day.end)
    s = charts.series(start=day.h0, end=day.end, tz=UTC, step=3600)
    t0 = int(day.h0.timestamp())
    assert s["t"] == [t0, t0 + 3600, t0 + 7200] and s["window"]["step"] == 3600
    assert s["source"]["rolled_hours"] == (3 if rolled else 0)
    assert s["answers"]["faq"] == [3, 1, 0] and s["answers"]["llm.medium"] == [0, 1, 0]
    assert s["ttft_ms"]["llm.simple"] == {
        "p50": [300.0, None, None],
        "p95": [500.0, None, None],
        "p99": [500.0, None, None],
    }
    # FAQ hour 0: 10, 20, 40 ms: p50 = 20 (bucket [19.87, 20.75), middle 20.30).
    assert s["ttft_ms"]["faq"]["p50"] == [20.3, 12.0, None]
    money = s["money"]
    assert money["t"] == s["t"]
    assert money["spent_usd"] == [0.850123, 1.0, 0.0]
    assert money["saved_usd"] == [0.800001, 0.1, 0.0]
    # Without the cache: spent + what the cache answers saved (0.25 + 0.250001).
    assert money["no_cache_usd"] == [1.350124, 1.0, 0.0]
    # The same calls at complex prices (2 / 0.5 cached / 8 USD per million tokens):
    # hour 0: prompt 1000 + 1500 + 400 + 100 = 3000 (500 cached), completion 550
    #   -> 2500 x 2 + 500 x 0.5 + 550 x 8 = 9650 micro-USD; hour 1: 2000 x 2 + 400 x 8 = 7200.
    assert money["all_complex_usd"] == [0.00965, 0.0072, 0.0]
    assert s["cache"] == {"hit_rate": [0.5, 0.0, None], "false_hit_rate": [0.5, None, None], "audits": [4, 0, 0]}
    q = s["queue"]
    assert q["handoffs"] == [1, 0, 0] and q["replied"] == [1, 0, 0]
    assert q["waiting_max"] == [3, None, None] and q["with_agent_max"] == [1, None, None]
    assert q["wait_s_p50"] == [150.0, None, None] and q["wait_s_p95"] == [150.0, None, None]
    # Thumbs-down over rated answers, by tier: faq hour 0 one up, two down; cache one down.
    assert s["ratings"]["down_rate"] == {
        "cache": [1.0, None, None],
        "faq": [0.6667, None, None],
        "handoff": [None, None, None],
        "medium": [None, 1.0, None],
        "simple": [0.0, None, None],
    }
    assert s["ratings"]["rated"]["faq"] == [3, 0, 0] and s["ratings"]["t"] == s["t"]
    assert s["faq"] == [
        {
            "id": day.e1.pk,
            "intent": "shipping_time",
            "locale": "en",
            "question": "How long does delivery take?",
            "answers": 3,
            "up": 1,
            "down": 1,
            "down_rate": 0.5,
        },
        {
            "id": day.e2.pk,
            "intent": "return_policy",
            "locale": "en",
            "question": "Can I return it?",
            "answers": 1,
            "up": 0,
            "down": 1,
            "down_rate": 1.0,
        },
    ]


def test_day_buckets_start_at_the_viewers_midnight(day: Day) -> None:
    """Hour 0 and hour 1 fall on different days for a viewer whose midnight lies between them."""
    hours_roll(day.h0, day.end)
    # A fixed-offset zone whose midnight is at hour 1 (UTC): Etc/GMT-N is UTC+N, Etc/GMT+N UTC-N.
    offset = -(day.h0 + timedelta(hours=1)).hour % 24
    offset = offset - 24 if offset > 14 else offset
    tz = ZoneInfo("UTC" if offset == 0 else f"Etc/GMT-{offset}" if offset > 0 else f"Etc/GMT+{-offset}")
    s = charts.series(start=day.h0, end=day.end, tz=tz, step=86400)
    t1 = int((day.h0 + timedelta(hours=1)).timestamp())
    assert s["t"] == [t1 - 86400, t1]
    assert s["answers"]["faq"] == [3, 1] and s["money"]["spent_usd"] == [0.850123, 1.0]


def test_short_windows_get_five_minute_buckets_from_raw_rows(day: Day) -> None:
    hours_roll(day.h0, day.end)
    s = charts.series(start=day.h0, end=day.h0 + timedelta(minutes=15), tz=UTC)
    assert s["window"]["step"] == 300 and len(s["t"]) == 3 and s["source"]["rolled_hours"] == 0
    assert s["answers"]["faq"] == [3, 0, 0] and s["answers"]["llm.simple"] == [0, 2, 0]
    assert s["money"]["spent_usd"] == [0.0, 0.85, 0.000123]  # the abandoned attempt at minute 11


def test_long_windows_show_money_per_day() -> None:
    now = floor_to(timezone.now(), HOUR)
    s = charts.series(start=now - timedelta(days=7), end=now, tz=UTC)
    assert s["window"]["step"] == 3600 and len(s["t"]) == 168
    assert len(s["money"]["t"]) in (7, 8) and s["ratings"]["t"] == s["money"]["t"]  # the days the week touches
    assert (
        charts.step_for(3 * 3600) == 300 and charts.step_for(8 * 86400) == 3600 and charts.step_for(9 * 86400) == 86400
    )


# --- views, export, command, schedule -------------------------------------------------------


def staff(name: str = "olivia", perm: bool = True) -> User:
    u = User.objects.create_user(name, password="pw", is_staff=True)
    if perm:
        u.user_permissions.add(Permission.objects.get(codename="view_costs"))
    return User.objects.get(pk=u.pk)


def test_series_api(client: Any, day: Day) -> None:
    url = f"/ops/api/series?from={int(day.h0.timestamp())}&to={int(day.end.timestamp())}&tz=UTC&step=3600"
    assert client.get(url).status_code == 401
    client.force_login(staff("agent", perm=False))
    assert client.get(url).status_code == 403
    client.force_login(staff())
    # One more audit, of another intent, and one outside the window (after its end).
    a = CacheAudit.objects.create(
        intent="returns", question="q", cached_question="q", cached_answer="a", verdict="same"
    )
    CacheAudit.objects.filter(pk=a.pk).update(created_at=day.h0 + timedelta(hours=1))
    day.audit(day.end, "different")
    r = client.get(url)
    assert r.status_code == 200 and r["Cache-Control"] == "no-store"
    assert r.json()["answers"]["faq"] == [3, 1, 0]
    # The measured false-hit rate per intent (the cache's slots), most false hits first: of
    # "shipping"'s six audits four are counted (error and pending are not), two of them false.
    assert r.json()["cache_intents"] == [
        {
            "intent": "shipping",
            "counted": 4,
            "false_hits": 2,
            "false_hit_rate": 0.5,
            "low": 0.15,
            "high": 0.85,
            "errors": 1,
        },
        {
            "intent": "returns",
            "counted": 1,
            "false_hits": 0,
            "false_hit_rate": 0.0,
            "low": 0.0,
            "high": 0.7935,
            "errors": 0,
        },
    ]
    # ISO times work too (no offset: UTC), and the summary takes the same window.
    iso = f"from={day.h0.replace(tzinfo=None).isoformat()}&to={day.end.isoformat().replace('+00:00', 'Z')}"
    assert client.get(f"/ops/api/series?{iso}&step=3600").json()["t"] == r.json()["t"]
    summary = client.get(f"/ops/api/summary?{iso}").json()
    assert summary["cost_usd"] == 1.850123 and summary["window"]["hours"] == 3.0
    for query, message in [
        ("from=1", "from and to go together"),
        ("from=abc&to=2", "from must be epoch seconds or an ISO 8601 time"),
        ("from=100&to=50", "to must be after from"),
        ("from=nan&to=1", "from must be epoch seconds or an ISO 8601 time"),
        ("from=0&to=8640000", "at most 90 days apart"),
        ("hours=1&tz=Mars/Olympus", "tz must be an IANA time zone name"),
        ("hours=1&tz=../../etc/passwd", "tz must be an IANA time zone name"),
        ("hours=1&step=60", "step must be 300, 3600 or 86400"),
        ("hours=0", "hours must be"),
    ]:
        r = client.get(f"/ops/api/series?{query}")
        assert r.status_code == 400 and message in r.json()["error"], (query, r.json())


def test_dashboard_page_carries_the_charts_and_the_custom_window(client: Any, day: Day) -> None:
    client.force_login(staff())
    start, end = int(day.h0.timestamp()), int(day.end.timestamp())
    r = client.get(f"/ops/?from={start}&to={end}")
    html = r.content.decode()
    assert r.status_code == 200 and "'unsafe-inline'" not in r["Content-Security-Policy"]
    assert f'data-from="{start}" data-to="{end}"' in html
    assert "/static/vendor/uplot/uPlot.iife.min.js" in html and "/static/kefu/ops.js" in html
    assert f'href="/ops/export/ledger.csv?from={start}&amp;to={end}"' in html
    assert "<script>" not in html and " style=" not in html  # nothing inline: the CSP forbids it
    assert 'id="cost-usd">1.8501<' in html and 'id="false-hit-rate">50% (2 of 4)' in html


def test_ledger_csv_export(client: Any, day: Day, monkeypatch: Any) -> None:
    from ops import export

    monkeypatch.setattr(export, "CHUNK_ROWS", 3)  # pages of 3: rows with one time split across pages
    url = f"/ops/export/ledger.csv?from={int(day.h0.timestamp())}&to={int(day.end.timestamp())}"
    r = client.get(url)
    assert r.status_code == 302 and r["Location"].startswith("/console/login/")
    client.force_login(staff("agent", perm=False))
    assert client.get(url).status_code == 403
    client.force_login(staff())
    UpstreamCall.objects.filter(tier="medium", outcome="failed").update(model="=HYPERLINK(1)")
    r = client.get(url)
    assert r.status_code == 200 and r.streaming and r["Content-Type"] == "text/csv; charset=utf-8"
    assert r["Content-Disposition"].startswith('attachment; filename="kefu-ledger-')
    rows = list(csv.DictReader(io.StringIO(b"".join(r.streaming_content).decode())))
    assert len(rows) == 8 and len({row["id"] for row in rows}) == 8
    assert [(row["created_at"], int(row["id"])) for row in rows] == sorted(
        (row["created_at"], int(row["id"])) for row in rows
    )
    assert sum(Decimal(row["cost_usd"]) for row in rows) == Decimal("1.850123")
    first = rows[0]
    assert first["tier"] == "simple" and first["prompt_tokens"] == "1000" and first["ttft_ms"] == "280.0"
    assert datetime.fromisoformat(first["created_at"]) == day.h0 + timedelta(minutes=7)
    assert first["conversation_id"] == str(day.conv.pk) and first["message_id"] == ""
    assert [row["model"] for row in rows if row["error_code"] == "timeout"] == ["'=HYPERLINK(1)"]


def test_rollup_command_and_the_beat_schedule(settings: Any, day: Day) -> None:
    out = io.StringIO()
    call_command("rollup", "--hours", "72", stdout=out)
    assert out.getvalue().startswith("rolled up 72 hours in ")
    assert RolledHour.objects.filter(hour__gte=epoch(day.h0), hour__lt=epoch(day.end)).count() == 3
    schedule = {v["task"]: v for v in settings.CELERY_BEAT_SCHEDULE.values()}
    assert schedule["ops.tasks.sample_queue"]["schedule"] == 60.0
    from config.celery import app
    from ops import tasks

    assert {"ops.tasks.rollup", "ops.tasks.rollup_span", "ops.tasks.sample_queue"} <= set(app.tasks)
    settings.KEFU_OPS_ROLLUP_HOURS = 2
    assert tasks.rollup.delay().get() == 2
    # The daily run: 60 hours as three tasks of at most a day each (eager here: run at once).
    RolledHour.objects.all().delete()
    settings.KEFU_OPS_ROLLUP_LATE_HOURS = 60
    before = epoch(floor_to(timezone.now(), HOUR))
    assert tasks.rollup.delay(late=True).get() == 3
    after = epoch(floor_to(timezone.now(), HOUR))  # the same hour unless the clock crossed one
    rolled = set(RolledHour.objects.values_list("hour", flat=True))
    assert rolled in ({*range(h - 60 * HOUR, h, HOUR)} for h in {before, after})
    assert tasks.sample_queue.delay().get() == 1  # the fixture's conversation waits
    assert QueueSample.objects.latest("at").waiting == 1


def test_cells_merge_exactly() -> None:
    a, b = Cell(0), Cell(3600)
    a.queue_waiting_max, b.queue_waiting_max = 4, 2
    b.audits = {"same": 1}
    b.answer("faq").saved_micro = 250_001
    a.merge(b)
    assert a.start == 0 and a.queue_waiting_max == 4 and a.audits == {"same": 1}
    assert a.answers["faq"].saved_micro == 250_001


def test_metrics_totals_read_rolled_hours_and_raw_rows_alike(day: Day) -> None:
    raw = ops.totals()
    # The day's 12 answers (two outside its window too) and 8 ledger rows, all raw.
    assert sum(n for _, n, _ in raw["answers"]) == 12 and sum(n for *_, n, _ in raw["calls"]) == 8
    assert ("simple", "answer", "ok", 2, 0.8) in raw["calls"]
    # Hour 1 rolled alone: hour 0 is before the first rolled hour, hour 2 after it; then hour 0
    # and hour 2 rolled with a gap between (hour 1's rollup deleted): the totals never change.
    hours_roll(day.h0 + timedelta(hours=1), day.h0 + timedelta(hours=2))
    assert ops.totals() == raw
    hours_roll(day.h0, day.end)
    RolledHour.objects.filter(hour=epoch(day.h0) + HOUR).delete()
    AnswerRollup.objects.filter(hour=epoch(day.h0) + HOUR).delete()
    CallRollup.objects.filter(hour=epoch(day.h0) + HOUR).delete()
    assert ops.totals() == raw
    # A row in the current hour is counted at once.
    day.call(timezone.now(), "complex", prompt_tokens=10, cost_usd=Decimal("0.020000"))
    after = ops.totals()
    assert ("complex", "answer", "ok", 1, 0.02) in after["calls"]
    assert sum(n for *_, n, _ in after["calls"]) == 9
