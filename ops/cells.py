"""The figures of a stretch of time ("cell": an hour, or five minutes), read from Ops' rollups
where an hour is rolled up and from the raw rows everywhere else (docs/ops.md).

:func:`raw_cells` aggregates the raw rows — bot and shopper messages (``chat.Message``), the cost
ledger (``routing.UpstreamCall``), cache audits (``cache_layer.CacheAudit``) and the queue samples
(``ops.QueueSample``) — into cells; ``ops.rollup`` stores its hourly cells, and
:func:`window_cells` reads a window back: rolled whole hours from the rollup tables, the rest
(the window's partial first and last hours, the current hour, hours not rolled yet) from the raw
rows, so a window's figures are the same either way (percentiles within the histograms' bound).
Every cell is half-open: ``[start, start + seconds)``, UTC.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from django.db.models import Count, OuterRef, Subquery, Sum

from cache_layer.models import CacheAudit
from chat.models import Conversation, ConversationStatus, Message, Role, Route
from routing.models import UpstreamCall

from .histogram import Hist
from .models import AnswerRollup, CallRollup, FaqRollup, QueueSample, RolledHour

HOUR = 3600
#: Cells of this many seconds are read from raw rows only (short windows: the last hour or so).
FINE = 300

ZERO = Decimal("0")

#: (tier, purpose, outcome, stop): how ledger rows are split. ``stop`` is ``abandoned`` (kefu
#: stopped the attempt: a take-over, a fenced answer, a reader gone), ``budget`` (a spend budget
#: skipped the tier, no request sent) or "".
CallKey = tuple[str, str, str, str]


def stop_of(error_code: str) -> str:
    return error_code if error_code in ("abandoned", "budget") else ""


@dataclass
class AnswerAgg:
    """Bot answers of one route in a cell."""

    answers: int = 0
    cut: int = 0
    cost_usd: Decimal = ZERO
    saved_usd: Decimal = ZERO
    prompt_tokens: int = 0
    completion_tokens: int = 0
    rated_up: int = 0
    rated_down: int = 0
    ttft: Hist = field(default_factory=Hist)

    def merge(self, o: AnswerAgg) -> None:
        self.answers += o.answers
        self.cut += o.cut
        self.cost_usd += o.cost_usd
        self.saved_usd += o.saved_usd
        self.prompt_tokens += o.prompt_tokens
        self.completion_tokens += o.completion_tokens
        self.rated_up += o.rated_up
        self.rated_down += o.rated_down
        self.ttft.merge(o.ttft)


@dataclass
class CallAgg:
    """Ledger rows of one :data:`CallKey` in a cell."""

    calls: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: Decimal = ZERO
    ttft: Hist = field(default_factory=Hist)

    def merge(self, o: CallAgg) -> None:
        self.calls += o.calls
        self.prompt_tokens += o.prompt_tokens
        self.cached_prompt_tokens += o.cached_prompt_tokens
        self.completion_tokens += o.completion_tokens
        self.cost_usd += o.cost_usd
        self.ttft.merge(o.ttft)


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
    """Everything Ops shows about ``[start, start + seconds)``.

    ``wait``: time from a handoff answer to the first agent message after it, ms, for the cell's
    handoff answers that got one (``wait.n`` of them). ``audits``: cache audits opened in the
    cell by verdict. ``queue_*``: the queue samples taken in the cell: how many, and the most
    conversations waiting for / held by an agent. ``faq``: answers by FAQ entry; filled by
    :func:`raw_cells` only (rolled hours keep it in ``FaqRollup``, read by :func:`faq_totals`).
    """

    start: datetime
    seconds: int
    answers: dict[str, AnswerAgg] = field(default_factory=dict)
    calls: dict[CallKey, CallAgg] = field(default_factory=dict)
    faq: dict[int, FaqAgg] = field(default_factory=dict)
    shopper_messages: int = 0
    wait: Hist = field(default_factory=Hist)
    audits: dict[str, int] = field(default_factory=dict)
    queue_samples: int = 0
    queue_waiting_max: int = 0
    queue_with_agent_max: int = 0

    def merge(self, o: Cell) -> None:
        """Add ``o``'s figures to this cell's (its start and length stay)."""
        for route, a in o.answers.items():
            self.answers.setdefault(route, AnswerAgg()).merge(a)
        for key, c in o.calls.items():
            self.calls.setdefault(key, CallAgg()).merge(c)
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
        Conversation.objects.filter(status__in=[ConversationStatus.WAITING_AGENT, ConversationStatus.AGENT])
        .values_list("status")
        .annotate(n=Count("id"))
        .order_by()
    )
    return counts.get(ConversationStatus.WAITING_AGENT, 0), counts.get(ConversationStatus.AGENT, 0)


def floor_to(t: datetime, seconds: int) -> datetime:
    """``t`` rounded down to a multiple of ``seconds`` since the epoch (UTC)."""
    epoch = int(t.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, tz=UTC)


def ceil_to(t: datetime, seconds: int) -> datetime:
    f = floor_to(t, seconds)
    return f if f == t else f + timedelta(seconds=seconds)


class _Cells:
    """Cells of ``seconds`` created on demand as rows arrive."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds
        self.by_epoch: dict[int, Cell] = {}

    def at(self, t: datetime) -> Cell:
        epoch = int(t.timestamp())
        key = epoch - epoch % self.seconds
        cell = self.by_epoch.get(key)
        if cell is None:
            cell = self.by_epoch[key] = Cell(datetime.fromtimestamp(key, tz=UTC), self.seconds)
        return cell


