"""Two workers, one budget, first requests at the same moment (issue: trust): the race that lets
every request through LiteLLM's end-user budgets. Two real Daphne processes on PostgreSQL and a
private Redis; two anonymous shoppers behind one address, each on its own worker, ask at once.
The address budget ($1.00 a day) holds one call's maximum ($0.60: 600 tokens at $1,000 per
million) but not two: exactly one shopper gets a model's answer, the other the polite notice
and a person, and the budget's spend is the one call's cost."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
import websockets

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fake_openai import Behaviour, running_fake_openai

from routing.decide.answers import budget_text

pytestmark = pytest.mark.asyncio

QUESTIONS = (
    "Does the walnut floor lamp come with a dimmer switch?",
    "Is the oak side table finished with a natural oil?",
)


async def recv(ws: Any, timeout: float = 60) -> dict[str, Any]:
    return json.loads(await asyncio.wait_for(ws.recv(), timeout))


async def ask(ws: Any, text: str, ready: asyncio.Event, start: asyncio.Event) -> dict[str, Any]:
    await ws.send(json.dumps({"type": "hello"}))
    assert (await recv(ws))["type"] == "conversation"
    ready.set()
    await start.wait()
    await ws.send(json.dumps({"type": "message", "client_id": "q-1", "text": text}))
    while (f := await recv(ws))["type"] != "stream.end":
        pass
    return f


async def test_two_workers_racing_one_address_budget_let_one_call_through(
    live_kefu: Any, private_redis: Any, pg_database: str
) -> None:
    # Both calls are in flight together: the first token comes after 1.5 s.
    with running_fake_openai(default=Behaviour(ttft_ms=1500, prompt_tokens=100, completion_tokens=20)) as upstream:
        prices = {
            f"KEFU_{tier}_PRICE_{kind}": price
            for tier in ("SIMPLE", "MEDIUM", "COMPLEX")
            for kind, price in (("INPUT", "0"), ("CACHED_INPUT", "0"), ("OUTPUT", "1000"))
        }
        env = {
            "DATABASE_URL": pg_database,
            "REDIS_URL": private_redis.url,
            "OPENAI_API_KEY": "upstream-key",
            "OPENAI_BASE_URL": upstream.base_url,
            "KEFU_LLM_MAX_TOKENS": "600",
            "KEFU_BUDGET_ADDRESS_DAY_USD": "1.00",
            "KEFU_BUDGET_SHOPPER_DAY_USD": "10",
            "KEFU_BUDGET_SHOPPER_MONTH_USD": "100",
            "KEFU_CACHE_ENABLED": "false",
            **prices,
        }
        one, two = live_kefu(env=env), live_kefu(env=env, faq_path=None)
        start, ready = asyncio.Event(), [asyncio.Event(), asyncio.Event()]
        async with (
            websockets.connect(one.ws, origin=one.base) as a,
            websockets.connect(two.ws, origin=two.base) as b,
        ):
            tasks = [
                asyncio.ensure_future(ask(ws, text, ok, start))
                for ws, text, ok in zip((a, b), QUESTIONS, ready, strict=True)
            ]
            await asyncio.wait_for(asyncio.gather(*(r.wait() for r in ready)), 60)
            start.set()  # both conversations exist: the two questions leave together
            ends = await asyncio.gather(*tasks)

    routes = sorted(e["route"] for e in ends)
    assert routes[0] == "handoff" and routes[1].startswith("llm."), routes
    notice = next(e for e in ends if e["route"] == "handoff")
    assert notice["text"] == budget_text("en")
    assert len(upstream.requests) == 1
    # The ledger row, and the settling with it, are written just after the answer ends.
    deadline = time.monotonic() + 30
    with psycopg.connect(pg_database, autocommit=True) as db:
        while True:
            rows = db.execute(
                "SELECT spent_usd, reserved_usd, limit_usd FROM routing_budgetcounter "
                "WHERE kind = 'address' AND period = 'day'"
            ).fetchall()
            if (rows and rows[0][1] == 0) or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
        ledger = db.execute("SELECT cost_usd, error_code FROM routing_upstreamcall ORDER BY id").fetchall()
    # 20 completion tokens x $1,000/M = $0.02, settled in place of the $0.60 held
    assert rows == [(Decimal("0.020000"), Decimal("0.000000"), Decimal("1.000000"))]
    # The refused call is booked once, on the simple tier: medium and complex only inherit OPENAI_*
    # here, so they are not in its fallback chain (issue 28; before, each was tried and refused too).
    assert sorted(code for _cost, code in ledger) == ["", "budget"]
    assert sum(cost for cost, _code in ledger) == Decimal("0.02")
