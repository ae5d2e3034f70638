"""Staff search over a million messages on PostgreSQL (issue 31, item 3; docs/search.md).

Set-up (private to the run, dropped afterwards): a fresh PostgreSQL database on
``TEST_DATABASE_URL``'s server, migrated, then filled with ``COPY``: ``--conversations`` (100,000)
conversations of ``--per`` (10) messages each (1,000,000), shopper and bot turns alternating, 60%
of conversations in English and 40% in Chinese, over the last 30 days; the words drawn from a
Zipf-like law over a store's vocabulary (English words and 2-4-character Chinese words) plus a
long tail of rare made-up words; 10% of messages name an order number (``KF-`` + 6 digits), 3% of
shopper messages an e-mail address, and 20% of conversations carry a left e-mail, 25% a verified
customer (id and e-mail). Each message's ``search_terms`` is computed with the same function as
the write path (lib.search_terms.index_terms); the GIN index is built after the load (as the
migration does after its fill). Seeded (``--seed``): two runs write the same rows.

Then ``chat.search.search`` (the view's whole work but the HTTP layer: the search, the snippets,
the log row) in this process for five kinds of query, ``--each`` (20) of each:

- ``rare``: made-up words found in a handful of messages;
- ``common``: English words in at least 1% of the messages (their share is printed);
- ``zh``: Chinese words of 2, 3 and 4 characters (common and rare);
- ``email``: addresses left in the widget, given by a verified identity or written in a message;
- ``order``: order numbers named in messages, typed as ``KF-123456`` or ``#123456``.

At concurrency 1 (every query ``--repeat`` (3) times after one warm-up round) and at 8 (8
threads, each its own database connection, each running the whole list ``--repeat`` times in its
own order); p50 / p95 / max per kind and overall (``all``: the searches), in ms. Beside them,
interleaved, ``floor``: a round trip and the log row's INSERT, what every search pays besides
its own work (on a busy machine, most of it).

    .venv/bin/python bench/search.py                       # 1,000,000 messages, ~10 min
    .venv/bin/python bench/search.py --conversations 10000 # a quick look
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import threading
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

EN_WORDS = [
    "order",
    "refund",
    "parcel",
    "delivery",
    "shipping",
    "return",
    "size",
    "colour",
    "color",
    "price",
    "discount",
    "coupon",
    "payment",
    "card",
    "account",
    "address",
    "change",
    "cancel",
    "track",
    "tracking",
    "package",
    "arrived",
    "late",
    "damaged",
    "broken",
    "wrong",
    "item",
    "shoes",
    "shirt",
    "dress",
    "jacket",
    "jeans",
    "bag",
    "watch",
    "phone",
    "charger",
    "cable",
    "box",
    "gift",
    "invoice",
    "receipt",
    "exchange",
    "stock",
    "available",
    "when",
    "where",
    "how",
    "much",
    "long",
    "days",
    "week",
    "today",
    "tomorrow",
    "please",
    "thanks",
    "hello",
    "help",
    "need",
    "want",
    "would",
    "like",
    "could",
    "you",
    "can",
    "my",
    "the",
    "a",
    "is",
    "it",
    "to",
    "of",
    "and",
    "for",
    "with",
    "not",
    "yet",
    "still",
    "again",
    "already",
    "paid",
    "charged",
    "twice",
    "email",
    "number",
    "code",
    "promo",
    "sale",
    "black",
    "white",
    "blue",
    "red",
    "green",
    "small",
    "medium",
    "large",
    "customer",
    "service",
    "agent",
    "person",
    "express",
    "standard",
    "free",
    "international",
    "customs",
    "fee",
    "tax",
    "warranty",
    "repair",
    "quality",
    "material",
    "cotton",
    "leather",
    "wool",
]
ZH_WORDS = [
    "订单",
    "退货",
    "退款",
    "快递",
    "物流",
    "发货",
    "收到",
    "尺码",
    "颜色",
    "价格",
    "优惠",
    "优惠券",
    "付款",
    "账号",
    "地址",
    "修改",
    "取消",
    "查询",
    "到货",
    "破损",
    "错发",
    "鞋子",
    "衬衫",
    "裙子",
    "外套",
    "牛仔裤",
    "包包",
    "手表",
    "手机",
    "充电器",
    "礼物",
    "发票",
    "换货",
    "库存",
    "什么时候",
    "多久",
    "今天",
    "明天",
    "谢谢",
    "你好",
    "请问",
    "可以",
    "需要",
    "客服",
    "人工",
    "质量",
    "质量问题",
    "材质",
    "棉质",
    "真皮",
    "羊毛",
    "保修",
    "维修",
    "包装",
    "包邮",
    "国际",
    "关税",
    "运费",
    "加急",
    "标准",
    "免费",
    "会员",
    "积分",
    "活动",
    "促销",
    "黑色",
    "白色",
    "蓝色",
    "红色",
    "小号",
    "中号",
    "大号",
    "没有",
    "已经",
    "还是",
    "再次",
    "重复扣款",
    "支付宝",
    "微信支付",
    "银行卡",
    "退换货政策",
]
RARE_PARTS = "zor vel qua mip tex bri lun dax fen gro pim wes"


def zipf_weights(n: int, s: float = 1.0) -> list[float]:
    return [1 / (i + 1) ** s for i in range(n)]


def rare_words(rng: random.Random, n: int) -> list[str]:
    parts = RARE_PARTS.split()
    out: set[str] = set()
    while len(out) < n:
        out.add("".join(rng.choice(parts) for _ in range(3)) + rng.choice("aeiouy"))
    return sorted(out)


class _NoCopy:
    """A COPY that writes nothing (``--db``: the rows are already there)."""

    def __enter__(self) -> _NoCopy:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def write_row(self, row: Any) -> None:
        return None


def generate(args: argparse.Namespace, now: datetime, *, write: bool = True) -> dict[str, Any]:
    """COPY the conversations and messages; returns what the queries are drawn from."""
    from django.db import connection, transaction

    from chat.models import Conversation, Message
    from lib.search_terms import index_terms

    rng = random.Random(args.seed)
    rare = rare_words(rng, 4000)
    en_w, zh_w = zipf_weights(len(EN_WORDS), 0.9), zipf_weights(len(ZH_WORDS), 0.9)
    span_s = 30 * 86400
    conv_cols = [
        "id",
        "token_hash",
        "status",
        "locale",
        "last_seq",
        "contact_email",
        "customer_id",
        "customer_email",
        "created_at",
        "updated_at",
    ]
    msg_cols = ["conversation_id", "seq", "role", "text", "search_terms", "created_at"]
    c_table, m_table = Conversation._meta.db_table, Message._meta.db_table
    # The other columns take their database defaults: set them for the COPY (Django keeps defaults in Python).
    extra_conv = {
        "answered_seq": 0,
        "owner_epoch": 0,
        "agent_name": "",
        "handoff_reason": "",
        "handoff_packet": "{}",
        "summary": "",
        "summary_upto_seq": 0,
        "session_from_seq": 0,
        "csat_comment": "",
        "customer_name": "",
        "address_key": "",
    }
    extra_msg = {
        "state": "done",
        "route": "",
        "model": "",
        "variant": "",
        "prompt_tokens": 0,
        "completion_tokens": 0,
        "cost_usd": 0,
        "saved_usd": 0,
        "usage_estimated": False,
        "cut": False,
        "superseded": False,
        "route_reason": "",
        "rating": "",
        "flags": "[]",
        "agent_name": "",
    }
    emails: list[str] = []
    orders: list[str] = []
    word_counts: dict[str, int] = {}
    rare_counts: dict[str, int] = {}
    messages = 0
    conversations: list[list[Any]] = []
    # One transaction: the messages' foreign keys are checked at its end (Django's are deferred),
    # after the conversations' COPY (one COPY at a time on a connection).
    with transaction.atomic(), connection.cursor() as cursor:
        raw = cursor.cursor

        def copy(table: str, cols: list[str]) -> Any:
            return raw.copy(f"COPY {table} ({', '.join(cols)}) FROM STDIN") if write else _NoCopy()

        if write:
            cursor.execute("DROP INDEX IF EXISTS chat_message_search_terms")
        with copy(m_table, msg_cols + list(extra_msg)) as cmsg:
            for i in range(args.conversations):
                cid = uuid.UUID(int=rng.getrandbits(128), version=4)
                start = now - timedelta(seconds=span_s * (1 - i / args.conversations))
                zh = rng.random() < 0.4
                status = rng.choices(["closed", "bot", "waiting_agent", "agent"], [70, 20, 5, 5])[0]
                contact = f"shopper{i}@mail{i % 97}.example" if rng.random() < 0.2 else ""
                customer = f"cus_{i:07d}" if rng.random() < 0.25 else ""
                cemail = f"c{i}@store{i % 13}.example" if customer else ""
                for e in (contact, cemail):
                    if e and len(emails) < 5000:
                        emails.append(e)
                last = start
                for seq in range(1, args.per + 1):
                    role = "shopper" if seq % 2 else "bot"
                    n = rng.randint(6, 18)
                    if zh:
                        words = rng.choices(ZH_WORDS, zh_w, k=n)
                        text = "".join(words) + "。"
                    else:
                        words = rng.choices(EN_WORDS, en_w, k=n)
                        text = " ".join(words).capitalize() + "."
                    if rng.random() < 0.004:
                        w = rng.choice(rare)
                        rare_counts[w] = rare_counts.get(w, 0) + 1
                        text += " " + w
                    if rng.random() < 0.10:
                        number = f"KF-{rng.randint(100000, 999999)}"
                        orders.append(number) if len(orders) < 5000 else None
                        text += f" 订单号 {number}" if zh else f" order {number}"
                    if role == "shopper" and rng.random() < 0.03:
                        e = f"buyer{i}.{seq}@example.com"
                        emails.append(e) if len(emails) < 10000 else None
                        text += f" {e}"
                    for w in set(words):
                        word_counts[w] = word_counts.get(w, 0) + 1
                    last = start + timedelta(seconds=seq * 40)
                    cmsg.write_row([cid, seq, role, text, index_terms(text), last, *extra_msg.values()])
                    messages += 1
                conversations.append(
                    [cid, "0" * 64, status, "zh" if zh else "en", args.per, contact, customer, cemail, start, last]
                    + list(extra_conv.values())
                )
        with copy(c_table, conv_cols + list(extra_conv)) as cconv:
            for row in conversations:
                cconv.write_row(row)
    return {
        "rare": rare_counts,
        "words": word_counts,
        "emails": emails,
        "orders": orders,
        "messages": messages,
    }


def pick(data: dict[str, Any], rng: random.Random, each: int) -> dict[str, list[str]]:
    """The queries of each kind (see the module docstring)."""
    total = data["messages"]
    rare = sorted(w for w, n in data["rare"].items() if n <= 5)
    common = [w for w in EN_WORDS if data["words"].get(w, 0) >= 0.01 * total and len(w) > 2]
    zh2 = [w for w in ZH_WORDS if len(w) == 2]
    zh34 = [w for w in ZH_WORDS if len(w) >= 3]
    orders = rng.sample(data["orders"], each)
    return {
        "rare": rng.sample(rare, min(each, len(rare))),
        "common": rng.sample(common, min(each, len(common))),
        "zh": rng.sample(zh2, each // 2) + rng.sample(zh34, each - each // 2),
        "email": rng.sample(data["emails"], each),
        "order": [o if k % 2 else "#" + o[3:] for k, o in enumerate(orders)],
    }


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


def run(args: argparse.Namespace) -> None:
    import django

    django.setup()
    from django.contrib.auth.models import Permission, User
    from django.core.management import call_command
    from django.db import connection, connections
    from django.utils import timezone

    from chat.search import index_ensure, search

    call_command("migrate", verbosity=0)
    agent, _ = User.objects.get_or_create(username="bench-agent", defaults={"is_staff": True})
    agent.user_permissions.add(Permission.objects.get(codename="handle_conversations"))
    t = time.perf_counter()
    # With --db the rows are there: generated again without writing (the same seed gives the
    # same rows, so the same queries).
    data = generate(args, timezone.now(), write=not args.db)
    load_s = time.perf_counter() - t
    t = time.perf_counter()
    index_ensure(connection)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    index_s = time.perf_counter() - t
    print(
        f"loaded {args.conversations:,} conversations, {data['messages']:,} messages in {load_s:.0f} s; "
        f"GIN index + ANALYZE {index_s:.0f} s"
    )
    queries = pick(data, random.Random(args.seed + 1), args.each)
    share = {w: data["words"].get(w, 0) / data["messages"] for w in queries["common"]}
    print("common words, share of messages: " + ", ".join(f"{w} {s:.1%}" for w, s in sorted(share.items())))
    found: dict[str, list[int]] = {}
    for kind, qs in queries.items():  # warm-up round; also what each query finds
        found[kind] = [len(search(text=q, agent=agent)) for q in qs]
    for kind, counts in found.items():
        zero = sum(1 for c in counts if c == 0)
        print(f"{kind:7} results per query: median {statistics.median(counts):g}, max {max(counts)}, none {zero}")

    if args.explain:
        from chat.search import SLICES, find_sql
        from lib.search_terms import query_terms

        for kind, qs in queries.items():
            sql, params = find_sql(query_terms(qs[0]), newest=SLICES[0])
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
                print(f"--- {kind}: {qs[0]}\n" + "\n".join(r[0] for r in cursor.fetchall()))

    # The floor, interleaved with the searches: what any request of the view costs here besides
    # the search itself (one round trip and the log row's INSERT and commit). On a busy shared
    # machine most of a search's time is this.
    from chat.models import SearchLog

    def floor() -> None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        SearchLog.objects.create(agent=agent, query="floor", results=0, took_ms=0)

    flat = [(kind, q) for kind, qs in queries.items() for q in qs] + [("floor", "")] * args.each
    rows: list[tuple[str, int, dict[str, list[float]]]] = []
    for concurrency in (1, 8):
        times: dict[str, list[float]] = {k: [] for k in [*queries, "floor"]}
        lock = threading.Lock()

        def worker(n: int) -> None:
            order = flat * args.repeat
            random.Random(n).shuffle(order)
            try:
                for kind, q in order:
                    t0 = time.perf_counter()
                    floor() if kind == "floor" else search(text=q, agent=agent)
                    ms = (time.perf_counter() - t0) * 1000
                    with lock:
                        times[kind].append(ms)
            finally:
                connections.close_all()

        threads = [threading.Thread(target=worker, args=(n,)) for n in range(concurrency)]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        wall = time.perf_counter() - t
        n = sum(len(v) for v in times.values())
        print(f"concurrency {concurrency}: {n} searches in {wall:.1f} s ({n / wall:.0f}/s)")
        rows.append(("", concurrency, times))

    print()
    print("| kind | concurrency | searches | p50 ms | p95 ms | max ms |")
    print("|---|---|---|---|---|---|")
    for _, concurrency, times in rows:
        for kind in [*queries, "all", "floor"]:
            v = [x for k, vs in times.items() if k != "floor" for x in vs] if kind == "all" else times[kind]
            print(f"| {kind} | {concurrency} | {len(v)} | {pct(v, 50):.1f} | {pct(v, 95):.1f} | {max(v):.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=100_000)
    parser.add_argument("--per", type=int, default=10, help="messages per conversation (default 10)")
    parser.add_argument("--each", type=int, default=20, help="queries of each kind (default 20)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--seed", type=int, default=31)
    parser.add_argument("--db", default="", help="search this database, loaded by an earlier run with --keep")
    parser.add_argument("--keep", action="store_true", help="keep the database (its name is printed)")
    parser.add_argument("--explain", action="store_true", help="print the plan of one query of each kind")
    args = parser.parse_args()

    for var in ("REDIS_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL"):
        os.environ.pop(var, None)
    import psycopg

    admin = os.environ.get("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    pg_name = args.db or f"kefu_search_bench_{uuid.uuid4().hex[:8]}"
    if not args.db:
        with psycopg.connect(admin, autocommit=True) as db:
            db.execute(f'CREATE DATABASE "{pg_name}"')
    os.environ["DATABASE_URL"] = urlsplit(admin)._replace(path="/" + pg_name).geturl()
    os.environ["DJANGO_SETTINGS_MODULE"] = "config.settings"
    os.environ.setdefault("ALLOWED_HOSTS", "testserver,127.0.0.1,localhost")
    try:
        run(args)
    finally:
        from django.db import connections

        connections.close_all()
        if args.keep:
            print(f"kept: --db {pg_name}")
        else:
            with psycopg.connect(admin, autocommit=True) as db:
                db.execute(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')


if __name__ == "__main__":
    main()