def raw_cells(start: datetime, end: datetime, *, seconds: int = HOUR) -> dict[datetime, Cell]:
    """The raw rows created in ``[start, end)``, aggregated into cells of ``seconds`` (aligned to
    multiples of ``seconds`` since the epoch; only cells with data are returned), by start.

    Seven queries, each a range on an indexed ``created_at`` (``at``); rows are streamed, never
    held all at once."""
    cells = _Cells(seconds)
    span = {"created_at__gte": start, "created_at__lt": end}
    bot = Message.objects.filter(role=Role.BOT, **span).exclude(route="")
    for at, route, cut, cost, saved, prompt, completion, rating, ttft, faq_entry in bot.values_list(
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
        cell = cells.at(at)
        a = cell.answers.get(route)
        if a is None:
            a = cell.answers[route] = AnswerAgg()
        a.answers += 1
        a.cut += cut
        a.cost_usd += cost
        a.saved_usd += saved
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

    for (at,) in Message.objects.filter(role=Role.SHOPPER, **span).values_list("created_at").iterator(chunk_size=5000):
        cells.at(at).shopper_messages += 1

    first_reply = Message.objects.filter(
        conversation_id=OuterRef("conversation_id"), role=Role.AGENT, seq__gt=OuterRef("seq")
    ).order_by("seq")
    handoffs = (
        Message.objects.filter(role=Role.BOT, route=Route.HANDOFF, **span)
        .annotate(reply_at=Subquery(first_reply.values("created_at")[:1]))
        .values_list("created_at", "reply_at")
    )
    for at, reply_at in handoffs.iterator(chunk_size=5000):
        if reply_at is not None:
            cells.at(at).wait.add((reply_at - at).total_seconds() * 1000)

    ledger = UpstreamCall.objects.filter(**span).values_list(
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
    for at, tier, purpose, outcome, code, prompt, cached, completion, cost, ttft in ledger.iterator(chunk_size=5000):
        cell = cells.at(at)
        key = (tier, purpose, outcome, stop_of(code))
        c = cell.calls.get(key)
        if c is None:
            c = cell.calls[key] = CallAgg()
        c.calls += 1
        c.prompt_tokens += prompt
        c.cached_prompt_tokens += cached
        c.completion_tokens += completion
        c.cost_usd += cost
        if ttft is not None:
            c.ttft.add(ttft)

    for at, verdict in CacheAudit.objects.filter(**span).values_list("created_at", "verdict").iterator(chunk_size=5000):
        cell = cells.at(at)
        cell.audits[verdict] = cell.audits.get(verdict, 0) + 1

    samples = QueueSample.objects.filter(at__gte=start, at__lt=end).values_list("at", "waiting", "with_agent")
    for at, waiting, with_agent in samples.iterator(chunk_size=5000):
        cell = cells.at(at)
        cell.queue_samples += 1
        cell.queue_waiting_max = max(cell.queue_waiting_max, waiting)
        cell.queue_with_agent_max = max(cell.queue_with_agent_max, with_agent)

    return {c.start: c for c in cells.by_epoch.values()}


def rolled_cells(first_hour: datetime, end_hour: datetime) -> dict[datetime, Cell]:
    """The rolled-up hours in ``[first_hour, end_hour)``, by start (hours not rolled are absent).
    Three queries; the FAQ split is left to :func:`faq_totals`."""
    cells: dict[datetime, Cell] = {}
    for h in RolledHour.objects.filter(hour__gte=first_hour, hour__lt=end_hour).order_by():
        cell = cells[h.hour] = Cell(h.hour, HOUR)
        cell.shopper_messages = h.shopper_messages
        cell.wait = Hist.from_stored(h.wait_hist, h.handoffs_replied, h.wait_min, h.wait_max)
        cell.audits = {
            v: n
            for v, n in (
                (CacheAudit.Verdict.SAME, h.audit_same),
                (CacheAudit.Verdict.DIFFERENT, h.audit_different),
                (CacheAudit.Verdict.AGENT_WRONG, h.audit_agent_wrong),
                (CacheAudit.Verdict.ERROR, h.audit_error),
            )
            if n
        }
        cell.queue_samples = h.queue_samples
        cell.queue_waiting_max = h.queue_waiting_max
        cell.queue_with_agent_max = h.queue_with_agent_max
    span = {"hour__gte": first_hour, "hour__lt": end_hour}
    for a in (
        AnswerRollup.objects.filter(**span)
        .order_by()
        .values_list(
            "hour",
            "route",
            "answers",
            "cut",
            "cost_usd",
            "saved_usd",
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
        if a[0] in cells:
            cells[a[0]].answers[a[1]] = AnswerAgg(*a[2:10], ttft=Hist.from_stored(*a[10:]))
    for c in (
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
            "cost_usd",
            "ttft_hist",
            "ttft_count",
            "ttft_min",
            "ttft_max",
        )
    ):
        if c[0] in cells:
            cells[c[0]].calls[(c[1], c[2], c[3], c[4])] = CallAgg(*c[5:10], ttft=Hist.from_stored(*c[10:]))
    return cells


def _runs(hours: Iterable[datetime]) -> Iterator[tuple[datetime, datetime]]:
    """Consecutive hours joined into ``[start, end)`` ranges."""
    run: list[datetime] = []
    for h in hours:
        if run and h != run[-1] + timedelta(hours=1):
            yield run[0], run[-1] + timedelta(hours=1)
            run = []
        run.append(h)
    if run:
        yield run[0], run[-1] + timedelta(hours=1)


@dataclass
class Window:
    """A window's cells, oldest first, and where they came from: ``raw_ranges`` were read from
    the raw rows (every ``[start, end)`` of them), the other hours from the rollups."""

    cells: list[Cell]
    raw_ranges: list[tuple[datetime, datetime]]
    rolled_hours: int
    #: The whole hours the rollups were read for: ``[rolled_from, rolled_to)`` (empty when none).
    rolled_from: datetime | None = None
    rolled_to: datetime | None = None

    def total(self, start: datetime) -> Cell:
        """Every cell merged into one that starts at ``start``."""
        total = Cell(start, 0)
        for c in self.cells:
            total.merge(c)
        return total


def window_cells(start: datetime, end: datetime, *, seconds: int = HOUR, use_rollups: bool = True) -> Window:
    """The cells of ``[start, end)``: hours (``seconds`` = :data:`HOUR`), rolled ones from the
    rollup tables and the rest from raw rows; or :data:`FINE` cells, all from raw rows.
    ``use_rollups=False`` reads everything raw (the benchmark's baseline, and a check)."""
    if seconds != HOUR or not use_rollups:
        return Window(sorted(raw_cells(start, end, seconds=seconds).values(), key=lambda c: c.start), [(start, end)], 0)
    first, last = ceil_to(start, HOUR), floor_to(end, HOUR)
    rolled = rolled_cells(first, last) if first < last else {}
    raw_ranges: list[tuple[datetime, datetime]] = []
    if first >= last:
        raw_ranges.append((start, end))
    else:
        if start < first:
            raw_ranges.append((start, first))
        hours = (first + timedelta(hours=i) for i in range(int((last - first).total_seconds()) // HOUR))
        raw_ranges.extend(_runs(h for h in hours if h not in rolled))
        if last < end:
            raw_ranges.append((last, end))
    cells = dict(rolled)
    for lo, hi in raw_ranges:
        for cell_start, cell in raw_cells(lo, hi).items():
            if cell_start in cells:  # an edge hour's part, beside nothing rolled for it
                cells[cell_start].merge(cell)
            else:
                cells[cell_start] = cell
    return Window(sorted(cells.values(), key=lambda c: c.start), raw_ranges, len(rolled), first, last)


def faq_totals(window: Window) -> dict[int, FaqAgg]:
    """Answers and ratings by FAQ entry over the window: its raw cells' plus, for its rolled
    hours, one grouped query over ``FaqRollup``."""
    totals: dict[int, FaqAgg] = {}
    for cell in window.cells:
        for entry, f in cell.faq.items():
            totals.setdefault(entry, FaqAgg()).merge(f)
    if window.rolled_hours and window.rolled_from is not None:
        rows = (
            FaqRollup.objects.filter(hour__gte=window.rolled_from, hour__lt=window.rolled_to)
            .values("faq_entry_id")
            .annotate(n=Sum("answers"), up=Sum("rated_up"), down=Sum("rated_down"))
            .order_by()
        )
        for r in rows:
            totals.setdefault(r["faq_entry_id"], FaqAgg()).merge(FaqAgg(r["n"], r["up"], r["down"]))
    return totals
