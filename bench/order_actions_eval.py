"""Store actions: how many order questions the router answers from the store (route ``action``).

Run from the repository root::

    .venv/bin/python bench/order_actions_eval.py [--shared ../shared] [--limit 100] [--json OUT]

What it does. It creates a temporary SQLite database (``DATABASE_URL``), migrates it, imports the
demo FAQ (``routing/demo/faq_demo.jsonl``: 27 intents, English and Chinese) with ``manage.py
import_faq``, loads the demo store's orders (``manage.py load_demo_orders --reset``) and trains
the FAQ model in this process. The demo adapter is on (``KEFU_STORE_ADAPTER=demo``) and no remote
model is configured (``OPENAI_*``, the per-tier keys and ``REDIS_URL`` are emptied), so what is
neither ``action`` nor ``faq`` is ``handoff`` or ``decline``. Each question is routed by the real
router, ``routing.decide.strategy.decide``, as the first message (seq 1) of a conversation of its own
(a fresh uuid4), so an offer or an order proved by one question never reaches another.

Questions: the Bitext public rows (``bitext/bitext_customer_support_public.csv``) of the order
intents (track_order, cancel_order, change_order, change_shipping_address, track_refund,
get_refund) and of four related ones reported apart (check_refund_policy, delivery_period,
check_cancellation_fee, place_order: questions near an order intent), duplicates dropped, at most
``--limit`` per intent, sampled with a fixed seed (default 100: 1,000 questions, ~3.5 min on 2
cores; 0: all 1,586). This Bitext release names an order with a made-up number (an ``order_id``
entity with its offsets, in 28% of these rows) rather than a ``{{Order Number}}`` placeholder;
that number is replaced by an order of the verified demo shopper, Mei (``demo-mei``,
``mei.chen@example.com``), whose state suits the intent (:data:`ORDER_FOR_INTENT`). Each question
is asked in three settings:

* (a) **verified**: ``Question(customer_id="demo-mei")``; the text with the demo order number
  where Bitext had one, else as written (the router then picks Mei's order for the intent);
* (b) **anonymous, number + e-mail**: the text of (a) with `` (e-mail: mei.chen@example.com)``
  appended where it names the order, else with `` (order KF-…, e-mail mei.chen@example.com)``;
* (c) **anonymous, neither**: the text with Bitext's number taken out; expected route ``faq``
  with the offer to look the order up (reason ``faq, order unknown for …``).

Baseline: the same texts routed with the store off (``settings.KEFU_STORE_ADAPTER = ""``, the
FAQ-only router; the route then depends on the text alone, so each distinct text is routed once),
so each ``action`` share reads as a ratio of the FAQ answers the router gave before. The FAQ
intent a text matched is read from its baseline answer (its FAQ entry). An ``action`` answer whose
text matched no order intent came from the router's "a message naming an order" path
(``routing.orders.actions.reference_decision``) and is counted apart (*ref*). The misses are sorted by
the baseline: the FAQ model not confident; an FAQ intent with no store action; an order intent
that still did not reach the store.

Also reported: the questions the store was called for (rows of the store's audit log,
``store.models.StoreCall``, by conversation), what the ``action`` answers were (the order's
status, an offer to cancel or return waiting for a "yes", a refusal by the order's state...), and
p50/p95 of ``decide``'s wall time per route, in milliseconds: one process on a shared machine,
so noisy (the embedder's cache of recent texts is emptied before each pass, so every pass embeds
its texts). The demo orders are reloaded before each pass; a cancel or return is only offered (it
needs a "yes"), and the run checks that no order changed.

Output: Markdown on stdout (tables to paste into bench/README.md) with the command, ``nproc`` and
the date, then a sample of missed questions per intent (``--samples``). Data rows are read from
``--shared`` at run time; ``--json`` writes figures only, never a question's text.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import datetime as dt
import io
import json
import os
import random
import re
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ORDER_INTENTS = (
    "track_order",
    "cancel_order",
    "change_order",
    "change_shipping_address",
    "track_refund",
    "get_refund",
)
RELATED_INTENTS = ("check_refund_policy", "delivery_period", "check_cancellation_fee", "place_order")
CUSTOMER_ID = "demo-mei"
EMAIL = "mei.chen@example.com"
# Mei's demo orders (store/demo/orders.json): KF-1001 shipped, KF-1002 placed (can still be
# changed or cancelled), KF-1003 delivered (can be returned).
ORDER_FOR_INTENT = {
    "track_order": "KF-1001",
    "delivery_period": "KF-1001",
    "cancel_order": "KF-1002",
    "change_order": "KF-1002",
    "change_shipping_address": "KF-1002",
    "check_cancellation_fee": "KF-1002",
    "place_order": "KF-1002",
    "track_refund": "KF-1003",
    "get_refund": "KF-1003",
    "check_refund_policy": "KF-1003",
}
SETTINGS = ("verified", "anon_order", "anon_none")
SETTING_LABELS = {
    "verified": "(a) verified shopper",
    "anon_order": "(b) anonymous, number + e-mail",
    "anon_none": "(c) anonymous, neither",
}
SAMPLE_SEED = 20261204
WARMUP = ("where is my order", "how do I cancel my order", "do you ship to Norway?", "refund status")
#: Emptied in this process's environment: no remote model, no Redis (the embedded defaults).
STRIPPED_ENV = ("REDIS_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL") + tuple(
    f"KEFU_{tier}_{what}" for tier in ("SIMPLE", "MEDIUM", "COMPLEX") for what in ("API_KEY", "BASE_URL", "MODEL")
)
_DIGITS = re.compile(r"\d{5,}")


# --- data -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Item:
    """One Bitext question: its intent, the text of each setting and whether Bitext named an order."""

    intent: str
    texts: dict[str, str]
    names_order: bool


def _number_span(row: dict[str, str]) -> tuple[int, int] | None:
    """Where the row's order number is: the ``order_id`` entity's offsets when they hold digits,
    else the first run of 5+ digits; None when the row names no order."""
    text = row["instruction"]
    if row.get("entity_type") == "order_id":
        try:
            s, e = int(row["start_offset"]), int(row["end_offset"])
        except ValueError:
            s = e = -1
        if 0 <= s < e <= len(text) and text[s:e].isdigit():
            return s, e
        m = _DIGITS.search(text)
        if m:
            return m.span()
    return None


def _tidy(text: str) -> str:
    text = re.sub(r"\s+([?.!,])", r"\1", text)
    return re.sub(r"\s{2,}", " ", text).strip()


def make_item(row: dict[str, str]) -> Item:
    intent, text = row["intent"], row["instruction"]
    number = ORDER_FOR_INTENT[intent]
    span = _number_span(row)
    if span is not None:
        s, e = span
        with_number = text[:s] + number + text[e:]
        texts = {
            "verified": with_number,
            "anon_order": f"{with_number} (e-mail: {EMAIL})",
            "anon_none": _tidy(text[:s] + text[e:]),
        }
    else:
        texts = {
            "verified": text,
            "anon_order": f"{text} (order {number}, e-mail {EMAIL})",
            "anon_none": text,
        }
    return Item(intent=intent, texts=texts, names_order=span is not None)


def load_items(shared: Path, intents: Sequence[str], limit: int) -> list[Item]:
    """At most ``limit`` distinct questions of each intent (a fixed-seed sample), intents in order."""
    path = shared / "data" / "bitext" / "bitext_customer_support_public.csv"
    by_intent: dict[str, dict[str, dict[str, str]]] = defaultdict(dict)
    with path.open(encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            if row["intent"] in intents:
                by_intent[row["intent"]].setdefault(row["instruction"], row)
    items = []
    for intent in intents:
        rows = list(by_intent[intent].values())
        if limit and len(rows) > limit:
            rows = random.Random(f"{SAMPLE_SEED}:{intent}").sample(rows, limit)
        items += [make_item(r) for r in rows]
    return items


# --- the router -------------------------------------------------------------------------------
@dataclass
class Outcome:
    """What one question got: route, the router's reason, the FAQ intent of a ``faq`` answer, the
    conversation (its store calls are counted by it) and decide's wall time."""

    route: str
    reason: str
    faq_intent: str | None
    conversation_id: uuid.UUID
    ms: float
    store_calls: int = 0


