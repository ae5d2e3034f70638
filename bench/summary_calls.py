"""Summary calls: how many rolling-summary calls a conversation's questions buy (issue 29, item 3).

One kefu worker (Daphne, on a private Redis and a fresh PostgreSQL database, as ``bench/load.py``
sets them up) and a Celery worker (which makes the summaries), the project's test upstream, the
production defaults (``KEFU_CONTEXT_TURNS`` 5, ``KEFU_SUMMARY_MIN_TURNS`` 2; the answer cache off,
so each model question reaches the model). Two conversations over real WebSockets:

- **FAQ**: ``--faq`` (1,000) questions the FAQ model answers (the bitext seed's questions and
  variants without numbers, in turn; questions answered another way are asked but not counted);
- **model**: ``--model`` (40) product questions, none in the FAQ, answered by the remote model;
  after each answer the shopper waits until the Celery queue is empty and no call came for 0.5 s
  (reading the answer), so a summary is made before the next question.

Reported: for each conversation, its questions, its answers by route, the summary calls the test
upstream received for it and what they cost (USD, from the ledger), once the Celery worker's
queue is empty and no call came for 3 s. Run it on two checkouts to compare (the script only
talks to the servers, so the same file runs against an older revision)::

    .venv/bin/python bench/summary_calls.py
    git archive <rev> | tar -x -C <dir> && cp bench/summary_calls.py <dir>/bench/ \\
        && ln -s "$PWD/.venv" <dir>/.venv && (cd <dir> && .venv/bin/python bench/summary_calls.py)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import websockets

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
from load import Load  # noqa: E402

#: What kefu's summary prompt starts with (routing.prompt.summary.SUMMARY_SYSTEM_PROMPT).
SUMMARY_PROMPT_START = "You keep a running summary"
ITEMS = ["oak side table", "walnut floor lamp", "linen sofa cover", "rattan lounge chair", "velvet cushion"]
COLOURS = ["white", "black", "green", "navy", "grey", "red", "yellow", "beige", "teal", "ivory"]


def faq_questions(data: Path) -> list[str]:
    """The bitext seed's questions and variants with no digits (no order numbers)."""
    out: list[str] = []
    for line in (data / "bitext" / "faq_seed.jsonl").read_text().splitlines():
        record = json.loads(line)
        out += [t for t in (record["question"], *record["variants"]) if not re.search(r"\d", t)]
    return out


def summaries_of(upstream: Any, conversation_texts: set[str]) -> int:
    """Summary calls whose transcript quotes one of ``conversation_texts`` (a conversation's own questions)."""
    n = 0
    for r in upstream.requests:
        if r["messages"][0]["content"].startswith(SUMMARY_PROMPT_START):
            transcript = r["messages"][-1]["content"]
            n += any(f"Shopper: {t}" in transcript for t in conversation_texts)
    return n


async def converse(
    ws_url: str, origin: str, questions: list[str], want: int, counted: str, pause: Callable[[], None] | None = None
) -> tuple[str, Counter[str]]:
    """One conversation: ask ``questions`` in turn until ``want`` answers came by route ``counted``
    (prefix), calling ``pause`` after each answer (the shopper reads it); its id and the answers
    by route."""
    routes: Counter[str] = Counter()
    async with websockets.connect(ws_url, origin=origin, max_size=2**22) as ws:
        await ws.send(json.dumps({"type": "hello"}))
        conversation = json.loads(await ws.recv())["id"]
        i = 0
        while sum(n for r, n in routes.items() if r.startswith(counted)) < want and i < 2 * want + 50:
            text = questions[i % len(questions)]
            i += 1
            await ws.send(json.dumps({"type": "message", "client_id": uuid.uuid4().hex, "text": text}))
            while True:
                f = json.loads(await asyncio.wait_for(ws.recv(), 120))
                if f.get("type") == "stream.end":
                    routes[str(f.get("route"))] += 1
                    break
            if pause is not None:
                pause()
    return conversation, routes


def settle(load: Load, quiet_s: float = 3.0) -> None:
    """Wait until the Celery queue is empty and the upstream got no request for ``quiet_s`` (at most 300 s)."""
    import redis

    r = redis.Redis.from_url(load.env["REDIS_URL"])
    deadline = time.monotonic() + 300
    seen, since = len(load.upstream.requests), time.monotonic()
    while time.monotonic() < deadline:
        now = len(load.upstream.requests)
        if now != seen or r.llen("celery"):
            seen, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        time.sleep(0.2)


def cost(load: Load, conversation: str, purpose: str) -> Decimal:
    with psycopg.connect(load.pg) as db:
        row = db.execute(
            "SELECT COALESCE(SUM(cost_usd), 0) FROM routing_upstreamcall WHERE conversation_id = %s AND purpose = %s",
            (uuid.UUID(conversation), purpose),
        ).fetchone()
    return Decimal(row[0]) if row else Decimal(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faq", type=int, default=1000, help="FAQ-answered questions in the first conversation")
    parser.add_argument("--model", type=int, default=40, help="model-answered questions in the second")
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    args = parser.parse_args(argv)
    load = Load(
        SimpleNamespace(ttft_ms=20.0, token_ms=2.0, workers=1, server="daphne", data=args.data, ws_ping_interval=0)
    )
    load.env["KEFU_CACHE_ENABLED"] = "false"  # the workers' env is this dict
    worker: subprocess.Popen[bytes] | None = None
    try:
        load.setup()
        worker = subprocess.Popen(
            [str(ROOT / ".venv/bin/celery"), "-A", "config", "worker", "--pool=solo", "--loglevel=WARNING"],
            cwd=ROOT, env=load.env, stdout=(load.tmp / "celery.log").open("wb"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        ws_url, origin = load.workers[0].ws, load.workers[0].base
        faq = faq_questions(args.data)
        model = [f"Does the {item} come in {colour}?" for colour in COLOURS for item in ITEMS][: args.model]
        rows = []
        for name, questions, want, counted in (("FAQ", faq, args.faq, "faq"), ("model", model, args.model, "llm.")):
            # The model conversation's shopper reads each answer while its summary (if any) is made:
            # the count is then the design's, not a race with a loaded Celery worker.
            pause = (lambda: settle(load, quiet_s=0.5)) if name == "model" else None
            conversation, routes = asyncio.run(converse(ws_url, origin, questions, want, counted, pause))
            settle(load)
            calls = summaries_of(load.upstream, set(questions))
            rows.append((name, sum(routes.values()), dict(routes), calls, cost(load, conversation, "summary")))
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            worker.wait(30)
        load.teardown()
    print("| conversation | questions | answers by route | summary calls | summary cost (USD) |")
    print("|---|---:|---|---:|---:|")
    for name, asked, routes, calls, usd in rows:
        print(f"| {name} | {asked} | {', '.join(f'{r} {n}' for r, n in sorted(routes.items()))} | {calls} | {usd} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
