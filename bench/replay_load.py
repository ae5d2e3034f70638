"""The replay trial (issue 29, item 4): does a worker under replay load keep other shoppers' FAQ
answers fast?

Run from the repository root::

    git archive <old rev> | tar -x -C <old-tree>      # the code before, to compare with
    .venv/bin/python bench/replay_load.py --baseline <old-tree> [--messages 20000] [--sockets 8] [--seconds 40]

What it does, for the ``--baseline`` tree (when given) and then for this one, one after the other
with the same settings and this virtual environment:

1. Starts kefu like ``bench/storefront_eval.py``: one Daphne process in its own process group, a
   temporary SQLite database, the demo FAQ (``routing/demo/faq_demo.jsonl``) imported, Redis and
   every upstream key removed from its environment (so the budgets are the in-memory ones of that
   one worker), ``KEFU_MESSAGES_PER_MINUTE_PER_IP`` lifted so that the shopper's own questions
   are never refused.
2. Stores a conversation of ``--messages`` (20,000) finished messages (shopper and bot in turn,
   ``manage.py shell``).
3. In a separate process (so that reading replays does not slow the measuring client down):
   ``--sockets`` (8) sockets of one address resume that conversation with ``hello`` ``after=0``,
   then each sends ``resync`` ``after=0`` once a second, and reads everything it is sent.
4. Meanwhile another shopper on the same worker asks the demo FAQ's questions one after another
   (0.2 s between an answer's end and the next question) for ``--seconds`` (40) and records each
   FAQ answer's **first delta**: from sending the message to its first ``stream.delta``, ms.

With ``--control``, this tree runs a third time without replay sockets: the first delta the
machine gives with no replay load at all (on a shared, busy machine its p99 is far from zero, and
the rows above are read against it).

Reported (Markdown): per tree, the other shopper's FAQ first-delta p50/p99 (numpy percentiles,
linear interpolation) and the number of answers, the messages the replay sockets were sent, and
their ``replay_limited`` / ``rate_limited`` errors. Client, server and load share the machine's
cores: compare the two rows with each other (same machine, same run), not with other machines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from websockets.asyncio.client import connect

ROOT = Path(__file__).resolve().parent.parent
STRIPPED_ENV = ("REDIS_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL") + tuple(
    f"KEFU_{tier}_{what}" for tier in ("SIMPLE", "MEDIUM", "COMPLEX") for what in ("API_KEY", "BASE_URL")
)
HEALTH_TIMEOUT_S = 180.0
QUESTION_TIMEOUT_S = 120.0
WARMUP_QUESTIONS = 3
ORIGIN = "http://127.0.0.1"

#: Stores the conversation in the tree's own models (both trees have these names).
SEED = """
import json
from chat.models import Conversation, Message
from chat.services import conversation_start
conv, token = conversation_start(locale="en")
n = {n}
batch = []
for seq in range(1, n + 1):
    shopper = seq % 2 == 1
    batch.append(Message(conversation=conv, seq=seq, role="shopper" if shopper else "bot",
        text=("Question number %d about my order" if shopper else "Answer number %d: it ships tomorrow.") % seq,
        client_id="seed-%d" % seq if shopper else None, route="" if shopper else "faq",
        reply_to_seq=None if shopper else seq - 1))
    if len(batch) == 2000:
        Message.objects.bulk_create(batch); batch = []
Message.objects.bulk_create(batch)
Conversation.objects.filter(pk=conv.pk).update(last_seq=n, answered_seq=n - 1 if n % 2 == 0 else n)
print(json.dumps({{"id": str(conv.id), "token": token}}))
"""


class Server:
    """kefu of ``tree`` on a temporary SQLite database, served by Daphne in its own process group."""

    def __init__(self, tree: Path, port: int) -> None:
        self.tree = tree
        self.port = port
        self.tmp = Path(tempfile.mkdtemp(prefix="kefu-replay-load-"))
        self.log_path = self.tmp / "daphne.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.env = dict(os.environ)
        for name in STRIPPED_ENV:
            self.env.pop(name, None)
            self.env[name] = ""  # an empty value also keeps a .env file from setting it
        self.env.update(
            DATABASE_URL=f"sqlite:///{self.tmp / 'bench.sqlite3'}",
            KEFU_MESSAGES_PER_MINUTE_PER_IP="1000000",
            PYTHONUNBUFFERED="1",
        )

    def manage(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=self.tree, env=self.env, capture_output=True, text=True
        )
        if done.returncode != 0:
            tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
            raise RuntimeError(f"manage.py {args[0]} failed (exit {done.returncode}): " + " | ".join(tail))
        return done.stdout

    def start(self, messages: int) -> dict[str, str]:
        """Migrates, imports the demo FAQ, stores the conversation, serves; its id and token."""
        self.manage("migrate", "--noinput")
        self.manage("import_faq", "routing/demo/faq_demo.jsonl")
        conv: dict[str, str] = json.loads(self.manage("shell", "-c", SEED.format(n=messages)).strip().splitlines()[-1])
        daphne = Path(sys.executable).parent / "daphne"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                [str(daphne), "-b", "127.0.0.1", "-p", str(self.port), "config.asgi:application"],
                cwd=self.tree,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"daphne exited with {self.proc.returncode}")
            try:
                with opener.open(f"http://127.0.0.1:{self.port}/healthz", timeout=5) as r:
                    if r.status == 200:
                        return conv
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"/healthz was not 200 within {HEALTH_TIMEOUT_S:.0f} s")

    def stop(self) -> None:
        """Stops Daphne's process group (TERM, then KILL after 10 s) and deletes the database."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- the replay load (its own process) ----------------------------------------------------------
