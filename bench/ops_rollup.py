"""The ops dashboard over a million cost-ledger rows: its data views read from Ops' hourly rollups
against the same views read from the raw rows (issue 16, item 2; docs/ops.md).

Set-up (private to the run, removed afterwards): a temporary database — a SQLite file
(``--db sqlite``, the default) or a fresh PostgreSQL database on ``TEST_DATABASE_URL``'s server
(``--db postgres``) — migrated, then filled with bulk inserts (SQLite ``executemany``, PostgreSQL
``COPY``) with ``--rows`` (1,000,000) ``UpstreamCall`` rows over the last ``--days`` (30) and the
conversations and messages they belong to: every remote answer (``llm.*``) has its ledger rows
(a retry before 8% of them, a fallback before 3%, 0.5% failed or stopped), and beside them the
answers that called no model — FAQ, cache, store actions, declines and handoffs — in the mix of
bench/replay.py's traffic; plus rewrite, summary, suggestion and audit calls, ratings on 6% of
answers, agents' replies to 70% of handoffs, cache audits of 5% of semantic hits (four intents),
a quarter of the conversations by signed-in customers (about four each, so some come back: the
outcomes' recontacts), satisfaction scores on 4%, and a queue sample each minute. Seeded (``--seed``), so two runs write the same rows.

Then, for the 30 days up to the last row written (the page's longest window, 720 hours, as
``from``/``to``: its partial first and last hours hold an hour of rows between them), three views through
Django's test client in this process (server time: the view's work, no network):
``GET /ops/`` (the page), ``GET /ops/api/summary`` and ``GET /ops/api/series`` (the charts'
data) — first with no rollup (everything read from the raw rows: the baseline), then after
``ops.rollup`` rolled every whole hour up (the current hour is still read raw, as in production).
Each view is called once to warm, then ``--repeat`` (5) times (the raw baseline
``--raw-repeat`` times: at a million rows each raw call takes a minute or more); the median is
reported, with the ratio. ``--profile`` prints where the rolled summary spends its time. The figures must agree: the summary read both ways is compared field by field. Also
timed: the load, the backfill (every hour of the 30 days) and one 5-minute beat run (the last
3 hours), and, when ``git`` can show it, the summary as it was computed before the rollups
(``--legacy-rev``: SQL aggregates over the raw rows and the newest 20,000 samples per route).

    .venv/bin/python bench/ops_rollup.py                     # SQLite, 1,000,000 rows
    .venv/bin/python bench/ops_rollup.py --db postgres
    .venv/bin/python bench/ops_rollup.py --rows 100000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import types
import uuid
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: Answers by route (what called no model beside what did), as bench/replay.py's traffic.
ROUTES = [
    ("llm.simple", 0.30),
    ("llm.medium", 0.10),
    ("llm.complex", 0.04),
    ("faq", 0.30),
    ("cache.exact", 0.07),
    ("cache.semantic", 0.07),
    ("action", 0.03),
    ("decline", 0.06),
    ("handoff", 0.03),
]
#: USD per million tokens (input, cached input, output), the shipped defaults.
PRICES = {"simple": (0.28, 0.028, 0.42), "medium": (0.30, 0.075, 2.50), "complex": (2.00, 0.50, 8.00)}
#: Median time to first token per route, ms (log-normal, sigma 0.5).
TTFT = {"llm.simple": 650, "llm.medium": 900, "llm.complex": 1400, "faq": 12, "cache.exact": 6, "cache.semantic": 25}
#: Share of conversations by a signed-in customer, and conversations per customer over the run
#: (so that some come back within the resolution window: recontacts).
VERIFIED = 0.25
PER_CUSTOMER = 4
#: Satisfaction scores 1-5 of the 4% of conversations that gave one.
CSAT = [8, 7, 15, 30, 40]
MTOK = Decimal(1_000_000)
USD = Decimal("0.000001")


def usd(tier: str, prompt: int, cached: int, completion: int) -> Decimal:
    p_in, p_cached, p_out = PRICES[tier]
    total = (
        Decimal(prompt - cached) * Decimal(str(p_in))
        + Decimal(cached) * Decimal(str(p_cached))
        + Decimal(completion) * Decimal(str(p_out))
    ) / MTOK
    return total.quantize(USD)


class Table:
    """Bulk rows for one model: every concrete column, Django's defaults for those not given,
    values adapted for the database (the raw insert skips the ORM)."""

    def __init__(self, model: Any, connection: Any) -> None:
        self.model = model
        self.connection = connection
        self.vendor = connection.vendor
        auto = ("AutoField", "BigAutoField")
        self.fields = [f for f in model._meta.concrete_fields if not (f.primary_key and f.get_internal_type() in auto)]
        self.with_id = False
        self.defaults = {f.attname: f.get_default() for f in self.fields}
        self.rows: list[tuple[Any, ...]] = []
        self.written = 0

    def columns(self) -> list[str]:
        return (["id"] if self.with_id else []) + [f.column for f in self.fields]

    def adapt(self, value: Any) -> Any:
        if isinstance(value, datetime):
            return value if self.vendor == "postgresql" else self.connection.ops.adapt_datetimefield_value(value)
        if isinstance(value, Decimal):
            return str(value)
        if isinstance(value, uuid.UUID):
            return value if self.vendor == "postgresql" else value.hex
        if isinstance(value, (list, dict)):
            return json.dumps(value)
        if isinstance(value, bool) and self.vendor != "postgresql":
            return int(value)
        return value

    def add(self, **values: Any) -> None:
        row = [self.adapt(values.get(f.attname, self.defaults[f.attname])) for f in self.fields]
        if self.with_id:
            row.insert(0, values["id"])
        self.rows.append(tuple(row))
        if len(self.rows) >= 20_000:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        table = self.model._meta.db_table
        cols = self.columns()
        with self.connection.cursor() as cursor:
            if self.vendor == "postgresql":
                raw = cursor.cursor
                with raw.copy(f'COPY "{table}" ({", ".join(cols)}) FROM STDIN') as copy:
                    for row in self.rows:
                        copy.write_row(row)
            else:
                marks = ", ".join(["%s"] * len(cols))
                cursor.executemany(f'INSERT INTO "{table}" ({", ".join(cols)}) VALUES ({marks})', self.rows)
        self.written += len(self.rows)
        self.rows = []


def generate(rows: int, days: int, seed: int, now: datetime) -> dict[str, int]:
    """Write the traffic (module docstring); returns row counts by table."""
    from django.db import connection, transaction

    from cache_layer.models import CacheAudit
    from chat.models import Conversation, Message
    from ops.models import QueueSample
    from routing.models import UpstreamCall

    rng = random.Random(seed)
    routes, weights = zip(*ROUTES)
    span = days * 86400
    start = now - timedelta(seconds=span)
    conversations, messages = Table(Conversation, connection), Table(Message, connection)
    messages.with_id = True
    calls, audits, samples = (
        Table(UpstreamCall, connection),
        Table(CacheAudit, connection),
        Table(QueueSample, connection),
    )
    tiers = ["simple", "medium", "complex"]
    message_id = 0
    # About 0.65 conversations per ledger row (measured): customers enough for PER_CUSTOMER each.
    customers = max(1, int(rows * 0.65 * VERIFIED / PER_CUSTOMER))

    def call(t: datetime, conv: uuid.UUID, msg: int | None, tier: str, **kw: Any) -> None:
        prompt = kw.pop("prompt", 0)
        cached = kw.pop("cached", 0)
        completion = kw.pop("completion", 0)
        calls.add(
            conversation_id=conv,
            message_id=msg,
            tier=tier,
            model=f"model-{tier}",
            prompt_tokens=prompt,
            cached_prompt_tokens=cached,
            completion_tokens=completion,
            cost_usd=usd(tier, prompt, cached, completion),
            created_at=t,
            **kw,
        )

    with transaction.atomic():
        while calls.written + len(calls.rows) < rows:
            conv = uuid.UUID(int=rng.getrandbits(128))
            t = start + timedelta(seconds=rng.random() * span)
            conv_row: dict[str, Any] = {"id": conv, "token_hash": "0" * 64, "handoff_packet": {}, "created_at": t}
            if rng.random() < VERIFIED:  # a signed-in customer: their next conversation may be a recontact
                conv_row["customer_id"] = f"customer-{rng.randrange(customers)}"
            seq = 0
            for _ in range(1 + min(12, int(rng.expovariate(1 / 2.5)))):
                t += timedelta(seconds=rng.uniform(15, 90))
                if t >= now:
                    break
                seq += 1
                message_id += 1
                question = message_id
                messages.add(id=question, conversation_id=conv, seq=seq, role="shopper", text="q", created_at=t)
                route = rng.choices(routes, weights)[0]
                answer_at = t + timedelta(milliseconds=5)
                bot: dict[str, Any] = {"route": route, "reply_to_seq": seq}
                if route in TTFT:
                    bot["ttft_ms"] = rng.lognormvariate(math.log(TTFT[route]), 0.5)
                if rng.random() < 0.06:
                    bot["rating"] = "up" if rng.random() < 0.75 else "down"
                if route.startswith("llm."):
                    tier = route[4:]
                    prompt, completion = rng.randint(350, 2400), rng.randint(30, 420)
                    cached = rng.choice([0, 0, 0, prompt // 2])
                    if rng.random() < 0.08:  # a retry before the answer
                        call(
                            t,
                            conv,
                            question,
                            tier,
                            outcome="retried",
                            error_code="server",
                            http_status=503,
                            purpose="answer",
                        )
                    if rng.random() < 0.03 and tier != "complex":  # the tier before fell back to this one
                        before = tiers[tiers.index(tier) - 1] if tier != "simple" else "simple"
                        call(t, conv, question, before, outcome="fell_back", error_code="timeout", purpose="answer")
                    final = rng.random()
                    outcome, code = (
                        ("failed", "abandoned")
                        if final < 0.003
                        else ("failed", "server")
                        if final < 0.005
                        else ("ok", "")
                    )
                    ttft = bot["ttft_ms"] * 0.9
                    call(
                        t,
                        conv,
                        question,
                        tier,
                        outcome=outcome,
                        error_code=code,
                        prompt=prompt,
                        cached=cached,
                        completion=completion,
                        ttft_ms=ttft,
                        latency_ms=ttft + completion * 12,
                        purpose="answer",
                    )
                    bot.update(
                        model=f"model-{tier}",
                        prompt_tokens=prompt,
                        completion_tokens=completion,
                        cost_usd=usd(tier, prompt, cached, completion),
                        latency_ms=ttft + completion * 12,
                    )
                elif route in ("faq", "action", "cache.exact", "cache.semantic"):
                    bot["saved_usd"] = usd("simple", 376, 0, rng.randint(40, 260))
                    if route in ("faq", "action"):
                        bot["faq_entry_id"] = rng.randint(1, 50)
                    if route == "cache.semantic" and rng.random() < 0.05:
                        verdict = rng.choices(["same", "different", "agent_wrong", "error"], [90, 6, 1, 3])[0]
                        audits.add(
                            intent=rng.choice(["shipping", "returns", "payment", "sizes"]),
                            question="q",
                            cached_question="q",
                            cached_answer="a",
                            verdict=verdict,
                            created_at=answer_at + timedelta(seconds=20),
                        )
                seq += 1
                message_id += 1
                messages.add(
                    id=message_id, conversation_id=conv, seq=seq, role="bot", text="a", created_at=answer_at, **bot
                )
                if rng.random() < 0.05:  # the follow-up rewrite, the summary, an agent's suggestion
                    purpose = rng.choice(["rewrite", "summary", "suggestion"])
                    call(
                        t,
                        conv,
                        None,
                        "simple",
                        outcome="ok",
                        prompt=rng.randint(200, 900),
                        completion=rng.randint(10, 120),
                        ttft_ms=300.0,
                        latency_ms=600.0,
                        purpose=purpose,
                    )
                if route == "handoff":
                    if rng.random() < 0.7:
                        seq += 1
                        message_id += 1
                        wait = timedelta(seconds=rng.lognormvariate(math.log(150), 0.9))
                        messages.add(
                            id=message_id,
                            conversation_id=conv,
                            seq=seq,
                            role="agent",
                            text="hi",
                            agent_name="Alice",
                            created_at=answer_at + wait,
                        )
                    break
            conv_row["updated_at"] = t
            if rng.random() < 0.04:  # closed, and the shopper answered the satisfaction question
                conv_row.update(status="closed", csat_score=rng.choices(range(1, 6), CSAT)[0], csat_at=t)
            conversations.add(**conv_row)
        minute = start
        while minute < now:
            samples.add(at=minute, waiting=max(0, int(rng.gauss(2, 2))), with_agent=rng.randint(0, 4))
            minute += timedelta(minutes=1)
        for table in (conversations, messages, calls, audits, samples):
            table.flush()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT setval(pg_get_serial_sequence('chat_message', 'id'), %s)", [message_id])
            cursor.execute("ANALYZE")
    return {
        "conversations": conversations.written,
        "messages": messages.written,
        "ledger rows": calls.written,
        "cache audits": audits.written,
        "queue samples": samples.written,
    }


def timed(fn: Any, repeat: int) -> tuple[float, Any]:
    """Median seconds of ``repeat`` calls after one warm-up call, and the last result."""
    result = fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


def legacy_summary(rev: str) -> Any:
    """``summary`` of ``ops/selectors.py`` at ``rev`` (before the rollups), or None."""
    try:
        source = subprocess.run(
            ["git", "show", f"{rev}:ops/selectors.py"], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    module = types.ModuleType("ops_legacy_selectors")
    module.__dict__["__name__"] = "ops_legacy_selectors"
    exec(compile(source, f"{rev}:ops/selectors.py", "exec"), module.__dict__)
    return module.summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--rows", type=int, default=1_000_000, help="ledger rows to write (default 1,000,000)")
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--raw-repeat",
        type=int,
        default=None,
        help="repeats of the raw baseline (default: --repeat; it is slow; 0: not timed, only compared)",
    )
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--legacy-rev", default="1e3dce6", help="the commit before the rollups ('' to skip)")
    parser.add_argument("--profile", action="store_true", help="print cProfile's top calls of the rolled summary")
    args = parser.parse_args()

    for var in ("REDIS_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        os.environ.pop(var, None)
    tmp = tempfile.TemporaryDirectory(prefix="kefu-ops-bench-")
    pg_name = None
    if args.db == "postgres":
        import psycopg

        admin = os.environ.get("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
        pg_name = f"kefu_ops_bench_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(admin, autocommit=True) as db:
            db.execute(f'CREATE DATABASE "{pg_name}"')
        os.environ["DATABASE_URL"] = urlsplit(admin)._replace(path="/" + pg_name).geturl()
    else:
        os.environ["DATABASE_URL"] = f"sqlite:///{tmp.name}/ops.sqlite3"
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ.setdefault("ALLOWED_HOSTS", "testserver,127.0.0.1,localhost")
    try:
        run(args)
    finally:
        if pg_name is not None:
            from django.db import connections

            connections.close_all()
            with psycopg.connect(admin, autocommit=True) as db:
                db.execute(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')
        tmp.cleanup()


def run(args: argparse.Namespace) -> None:
    import django

    django.setup()
    from django.conf import settings
    from django.contrib.auth.models import Permission, User
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.utils import timezone

    from ops import selectors
    from ops.cells import HOUR, floor_to
    from ops.rollup import hours_roll, recent_roll

    settings.ALLOWED_HOSTS = ["testserver"]
    call_command("migrate", verbosity=0)
    now = timezone.now()
    t = time.perf_counter()
    counts = generate(args.rows, args.days, args.seed, now)
    load_s = time.perf_counter() - t
    if connection.vendor == "sqlite":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")
    size = Path(settings.DATABASES["default"]["NAME"]).stat().st_size / 2**20 if connection.vendor == "sqlite" else None
    user = User.objects.create_user("olivia", password="x", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_costs"))
    client = Client()
    client.force_login(user)
    hours = 24 * args.days
    # The window ends when the generated traffic does, so that its partial first and last hours
    # (read raw) hold a whole hour of rows between them, as a live window's do.
    start = now - timedelta(hours=hours)
    window = f"from={start.timestamp():.6f}&to={now.timestamp():.6f}"
    urls = {
        "page `GET /ops/`": f"/ops/?{window}",
        "`GET /ops/api/summary`": f"/ops/api/summary?{window}",
        "`GET /ops/api/series` (charts)": f"/ops/api/series?{window}&tz=Europe/Berlin",
    }

    def get(url: str) -> Any:
        def call() -> Any:
            r = client.get(url)
            assert r.status_code == 200, (url, r.status_code, r.content[:200])
            return r

        return call

    print(f"database: {connection.vendor}; rows: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()), flush=True)
    print(f"load: {load_s:.1f} s" + (f", file {size:,.0f} MiB" if size else ""), flush=True)
    raw: dict[str, float] = {}
    raw_repeat = args.repeat if args.raw_repeat is None else args.raw_repeat
    for name, url in urls.items() if raw_repeat else ():
        raw[name], _ = timed(get(url), raw_repeat)
        print(f"raw   {name}: {raw[name]:.3f} s", flush=True)
    raw_summary = selectors.summary(start=start, end=now)
    legacy = legacy_summary(args.legacy_rev) if args.legacy_rev and raw_repeat else None
    legacy_s = None
    if legacy is not None:
        legacy_s, _ = timed(lambda: legacy(hours=hours), raw_repeat)
        print(f"legacy summary ({args.legacy_rev}): {legacy_s:.3f} s", flush=True)

    t = time.perf_counter()
    written = hours_roll(start, now)
    backfill_s = time.perf_counter() - t
    t = time.perf_counter()
    recent_roll(hours=3)
    recent_s = time.perf_counter() - t
    print(f"backfill: {written} hours in {backfill_s:.1f} s; a 5-minute run (3 hours): {recent_s:.2f} s", flush=True)
    rolled: dict[str, float] = {}
    for name, url in urls.items():
        rolled[name], _ = timed(get(url), args.repeat)
        print(f"rolled {name}: {rolled[name]:.3f} s", flush=True)
    rolled_summary = selectors.summary(start=start, end=now)
    if args.profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.runcall(selectors.summary, start=start, end=now)
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)
    strip = ("source", "budgets")
    assert {k: v for k, v in raw_summary.items() if k not in strip} == {
        k: v for k, v in rolled_summary.items() if k not in strip
    }, "the rolled-up summary differs from the raw one"
    assert rolled_summary["source"]["rolled_hours"] == hours - 1 + (start == floor_to(start, HOUR))

    print()
    print(
        f"**{counts['ledger rows']:,} ledger rows**, {counts['messages']:,} messages over {args.days} days, "
        f"{connection.vendor}; window: the {hours} hours up to the last row; median of {args.repeat} warm calls "
        f"({raw_repeat} from raw rows), seconds of server time:"
    )
    print()
    print("| view | from raw rows | from rollups | raw / rollups |")
    print("|---|---:|---:|---:|")
    for name in urls:
        if name in raw:
            print(f"| {name} | {raw[name]:.3f} | {rolled[name]:.3f} | {raw[name] / rolled[name]:.0f}x |")
        else:
            print(f"| {name} | not timed | {rolled[name]:.3f} | — |")
    if legacy_s is not None:
        print(f"| summary as computed before the rollups ({args.legacy_rev}) | {legacy_s:.3f} | — | — |")
    print()
    print(
        f"Load {load_s:.0f} s; backfill of {written} hours {backfill_s:.1f} s; one 5-minute beat run "
        f"(3 hours) {recent_s:.2f} s. Raw and rolled summaries agree field by field."
    )
    o = rolled_summary["outcomes"]
    print(
        f"Outcomes compared: {o['conversations']:,} conversations, {o['open']:,} open, "
        f"{o['resolved_confirmed']:,} confirmed and {o['resolved_assumed']:,} assumed resolutions, "
        f"{o['unresolved']:,} unresolved ({', '.join(f'{k} {v:,}' for k, v in o['unresolved_by_reason'].items())}); "
        f"{o['csat']['responses']:,} CSAT scores."
    )


if __name__ == "__main__":
    main()
