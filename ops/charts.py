"""The dashboard's charts as data (``GET /ops/api/series``, docs/ops.md): one series per figure,
bucketed by five minutes, hours or the viewer's days, read through ``ops.cells`` (rollups where
they are, raw rows elsewhere) with the definitions of ``ops.selectors.summary``.

Times are UTC epoch seconds (the browser shows them in the viewer's zone); a day bucket starts
at midnight in the zone the page sends (``tz``). Hours are the rollups' grain, so in a zone
whose offset is not whole hours (Asia/Kolkata, +05:30) a "day" starts at the whole UTC hour
before its local midnight.
"""

from __future__ import annotations

from datetime import datetime, time, timedelta
from decimal import Decimal
from typing import Any
from zoneinfo import ZoneInfo

from cache_layer.audit import false_hit_rates
from routing.models import FaqEntry
from routing.upstream.ledger import cost_usd

from .cells import FINE, HOUR, MICRO, Cell, at, epoch, faq_totals, floor_to, starting_at, window_cells
from .histogram import Hist
from .selectors import audit_rate

DAY = 86400
#: Windows up to this long get five-minute buckets (from the raw rows), up to :data:`HOURLY_UP_TO`
#: hourly ones, longer ones days.
FINE_UP_TO = 3 * HOUR
HOURLY_UP_TO = 8 * DAY
#: FAQ entries listed, most thumbs-down first.
FAQ_ROWS = 20
#: Cache intents listed, most false hits first.
INTENT_ROWS = 20
#: The tier all-``complex`` prices at.
BASELINE_TIER = "complex"


def step_for(seconds: float) -> int:
    """The bucket length for a window of ``seconds``: 300, 3600 or 86400."""
    if seconds <= FINE_UP_TO:
        return FINE
    return HOUR if seconds <= HOURLY_UP_TO else DAY


def _usd(value: Decimal) -> float:
    return float(round(value, 6))


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _s(value: float | None) -> float | None:
    return None if value is None else round(value / 1000, 1)


def _rate(num: int, den: int) -> float | None:
    return round(num / den, 4) if den else None


def _bucket_starts(start: datetime, end: datetime, step: int, tz: ZoneInfo) -> list[int]:
    """Bucket starts (epoch seconds) covering ``[start, end)``, oldest first (the first may start
    before ``start``: the five minutes, hour or local day holding it). A local day starts at the
    whole UTC hour at or before its midnight."""
    if step == DAY:
        day = start.astimezone(tz).date()
        last = (end - timedelta(microseconds=1)).astimezone(tz).date()
        out = []
        while day <= last:
            out.append(epoch(floor_to(datetime.combine(day, time(0), tzinfo=tz), HOUR)))
            day += timedelta(days=1)
        return out
    first = epoch(floor_to(start, step))
    return list(range(first, epoch(end) + (0 if end == at(epoch(end)) else 1), step))


def _regrouped(buckets: list[Cell], starts: list[int]) -> list[Cell]:
    """``buckets`` merged into coarser ones that start at ``starts``."""
    key = starting_at(starts)
    out = {s: Cell(s) for s in starts}
    for b in buckets:
        out[key(b.start)].merge(b)
    return [out[s] for s in starts]


def _tier_label(route: str) -> str:
    """How the ratings chart groups routes: a remote answer by its tier, cache hits together."""
    if route.startswith("llm."):
        return route.removeprefix("llm.")
    return "cache" if route.startswith("cache.") else route