@dataclass
class Pass:
    label: str
    outcomes: list[Outcome]
    wall_s: float


def _quiet(*args: str) -> None:
    from django.core.management import call_command

    call_command(*args, verbosity=0, stdout=io.StringIO())


def setup_django(tmp: Path) -> None:
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ["DATABASE_URL"] = f"sqlite:///{tmp / 'bench.sqlite3'}"
    for name in STRIPPED_ENV:
        os.environ[name] = ""  # an empty value also keeps a project .env from setting it
    os.environ["KEFU_STORE_ADAPTER"] = "demo"
    os.environ["KEFU_NO_WARMUP"] = "1"
    import django

    django.setup()
    _quiet("migrate", "--noinput")
    _quiet("import_faq", str(ROOT / "routing" / "demo" / "faq_demo.jsonl"))
    _quiet("load_demo_orders", "--reset")


def demo_state() -> dict[str, tuple[str, str]]:
    from store.models import DemoOrder

    return {o.number: (o.status, json.dumps(o.shipping_address, sort_keys=True)) for o in DemoOrder.objects.all()}


async def _no_history(*, before_seq: int, turns: int) -> Any:
    from routing.types import History

    return History()


async def _route(questions: Sequence[tuple[str, str]]) -> list[Outcome]:
    from routing.decide.strategy import decide
    from routing.faq.registry import registry
    from routing.types import Question

    out = []
    for text, customer_id in questions:
        cid = uuid.uuid4()  # a conversation of its own: no offer or known order from another question
        question = Question(
            conversation_id=cid, message_id=None, seq=1, text=text, locale="en", customer_id=customer_id
        )
        started = time.perf_counter()
        decision = await decide(question=question, history=_no_history)
        ms = (time.perf_counter() - started) * 1000
        entry = registry.entries.get(decision.faq_entry_id) if decision.faq_entry_id is not None else None
        out.append(
            Outcome(
                route=decision.route,
                reason=decision.reason,
                faq_intent=entry.intent if entry is not None and decision.route == "faq" else None,
                conversation_id=cid,
                ms=ms,
            )
        )
    return out


