"""Load: shoppers in a closed loop over real sockets against one or more kefu workers on Redis +
PostgreSQL, and what each answer costs the server.

Set-up (private to the run, removed afterwards): a ``redis-server`` on its own port, a fresh
PostgreSQL database on ``TEST_DATABASE_URL``'s server, the Bitext FAQ seed from the team's shared
data (``--data``, default ``../shared/data`` beside the checkout) imported with ``import_faq``,
``--workers`` Daphne processes, and the project's OpenAI-compatible test server as the remote
model (``--ttft-ms`` 300 to the first token, ``--token-ms`` 20 a chunk). The per-address limits
are raised for the run.

Traffic: a fixed pool of about 600 questions drawn once (seeded): 400 Bitext shopper messages,
100 CLINC150 out-of-scope questions and 100 product questions for the model. Each shopper holds
one socket to a worker (round robin), asks ``--turns`` (5) questions drawn at random from the pool
one after the other (no think time unless ``--think-ms``), then starts a new conversation; most
questions are repeats after the warm-up, as in a store's traffic. ``--mix`` keeps only one kind
(``faq``: Bitext, ``oos``, ``remote``: product questions for the model, ``product``: questions
about the demo catalog's products, answered from the catalog) to read the cost of one route;
``--mixes faq,product`` runs several one after the other. ``--catalog`` loads a catalog
(``import_products``; ``--mix product`` loads the demo catalog ``store/demo/products.jsonl``).

``--embedded``: the embedded defaults instead (a SQLite file, no Redis: in-process channel layer,
cache and exact store, eager Celery), as ``make run`` without ``DATABASE_URL`` and ``REDIS_URL``.
``--baseline REV``: each run is made twice, side by side, on the revision ``REV`` (exported
with ``git archive``, sharing this checkout's virtual environment) and on this checkout, one
after the other, and a table of ratios against the baseline is printed at the end.

Measured over the ``--seconds`` after ``--warmup`` seconds: answers a second; server CPU per
answer (user + system time of the worker processes from /proc, ms, over answers in the window);
first delta and end p50 / p95 / p99 by route (from sending the ``message`` frame; the route of
its ``stream.end``); frames a second received by the shoppers; and at the end, from the
database, messages lost (a sent ``client_id`` not stored) and duplicated (a question with two
whole bot answers). ``--idle N`` instead opens N idle sockets (``hello`` only) and reports the
workers' memory (RSS) and CPU per socket over ``--seconds``.

    .venv/bin/python bench/load.py --shoppers 8
    .venv/bin/python bench/load.py --shoppers 64 --workers 2
    .venv/bin/python bench/load.py --shoppers 8 --mix faq
    .venv/bin/python bench/load.py --idle 2000
    .venv/bin/python bench/load.py --embedded --mixes all,faq,product --baseline HEAD~1

Percentiles are numpy's (linear interpolation). The shoppers, the test upstream and the workers
share the machine's cores: read the figures as ratios between runs side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import csv
import json
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import psycopg
import websockets

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
from fake_openai import Behaviour, FakeOpenAI  # noqa: E402
from soak import PRODUCT_QUESTIONS, SERVERS, Worker, free_port  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")
PRODUCTS = ["walnut floor lamp", "oak side table", "linen sofa cover", "brass desk lamp", "marble coffee table",
            "wool throw", "ceramic vase", "rattan armchair", "velvet cushion", "pine bookshelf"]  # fmt: skip
ASKS = ["Does the {p} come in other colours?", "How heavy is the {p}?", "Is the {p} easy to assemble?",
        "What are the dimensions of the {p}?", "Can the {p} be used outdoors?", "How do I clean the {p}?",
        "Is the {p} in stock in large?", "What is the {p} made of?", "Does the {p} have a warranty?",
        "Can I get the {p} delivered next week?"]  # fmt: skip


DEMO_CATALOG = ROOT / "store" / "demo" / "products.jsonl"
MIXES = ["all", "faq", "oos", "remote", "product"]


def catalog_questions(catalog: Path) -> list[str]:
    """The questions of ``bench/products_eval.py``'s demo set that name one product of the demo
    catalog and ask its price, stock, options or an attribute (English and Chinese): the ones the
    ``product`` route answers, without "which one?" and questions about no product."""
    from products_eval import demo_questions, load_catalog

    return [q["text"] for q in demo_questions(load_catalog(catalog)) if q["expect"]["kind"] not in ("which", "none")]


def question_pool(data: Path, seed: int) -> dict[str, list[str]]:
    """The fixed pool: ``{"faq": 400 Bitext messages, "oos": 100 CLINC150, "remote": 100 product
    questions for the model, "product": 100 questions about the demo catalog}``."""
    rng = random.Random(seed)
    with (data / "bitext" / "bitext_customer_support_public.csv").open(encoding="utf-8") as f:
        bitext = sorted({row["instruction"].strip() for row in csv.DictReader(f) if row["instruction"].strip()})
    clinc = json.loads((data / "clinc150" / "data_full_public.json").read_text(encoding="utf-8"))
    oos = sorted({text for text, _ in clinc["oos_val"] + clinc["oos_train"]})
    remote = sorted({a.format(p=p) for p in PRODUCTS for a in ASKS} | set(PRODUCT_QUESTIONS))
    pool = {"faq": rng.sample(bitext, 400), "oos": rng.sample(oos, 100), "remote": rng.sample(remote, 100)}
    pool["product"] = rng.sample(catalog_questions(DEMO_CATALOG), 100)
    return pool


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` (/proc/PID/stat fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def process_tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (a server's supervisor and its worker processes)."""
    children: dict[int, list[int]] = defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children[int(fields[1])].append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo.extend(children.get(p, []))
    return tree