def _money(buckets: list[Cell]) -> dict[str, Any]:
    """Per bucket: ``spent_usd`` (the ledger), ``saved_usd`` (FAQ, cache and store answers),
    ``no_cache_usd`` (spent + what the cache answers saved: the spend without the cache) and
    ``all_complex_usd`` (the same upstream calls' tokens at the ``complex`` tier's prices)."""
    spent: list[float] = []
    saved: list[float] = []
    no_cache: list[float] = []
    complex_: list[float | None] = []
    for b in buckets:
        cost = sum(c.cost_micro for c in b.calls.values())
        cache_saved = sum(a.saved_micro for r, a in b.answers.items() if r.startswith("cache."))
        spent.append(cost / MICRO)
        saved.append(sum(a.saved_micro for a in b.answers.values()) / MICRO)
        no_cache.append((cost + cache_saved) / MICRO)
        try:
            complex_.append(
                _usd(
                    cost_usd(
                        tier=BASELINE_TIER,
                        prompt_tokens=sum(c.prompt_tokens for c in b.calls.values()),
                        completion_tokens=sum(c.completion_tokens for c in b.calls.values()),
                        cached_prompt_tokens=sum(c.cached_prompt_tokens for c in b.calls.values()),
                    )
                )
            )
        except KeyError:  # no complex tier configured: no baseline
            complex_.append(None)
    return {
        "t": [b.start for b in buckets],
        "spent_usd": spent,
        "saved_usd": saved,
        "no_cache_usd": no_cache,
        "all_complex_usd": complex_,
    }


def _ratings(buckets: list[Cell]) -> dict[str, Any]:
    """Per bucket and tier label (:func:`_tier_label`): thumbs-down / rated answers, and how many
    were rated."""
    labels = sorted({_tier_label(r) for b in buckets for r in b.answers})
    ups = {label: [0] * len(buckets) for label in labels}
    downs = {label: [0] * len(buckets) for label in labels}
    for i, b in enumerate(buckets):
        for r, a in b.answers.items():
            ups[_tier_label(r)][i] += a.rated_up
            downs[_tier_label(r)][i] += a.rated_down
    return {
        "t": [b.start for b in buckets],
        "down_rate": {label: [_rate(d, u + d) for u, d in zip(ups[label], downs[label])] for label in labels},
        "rated": {label: [u + d for u, d in zip(ups[label], downs[label])] for label in labels},
    }


def _faq_rows(totals: dict[int, Any]) -> list[dict[str, Any]]:
    ids = sorted(totals, key=lambda i: (-totals[i].rated_down, -totals[i].answers, i))[:FAQ_ROWS]
    entries = {e["id"]: e for e in FaqEntry.objects.filter(id__in=ids).values("id", "intent", "locale", "question")}
    rows = []
    for i in ids:
        f, e = totals[i], entries.get(i)
        rows.append(
            {
                "id": i,
                "intent": e["intent"] if e else None,
                "locale": e["locale"] if e else None,
                "question": e["question"] if e else None,  # None: the entry was deleted since
                "answers": f.answers,
                "up": f.rated_up,
                "down": f.rated_down,
                "down_rate": _rate(f.rated_down, f.rated_up + f.rated_down),
            }
        )
    return rows


def _intent_rows(start: datetime, end: datetime) -> list[dict[str, Any]]:
    """The measured false-hit rate of the semantic cache per intent (the cache's slots) over the
    cache audits opened in the window: read from the audit rows themselves (a sample of the
    hits, so few), the intents with the most false hits first."""
    rates = sorted(
        false_hit_rates(start=start, end=end), key=lambda r: (-(r.different + r.agent_wrong), -r.n, r.intent)
    )
    return [
        {
            "intent": r.intent,
            "counted": r.n,
            "false_hits": r.different + r.agent_wrong,
            "false_hit_rate": round(r.rate, 4) if r.n else None,
            "low": round(r.low, 4),
            "high": round(r.high, 4),
            "errors": r.errors,
        }
        for r in rates[:INTENT_ROWS]
    ]


