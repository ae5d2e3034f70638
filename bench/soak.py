"""Soak: shoppers chat for minutes over two workers on Redis + PostgreSQL while faults are made, and
nothing a shopper sent may be lost, stored twice or left unanswered.

Set-up (all private to the run, removed afterwards): a ``redis-server`` on its own port, a fresh
PostgreSQL database on ``TEST_DATABASE_URL``'s server (default postgres://postgres@127.0.0.1:5432/
postgres), the demo FAQ, two Daphne workers, and the project's OpenAI-compatible test server as
the remote model (300 ms to the first token, 20 ms a chunk). ``--shoppers`` (50) chat in a closed
loop, each over one socket to a worker picked at random (the other when it is down), asking demo
FAQ questions and product questions for the model; about 5% of answers see the shopper's socket
dropped mid-answer (it reconnects and resumes, resending what was not acknowledged).

Every ``--event-every`` seconds (30) one fault, in turn: Redis drops every client connection
(CLIENT KILL); a worker is killed with SIGKILL and started again; a worker is stopped with SIGTERM
(it drains) and started again; an FAQ entry is edited (the workers retrain); an agent takes a
conversation over and vanishes (the lease runs out and the conversation goes back).

Report: messages sent / acknowledged / answered in full, lost (sent, never stored), duplicated (a
second complete answer to one question), left unanswered (a shopper message with nothing after
it at the end), rows left streaming, answers whose deltas had a gap the stream.end mended
("frames lost"), and the first-delta p99 in the 15 s after each kind of event against the rest.

    .venv/bin/python bench/soak.py                 # 10 minutes, 50 shoppers
    .venv/bin/python bench/soak.py --minutes 3 --shoppers 30

Exit status 1 when anything was lost, duplicated or left unanswered.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import websockets

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from fake_openai import Behaviour, FakeOpenAI  # noqa: E402

PRODUCT_QUESTIONS = [
    "Does the walnut floor lamp come with a dimmer switch?",
    "Is the oak side table solid wood?",
    "Is the linen sofa cover machine washable?",
    "What bulb does the brass desk lamp take?",
    "How heavy is the marble coffee table?",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def p99(values: list[float]) -> float | None:
    if len(values) < 2:
        return values[0] if values else None
    return statistics.quantiles(values, n=100)[98]


# The ASGI servers a worker can run under (``{port}`` filled in), for bench/load.py's ``--server``.
# Each serves the same Channels application on one process (Gunicorn and Granian: one worker under
# their own supervisor). Only Daphne is a project dependency; the others are installed for the
# comparison (``pip install "uvicorn[standard]" granian gunicorn``).
SERVERS = {
    "daphne": ["daphne", "-b", "127.0.0.1", "-p", "{port}", "config.asgi:application"],
    "uvicorn": ["uvicorn", "--host", "127.0.0.1", "--port", "{port}", "--loop", "uvloop", "--http", "httptools",
                "--ws", "websockets", "--lifespan", "off", "--no-access-log", "config.asgi:application"],
    "granian": ["granian", "--interface", "asgi", "--host", "127.0.0.1", "--port", "{port}", "--loop", "uvloop",
                "--workers", "1", "--no-access-log", "config.asgi:application"],
    "gunicorn": ["gunicorn", "-k", "asgi", "-w", "1", "-b", "127.0.0.1:{port}", "config.asgi:application"],
}  # fmt: skip


class Worker:
    """One kefu web process under an ASGI server of ``SERVERS`` (Daphne by default)."""

    def __init__(
        self, env: dict[str, str], log: Path, server: str = "daphne", extra: list[str] | None = None, root: Path = ROOT
    ) -> None:
        self.env, self.log, self.port, self.server = env, log, free_port(), server
        self.root = root  # the checkout it runs (bench/load.py's --baseline: another revision's)
        self.extra = extra or []  # more arguments for the server (e.g. Daphne's --ping-interval)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws/chat/"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        cmd = SERVERS[self.server]
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [str(ROOT / ".venv/bin" / cmd[0]), *(a.format(port=self.port) for a in cmd[1:]), *self.extra],
                cwd=self.root, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.base + "/healthz", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def wait_healthy(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not self.healthy():
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker on {self.port} not healthy; see {self.log}")
            time.sleep(0.3)

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, sig)

    def wait_exit(self, timeout: float = 30) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal(signal.SIGKILL)
                self.proc.wait(10)


@dataclass
class Stats:
    sent: int = 0
    acked: int = 0
    answered: int = 0
    gaps: int = 0
    timeouts: int = 0
    drops: int = 0
    firsts: list[tuple[float, float]] = field(default_factory=list)  # (time, first-delta ms)
    messages: list[tuple[str, str]] = field(default_factory=list)  # (conversation, client_id) sent
    events: list[tuple[float, str]] = field(default_factory=list)


class Shopper:
    def __init__(self, workers: list[Worker], questions: list[str], stats: Stats, drop_rate: float) -> None:
        self.workers, self.questions, self.stats, self.drop_rate = workers, questions, stats, drop_rate
        self.conv: str | None = None
        self.token: str | None = None
        self.ws: Any = None

    async def connect(self) -> None:
        for worker in random.sample(self.workers, len(self.workers)) * 20:
            try:
                self.ws = await websockets.connect(worker.ws, origin=worker.base, open_timeout=5)
                hello: dict[str, Any] = {"type": "hello"}
                if self.conv:
                    hello.update(conversation=self.conv, token=self.token, after=0)
                await self.ws.send(json.dumps(hello))
                frame = json.loads(await asyncio.wait_for(self.ws.recv(), 10))
                if frame.get("type") == "conversation":
                    self.conv, self.token = frame["id"], frame["token"]
                    return
            except (TimeoutError, OSError, websockets.WebSocketException):
                pass
            await asyncio.sleep(0.5)
        raise RuntimeError("no worker would take a socket for 20 tries")

    async def ask(self) -> None:
        """One question, resent on every new socket until acknowledged, waited for until answered."""
        client_id, text = str(uuid.uuid4()), random.choice(self.questions)
        self.stats.sent += 1
        try:
            await self._ask(client_id, text)
        finally:
            if self.conv is not None:
                self.stats.messages.append((self.conv, client_id))

    async def _ask(self, client_id: str, text: str) -> None:
        sent_at, ack_seq, first, drop = time.monotonic(), None, None, random.random() < self.drop_rate
        deadline = time.monotonic() + 120
        texts: dict[int, str] = {}
        while time.monotonic() < deadline:
            if self.ws is None:
                await self.connect()
            try:
                if ack_seq is None:
                    await self.ws.send(json.dumps({"type": "message", "client_id": client_id, "text": text}))
                while True:
                    f = json.loads(await asyncio.wait_for(self.ws.recv(), max(1.0, deadline - time.monotonic())))
                    kind = f.get("type")
                    if kind == "message" and f.get("client_id") == client_id and ack_seq is None:
                        ack_seq = f["seq"]
                        self.stats.acked += 1
                    elif kind == "stream.delta" and ack_seq is not None:
                        if first is None:
                            first = (time.monotonic() - sent_at) * 1000
                        have = texts.setdefault(f["id"], "")
                        if f.get("pos", len(have)) > len(have):
                            self.stats.gaps += 1
                        texts[f["id"]] = have[: f.get("pos", len(have))] + f["text"]
                        if drop:
                            drop = False
                            self.stats.drops += 1
                            self.ws.transport.abort()
                            raise websockets.ConnectionClosed(None, None)
                    elif (
                        kind in ("stream.end", "message")
                        and ack_seq is not None
                        and f.get("role", "bot") in ("bot", "agent")
                        and f.get("seq", 0) > ack_seq
                        and not f.get("cut")
                    ):
                        if first is None:
                            first = (time.monotonic() - sent_at) * 1000
                        self.stats.answered += 1
                        self.stats.firsts.append((time.time(), first))
                        return
            except (TimeoutError, OSError, websockets.WebSocketException):
                self.ws = None
        self.stats.timeouts += 1

    async def run(self, stop_at: float) -> None:
        while time.monotonic() < stop_at:
            await self.ask()
        if self.ws is not None:
            await self.ws.close()


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="kefu-soak-"))
        self.redis_port = free_port()
        pg = os.environ.get("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
        self.pg_admin = pg
        self.db_name = f"kefu_soak_{uuid.uuid4().hex[:8]}"
        self.pg = urlsplit(pg)._replace(path="/" + self.db_name).geturl()
        self.upstream = FakeOpenAI.start(default=Behaviour(ttft_ms=300, token_ms=20))
        self.env = {
            **{k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
            "DATABASE_URL": self.pg,
            "REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0",
            "OPENAI_API_KEY": "soak-key",
            "OPENAI_BASE_URL": self.upstream.base_url,
            "KEFU_MESSAGES_PER_MINUTE_PER_IP": "1000000",
            "KEFU_MAX_SOCKETS_PER_IP": "100000",
            "KEFU_AGENT_LEASE_S": "9",
            "KEFU_AGENT_HEARTBEAT_S": "3",
            "KEFU_FAQ_POLL_S": "5",
            "PYTHONUNBUFFERED": "1",
        }
        self.redis: subprocess.Popen[bytes] | None = None
        self.workers = [Worker(self.env, self.tmp / f"worker-{i}.log") for i in range(2)]
        self.stats = Stats()

    # --- set-up -------------------------------------------------------------------------------
    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [str(ROOT / ".venv/bin/python"), "manage.py", *args], cwd=ROOT, env=self.env, capture_output=True, text=True
        )
        if done.returncode != 0:
            raise RuntimeError(f"manage.py {args[0]}: {(done.stdout + done.stderr)[-800:]}")
        return done.stdout

    def start_redis(self) -> None:
        self.redis = subprocess.Popen(
            ["redis-server", "--port", str(self.redis_port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            cwd=self.tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        time.sleep(0.5)

    def redis_cli(self, *args: str) -> str:
        return subprocess.run(
            ["redis-cli", "-p", str(self.redis_port), *args], capture_output=True, text=True, check=False
        ).stdout

    def setup(self) -> None:
        with psycopg.connect(self.pg_admin, autocommit=True) as db:
            db.execute(f'CREATE DATABASE "{self.db_name}"')
        self.start_redis()
        self.manage("migrate", "--noinput")
        self.manage("import_faq", "routing/demo/faq_demo.jsonl")
        self.agent_session = (
            self.manage(
                "shell",
                "-c",
                "from django.contrib.auth.models import Permission, User\nfrom django.test import Client\n"
                "u = User.objects.create_user('soak-agent', password='pw', is_staff=True)\n"
                "u.user_permissions.add(Permission.objects.get(codename='handle_conversations'))\n"
                "c = Client(); c.force_login(User.objects.get(pk=u.pk)); print('session', c.cookies['sessionid'].value)\n",
            )
            .split("session ")[-1]
            .strip()
        )
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
        with psycopg.connect(self.pg_admin, autocommit=True) as db:
            db.execute(f'DROP DATABASE IF EXISTS "{self.db_name}" WITH (FORCE)')
        shutil.rmtree(self.tmp, ignore_errors=True)

    # --- faults -------------------------------------------------------------------------------
    async def fault(self, kind: str) -> None:
        self.stats.events.append((time.time(), kind))
        print(f"  {time.strftime('%H:%M:%S')} {kind}", flush=True)
        if kind == "redis_kill":
            self.redis_cli("CLIENT", "KILL", "TYPE", "normal")
        elif kind in ("kill9", "sigterm"):
            w = random.choice(self.workers)
            w.signal(signal.SIGKILL if kind == "kill9" else signal.SIGTERM)
            await asyncio.to_thread(w.wait_exit, 30)
            await asyncio.sleep(1)
            w.start()
            await asyncio.to_thread(w.wait_healthy)
        elif kind == "faq_edit":
            await asyncio.to_thread(
                self.manage,
                "shell",
                "-c",
                "from routing.models import FaqEntry\ne = FaqEntry.objects.filter(locale='en').order_by('?').first()\n"
                "e.answer = e.answer.rstrip() + ' '\ne.save()\n",
            )
        elif kind == "agent_vanish":
            await self.agent_takes_over_and_vanishes()

    async def agent_takes_over_and_vanishes(self) -> None:
        with psycopg.connect(self.pg) as db:
            row = db.execute(
                "SELECT id FROM chat_conversation WHERE status = 'bot' ORDER BY updated_at DESC LIMIT 1"
            ).fetchone()
        if row is None:
            return
        w = random.choice([w for w in self.workers if w.healthy()] or self.workers)
        async with websockets.connect(
            w.ws.replace("/ws/chat/", "/ws/agent/"),
            origin=w.base,
            additional_headers={"Cookie": f"sessionid={self.agent_session}"},
        ) as ws:
            await ws.send(json.dumps({"type": "take_over", "conversation": str(row[0])}))
            await asyncio.sleep(0.5)
            ws.transport.abort()  # vanishes: no hand-back, no more heartbeats

    # --- the run ------------------------------------------------------------------------------
    async def run(self) -> None:
        rows = [json.loads(x) for x in (ROOT / "routing/demo/faq_demo.jsonl").read_text().splitlines() if x]
        faq = [r["question"] for r in rows if r["locale"] == "en"]
        faq = [q for q in faq if not any(w in q.lower() for w in ("person", "human", "agent"))]
        questions = faq + PRODUCT_QUESTIONS
        stop_at = time.monotonic() + self.args.minutes * 60
        shoppers = [Shopper(self.workers, questions, self.stats, 0.05) for _ in range(self.args.shoppers)]
        kinds = ["redis_kill", "kill9", "faq_edit", "sigterm", "agent_vanish"]

        async def faults() -> None:
            i = 0
            while time.monotonic() + self.args.event_every < stop_at:
                await asyncio.sleep(self.args.event_every)
                await self.fault(kinds[i % len(kinds)])
                i += 1

        await asyncio.gather(faults(), *(s.run(stop_at) for s in shoppers))

    def verify(self) -> dict[str, int]:
        time.sleep(self.args.settle)
        with psycopg.connect(self.pg) as db:
            streaming = db.execute("SELECT count(*) FROM chat_message WHERE state = 'streaming'").fetchone()[0]
            stored = {
                (str(c), str(k))
                for c, k in db.execute("SELECT conversation_id, client_id FROM chat_message WHERE role = 'shopper'")
            }
            duplicated = db.execute(
                "SELECT count(*) FROM (SELECT conversation_id, reply_to_seq FROM chat_message"
                " WHERE role = 'bot' AND NOT cut AND state = 'done' AND reply_to_seq IS NOT NULL"
                " GROUP BY 1, 2 HAVING count(*) > 1) d"
            ).fetchone()[0]
            unanswered = db.execute(
                "SELECT count(*) FROM chat_conversation c WHERE EXISTS (SELECT 1 FROM chat_message s"
                " WHERE s.conversation_id = c.id AND s.role = 'shopper' AND NOT EXISTS (SELECT 1 FROM"
                " chat_message a WHERE a.conversation_id = c.id AND a.seq > s.seq AND a.role IN ('bot', 'agent')"
                " AND a.state = 'done' AND NOT a.cut))"
            ).fetchone()[0]
            for (cid,) in db.execute(
                "SELECT c.id FROM chat_conversation c WHERE EXISTS (SELECT 1 FROM chat_message s"
                " WHERE s.conversation_id = c.id AND s.role = 'shopper' AND NOT EXISTS (SELECT 1 FROM"
                " chat_message a WHERE a.conversation_id = c.id AND a.seq > s.seq AND a.role IN ('bot', 'agent')"
                " AND a.state = 'done' AND NOT a.cut)) LIMIT 3"
            ).fetchall():
                status = db.execute(
                    "SELECT status, agent_id, answered_seq, last_seq FROM chat_conversation WHERE id = %s",
                    (cid,),
                ).fetchone()
                tail = db.execute(
                    "SELECT seq, role, state, cut, route, left(text, 50), created_at FROM chat_message"
                    " WHERE conversation_id = %s ORDER BY seq DESC LIMIT 5",
                    (cid,),
                ).fetchall()
                print(f"  unanswered {cid} {status}: {tail[::-1]}")
        return {
            "lost": sum(1 for m in self.stats.messages if m not in stored),
            "streaming": int(streaming),
            "duplicated": int(duplicated),
            "unanswered": int(unanswered),
        }

    def report(self, db: dict[str, int]) -> bool:
        s = self.stats
        lost = db["lost"]
        print(f"\nsoak: {self.args.minutes:g} min, {self.args.shoppers} shoppers, 2 workers, {len(s.events)} faults")
        print("| sent | acknowledged | answered in full | lost | duplicated | left unanswered | left streaming |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        print(
            f"| {s.sent} | {s.acked} | {s.answered} | {lost} | {db['duplicated']} | {db['unanswered']}"
            f" | {db['streaming']} |"
        )
        print(f"sockets dropped mid-answer: {s.drops}; answers with a delta gap (mended): {s.gaps};"
              f" shopper waits over 120 s: {s.timeouts}")  # fmt: skip
        windows: dict[str, list[float]] = {}
        quiet = []
        for t, ms in s.firsts:
            near = [k for te, k in s.events if te <= t <= te + 15]
            for k in near:
                windows.setdefault(k, []).append(ms)
            if not near:
                quiet.append(ms)
        base = p99(quiet)
        print("\n| first delta p99, ms | samples | p99 | ratio to quiet |")
        print("|---|---:|---:|---:|")
        print(f"| quiet | {len(quiet)} | {base or 0:.0f} | 1.00 |")
        for k, v in sorted(windows.items()):
            q = p99(v) or 0
            print(f"| 15 s after {k} | {len(v)} | {q:.0f} | {q / base if base else 0:.2f} |")
        return lost == 0 and db["duplicated"] == 0 and db["unanswered"] == 0 and db["streaming"] == 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--shoppers", type=int, default=50)
    ap.add_argument("--event-every", type=float, default=30.0, help="seconds between faults")
    ap.add_argument("--settle", type=float, default=40.0, help="seconds after the run before the database is checked")
    args = ap.parse_args()
    soak = Soak(args)
    try:
        soak.setup()
        asyncio.run(soak.run())
        ok = soak.report(soak.verify())
    finally:
        soak.teardown()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