def _forget_recent_embeddings() -> None:
    """Empties the embedder's cache of recent texts (a private LRU; nothing if it has none), so a
    pass does not find the previous pass's embeddings of the same texts."""
    from cache_layer.embeddings import get_embedder

    lru = getattr(get_embedder(), "_lru", None)
    if lru is not None:
        lru.clear()


def run_pass(label: str, questions: Sequence[tuple[str, str]], *, store_on: bool) -> Pass:
    """Routes ``questions`` (text, customer id) one after the other, the store on or off, on
    freshly loaded demo orders; fails when an order changed meanwhile."""
    from django.conf import settings
    from django.db.models import Count

    from store.models import StoreCall

    _quiet("load_demo_orders", "--reset")
    before = demo_state()
    _forget_recent_embeddings()
    saved = settings.KEFU_STORE_ADAPTER
    settings.KEFU_STORE_ADAPTER = "demo" if store_on else ""
    started = time.perf_counter()
    try:
        outcomes = asyncio.run(_route(questions))
    finally:
        settings.KEFU_STORE_ADAPTER = saved
    wall = time.perf_counter() - started
    rows = (
        StoreCall.objects.filter(conversation_id__in=[o.conversation_id for o in outcomes])
        .values("conversation_id")
        .annotate(n=Count("id"))
    )
    calls = {r["conversation_id"]: r["n"] for r in rows}
    for o in outcomes:
        o.store_calls = calls.get(o.conversation_id, 0)
    changed = [n for n, state in demo_state().items() if before.get(n) != state]
    if changed:
        raise RuntimeError(f"demo orders changed during the pass {label!r}: {changed}")
    return Pass(label=label, outcomes=outcomes, wall_s=wall)


