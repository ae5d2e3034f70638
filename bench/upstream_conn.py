"""Upstream connections: what a kept (warm) connection and HTTP/2 save, measured through kefu's
provider (``routing.providers.openai_remote``, the real ``openai`` client) against a TLS upstream
that speaks HTTP/2 and HTTP/1.1 (``tests/tls_upstream.py``, in its own process so that the CPU
figures are the client's alone).

1. **Cold vs warm first token**, one call at a time (``--calls`` each, alternating): *cold* is a
   call on a new connection (TCP connect and TLS 1.3 handshake before the request leaves: what
   the HTTP client's 5 s keep-alive gave nearly every answer of a quiet store), *warm* a call on
   a pooled connection (what ``KEFU_UPSTREAM_KEEPALIVE_S`` and ``KEFU_UPSTREAM_KEEPWARM_S`` keep).
   The upstream answers at once, so the difference is the connection's cost: the CPU and
   loopback time here, plus two network round trips (TCP, then TLS) to a real upstream.
2. **Concurrent streams, HTTP/1.1 vs HTTP/2** (``--streams`` streams of ``--chunks`` chunks
   ``--gap-ms`` apart, ``--rounds`` rounds each, alternating, on warm pools): connections used,
   client CPU per stream (ms, ``time.process_time`` of this process over the round) and the
   gap between two chunks as the client reads them (p50 / p99, ms; the upstream paces them
   ``--gap-ms`` apart).

    .venv/bin/python bench/upstream_conn.py
    .venv/bin/python bench/upstream_conn.py --calls 200 --streams 64 --rounds 3

Percentiles are numpy's (linear interpolation). Client and upstream share the machine's cores.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import re
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from routing.providers.base import ChatRequest, ProviderConfig, TextDelta  # noqa: E402
from routing.providers.openai_remote import OpenAIProvider, close_clients, get_client  # noqa: E402

MESSAGES = [{"role": "user", "content": "Do you ship to Canada?"}]
REQUEST = ChatRequest(messages=MESSAGES, model="gpt-4o-mini")
ONE_TOKEN = ChatRequest(messages=MESSAGES, model="gpt-4o-mini", max_tokens=1)  # the upstream sends 1 chunk


def start_upstream(*, chunks: int, gap_ms: float) -> tuple[subprocess.Popen[str], str]:
    """The TLS upstream in a child process; (process, base URL). Its CA goes to SSL_CERT_FILE."""
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "tests" / "tls_upstream.py"), "--chunks", str(chunks), "--gap-ms", str(gap_ms)],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    match = re.match(r"listening on (\S+) ca=(\S+)", line)
    if match is None:
        proc.kill()
        raise SystemExit(f"the TLS upstream did not start: {line!r}")
    os.environ["SSL_CERT_FILE"] = match.group(2)
    return proc, match.group(1)


async def one_call(config: ProviderConfig, request: ChatRequest = REQUEST) -> tuple[float, list[float]]:
    """(time to first token ms, arrival times of each chunk in s)."""
    started = time.perf_counter()
    first: float | None = None
    arrivals: list[float] = []
    async for item in OpenAIProvider(config).stream(request):
        if isinstance(item, TextDelta):
            now = time.perf_counter()
            first = first if first is not None else (now - started) * 1000
            arrivals.append(now)
    assert first is not None
    return first, arrivals


async def cold_vs_warm(config: ProviderConfig, calls: int) -> dict[str, tuple[list[float], list[float]]]:
    """{"cold"|"warm": (ttft ms, CPU ms per call)}. Cold: the same client with a keep-alive of
    1 ms, idle 20 ms before each call (its pooled connection expired: a new one is opened)."""
    cold = replace(config, keepalive_s=0.001)
    out: dict[str, tuple[list[float], list[float]]] = {"cold": ([], []), "warm": ([], [])}
    for c in (config, cold):
        await one_call(c, ONE_TOKEN)  # each client's first call
    for _ in range(calls):
        for mode in ("cold", "warm"):
            if mode == "cold":
                await asyncio.sleep(0.02)
            else:
                await one_call(config, ONE_TOKEN)  # make sure a pooled connection is there
            cpu = time.process_time()
            ttft, _ = await one_call(cold if mode == "cold" else config, ONE_TOKEN)
            out[mode][0].append(ttft)
            out[mode][1].append((time.process_time() - cpu) * 1000)
    await close_clients()
    return out


async def concurrent(config: ProviderConfig, streams: int) -> tuple[float, list[float]]:
    """One round: (client CPU ms per stream, chunk gaps ms)."""
    await asyncio.gather(*(one_call(config) for _ in range(streams)))  # warm the pool to `streams`
    cpu = time.process_time()
    results = await asyncio.gather(*(one_call(config) for _ in range(streams)))
    cpu_ms = (time.process_time() - cpu) * 1000 / streams
    gaps = [(b - a) * 1000 for _, arrivals in results for a, b in itertools.pairwise(arrivals)]
    return cpu_ms, gaps


def p(values: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(values), q))


async def main_async(args: argparse.Namespace) -> None:
    proc, base_url = start_upstream(chunks=args.chunks, gap_ms=args.gap_ms)
    try:
        h1 = ProviderConfig(base_url=base_url, api_key="bench", http2=False, keepalive_s=90)
        h2 = ProviderConfig(base_url=base_url, api_key="bench", http2=True, keepalive_s=90)
        print(f"## 1. Cold vs warm connection ({args.calls} calls each, HTTP/1.1 over TLS, one at a time)\n")
        print("| connection | first token p50 / p99 (ms) | client CPU per call p50 (ms) |")
        print("|---|---|---|")
        res = await cold_vs_warm(h1, args.calls)
        for mode in ("cold", "warm"):
            ttft, cpu = res[mode]
            print(f"| {mode} | {p(ttft, 50):.2f} / {p(ttft, 99):.2f} | {p(cpu, 50):.2f} |")
        saved = p(res["cold"][0], 50) - p(res["warm"][0], 50)
        print(f"\nwarm saves {saved:.2f} ms at p50 here, plus 2 round trips to a real upstream.\n")
        print(
            f"## 2. {args.streams} concurrent streams of {args.chunks} chunks {args.gap_ms:g} ms apart "
            f"({args.rounds} rounds each)\n"
        )
        print("| protocol | connections | client CPU per stream (ms) | chunk gap p50 / p99 (ms) |")
        print("|---|---|---|---|")
        figures: dict[str, tuple[list[float], list[float]]] = {"HTTP/1.1": ([], []), "HTTP/2": ([], [])}
        for _ in range(args.rounds):
            for name, config in (("HTTP/1.1", h1), ("HTTP/2", h2)):
                cpu_ms, gaps = await concurrent(config, args.streams)
                figures[name][0].append(cpu_ms)
                figures[name][1].extend(gaps)
        for name, config in (("HTTP/1.1", h1), ("HTTP/2", h2)):
            pool = get_client(config)._client._transport._pool  # type: ignore[attr-defined]
            cpus, gaps = figures[name]
            print(
                f"| {name} | {len(pool.connections)} | {np.mean(cpus):.2f} "
                f"(rounds: {', '.join(f'{c:.2f}' for c in cpus)}) | {p(gaps, 50):.2f} / {p(gaps, 99):.2f} |"
            )
        await close_clients()
    finally:
        proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--chunks", type=int, default=64)
    parser.add_argument("--gap-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
