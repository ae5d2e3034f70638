"""The figures of a window, summed into buckets, read from Ops' rollups where an hour is rolled up
and from the raw rows everywhere else (docs/ops.md).

:func:`raw_cells` aggregates the raw rows — bot and shopper messages (``chat.Message``), the cost
ledger (``routing.UpstreamCall``), cache audits (``cache_layer.CacheAudit``) and the queue samples
(``ops.QueueSample``); ``ops.rollup`` stores each whole hour of it; :func:`window_cells` reads a
window back into the caller's buckets: rolled whole hours from the rollup tables, the rest (the
window's partial first and last hours, the current hour, hours not rolled yet) from the raw rows,
so a window's figures are the same either way (percentiles within the histograms' bound).

Times are UTC epoch seconds; a bucket is named by its start and holds what a ``key`` function
sends to it. Money is summed in integer micro-dollars (the ledger's six places, exactly).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from django.db.models import Count, OuterRef, Subquery, Sum

from cache_layer.models import CacheAudit
from chat.models import Conversation, ConversationStatus, Message, Role, Route
from chat.outcomes import OutcomeTally, outcome_tallies
from routing.models import Purpose, UpstreamCall

from .histogram import Hist
from .models import AnswerRollup, CallRollup, FaqRollup, OutcomeRollup, QueueSample, RolledHour, TierRollup

HOUR = 3600
#: Five minutes: short windows' buckets, read from raw rows only.
FINE = 300
MICRO = 1_000_000

#: (tier, purpose, outcome, stop): how ledger rows are split. ``stop`` is ``abandoned`` (kefu
#: stopped the attempt: a take-over, a fenced answer, a reader gone), ``budget`` (a spend budget
#: skipped the tier, no request sent) or "".
CallKey = tuple[str, str, str, str]
#: Bucket start (epoch seconds) of a row's time (epoch seconds).
Key = Callable[[int], int]


def stop_of(error_code: str) -> str:
    return error_code if error_code in ("abandoned", "budget") else ""


def micro(usd: Any) -> int:
    """USD (a ``Decimal`` of at most 6 places) in integer micro-dollars."""
    return int(usd.scaleb(6))


@dataclass
class AnswerAgg:
    """Bot answers of one route in a bucket; money in micro-USD."""

    answers: int = 0
    cut: int = 0
    cost_micro: int = 0
    saved_micro: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    rated_up: int = 0
    rated_down: int = 0
    ttft: Hist = field(default_factory=Hist)

    def merge(self, o: AnswerAgg) -> None:
        self.answers += o.answers
        self.cut += o.cut
        self.cost_micro += o.cost_micro
        self.saved_micro += o.saved_micro
        self.prompt_tokens += o.prompt_tokens
        self.completion_tokens += o.completion_tokens
        self.rated_up += o.rated_up
        self.rated_down += o.rated_down
        self.ttft.merge(o.ttft)


@dataclass
class CallAgg:
    """Ledger rows of one :data:`CallKey` in a bucket; money in micro-USD."""

    calls: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_micro: int = 0

    def merge(self, o: CallAgg) -> None:
        self.calls += o.calls
        self.prompt_tokens += o.prompt_tokens
        self.cached_prompt_tokens += o.cached_prompt_tokens
        self.completion_tokens += o.completion_tokens
        self.cost_micro += o.cost_micro


@dataclass
class FaqAgg:
    """Answers given from one FAQ entry, with their ratings."""

    answers: int = 0
    rated_up: int = 0
    rated_down: int = 0

    def merge(self, o: FaqAgg) -> None:
        self.answers += o.answers
        self.rated_up += o.rated_up
        self.rated_down += o.rated_down


@dataclass
class Cell:
    """Everything Ops shows about one bucket, which starts at ``start`` (epoch seconds).

    ``tier_ttft``: the upstream's time to first token by tier (every ledger row with one).
    ``wait``: time from a handoff answer to the first agent message after it, ms, for the
    bucket's handoff answers that got one (``wait.n`` of them). ``audits``: cache audits opened in
    the bucket by verdict. ``queue_*``: the queue samples taken in it: how many, and the most
    conversations waiting for / held by an agent. ``faq``: answers by FAQ entry, from raw rows only
    (rolled hours keep it in ``FaqRollup``, read by :func:`faq_totals`).
    """

    start: int
    answers: dict[str, AnswerAgg] = field(default_factory=dict)
    calls: dict[CallKey, CallAgg] = field(default_factory=dict)
    tier_ttft: dict[str, Hist] = field(default_factory=dict)
    faq: dict[int, FaqAgg] = field(default_factory=dict)
    shopper_messages: int = 0
    wait: Hist = field(default_factory=Hist)
    audits: dict[str, int] = field(default_factory=dict)
    queue_samples: int = 0
    queue_waiting_max: int = 0
    queue_with_agent_max: int = 0

    @property
    def start_at(self) -> datetime:
        return datetime.fromtimestamp(self.start, tz=UTC)

    def answer(self, route: str) -> AnswerAgg:
        a = self.answers.get(route)
        if a is None:
            a = self.answers[route] = AnswerAgg()
        return a

    def call(self, key: CallKey) -> CallAgg:
        c = self.calls.get(key)
        if c is None:
            c = self.calls[key] = CallAgg()
        return c

    def ttft_of(self, tier: str) -> Hist:
        h = self.tier_ttft.get(tier)
        if h is None:
            h = self.tier_ttft[tier] = Hist()
        return h

    def merge(self, o: Cell) -> None:
        """Add ``o``'s figures to this bucket's (its start stays)."""
        for route, a in o.answers.items():
            self.answer(route).merge(a)
        for key, c in o.calls.items():
            self.call(key).merge(c)
        for tier, h in o.tier_ttft.items():
            self.ttft_of(tier).merge(h)
        for entry, f in o.faq.items():
            self.faq.setdefault(entry, FaqAgg()).merge(f)
        self.shopper_messages += o.shopper_messages
        self.wait.merge(o.wait)
        for verdict, n in o.audits.items():
            self.audits[verdict] = self.audits.get(verdict, 0) + n
        self.queue_samples += o.queue_samples
        self.queue_waiting_max = max(self.queue_waiting_max, o.queue_waiting_max)
        self.queue_with_agent_max = max(self.queue_with_agent_max, o.queue_with_agent_max)


def agent_queue_now() -> tuple[int, int]:
    """Conversations waiting for an agent and held by one, now: ``(waiting, with_agent)``."""
    counts = dict(
        Conversation.objects.filter(
            status__in=[ConversationStatus.WAITING_AGENT, ConversationStatus.AGENT], sandbox=False
        )
        .values_list("status")
        .annotate(n=Count("id"))
        .order_by()
    )
    return counts.get(ConversationStatus.WAITING_AGENT, 0), counts.get(ConversationStatus.AGENT, 0)


def epoch(t: datetime) -> int:
    return int(t.timestamp())


def at(seconds: int) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def floor_to(t: datetime, seconds: int) -> datetime:
    """``t`` rounded down to a multiple of ``seconds`` since the epoch (UTC)."""
    e = epoch(t)
    return at(e - e % seconds)


def ceil_to(t: datetime, seconds: int) -> datetime:
    f = floor_to(t, seconds)
    return f if f == t else at(epoch(f) + seconds)


def aligned(seconds: int) -> Key:
    """Buckets of ``seconds``, aligned to multiples of it since the epoch."""
    return lambda e: e - e % seconds


def starting_at(starts: Sequence[int]) -> Key:
    """Buckets that start at ``starts`` (sorted): each time goes to the last start at or before
    it (times before the first go to the first)."""
    first = starts[0]

    def key(e: int) -> int:
        i = bisect.bisect_right(starts, e)
        return starts[i - 1] if i else first

    return key


class _Buckets:
    """Cells created on demand, by the start their ``key`` names."""

    def __init__(self, key: Key, cells: dict[int, Cell] | None = None) -> None:
        self.key = key
        self.cells: dict[int, Cell] = {} if cells is None else cells

    def at(self, t: datetime) -> Cell:
        return self.at_epoch(int(t.timestamp()))

    def at_epoch(self, e: int) -> Cell:
        k = self.key(e)
        cell = self.cells.get(k)
        if cell is None:
            cell = self.cells[k] = Cell(k)
        return cell


def raw_cells(start: datetime, end: datetime, *, key: Key, into: dict[int, Cell] | None = None) -> dict[int, Cell]:
    """The raw rows created in ``[start, end)`` summed into the buckets ``key`` names (only
    buckets with data appear), added to ``into`` when given; returns the buckets by start.

    Seven queries, each a range on an indexed time column; rows are streamed, never held all at
    once."""
    buckets = _Buckets(key, into)
    span = {"created_at__gte": start, "created_at__lt": end}
    # Unordered (.order_by()): the models' default orders would sort every range first.
    # A bot test's messages and calls are in no figure (Conversation.sandbox, ledger purpose "test").
    bot = Message.objects.filter(role=Role.BOT, conversation__sandbox=False, **span).exclude(route="").order_by()
    for t, route, cut, cost, saved, prompt, completion, rating, ttft, faq_entry in bot.values_list(
        "created_at",
        "route",
        "cut",
        "cost_usd",
        "saved_usd",
        "prompt_tokens",
        "completion_tokens",
        "rating",
        "ttft_ms",
        "faq_entry_id",
    ).iterator(chunk_size=5000):
        cell = buckets.at(t)
        a = cell.answer(route)
        a.answers += 1
        a.cut += cut
        a.cost_micro += micro(cost)
        a.saved_micro += micro(saved)
        a.prompt_tokens += prompt
        a.completion_tokens += completion
        if rating == "up":
            a.rated_up += 1
        elif rating == "down":
            a.rated_down += 1
        if ttft is not None:
            a.ttft.add(ttft)
        if faq_entry is not None:
            f = cell.faq.get(faq_entry)
            if f is None:
                f = cell.faq[faq_entry] = FaqAgg()
            f.answers += 1
            f.rated_up += rating == "up"
            f.rated_down += rating == "down"

    shoppers = (
        Message.objects.filter(role=Role.SHOPPER, conversation__sandbox=False, **span)
        .order_by()
        .values_list("created_at")
    )
    for (t,) in shoppers.iterator(chunk_size=5000):
        buckets.at(t).shopper_messages += 1

    first_reply = Message.objects.filter(
        conversation_id=OuterRef("conversation_id"), role=Role.AGENT, seq__gt=OuterRef("seq")
    ).order_by("seq")
    handoffs = (
        Message.objects.filter(role=Role.BOT, route=Route.HANDOFF, conversation__sandbox=False, **span)
        .order_by()
        .annotate(reply_at=Subquery(first_reply.values("created_at")[:1]))
        .values_list("created_at", "reply_at")
    )
    for t, reply_at in handoffs.iterator(chunk_size=5000):
        if reply_at is not None:
            buckets.at(t).wait.add((reply_at - t).total_seconds() * 1000)

    ledger = (
        UpstreamCall.objects.filter(**span)
        .exclude(purpose=Purpose.TEST)
        .order_by()
        .values_list(
            "created_at",
            "tier",
            "purpose",
            "outcome",
            "error_code",
            "prompt_tokens",
            "cached_prompt_tokens",
            "completion_tokens",
            "cost_usd",
            "ttft_ms",
        )
    )
    for t, tier, purpose, outcome, code, prompt, cached, completion, cost, ttft in ledger.iterator(chunk_size=5000):
        cell = buckets.at(t)
        c = cell.call((tier, purpose, outcome, stop_of(code)))
        c.calls += 1
        c.prompt_tokens += prompt
        c.cached_prompt_tokens += cached
        c.completion_tokens += completion
        c.cost_micro += micro(cost)
        if ttft is not None:
            cell.ttft_of(tier).add(ttft)

    audits = CacheAudit.objects.filter(**span).order_by().values_list("created_at", "verdict")
    for t, verdict in audits.iterator(chunk_size=5000):
        cell = buckets.at(t)
        cell.audits[verdict] = cell.audits.get(verdict, 0) + 1

    samples = (
        QueueSample.objects.filter(at__gte=start, at__lt=end).order_by().values_list("at", "waiting", "with_agent")
    )
    for t, waiting, with_agent in samples.iterator(chunk_size=5000):
        cell = buckets.at(t)
        cell.queue_samples += 1
        cell.queue_waiting_max = max(cell.queue_waiting_max, waiting)
        cell.queue_with_agent_max = max(cell.queue_with_agent_max, with_agent)

    return buckets.cells


_VERDICTS = (
    CacheAudit.Verdict.SAME,
    CacheAudit.Verdict.DIFFERENT,
    CacheAudit.Verdict.AGENT_WRONG,
    CacheAudit.Verdict.ERROR,
)


def rolled_cells(
    first_hour: int, end_hour: int, *, key: Key, into: dict[int, Cell], tier_ttft: bool = True
) -> set[int]:
    """Add the rolled-up hours in ``[first_hour, end_hour)`` (epoch seconds) to the buckets
    ``key`` names in ``into``; returns the hours found rolled. Four queries (three without
    ``tier_ttft``, the upstream's histograms), every value read as stored (integers, floats and
    the histograms' JSON: no per-row conversion); the FAQ split is left to :func:`faq_totals`."""
    buckets = _Buckets(key, into)
    span = {"hour__gte": first_hour, "hour__lt": end_hour}
    rolled: set[int] = set()
    for row in (
        RolledHour.objects.filter(**span)
        .order_by()
        .values_list(
            "hour",
            "shopper_messages",
            "handoffs_replied",
            "wait_hist",
            "wait_min",
            "wait_max",
            "audit_same",
            "audit_different",
            "audit_agent_wrong",
            "audit_error",
            "queue_samples",
            "queue_waiting_max",
            "queue_with_agent_max",
        )
    ):
        rolled.add(row[0])
        cell = buckets.at_epoch(row[0])
        cell.shopper_messages += row[1]
        if row[2]:
            cell.wait.merge_stored(row[3], row[2], row[4], row[5])
        for verdict, n in zip(_VERDICTS, row[6:10]):
            if n:
                cell.audits[verdict] = cell.audits.get(verdict, 0) + n
        cell.queue_samples += row[10]
        cell.queue_waiting_max = max(cell.queue_waiting_max, row[11])
        cell.queue_with_agent_max = max(cell.queue_with_agent_max, row[12])
    for hour, route, n, cut, cost, saved, prompt, completion, up, down, hist, count, lo, hi in (
        AnswerRollup.objects.filter(**span)
        .order_by()
        .values_list(
            "hour",
            "route",
            "answers",
            "cut",
            "cost_micro_usd",
            "saved_micro_usd",
            "prompt_tokens",
            "completion_tokens",
            "rated_up",
            "rated_down",
            "ttft_hist",
            "ttft_count",
            "ttft_min",
            "ttft_max",
        )
    ):
        a = buckets.at_epoch(hour).answer(route)
        a.answers += n
        a.cut += cut
        a.cost_micro += cost
        a.saved_micro += saved
        a.prompt_tokens += prompt
        a.completion_tokens += completion
        a.rated_up += up
        a.rated_down += down
        if count:
            a.ttft.merge_stored(hist, count, lo, hi)
    for hour, tier, purpose, outcome, stop, n, prompt, cached, completion, cost in (
        CallRollup.objects.filter(**span)
        .order_by()
        .values_list(
            "hour",
            "tier",
            "purpose",
            "outcome",
            "stop",
            "calls",
            "prompt_tokens",
            "cached_prompt_tokens",
            "completion_tokens",
            "cost_micro_usd",
        )
    ):
        c = buckets.at_epoch(hour).call((tier, purpose, outcome, stop))
        c.calls += n
        c.prompt_tokens += prompt
        c.cached_prompt_tokens += cached
        c.completion_tokens += completion
        c.cost_micro += cost
    if tier_ttft:
        rows = TierRollup.objects.filter(**span).order_by()
        for hour, tier, hist, count, lo, hi in rows.values_list(
            "hour", "tier", "ttft_hist", "ttft_count", "ttft_min", "ttft_max"
        ):
            buckets.at_epoch(hour).ttft_of(tier).merge_stored(hist, count, lo, hi)
    return rolled


def runs_of(hours: Iterable[int]) -> Iterator[tuple[int, int]]:
    """Consecutive hours (epoch seconds) joined into ``[start, end)`` ranges."""
    run: list[int] = []
    for h in hours:
        if run and h != run[-1] + HOUR:
            yield run[0], run[-1] + HOUR
            run = []
        run.append(h)
    if run:
        yield run[0], run[-1] + HOUR


def unrolled(
    start: datetime, end: datetime, first: int, last: int, rolled: set[int]
) -> list[tuple[datetime, datetime]]:
    """The parts of ``[start, end)`` to read from the raw rows, as ``[lo, hi)`` ranges: before the
    first whole hour ``first``, from the last one's end ``last`` (epoch seconds), and the whole
    hours between that are not in ``rolled``."""
    raw = [(start, at(first))] if start < at(first) else []
    raw.extend((at(lo), at(hi)) for lo, hi in runs_of(h for h in range(first, last, HOUR) if h not in rolled))
    if at(last) < end:
        raw.append((at(last), end))
    return raw


@dataclass
class Window:
    """A window's buckets by start, and where their figures came from: ``raw_ranges`` were read
    from the raw rows (each ``[start, end)``), ``rolled_hours`` whole hours from the rollups,
    which cover ``[rolled_from, rolled_to)`` (epoch seconds; equal when none)."""

    cells: dict[int, Cell]
    raw_ranges: list[tuple[datetime, datetime]]
    rolled_hours: int
    rolled_from: int = 0
    rolled_to: int = 0

    def total(self) -> Cell:
        """Every bucket merged into one."""
        total = Cell(min(self.cells, default=0))
        for c in self.cells.values():
            total.merge(c)
        return total


def window_cells(
    start: datetime,
    end: datetime,
    *,
    key: Key,
    use_rollups: bool = True,
    fine: bool = False,
    tier_ttft: bool = True,
) -> Window:
    """The figures of ``[start, end)`` in the buckets ``key`` names. Whole hours come from the
    rollups where rolled up (``key`` must then send a whole hour to one bucket), the rest from
    the raw rows; ``use_rollups=False`` reads everything raw (the benchmark's baseline, and a
    check); ``fine`` (buckets shorter than an hour) reads everything raw too. Without
    ``tier_ttft`` the rolled hours' upstream histograms are not read (the charts show none)."""
    cells: dict[int, Cell] = {}
    if fine or not use_rollups:
        raw_cells(start, end, key=key, into=cells)
        return Window(cells, [(start, end)], 0)
    first, last = epoch(ceil_to(start, HOUR)), epoch(floor_to(end, HOUR))
    if first >= last:
        raw_cells(start, end, key=key, into=cells)
        return Window(cells, [(start, end)], 0)
    rolled = rolled_cells(first, last, key=key, into=cells, tier_ttft=tier_ttft)
    raw_ranges = unrolled(start, end, first, last, rolled)
    for lo, hi in raw_ranges:
        raw_cells(lo, hi, key=key, into=cells)
    return Window(cells, raw_ranges, len(rolled), first, last)


def faq_totals(window: Window) -> dict[int, FaqAgg]:
    """Answers and ratings by FAQ entry over the window: its raw rows' plus, for its rolled
    hours, one grouped query over ``FaqRollup``."""
    totals: dict[int, FaqAgg] = {}
    for cell in window.cells.values():
        for entry, f in cell.faq.items():
            totals.setdefault(entry, FaqAgg()).merge(f)
    if window.rolled_hours:
        rows = (
            FaqRollup.objects.filter(hour__gte=window.rolled_from, hour__lt=window.rolled_to)
            .values("faq_entry_id")
            .annotate(n=Sum("answers"), up=Sum("rated_up"), down=Sum("rated_down"))
            .order_by()
        )
        for r in rows:
            totals.setdefault(r["faq_entry_id"], FaqAgg()).merge(FaqAgg(r["n"], r["up"], r["down"]))
    return totals


def window_outcomes(start: datetime, end: datetime, *, use_rollups: bool = True) -> OutcomeTally:
    """The outcomes of the conversations started in ``[start, end)`` (``chat.outcomes``) as one
    tally: whole hours whose outcomes are rolled up (``RolledHour.outcomes_at`` set) from
    ``OutcomeRollup`` and the hours' CSAT counts, everything else from the raw rows
    (``use_rollups=False``: all raw). Read it at a time with ``OutcomeTally.summary``: a
    resolution is open or settled by its stored settle time, so the figures are those of the raw
    rows either way."""
    tally = OutcomeTally()
    first, last = epoch(ceil_to(start, HOUR)), epoch(floor_to(end, HOUR))
    raw: list[tuple[datetime, datetime]] = [(start, end)]
    if use_rollups and first < last:
        rolled: set[int] = set()
        for hour, *scores in (
            RolledHour.objects.filter(hour__gte=first, hour__lt=last, outcomes_at__isnull=False)
            .order_by()
            .values_list("hour", "csat_1", "csat_2", "csat_3", "csat_4", "csat_5")
        ):
            rolled.add(hour)
            for score, n in enumerate(scores, start=1):
                if n:
                    tally.csat[score] += n
        rows = OutcomeRollup.objects.filter(hour__gte=first, hour__lt=last).order_by()
        for hour, state, reasons, settles, n in rows.values_list(
            "hour", "state", "reasons", "settles", "conversations"
        ):
            if hour in rolled:  # an hour rolled after ``rolled`` was read is read raw below
                tally.verdicts[(state, reasons, settles)] += n
        raw = unrolled(start, end, first, last, rolled)
    for lo, hi in raw:
        for part in outcome_tallies(since=lo, until=hi, bucket=lambda _: 0).values():
            tally.merge(part)
    return tally