# --- report -----------------------------------------------------------------------------------
def action_kind(reason: str) -> str:
    """What an ``action`` answer was, from the router's reason."""
    if "not_found" in reason:
        return "order not found"
    if "no such order" in reason:
        return "no order of that kind"
    if " offered " in reason:
        return "change offered (awaits yes)"
    if " refused" in reason:
        return "refused by the order's state"
    if " ask " in reason:
        return "new address asked for"
    if "no conversation" in reason:
        return "status (no conversation)"
    m = re.match(r"action (status|refund_status) \S+$", reason)
    if m:
        return "refund shown" if m.group(1) == "refund_status" else "status shown"
    return reason


def _pct(n: int, d: int) -> str:
    return f"{100 * n / d:.1f}%" if d else "–"


def _share(n: int, d: int) -> str:
    return f"{_pct(n, d)} ({n}/{d})" if d else "–"


def _ratio(n: int, d: int) -> str:
    return f"{n / d:.2f}" if d else "–"


def _pctl(values: Sequence[float]) -> str:
    if not values:
        return "–"
    p50, p95 = np.percentile(values, [50, 95])
    return f"{p50:.1f} / {p95:.1f}"


def _groups(items: Sequence[Item], intents: Sequence[str]) -> list[tuple[str, list[int]]]:
    """(label, indexes): each order intent, the order intents together, each related intent,
    the related intents together."""
    idx: dict[str, list[int]] = defaultdict(list)
    for i, it in enumerate(items):
        idx[it.intent].append(i)
    out: list[tuple[str, list[int]]] = []
    for title, family in (("order intents", ORDER_INTENTS), ("related intents", RELATED_INTENTS)):
        present = [x for x in family if x in intents and idx[x]]
        out += [(f"`{x}`", idx[x]) for x in present]
        if present:
            out.append((f"**{title} ({len(present)})**", [i for x in present for i in idx[x]]))
    return out


@dataclass
class Results:
    items: list[Item]
    on: dict[str, Pass]  # setting -> store-on pass (aligned with items)
    off: dict[str, list[Outcome]]  # setting -> the FAQ-only outcome of each item's text
    baseline: Pass  # the FAQ-only pass over the distinct texts