def rss_bytes(pid: int) -> int:
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


@dataclass
class Stats:
    measuring: bool = False
    answers: int = 0
    frames: int = 0
    first: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    end: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    sent: list[tuple[str, str]] = field(default_factory=list)  # (conversation, client_id)
    errors: int = 0
    # what each error was: an error frame's code, or the exception's type (a socket that failed)
    error_kinds: dict[str, int] = field(default_factory=lambda: defaultdict(int))


class Shopper:
    def __init__(self, url: str, origin: str, pool: list[str], stats: Stats, args: argparse.Namespace) -> None:
        self.url, self.origin, self.pool, self.stats, self.args = url, origin, pool, stats, args
        self.rng = random.Random()

    async def conversation(self) -> None:
        async with websockets.connect(self.url, origin=self.origin, max_size=2**22) as ws:
            await ws.send(json.dumps({"type": "hello"}))
            conv = json.loads(await ws.recv())["id"]
            for _ in range(self.args.turns):
                await self.ask(ws, conv, self.rng.choice(self.pool))
                if self.args.think_ms:
                    await asyncio.sleep(self.rng.uniform(0.5, 1.5) * self.args.think_ms / 1000)

    async def ask(self, ws: websockets.ClientConnection, conv: str, text: str) -> None:
        client_id = uuid.uuid4().hex
        sent = time.perf_counter()
        await ws.send(json.dumps({"type": "message", "client_id": client_id, "text": text}))
        self.stats.sent.append((conv, client_id))
        first: float | None = None
        acked = False
        while True:
            f = json.loads(await asyncio.wait_for(ws.recv(), 60))
            if self.stats.measuring:
                self.stats.frames += 1
            kind = f.get("type")
            if kind == "message" and f.get("client_id") == client_id:
                acked = True
            elif kind == "stream.delta" and acked and first is None:
                first = (time.perf_counter() - sent) * 1000
            elif kind == "stream.end" and acked and not f.get("superseded"):
                done = (time.perf_counter() - sent) * 1000
                if self.stats.measuring:
                    route = f.get("route") or "?"
                    self.stats.answers += 1
                    self.stats.first[route].append(first if first is not None else done)
                    self.stats.end[route].append(done)
                return
            elif kind == "error" and f.get("client_id") == client_id:
                self.stats.errors += 1
                self.stats.error_kinds[f"frame {f.get('code')}"] += 1
                return

    async def run(self, stop_at: float) -> None:
        while time.monotonic() < stop_at:
            try:
                await self.conversation()
            except (OSError, TimeoutError, websockets.WebSocketException) as e:
                self.stats.errors += 1
                self.stats.error_kinds[type(e).__name__] += 1
                await asyncio.sleep(0.5)