def series(
    *, start: datetime, end: datetime, tz: ZoneInfo, step: int | None = None, use_rollups: bool = True
) -> dict[str, Any]:
    """The charts' data for ``[start, end)``::

        {"window": {"from", "to", "step", "tz"}, "t": [epoch s],
         "answers": {route: [n]},
         "ttft_ms": {route: {"p50": [ms], "p95": [ms], "p99": [ms]}},
         "money": {"t": [epoch s], "spent_usd", "saved_usd", "no_cache_usd", "all_complex_usd"},
         "queue": {"handoffs", "replied", "waiting_max", "with_agent_max", "wait_s_p50", "wait_s_p95"},
         "cache": {"hit_rate", "false_hit_rate", "audits"},
         "ratings": {"t": [epoch s], "down_rate": {label: [rate]}, "rated": {label: [n]}},
         "faq": [{"id", "intent", "locale", "question", "answers", "up", "down", "down_rate"}],
         "cache_intents": [{"intent", "counted", "false_hits", "false_hit_rate", "low", "high", "errors"}],
         "source": {"rolled_hours", "raw_ranges"}}

    Every list but ``money``'s and ``ratings``' is aligned with ``t``; ``null`` where a bucket has
    nothing to measure (no samples, a zero denominator). ``money`` and ``ratings`` are per day
    (their own ``t``) once the window is longer than two days, else per bucket. Rates are fractions; ``down_rate`` = thumbs-down / ratings
    (of the answers rated at all); percentiles as ``ops.histogram`` reads them (within 2.2%).
    """
    step = step or step_for((end - start).total_seconds())
    starts = _bucket_starts(start, end, step, tz)
    window = window_cells(
        start, end, key=starting_at(starts), use_rollups=use_rollups, fine=step == FINE, tier_ttft=False
    )
    buckets = [window.cells.get(s) or Cell(s) for s in starts]

    routes = sorted({r for b in buckets for r in b.answers})
    answers = {r: [b.answers[r].answers if r in b.answers else 0 for b in buckets] for r in routes}
    ttft: dict[str, dict[str, list[float | None]]] = {}
    for r in routes:
        hists = [b.answers[r].ttft if r in b.answers else Hist() for b in buckets]
        ttft[r] = {f"p{p}": [_ms(h.percentile(p)) for h in hists] for p in (50, 95, 99)}

    hit_rate, false_rate, audits = [], [], []
    handoffs, replied, waiting, with_agent, wait50, wait95 = [], [], [], [], [], []
    for b in buckets:
        hits = sum(a.answers for r, a in b.answers.items() if r.startswith("cache."))
        remote = sum(a.answers for r, a in b.answers.items() if r.startswith("llm."))
        hit_rate.append(_rate(hits, hits + remote))
        audit = audit_rate(b.audits)
        false_rate.append(None if audit["false_hit_rate"] is None else round(audit["false_hit_rate"], 4))
        audits.append(audit["counted"])
        handoffs.append(b.answers["handoff"].answers if "handoff" in b.answers else 0)
        replied.append(b.wait.n)
        waiting.append(b.queue_waiting_max if b.queue_samples else None)
        with_agent.append(b.queue_with_agent_max if b.queue_samples else None)
        wait50.append(_s(b.wait.percentile(50)))
        wait95.append(_s(b.wait.percentile(95)))

    coarse = buckets
    if step != DAY and (end - start).total_seconds() > 2 * DAY:
        coarse = _regrouped(buckets, _bucket_starts(start, end, DAY, tz))
    return {
        "window": {"from": int(start.timestamp()), "to": int(end.timestamp()), "step": step, "tz": tz.key},
        "t": starts,
        "answers": answers,
        "ttft_ms": ttft,
        "money": _money(coarse),
        "queue": {
            "handoffs": handoffs,
            "replied": replied,
            "waiting_max": waiting,
            "with_agent_max": with_agent,
            "wait_s_p50": wait50,
            "wait_s_p95": wait95,
        },
        "cache": {"hit_rate": hit_rate, "false_hit_rate": false_rate, "audits": audits},
        "ratings": _ratings(coarse),
        "faq": _faq_rows(faq_totals(window)),
        "cache_intents": _intent_rows(start, end),
        "source": {
            "rolled_hours": window.rolled_hours,
            "raw_ranges": [[int(lo.timestamp()), int(hi.timestamp())] for lo, hi in window.raw_ranges],
        },
    }
