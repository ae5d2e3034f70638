"""Stream gap: what kefu adds between a remote model's tokens, as the shopper sees them.

The project's OpenAI-compatible test server paces an answer of ``--chunks`` (64) pieces
``--token-ms`` (20) ms apart and logs the moment it wrote each piece (``FakeOpenAI.chunk_log``).
Two readers take the same streams side by side, in the same process and at the same
concurrency:

- **direct** (the baseline): the ``openai`` SDK reading the test server itself, with no kefu;
- **kefu**: a shopper over a real WebSocket to one kefu worker (Daphne, on a private Redis and a
  fresh PostgreSQL database, as ``bench/load.py`` sets them up), asking a new product question
  (unique, so no cache hit and no shared upstream call), answered by the remote ``simple`` tier.

For every piece a reader receives: its **latency** (received minus written by the server, ms;
one clock, ``time.monotonic``, in one process), and its **added gap** (the time since the
previous piece received, minus the time between the two writes, ms). A piece that kefu's
stream merged or split is matched to the server's write that completed it (by code points).
Reported per concurrency (``--streams 1,64``): p50 / p99 of each, for both readers; kefu's
own share is kefu's figure minus direct's.

    .venv/bin/python bench/stream_gap.py
    .venv/bin/python bench/stream_gap.py --streams 1,16,64 --rounds 3

Percentiles are numpy's (linear interpolation). The readers, the test server and the worker
share the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import websockets
from openai import AsyncOpenAI

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
from fake_openai import Behaviour  # noqa: E402
from load import Load  # noqa: E402
from soak import PRODUCT_QUESTIONS  # noqa: E402

Arrivals = list[tuple[int, float]]  # (code points received so far, time.monotonic())


async def via_kefu(ws_url: str, origin: str, question: str) -> tuple[Arrivals, str]:
    """Ask ``question`` on a new conversation; the pieces of its answer as they arrive, and the route."""
    async with websockets.connect(ws_url, origin=origin, max_size=2**22) as ws:
        await ws.send(json.dumps({"type": "hello"}))
        json.loads(await ws.recv())
        await ws.send(json.dumps({"type": "message", "client_id": uuid.uuid4().hex, "text": question}))
        got: Arrivals = []
        have = 0
        while True:
            f = json.loads(await asyncio.wait_for(ws.recv(), 60))
            if f.get("type") == "stream.delta":
                have += len(f["text"])
                got.append((have, time.monotonic()))
            elif f.get("type") == "stream.end" and not f.get("superseded"):
                return got, str(f.get("route"))


async def via_sdk(client: AsyncOpenAI, question: str) -> Arrivals:
    """The same answer read straight from the test server with the ``openai`` SDK."""
    stream = await client.chat.completions.create(
        model="gpt-4o-mini", messages=[{"role": "user", "content": question}], stream=True
    )
    got: Arrivals = []
    have = 0
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            have += len(chunk.choices[0].delta.content)
            got.append((have, time.monotonic()))
    return got


def measure(arrivals: Arrivals, writes: list[tuple[int, float]]) -> tuple[list[float], list[float]]:
    """Per piece received: latency (ms) and added gap (ms, from the second piece on)."""
    latency, gaps = [], []
    j, previous = 0, None
    for end, t in arrivals:
        while j < len(writes) - 1 and writes[j][0] < end:
            j += 1
        written = writes[j][1]
        latency.append((t - written) * 1000)
        if previous is not None:
            gaps.append(((t - previous[0]) - (written - previous[1])) * 1000)
        previous = (t, written)
    return latency, gaps


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


async def run(load: Load, args: argparse.Namespace) -> list[dict[str, object]]:
    log: list[tuple[str, int, float]] = []
    load.upstream.chunk_log = log
    client = AsyncOpenAI(api_key="load-key", base_url=load.upstream.base_url, max_retries=0)
    worker = load.workers[0]
    results = []
    n = 0
    for streams in args.streams:
        figures: dict[str, tuple[list[float], list[float]]] = {"direct": ([], []), "kefu": ([], [])}
        other_routes = 0
        for _ in range(args.rounds):
            questions = []
            for _ in range(streams):
                n += 1
                base = PRODUCT_QUESTIONS[n % len(PRODUCT_QUESTIONS)]
                questions.append((f"{base} (asking for the {n}th time)", f"{base} (direct, the {n}th time)"))
            del log[:]
            kefu = asyncio.gather(*(via_kefu(worker.ws, worker.base, q) for q, _ in questions))
            direct = asyncio.gather(*(via_sdk(client, d) for _, d in questions))
            kefu_got, direct_got = await asyncio.gather(kefu, direct)
            writes: dict[str, list[tuple[int, float]]] = {}
            for text, end, t in list(log):
                writes.setdefault(text, []).append((end, t))
            for (q, d), (arrivals, route), plain in zip(questions, kefu_got, direct_got, strict=True):
                if not route.startswith("llm."):
                    other_routes += 1
                    continue
                mine = next((w for text, w in writes.items() if q in text), None)
                theirs = writes.get(d)
                if mine is None or theirs is None:
                    raise RuntimeError(f"no upstream writes logged for {q!r}")
                for name, got, w in (("kefu", arrivals, mine), ("direct", plain, theirs)):
                    latency, gaps = measure(got, w)
                    figures[name][0].extend(latency)
                    figures[name][1].extend(gaps)
        for name in ("direct", "kefu"):
            latency, gaps = figures[name]
            results.append(
                {
                    "streams": streams,
                    "reader": name,
                    "pieces": len(latency),
                    "latency_p50_ms": pct(latency, 50),
                    "latency_p99_ms": pct(latency, 99),
                    "gap_p50_ms": pct(gaps, 50),
                    "gap_p99_ms": pct(gaps, 99),
                    "not_remote": other_routes if name == "kefu" else 0,
                }
            )
    await client.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=lambda s: [int(x) for x in s.split(",")], default=[1, 64])
    parser.add_argument("--rounds", type=int, default=5, help="batches of concurrent streams per concurrency")
    parser.add_argument("--chunks", type=int, default=64)
    parser.add_argument("--token-ms", type=float, default=20.0)
    parser.add_argument("--ttft-ms", type=float, default=100.0)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    answer = " ".join(f"word{i}" for i in range(args.chunks))
    load = Load(
        SimpleNamespace(ttft_ms=args.ttft_ms, token_ms=args.token_ms, workers=1, server="daphne", data=args.data)
    )
    load.upstream.default = Behaviour(text=answer, chunks=args.chunks, ttft_ms=args.ttft_ms, token_ms=args.token_ms)
    try:
        load.setup()
        results = asyncio.run(run(load, args))
    finally:
        load.teardown()
    print(f"{args.chunks} pieces {args.token_ms:g} ms apart; ms; kefu's share = kefu - direct")
    print("| streams | reader | pieces | latency p50 / p99 | added gap p50 / p99 |")
    print("|---:|---|---:|---:|---:|")
    for r in results:
        print(
            f"| {r['streams']} | {r['reader']} | {r['pieces']} | {r['latency_p50_ms']:.2f} / {r['latency_p99_ms']:.2f} "
            f"| {r['gap_p50_ms']:.2f} / {r['gap_p99_ms']:.2f} |"
        )
    skipped = sum(int(r["not_remote"]) for r in results)  # type: ignore[call-overload]
    if skipped:
        print(f"({skipped} kefu answers took another route than the remote model and were left out)")
    if args.json:
        print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