class Load:
    def __init__(self, args: argparse.Namespace, root: Path = ROOT) -> None:
        self.args, self.root = args, root
        self.tmp = Path(tempfile.mkdtemp(prefix="kefu-load-"))
        self.redis_port = free_port()
        pg = os.environ.get("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
        self.pg_admin = pg
        self.db_name = f"kefu_load_{uuid.uuid4().hex[:8]}"
        self.pg = urlsplit(pg)._replace(path="/" + self.db_name).geturl()
        self.upstream = FakeOpenAI.start(default=Behaviour(ttft_ms=args.ttft_ms, token_ms=args.token_ms))
        self.env = {
            **{k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
            "DATABASE_URL": self.pg,
            "REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0",
            "OPENAI_API_KEY": "load-key",
            "OPENAI_BASE_URL": self.upstream.base_url,
            "KEFU_MESSAGES_PER_MINUTE_PER_IP": "100000000",
            "KEFU_MAX_SOCKETS_PER_IP": "1000000",
            "PYTHONUNBUFFERED": "1",
        }
        if args.embedded:  # a SQLite file of the run's own, no Redis
            self.env.pop("REDIS_URL")
            self.env["DATABASE_URL"] = f"sqlite:///{self.tmp / 'db.sqlite3'}"
        self.redis: subprocess.Popen[bytes] | None = None
        extra = (
            ["--ping-interval", str(args.ws_ping_interval)] if args.ws_ping_interval and args.server == "daphne" else []
        )
        self.workers = [
            Worker(self.env, self.tmp / f"worker-{i}.log", args.server, extra, root) for i in range(args.workers)
        ]

    def manage(self, *args: str) -> None:
        done = subprocess.run(
            [str(ROOT / ".venv/bin/python"), "manage.py", *args],
            cwd=self.root, env=self.env, capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {args[0]}: {(done.stdout + done.stderr)[-800:]}")

    def setup(self) -> None:
        if not self.args.embedded:
            with psycopg.connect(self.pg_admin, autocommit=True) as db:
                db.execute(f'CREATE DATABASE "{self.db_name}"')
            self.redis = subprocess.Popen(
                ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                cwd=self.tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        self.manage("migrate", "--noinput")
        self.manage("import_faq", str(self.args.data / "bitext" / "faq_seed.jsonl"))
        if self.args.catalog:
            self.manage("import_products", str(self.args.catalog))
        for w in self.workers:
            w.start()
        for w in self.workers:
            w.wait_healthy()

    def teardown(self) -> None:
        for w in self.workers:
            w.signal(signal.SIGKILL)
            w.wait_exit(10)
        if self.redis is not None:
            self.redis.kill()
        self.upstream.stop()
        if not self.args.embedded:
            with psycopg.connect(self.pg_admin, autocommit=True) as db:
                db.execute(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
        shutil.rmtree(self.tmp, ignore_errors=True)

    def pids(self) -> list[int]:
        """The server processes: each worker's process and its descendants."""
        return [p for w in self.workers if w.proc is not None for p in process_tree(w.proc.pid)]

    async def chat(self) -> dict[str, object]:
        args = self.args
        pools = question_pool(args.data, args.seed)
        pool = pools[args.mix] if args.mix != "all" else pools["faq"] + pools["oos"] + pools["remote"]
        stats = Stats()
        stop_at = time.monotonic() + args.warmup + args.seconds
        shoppers = [
            Shopper(self.workers[i % len(self.workers)].ws, self.workers[0].base, pool, stats, args)
            for i in range(args.shoppers)
        ]
        tasks = [asyncio.create_task(s.run(stop_at)) for s in shoppers]
        await asyncio.sleep(args.warmup)
        cpu0 = sum(cpu_s(p) for p in self.pids())
        stats.measuring, started = True, time.monotonic()
        await asyncio.sleep(args.seconds)
        stats.measuring = False
        elapsed = time.monotonic() - started
        cpu = sum(cpu_s(p) for p in self.pids()) - cpu0
        await asyncio.gather(*tasks, return_exceptions=True)
        lost, duplicated = await asyncio.to_thread(self.check, stats.sent)
        routes = sorted(stats.first, key=lambda r: -len(stats.first[r]))
        return {
            "shoppers": args.shoppers,
            "workers": args.workers,
            "server": args.server,
            "mix": args.mix,
            "answers_per_s": stats.answers / elapsed,
            "cpu_ms_per_answer": cpu * 1000 / max(1, stats.answers),
            "server_cores": cpu / elapsed,
            "frames_per_s": stats.frames / elapsed,
            "answers": stats.answers,
            "errors": stats.errors,
            "error_kinds": dict(stats.error_kinds),
            "lost": lost,
            "duplicated": duplicated,
            "routes": {
                r: {
                    "n": len(stats.first[r]),
                    "first_p50": pct(stats.first[r], 50),
                    "first_p95": pct(stats.first[r], 95),
                    "first_p99": pct(stats.first[r], 99),
                    "end_p99": pct(stats.end[r], 99),
                }
                for r in routes
            },
        }

    def check(self, sent: list[tuple[str, str]]) -> tuple[int, int]:
        """Sent client_ids not stored, and questions with more than one whole bot answer."""
        stored_sql = "SELECT conversation_id, client_id FROM chat_message WHERE role = 'shopper'"
        duplicated_sql = (
            "SELECT count(*) FROM (SELECT conversation_id, reply_to_seq FROM chat_message WHERE role = 'bot'"
            " AND NOT cut AND state = 'done' GROUP BY 1, 2 HAVING count(*) > 1) d"
        )
        if self.args.embedded:
            with sqlite3.connect(self.tmp / "db.sqlite3", timeout=30) as lite:
                # Django stores a UUID in SQLite as 32 hex digits without hyphens.
                stored = {(str(uuid.UUID(c)), cid) for c, cid in lite.execute(stored_sql)}
                duplicated = lite.execute(duplicated_sql).fetchone()
            return sum(1 for s in sent if s not in stored), int(duplicated[0] if duplicated else 0)
        with psycopg.connect(self.pg) as db:
            stored = {(str(c), cid) for c, cid in db.execute(stored_sql)}
            duplicated = db.execute(duplicated_sql).fetchone()
        return sum(1 for s in sent if s not in stored), int(duplicated[0] if duplicated else 0)

    async def idle(self) -> dict[str, object]:
        args = self.args
        pids = self.pids()
        rss0 = sum(rss_bytes(p) for p in pids)
        sockets = []
        for i in range(args.idle):
            w = self.workers[i % len(self.workers)]
            # A browser sends no pings of its own (the server's pings keep the socket alive);
            # --client-pings makes the generator ping every 20 s, as the websockets library does.
            ws = await websockets.connect(w.ws, origin=w.base, ping_interval=20 if args.client_pings else None)
            await ws.send(json.dumps({"type": "hello"}))
            await ws.recv()
            sockets.append(ws)
        await asyncio.sleep(5)
        rss1 = sum(rss_bytes(p) for p in pids)
        cpu0 = sum(cpu_s(p) for p in pids)
        await asyncio.sleep(args.seconds)
        cpu = sum(cpu_s(p) for p in pids) - cpu0
        for ws in sockets:
            await ws.close()
        return {
            "idle_sockets": args.idle,
            "workers": args.workers,
            "server": args.server,
            "client_pings": args.client_pings,
            "ws_ping_interval": args.ws_ping_interval or 20,
            "kb_per_socket": (rss1 - rss0) / 1024 / args.idle,
            "core_share": cpu / args.seconds,
        }


def print_chat(r: dict[str, object]) -> None:
    print(
        f"{r['shoppers']} shoppers, {r['workers']} {r['server']} worker(s), mix {r['mix']}: {r['answers_per_s']:.1f} answers/s, "
        f"{r['cpu_ms_per_answer']:.1f} ms server CPU per answer ({r['server_cores']:.2f} cores), "
        f"{r['frames_per_s']:.0f} frames/s, errors {r['errors']}, lost {r['lost']}, duplicated {r['duplicated']}"
    )
    if r.get("error_kinds"):
        print(f"errors by kind (warm-up included): {r['error_kinds']}")
    print("| route | answers | first delta p50 / p95 / p99 | end p99 |")
    print("|---|---:|---:|---:|")
    for route, v in r["routes"].items():  # type: ignore[attr-defined]
        print(
            f"| `{route}` | {v['n']} | {v['first_p50']:.0f} / {v['first_p95']:.0f} / {v['first_p99']:.0f} ms "
            f"| {v['end_p99']:.0f} ms |"
        )


def export_revision(rev: str, into: Path) -> Path:
    """Revision ``rev`` of this repository as a plain tree under ``into`` (``git archive``), with
    this checkout's virtual environment linked in; returns its root."""
    tree = into / "baseline"
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", rev], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    (tree / ".venv").symlink_to((ROOT / ".venv").resolve())
    return tree


def ratio(after: float | None, before: float | None) -> str:
    return f"{after / before:.2f}×" if after is not None and before else "–"


def print_side_by_side(rows: list[tuple[str, str, dict[str, object]]]) -> None:
    """One line per run, with ratios of CPU per answer and answers/s against the baseline run of
    the same mix just before it (``--mixes`` may name a mix twice: each pair is side by side)."""
    base: dict[str, dict[str, object]] = {}
    print("| mix | build | answers/s | server CPU per answer | routes (share of answers) | FAQ first delta p50 / p99 |")
    print("|---|---|---:|---:|---|---:|")
    for mix, build, r in rows:
        if build == "baseline":  # the baseline run just before this checkout's run of the same mix
            base[mix] = r
        routes: dict[str, dict[str, float]] = r["routes"]  # type: ignore[assignment]
        total = sum(v["n"] for v in routes.values()) or 1
        shares = ", ".join(f"`{k}` {v['n'] * 100 / total:.0f}%" for k, v in routes.items())
        faq = routes.get("faq")
        lat = f"{faq['first_p50']:.0f} / {faq['first_p99']:.0f} ms" if faq else ""
        b = base.get(mix)
        cpu, aps = float(r["cpu_ms_per_answer"]), float(r["answers_per_s"])  # type: ignore[arg-type]
        cpu_ratio = f" ({ratio(cpu, float(b['cpu_ms_per_answer']))})" if b is not None and b is not r else ""  # type: ignore[arg-type]
        aps_ratio = f" ({ratio(aps, float(b['answers_per_s']))})" if b is not None and b is not r else ""  # type: ignore[arg-type]
        print(f"| {mix} | {build} | {aps:.1f}{aps_ratio} | {cpu:.2f} ms{cpu_ratio} | {shares} | {lat} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shoppers", type=int, default=8)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=30.0, help="measured window")
    parser.add_argument("--warmup", type=float, default=15.0)
    parser.add_argument("--turns", type=int, default=5, help="questions per conversation")
    parser.add_argument("--think-ms", type=float, default=0.0)
    parser.add_argument("--mix", choices=MIXES, default="all")
    parser.add_argument("--mixes", default="", help="several mixes, one run each (comma-separated; overrides --mix)")
    parser.add_argument("--catalog", type=Path, default=None, help="a product catalog to import (JSONL or CSV)")
    parser.add_argument("--embedded", action="store_true", help="SQLite and no Redis (the embedded defaults)")
    parser.add_argument("--baseline", default="", help="a git revision to run side by side with this checkout")
    parser.add_argument("--ttft-ms", type=float, default=300.0)
    parser.add_argument("--token-ms", type=float, default=20.0)
    parser.add_argument("--server", choices=sorted(SERVERS), default="daphne", help="the ASGI server of each worker")
    parser.add_argument("--idle", type=int, default=0, help="open this many idle sockets instead of chatting")
    parser.add_argument("--client-pings", action="store_true", help="idle sockets ping the server every 20 s")
    parser.add_argument("--ws-ping-interval", type=int, default=0, help="Daphne's --ping-interval (s; 0: its 20)")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--json", action="store_true", help="print the result as JSON too")
    args = parser.parse_args(argv)
    mixes = [m.strip() for m in args.mixes.split(",") if m.strip()] or [args.mix]
    for m in mixes:
        if m not in MIXES:
            parser.error(f"unknown mix {m!r} (one of {', '.join(MIXES)})")
    if args.idle:
        mixes = mixes[:1]
    work = Path(tempfile.mkdtemp(prefix="kefu-load-trees-"))
    builds = [("this", ROOT)]
    rows: list[tuple[str, str, dict[str, object]]] = []
    status = 0
    try:
        if args.baseline:
            builds.insert(0, ("baseline", export_revision(args.baseline, work)))
        for mix in mixes:
            for build, root in builds:
                run_args = copy.copy(args)
                run_args.mix = mix
                if mix == "product" and run_args.catalog is None:
                    run_args.catalog = DEMO_CATALOG
                load = Load(run_args, root)
                try:
                    load.setup()
                    result = asyncio.run(load.idle() if args.idle else load.chat())
                finally:
                    load.teardown()
                if len(builds) > 1:
                    print(f"--- {build} ({args.baseline if build == 'baseline' else 'this checkout'})")
                if args.idle:
                    print(
                        f"{result['idle_sockets']} idle sockets on {result['workers']} worker(s) "
                        f"(server pings every {result['ws_ping_interval']:g} s, client pings {'on' if result['client_pings'] else 'off'}): "
                        f"{result['kb_per_socket']:.1f} KB each, {result['core_share'] * 100:.1f}% of a core"
                    )
                else:
                    print_chat(result)
                    rows.append((mix, build, result))
                    if result["lost"] or result["duplicated"]:
                        status = 1
                if args.json:
                    print(json.dumps({"build": build, **result}))
                sys.stdout.flush()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if len(rows) > 1:
        print()
        print_side_by_side(rows)
    return status


if __name__ == "__main__":
    sys.exit(main())
