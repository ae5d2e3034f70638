"""Replay benchmark of the tiered router: real questions through kefu, the test server as upstream.

Run from the repository root::

    .venv/bin/python bench/replay.py [--shared ../shared] [-n 400] [--concurrency 4] [--ttft-ms 200]

What it does.

1. Starts the project's streaming test server (``tests/fake_openai.py`` CLI) with a first token
   after ``--ttft-ms`` (200) and ``--token-ms`` (10) between words. It answers a fixed ~90-word
   text (:data:`ANSWER`) and reports usage: prompt tokens = words of the prompt, completion tokens
   = words streamed (not a real tokenizer; the cost comparison prices the *same* counts at every
   tier).
2. Starts kefu like ``bench/storefront_eval.py`` (Daphne in its own process group, a temporary
   SQLite database, the Bitext FAQ seed loaded with ``manage.py import_faq``; Redis and every key
   removed from its environment) with ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` pointing at the
   test server and the tier models ``fake-simple``, ``fake-medium``, ``fake-complex`` (each tier
   is then configured on its own, so the tier classifier may choose any of them).
3. Replays ``-n`` messages from ``<shared>/data``, each on a new ``/ws/chat/`` socket,
   ``--concurrency`` at a time, in a fixed shuffled order (seed 7): Bitext ``faq_eval_public``
   and other public Bitext rows (shopper questions), CLINC150 ``oos_test`` (off-topic), exact
   repeats of earlier questions, and QQP duplicate pairs about shopping (both questions:
   paraphrases) to exercise the answer cache. After each kefu question the same worker asks the
   test server the same question directly with the ``openai`` SDK (``stream=True``, model
   ``fake-simple``), so both paths see the same upstream, load and moment.

Reported (Markdown): the share of each route; total cost in USD (sum of ``stream.end``
``usage.cost_usd``) and the cost saved (``saved_usd``: FAQ and cache answers) against two
all-``complex`` baselines — the same remote calls' token counts at ``complex`` prices, and every
message at ``complex`` (messages kefu answered without a remote call counted with the mean token
counts of the remote calls); and time to first token: kefu's first ``stream.delta`` of its
``llm.*`` answers vs the direct SDK's first content chunk, p50/p99 side by side (numpy
percentiles, linear interpolation), after ``--warmup`` uncounted product questions
(:data:`WARMUP`; they train the tier classifier and warm both paths). Client, server and
upstream share the machine's cores: this is a per-message overhead, not a capacity figure.

Data rows are read from ``--shared`` at run time and never written anywhere.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import datetime as dt
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed, WebSocketException

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from storefront_eval import Server, free_port  # noqa: E402

#: List prices, USD per million tokens (input, output), the defaults of config/settings.py. The
#: replay's server uses the same defaults (no price variables are passed to it).
PRICES = {"simple": (0.28, 0.42), "medium": (0.30, 2.50), "complex": (2.00, 8.00)}
QUESTION_TIMEOUT_S = 60.0
#: The test server's answer (``--text``): about 90 words, so that completion token counts are of
#: a plausible size (the default echo would be as short as the question).
ANSWER = (
    "Thanks for your message. Here is what I can tell you from the store information: orders ship "
    "within one business day and usually arrive in two to four days; you can follow the parcel from "
    "the link in your confirmation e-mail. Unused items can be returned within 30 days for a full "
    "refund, and the refund reaches your original payment method within five business days of the "
    "return arriving. If anything in your order is missing or damaged, reply with a photo and your "
    "order number and a colleague will sort it out. Is there anything else I can help with?"
)
#: Warm-up messages (not counted), written for this benchmark: product questions the Bitext FAQ
#: does not answer, so the first remote calls (and the tier classifier's training) happen here.
WARMUP = (
    "Does the walnut side table come in a darker stain?",
    "Is the linen duvet cover available in king size?",
    "Can the garden bench stay outside in winter?",
    "Does the rice cooker have a keep-warm setting?",
    "Is the wool rug suitable for underfloor heating?",
    "Does the desk lamp work with a smart plug?",
    "Are the hiking socks made of merino wool?",
    "Is the glass teapot safe on a gas hob?",
    "Does the baby carrier fit a newborn?",
    "Can the bookshelf be used as a room divider?",
)
SHOPPING = re.compile(
    r"\b(order|buy|bought|deliver|delivery|shipping|ship|refund|return|amazon|price|discount|"
    r"coupon|purchase|online shopping|flipkart|ebay|product|payment)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Item:
    """One message: its source set and text."""

    set_name: str
    text: str


@dataclass
class Outcome:
    """What one message got: the route of ``stream.end`` (or ``timeout`` / ``error:...``), its
    model and usage, and times in ms from sending the message; ``direct_ms`` is the direct SDK's
    time to first content chunk for the same question."""

    item: Item
    route: str = "timeout"
    model: str = ""
    usage: dict[str, Any] = field(default_factory=dict)
    first_delta_ms: float | None = None
    direct_ms: float | None = None


def load_items(shared: Path, n: int) -> list[Item]:
    """``n`` messages in the mix of the module docstring (about 40 % Bitext eval, 25 % other Bitext
    rows, 15 % CLINC oos, 10 % exact repeats, 10 % QQP paraphrase pairs), shuffled (seed 7);
    every repeat and second paraphrase comes after its first question."""
    rng = random.Random(7)
    data = shared / "data"
    ev = [json.loads(line)["text"] for line in (data / "bitext" / "faq_eval_public.jsonl").open(encoding="utf-8")]
    seed = [json.loads(line) for line in (data / "bitext" / "faq_seed.jsonl").open(encoding="utf-8")]
    taken = set(ev) | {s["question"] for s in seed} | {v for s in seed for v in s.get("variants", [])}
    with (data / "bitext" / "bitext_customer_support_public.csv").open(encoding="utf-8", newline="") as f:
        rest = list(dict.fromkeys(r["instruction"] for r in csv.DictReader(f) if r["instruction"] not in taken))
    clinc = json.loads((data / "clinc150" / "data_full_public.json").read_text(encoding="utf-8"))
    pairs = []
    with (data / "qqp" / "qqp_pairs_public.jsonl").open(encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r.get("label") == 1 and SHOPPING.search(r["text_a"]) and SHOPPING.search(r["text_b"]):
                pairs.append((r["text_a"], r["text_b"]))
            if len(pairs) >= 2000:
                break
    k_ev, k_rest, k_oos = round(n * 0.40), round(n * 0.25), round(n * 0.15)
    k_rep = round(n * 0.10)
    k_pairs = max(0, (n - k_ev - k_rest - k_oos - k_rep) // 2)
    firsts = (
        [Item("bitext_eval", t) for t in rng.sample(ev, min(k_ev, len(ev)))]
        + [Item("bitext_other", t) for t in rng.sample(rest, k_rest)]
        + [Item("clinc_oos", str(q)) for q, _ in rng.sample(clinc["oos_test"], k_oos)]
    )
    chosen_pairs = rng.sample(pairs, min(k_pairs, len(pairs)))
    firsts += [Item("qqp_first", a) for a, _ in chosen_pairs]
    rng.shuffle(firsts)
    seconds = [Item("repeat", i.text) for i in rng.sample(firsts, min(k_rep, len(firsts)))]
    seconds += [Item("qqp_paraphrase", b) for _, b in chosen_pairs]
    out = list(firsts)
    first_of = {b: a for a, b in chosen_pairs}
    for it in seconds:  # each repeat / second paraphrase at a random place after its first question
        first = it.text if it.set_name == "repeat" else first_of[it.text]
        after = next(i for i, x in enumerate(out) if x.text == first)
        out.insert(rng.randint(after + 1, len(out)), it)
    return out


async def ask_kefu(port: int, out: Outcome) -> None:
    """One message on a new socket (hello, message, frames until ``stream.end``; after a handoff
    until its ``status`` frame)."""
    try:
        async with connect(
            f"ws://127.0.0.1:{port}/ws/chat/",
            origin=f"http://127.0.0.1:{port}",  # type: ignore[arg-type]
            proxy=None,
            open_timeout=10,
            close_timeout=5,
        ) as ws:
            await ws.send(json.dumps({"type": "hello"}))
            await asyncio.wait_for(ws.recv(), QUESTION_TIMEOUT_S)
            t0 = time.perf_counter()
            await ws.send(
                json.dumps(
                    {"type": "message", "client_id": str(uuid.uuid4()), "text": out.item.text}, ensure_ascii=False
                )
            )
            while True:
                f = json.loads(await asyncio.wait_for(ws.recv(), QUESTION_TIMEOUT_S))
                kind = f.get("type")
                if kind == "stream.delta" and out.first_delta_ms is None:
                    out.first_delta_ms = (time.perf_counter() - t0) * 1000
                elif kind == "stream.end":
                    out.route, out.model, out.usage = (
                        str(f.get("route")),
                        str(f.get("model") or ""),
                        f.get("usage") or {},
                    )
                    if out.route != "handoff":
                        return
                elif kind == "status" and out.route == "handoff":
                    return
                elif kind == "error" and out.route == "timeout":
                    out.route = f"error:{f.get('code')}"
                    return
    except TimeoutError:
        pass
    except (ConnectionClosed, OSError, WebSocketException, ValueError) as e:
        out.route = f"exception:{type(e).__name__}"


async def ask_direct(client: Any, text: str) -> float | None:
    """Time to the first content chunk (ms) of the same question sent straight to the upstream."""
    t0 = time.perf_counter()
    stream = await client.chat.completions.create(
        model="fake-simple", messages=[{"role": "user", "content": text}], stream=True
    )
    first = None
    async for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = (time.perf_counter() - t0) * 1000
    return first


async def replay(port: int, upstream: str, items: Sequence[Item], concurrency: int) -> list[Outcome]:
    """Every item through kefu, then the same text straight to the upstream, ``concurrency``
    workers; outcomes in item order."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(api_key="bench-key", base_url=upstream, max_retries=0, timeout=QUESTION_TIMEOUT_S)
    outcomes = [Outcome(it) for it in items]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(items)):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            await ask_kefu(port, outcomes[i])
            outcomes[i].direct_ms = await ask_direct(client, items[i].text)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await client.close()
    return outcomes