def report(r: Results, intents: Sequence[str]) -> tuple[list[str], dict[str, Any]]:
    from django.conf import settings

    action_intents = set(settings.KEFU_ACTION_INTENTS)
    items, off = r.items, r.off
    on = {s: p.outcomes for s, p in r.on.items()}
    groups = _groups(items, intents)
    figures: dict[str, Any] = {"groups": {}, "passes": {}, "misses": {}}

    def by_reference(s: str, i: int) -> bool:
        # An `action` answer whose text matched no order intent in the FAQ: the router's
        # "a message that names an order" path (routing.orders.actions.reference_decision).
        return on[s][i].route == "action" and off[s][i].faq_intent not in action_intents

    lines = [
        "Share of questions answered on route `action` (store on). FAQ-only: the same texts routed "
        'with the store off (`KEFU_STORE_ADAPTER=""`), share answered on route `faq`; × = the '
        "`action` share over the FAQ-only `faq` share of the same texts. *ref*: `action` answers "
        "whose text matched no order intent in the FAQ, answered because the message names an order "
        "(`routing.orders.actions.reference_decision`).",
        "",
        "| intent | questions | (a) verified: `action` | ×, FAQ-only (a) | (b) anonymous, number + e-mail: `action` "
        "| ×, FAQ-only (b) | (c) anonymous, neither: `faq` with the lookup offer | (c): `faq`, all "
        "| FAQ-only `faq` on (a) / (b) / (c) texts |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, idx in groups:
        n = len(idx)
        act = {s: sum(on[s][i].route == "action" for i in idx) for s in SETTINGS}
        ref = {s: sum(by_reference(s, i) for i in idx) for s in SETTINGS}
        base = {s: sum(off[s][i].route == "faq" for i in idx) for s in SETTINGS}
        offered = sum(on["anon_none"][i].route == "faq" and "order unknown" in on["anon_none"][i].reason for i in idx)
        faq_c = sum(on["anon_none"][i].route == "faq" for i in idx)
        lines.append(
            f"| {label} | {n} | {_share(act['verified'], n)}; ref {ref['verified']} "
            f"| {_ratio(act['verified'], base['verified'])} "
            f"| {_share(act['anon_order'], n)}; ref {ref['anon_order']} "
            f"| {_ratio(act['anon_order'], base['anon_order'])} "
            f"| {_share(offered, n)} | {_pct(faq_c, n)} "
            f"| {_pct(base['verified'], n)} / {_pct(base['anon_order'], n)} / {_pct(base['anon_none'], n)} |"
        )
        figures["groups"][label.strip("`*")] = {
            "questions": n,
            "action": act,
            "action_by_reference": ref,
            "faq_only_faq": base,
            "anon_none_faq_with_offer": offered,
            "anon_none_faq": faq_c,
            "anon_none_action": act["anon_none"],
        }

    passes = [(SETTING_LABELS[s] + ", store on", r.on[s]) for s in SETTINGS] + [
        ("FAQ-only (store off), each distinct text once", r.baseline)
    ]
    lines += [
        "",
        "Routes of each pass, the questions the store was called for (its audit log, "
        "`store.models.StoreCall`, by conversation) and the store calls:",
        "",
        "| pass | questions | action | faq | handoff | decline | other | store called for | store calls | wall (s) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, p in passes:
        routes = Counter(o.route for o in p.outcomes)
        other = sum(c for k, c in routes.items() if k not in ("action", "faq", "handoff", "decline"))
        called = sum(1 for o in p.outcomes if o.store_calls)
        calls = sum(o.store_calls for o in p.outcomes)
        lines.append(
            f"| {label} | {len(p.outcomes)} | {routes['action']} | {routes['faq']} | {routes['handoff']} | "
            f"{routes['decline']} | {other} | {called} | {calls} | {p.wall_s:.1f} |"
        )
        figures["passes"][label] = {
            "questions": len(p.outcomes),
            "routes": dict(routes),
            "store_called_for": called,
            "store_calls": calls,
            "wall_s": round(p.wall_s, 2),
            "decide_ms_p50_p95": {
                k: [round(float(x), 2) for x in np.percentile([o.ms for o in p.outcomes if o.route == k], [50, 95])]
                for k in routes
            },
        }

    kinds = sorted({action_kind(o.reason) for s in SETTINGS for o in on[s] if o.route == "action"})
    if kinds:
        lines += [
            "",
            "What the `action` answers said (store on; from the router's reason):",
            "",
            "| intent | setting | " + " | ".join(kinds) + " |",
            "|---|---|" + "---:|" * len(kinds),
        ]
        for label, idx in groups:
            for s in ("verified", "anon_order"):
                c = Counter(action_kind(on[s][i].reason) for i in idx if on[s][i].route == "action")
                lines.append(f"| {label} | {s} | " + " | ".join(str(c[k]) for k in kinds) + " |")
                figures["groups"][label.strip("`*")].setdefault("action_kinds", {})[s] = dict(c)

    lines += [
        "",
        "`decide` wall time per route, ms p50 / p95 (one process, the embedding included, the "
        "embedder's cache of recent texts emptied before each pass; **noisy**: a shared 2-core "
        "machine, read the order of magnitude only):",
        "",
        "| pass | action | faq | handoff | decline |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, p in passes:
        cells = []
        for k in ("action", "faq", "handoff", "decline"):
            ms = [o.ms for o in p.outcomes if o.route == k]
            cells.append(f"{_pctl(ms)} (n={len(ms)})" if ms else "–")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")

    lines += [
        "",
        "Why questions missed `action`, from the same text's FAQ-only answer: *not confident* = "
        "the FAQ model answered nothing (handoff/decline); *other FAQ intent* = an FAQ entry with no "
        "store action (top intents); *order intent* = an order intent's entry, and still no `action`.",
        "",
        "| intent | setting | misses | not confident | other FAQ intent (top) | order intent |",
        "|---|---|---:|---:|---|---:|",
    ]
    for label, idx in groups:
        for s in ("verified", "anon_order"):
            missed = [i for i in idx if on[s][i].route != "action"]
            unsure = sum(off[s][i].route != "faq" for i in missed)
            other = Counter(off[s][i].faq_intent for i in missed if off[s][i].faq_intent not in (None, *action_intents))
            stuck = sum(off[s][i].faq_intent in action_intents for i in missed)
            top = ", ".join(f"{k} {v}" for k, v in other.most_common(3)) or "–"
            lines.append(f"| {label} | {s} | {len(missed)} | {unsure} | {sum(other.values())} ({top}) | {stuck} |")
            figures["misses"][f"{label.strip('`*')}/{s}"] = {
                "misses": len(missed),
                "not_confident": unsure,
                "other_faq_intent": dict(other),
                "order_intent_no_action": stuck,
            }

    lines += [
        "",
        "FAQ intent each Bitext intent matched (FAQ-only, texts of (a) / of (b); — = none):",
        "",
        "| Bitext intent | texts of (a) | texts of (b) |",
        "|---|---|---|",
    ]
    matched: dict[str, dict[str, Counter[str]]] = {s: defaultdict(Counter) for s in SETTINGS}
    for i, it in enumerate(items):
        for s in SETTINGS:
            matched[s][it.intent][off[s][i].faq_intent or "—"] += 1
    for intent in intents:
        if matched["verified"][intent]:
            cells = [
                ", ".join(f"{k} {v}" for k, v in matched[s][intent].most_common()) for s in ("verified", "anon_order")
            ]
            lines.append(f"| `{intent}` | {cells[0]} | {cells[1]} |")
    figures["faq_intent_matched"] = {s: {k: dict(v) for k, v in m.items()} for s, m in matched.items()}
    return lines, figures


def samples(r: Results, per_intent: int) -> list[str]:
    """A few missed questions of each intent and setting (a)/(b), and a few answered by the
    reference path, with the reasons: for reading, printed only."""
    from django.conf import settings

    action_intents = set(settings.KEFU_ACTION_INTENTS)
    out: list[str] = []
    rng = random.Random(SAMPLE_SEED)
    for s in ("verified", "anon_order"):
        on, off = r.on[s].outcomes, r.off[s]
        for title, keep in (
            ("missed", lambda i: on[i].route != "action"),
            ("by reference", lambda i: on[i].route == "action" and off[i].faq_intent not in action_intents),
        ):
            by: dict[str, list[int]] = defaultdict(list)
            for i, it in enumerate(r.items):
                if keep(i):
                    by[it.intent].append(i)
            for intent, idx in by.items():
                for i in rng.sample(idx, min(per_intent, len(idx))):
                    why = off[i].faq_intent or off[i].route
                    out.append(
                        f"- {s}, {title}, `{intent}`: {r.items[i].texts[s]!r} → {on[i].route} ({on[i].reason}); "
                        f"FAQ-only: {why}"
                    )
    return out


def _display_command(argv: Sequence[str]) -> str:
    def rel(path: str) -> str:
        try:
            return os.path.relpath(path) if Path(path).absolute().is_relative_to(Path.cwd()) else path
        except ValueError:
            return path

    return shlex.join([rel(sys.executable), rel(sys.argv[0]), *argv])


def _git_revision() -> str:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        return (rev or "unknown") + (" + uncommitted changes" if dirty else "")
    except OSError:
        return "unknown"


# --- main -------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared", help="the shared folder (holds data/)")
    ap.add_argument(
        "--limit", type=int, default=100, help="questions per intent, a fixed-seed sample (default 100; 0: all)"
    )
    ap.add_argument("--json", type=Path, help="also write the figures (no question texts) to this file")
    ap.add_argument("--samples", type=int, default=3, help="questions shown per intent, setting and kind (0: none)")
    ap.add_argument("--no-related", action="store_true", help="only the six order intents")
    args = ap.parse_args(argv)
    raw_argv = list(sys.argv[1:] if argv is None else argv)
    intents = ORDER_INTENTS if args.no_related else ORDER_INTENTS + RELATED_INTENTS
    try:
        items = load_items(args.shared.resolve(), intents, max(0, args.limit))
    except (OSError, KeyError, ValueError) as e:
        ap.error(f"cannot read the Bitext data under {args.shared}/data: {e}")
    if not items:
        ap.error("no Bitext questions of the order intents found")
    started = dt.datetime.now(dt.UTC)
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()

    with tempfile.TemporaryDirectory(prefix="kefu-order-actions-") as tmp:
        setup_django(Path(tmp))
        from django.db import connections

        from routing.faq.registry import registry
        from routing.orders.actions import email_in, order_number_in
        from routing.upstream.tiers import configured_tiers

        try:
            if configured_tiers():
                print(f"a remote model is configured ({configured_tiers()}); unset it", file=sys.stderr)
                return 1
            registry.reload()
            print(f"… set up and FAQ model trained in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
            run_pass("warm-up", [(t, CUSTOMER_ID) for t in WARMUP], store_on=True)  # not counted
            on: dict[str, Pass] = {}
            for s in SETTINGS:
                print(f"… {SETTING_LABELS[s]}, store on: {len(items)} questions", file=sys.stderr, flush=True)
                customer = CUSTOMER_ID if s == "verified" else ""
                on[s] = run_pass(s, [(it.texts[s], customer) for it in items], store_on=True)
            # With the store off the route depends on the text alone (no order lookup, no
            # offer; the shopper's identity only matters to a remote model's budgets).
            texts = list(dict.fromkeys(it.texts[s] for s in SETTINGS for it in items))
            print(f"… FAQ-only (store off): {len(texts)} distinct texts", file=sys.stderr, flush=True)
            baseline = run_pass("faq-only", [(t, "") for t in texts], store_on=False)
        except RuntimeError as e:
            print(f"benchmark failed: {e}", file=sys.stderr)
            return 1
        finally:
            connections.close_all()
        by_text = dict(zip(texts, baseline.outcomes))
        results = Results(
            items=items,
            on=on,
            off={s: [by_text[it.texts[s]] for it in items] for s in SETTINGS},
            baseline=baseline,
        )
        named = {
            s: (
                sum(bool(order_number_in(it.texts[s])) for it in items),
                sum(bool(email_in(it.texts[s])) for it in items),
            )
            for s in SETTINGS
        }
        table, figures = report(results, intents)
        shown = samples(results, args.samples) if args.samples > 0 else []

    n_intents = Counter(it.intent for it in items)
    out = [
        "## Store actions benchmark (`bench/order_actions_eval.py`)",
        "",
        f"Command: `{_display_command(raw_argv)}`  ",
        f"Date: {started:%Y-%m-%d %H:%M} UTC · `nproc` {len(os.sched_getaffinity(0))} · load average (1 min) at "
        f"start {load_before:.2f} · {time.perf_counter() - t0:.0f} s · kefu {_git_revision()} · "
        f"Python {sys.version.split()[0]} · demo FAQ (`routing/demo/faq_demo.jsonl`), demo store adapter, "
        "SQLite, no remote model",
        "",
        f"Questions: {len(items)} distinct Bitext questions ("
        + ", ".join(f"{k} {v}" for k, v in n_intents.items())
        + f"); {sum(it.names_order for it in items)} name an order in Bitext's text. Found by the router's "
        "own patterns (order number / e-mail): "
        + ", ".join(f"{SETTING_LABELS[s]} {named[s][0]} / {named[s][1]}" for s in SETTINGS)
        + ".",
        "",
        *table,
    ]
    print("\n".join(out))
    if shown:
        print("\nA sample of the questions (as asked → route (reason); the FAQ-only answer's intent):\n")
        print("\n".join(shown))
    if args.json:
        figures.update(
            command=_display_command(raw_argv),
            date=f"{started:%Y-%m-%dT%H:%MZ}",
            revision=_git_revision(),
            questions=dict(n_intents),
            named_number_email={s: list(v) for s, v in named.items()},
        )
        args.json.write_text(json.dumps(figures, indent=2, default=str) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