async def _replayer(url: str, conv: dict[str, str], stop_at: float, counts: dict[str, int]) -> None:
    """One socket: resume with after=0, then resync after=0 once a second, reading everything."""
    async with connect(url, origin=ORIGIN, max_size=None, max_queue=None) as ws:  # type: ignore[arg-type]
        await ws.send(json.dumps({"type": "hello", "conversation": conv["id"], "token": conv["token"], "after": 0}))

        async def read() -> None:
            async for raw in ws:
                frame = json.loads(raw)
                kind = frame["type"]
                if kind == "message":
                    counts["messages"] += 1
                elif kind == "error":
                    counts[frame["code"]] = counts.get(frame["code"], 0) + 1

        reader = asyncio.ensure_future(read())
        start = time.monotonic()
        tick = 1
        while time.monotonic() < stop_at:
            await asyncio.sleep(max(0.0, start + tick - time.monotonic()))
            await ws.send(json.dumps({"type": "resync", "after": 0}))
            tick += 1
        reader.cancel()


def _load(url: str, conv: dict[str, str], sockets: int, seconds: float, out: Any) -> None:
    counts: dict[str, int] = {"messages": 0}

    async def main() -> None:
        stop_at = time.monotonic() + seconds
        await asyncio.gather(*(_replayer(url, conv, stop_at, counts) for _ in range(sockets)), return_exceptions=True)

    asyncio.run(main())
    out.put(counts)


# --- the other shopper --------------------------------------------------------------------------
def faq_questions() -> list[str]:
    rows = [json.loads(line) for line in (ROOT / "routing/demo/faq_demo.jsonl").read_text().splitlines() if line]
    return [str(r["question"]) for r in rows if r.get("locale", "en") == "en"][:8]


async def ask(ws: Any, text: str, n: int) -> tuple[float | None, str]:
    """Sends one question; (ms to its first stream.delta, the answer's route)."""
    sent = time.perf_counter()
    await ws.send(json.dumps({"type": "message", "client_id": f"faq-{n}", "text": text}))
    first: float | None = None
    while True:
        frame = json.loads(await asyncio.wait_for(ws.recv(), QUESTION_TIMEOUT_S))
        if frame["type"] == "stream.delta" and first is None:
            first = (time.perf_counter() - sent) * 1000
        if frame["type"] == "stream.end":
            return first, str(frame.get("route"))


@dataclass
class Result:
    label: str
    first_delta_ms: list[float]
    load: dict[str, int]


async def shopper(url: str, seconds: float, questions: list[str]) -> list[float]:
    """The other shopper: FAQ questions one after another for ``seconds``; FAQ first deltas, ms."""
    out: list[float] = []
    async with connect(url, origin=ORIGIN) as ws:
        await ws.send(json.dumps({"type": "hello"}))
        assert json.loads(await ws.recv())["type"] == "conversation"
        n = 0
        stop_at = time.monotonic() + seconds
        while time.monotonic() < stop_at:
            ms, route = await ask(ws, questions[n % len(questions)], n)
            n += 1
            if route == "faq" and ms is not None:
                out.append(ms)
            await asyncio.sleep(0.2)  # pacing of the shopper, not a wait for a condition
    return out


def trial(label: str, tree: Path, args: argparse.Namespace, sockets: int) -> Result:
    server = Server(tree, free_port())
    try:
        conv = server.start(args.messages)
        url = f"ws://127.0.0.1:{server.port}/ws/chat/"
        questions = faq_questions()

        async def warm() -> None:
            async with connect(url, origin=ORIGIN) as ws:
                await ws.send(json.dumps({"type": "hello"}))
                await ws.recv()
                for n in range(WARMUP_QUESTIONS):
                    await ask(ws, questions[n % len(questions)], n)

        asyncio.run(warm())
        queue: Any = multiprocessing.get_context("spawn").Queue()
        load = multiprocessing.get_context("spawn").Process(
            target=_load, args=(url, conv, sockets, args.seconds + 5, queue)
        )
        load.start()
        try:
            first = asyncio.run(shopper(url, args.seconds, questions))
            counts = queue.get(timeout=args.seconds + 120)
        finally:
            load.join(30)
            if load.is_alive():
                load.kill()
        return Result(label, first, counts)
    finally:
        server.stop()


def row(r: Result) -> str:
    if r.first_delta_ms:
        p50, p99 = (float(np.percentile(r.first_delta_ms, q)) for q in (50, 99))
        speed = f"{p50:,.0f} | {p99:,.0f}"
    else:
        speed = "— | —"
    return (
        f"| {r.label} | {speed} | {len(r.first_delta_ms)} | {r.load.get('messages', 0):,} | "
        f"{r.load.get('replay_limited', 0)} | {r.load.get('rate_limited', 0)} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--baseline", type=Path, help="a copy of the code before (git archive), run first")
    parser.add_argument("--messages", type=int, default=20000)
    parser.add_argument("--sockets", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=40.0)
    parser.add_argument(
        "--control", action="store_true", help="also run this tree without replay sockets: what the machine alone costs"
    )
    args = parser.parse_args(argv)
    results = []
    if args.baseline:
        results.append(trial("before (baseline)", args.baseline.resolve(), args, args.sockets))
    results.append(trial("after (this tree)", ROOT, args, args.sockets))
    if args.control:
        results.append(trial("after, no replay sockets (the machine's floor)", ROOT, args, 0))
    print(f"command: {shlex.join(['bench/replay_load.py', *(argv if argv is not None else sys.argv[1:])])}")
    print(f"{args.messages:,} stored messages; {args.sockets} sockets of one address replaying once a second\n")
    print(
        "| code | FAQ first delta p50 (ms) | p99 (ms) | FAQ answers | messages sent to the replay sockets | replay_limited | rate_limited |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(row(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