def usd(tier: str, prompt: float, completion: float) -> float:
    p_in, p_out = PRICES[tier]
    return (prompt * p_in + completion * p_out) / 1e6


def report(outcomes: Sequence[Outcome], warmup: int, args: argparse.Namespace, wall_s: float) -> str:
    counted = list(outcomes[warmup:])
    n = len(counted)
    routes = Counter(o.route for o in counted)
    lines = [
        f"**Routes** ({n} messages after {warmup} warm-up; {wall_s:.0f} s):",
        "",
        "| route | messages | share |",
        "|---|---:|---:|",
    ]
    for r, c in sorted(routes.items(), key=lambda rc: -rc[1]):
        lines.append(f"| `{r}` | {c} | {c / n:.1%} |")
    by_set: dict[str, Counter[str]] = {}
    for o in counted:
        by_set.setdefault(o.item.set_name, Counter())[o.route] += 1
    lines += ["", "| source | messages | routes |", "|---|---:|---|"]
    for s, c in by_set.items():
        lines.append(f"| {s} | {sum(c.values())} | " + ", ".join(f"{r} {k}" for r, k in c.most_common()) + " |")

    remote = [o for o in counted if o.route.startswith("llm.")]
    cost = sum(float(o.usage.get("cost_usd") or 0) for o in counted)
    saved = sum(float(o.usage.get("saved_usd") or 0) for o in counted)
    prompt = [float(o.usage.get("prompt_tokens") or 0) for o in remote]
    completion = [float(o.usage.get("completion_tokens") or 0) for o in remote]
    same_complex = sum(usd("complex", p, c) for p, c in zip(prompt, completion))
    mean_p = float(np.mean(prompt)) if prompt else 0.0
    mean_c = float(np.mean(completion)) if completion else 0.0
    every_complex = same_complex + (n - len(remote)) * usd("complex", mean_p, mean_c)
    lines += [
        "",
        "**Cost** (USD; list prices, tokens as the test server counts them: "
        f"mean {mean_p:.0f} prompt / {mean_c:.0f} completion per remote call):",
        "",
        "| | USD | kefu as a share |",
        "|---|---:|---:|",
        f"| kefu (sum of `cost_usd`) | {cost:.6f} | — |",
        f"| saved by FAQ and cache answers (`saved_usd`) | {saved:.6f} | — |",
        f"| the same {len(remote)} remote calls, all at `complex` | {same_complex:.6f} | {cost / same_complex:.1%} |"
        if same_complex
        else "| the same remote calls, all at `complex` | 0 | — |",
        f"| every message at `complex` | {every_complex:.6f} | {cost / every_complex:.1%} |"
        if every_complex
        else "| every message at `complex` | 0 | — |",
    ]

    kefu = [o.first_delta_ms for o in remote if o.first_delta_ms is not None]
    direct = [o.direct_ms for o in counted if o.direct_ms is not None]
    if kefu and direct:
        k50, k99 = np.percentile(kefu, [50, 99])
        d50, d99 = np.percentile(direct, [50, 99])
        lines += [
            "",
            f"**Time to first token** (upstream first token after {args.ttft_ms:.0f} ms; kefu: its "
            f"{len(kefu)} `llm.*` answers; direct: the `openai` SDK, every message, interleaved):",
            "",
            "| | p50 ms | p99 ms |",
            "|---|---:|---:|",
            f"| kefu over `/ws/chat/` | {k50:.1f} | {k99:.1f} |",
            f"| `openai` SDK straight to the upstream | {d50:.1f} | {d99:.1f} |",
            f"| **added by kefu** | **{k50 - d50:+.1f}** | **{k99 - d99:+.1f}** |",
        ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    ap.add_argument("-n", type=int, default=400, help="messages (plus --warmup)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--ttft-ms", type=float, default=200.0)
    ap.add_argument("--token-ms", type=float, default=10.0)
    ap.add_argument("--port", type=int, default=0)
    args = ap.parse_args(argv)

    items = [Item("warmup", WARMUP[i % len(WARMUP)]) for i in range(args.warmup)] + load_items(args.shared, args.n)
    uport = free_port()
    py = sys.executable
    upstream = subprocess.Popen(
        [
            py,
            str(ROOT / "tests" / "fake_openai.py"),
            "--port",
            str(uport),
            "--ttft-ms",
            str(args.ttft_ms),
            "--token-ms",
            str(args.token_ms),
            "--text",
            ANSWER,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    server = Server(
        port=args.port or free_port(), seed_path=args.shared / "data" / "bitext" / "faq_seed.jsonl", python=py
    )
    base_url = f"http://127.0.0.1:{uport}/v1"
    server.env.update(
        OPENAI_BASE_URL=base_url,
        OPENAI_API_KEY="bench-key",
        KEFU_SIMPLE_MODEL="fake-simple",
        KEFU_MEDIUM_MODEL="fake-medium",
        KEFU_COMPLEX_MODEL="fake-complex",
        KEFU_MAX_SOCKETS_PER_IP=str(max(16, 2 * args.concurrency)),
    )
    try:
        assert upstream.stdout is not None
        line = upstream.stdout.readline().decode()
        if "listening" not in line:
            raise RuntimeError(f"the test server did not start: {line!r}")
        server.start()
        t0 = time.perf_counter()
        outcomes = asyncio.run(replay(server.port, base_url, items, args.concurrency))
        wall = time.perf_counter() - t0
    finally:
        server.stop()
        try:
            os.killpg(upstream.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        upstream.wait(timeout=10)
    cmd = " ".join(shlex.quote(a) for a in [".venv/bin/python", "bench/replay.py", *(argv or sys.argv[1:])])
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(
        f"# Replay through the tiered router\n\n`{cmd}` — {dt.datetime.now():%Y-%m-%d %H:%M}, "
        f"{os.cpu_count()} CPUs, load {load:.1f}, concurrency {args.concurrency}\n"
    )
    print(report(outcomes, args.warmup, args, wall))


if __name__ == "__main__":
    main()
