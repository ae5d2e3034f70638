"""Summaries only for what a prompt needs (issue 29, item 3), in production shape: a Daphne worker
on PostgreSQL and a private Redis, summaries made by a Celery worker, a shopper on a real
WebSocket, the project's test upstream.

The trial of the issue: 10,000 FAQ-answered questions in one conversation caused 4,931 summary
calls, none on the shopper's budget. Here 1,000 FAQ-answered questions cause none; then 40
questions a model answers, with a window of 2 turns and summaries in batches of 2 (the production
default), cause one summary per window: after the 4th answer, the 6th, ... the 40th (19), each
folding in the two turns that left the window since the one before; and every summary's cost is
on the shopper's budget like her answers'. Waits are for conditions (the summary stored), never
fixed sleeps. In process, case by case: tests/routing/test_summary.py.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
import websockets

from tests.processes import celery_worker
from tests.sockets import frames_until

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import TEST_FAQ
from fake_openai import Behaviour, running_fake_openai

pytestmark = pytest.mark.asyncio

#: What kefu's summary prompt starts with (routing.prompt.summary.SUMMARY_SYSTEM_PROMPT).
SUMMARY_PROMPT_START = "You keep a running summary"
FAQ_QUESTIONS = [t for r in TEST_FAQ if r["locale"] == "en" for t in (r["question"], *r["variants"])]
ITEMS = ["oak side table", "walnut floor lamp", "linen sofa cover", "rattan lounge chair", "velvet cushion"]
COLOURS = ["white", "black", "green", "navy", "grey", "red", "yellow", "beige"]
#: 40 standalone product questions, none of them in the FAQ.
MODEL_QUESTIONS = [f"Does the {item} come in {colour}?" for colour in COLOURS for item in ITEMS]
#: The longest wait for a summary to be stored, seconds (a loaded 2-core machine; never slept).
SUMMARY_WAIT_S = 120.0


def summary_requests(upstream: Any) -> list[dict[str, Any]]:
    """The upstream requests that were summary calls."""
    return [r for r in upstream.requests if r["messages"][0]["content"].startswith(SUMMARY_PROMPT_START)]


def stored_summary(pg: str, conversation: str) -> int:
    with psycopg.connect(pg) as db:
        row = db.execute(
            "SELECT summary_upto_seq FROM chat_conversation WHERE id = %s", (uuid.UUID(conversation),)
        ).fetchone()
    assert row is not None
    return int(row[0])


async def ask(ws: Any, text: str) -> dict[str, Any]:
    """Send ``text``; its answer's ``stream.end``."""
    await ws.send(json.dumps({"type": "message", "client_id": str(uuid.uuid4()), "text": text}))
    return (await frames_until(ws, "stream.end", timeout=60))[-1]


# A Daphne worker migrates, imports the FAQ and warms up before it is healthy (~60 s on the 2-core
# machine under load), then 1,040 answers and 19 summaries.
@pytest.mark.timeout(1200)
async def test_faq_questions_buy_no_summary_and_model_questions_one_per_window_on_the_shoppers_budget(
    live_kefu: Any, private_redis: Any, pg_database: str, tmp_path: Path
) -> None:
    with running_fake_openai(default=Behaviour(prompt_tokens=500, completion_tokens=60)) as upstream:
        env = {
            "DATABASE_URL": pg_database,
            "REDIS_URL": private_redis.url,
            "OPENAI_API_KEY": "upstream-key",
            "OPENAI_BASE_URL": upstream.base_url,
            "KEFU_CONTEXT_TURNS": "2",
            "KEFU_SUMMARY_MIN_TURNS": "2",
            "KEFU_CACHE_ENABLED": "false",  # each model question reaches the model
            "KEFU_MESSAGES_PER_MINUTE_PER_IP": "100000",
            "KEFU_BUDGETS_ENABLED": "true",
            "KEFU_BUDGET_SHOPPER_DAY_USD": "5",
        }
        kefu = live_kefu(env=env)
        worker = celery_worker({**kefu.env, **env}, tmp_path / "worker.log")
        try:
            async with websockets.connect(kefu.ws, origin=kefu.base) as ws:
                await ws.send(json.dumps({"type": "hello"}))
                faq_conversation = json.loads(await ws.recv())["id"]
                routes = [(await ask(ws, FAQ_QUESTIONS[i % len(FAQ_QUESTIONS)]))["route"] for i in range(1000)]
            assert routes == ["faq"] * 1000
            assert summary_requests(upstream) == [] and upstream.requests == []

            async with websockets.connect(kefu.ws, origin=kefu.base) as ws:
                await ws.send(json.dumps({"type": "hello"}))
                conversation = json.loads(await ws.recv())["id"]
                for n, question in enumerate(MODEL_QUESTIONS, 1):
                    end = await ask(ws, question)
                    assert end["route"].startswith("llm."), end
                    if n >= 4 and n % 2 == 0:
                        # The n-th prompt left turn n-3 out: after its answer turns 1..n-2 left the
                        # window, and the summary reaches the answer of turn n-2 (seq 2(n-2)).
                        deadline = time.monotonic() + SUMMARY_WAIT_S
                        while stored_summary(pg_database, conversation) < 2 * (n - 2):
                            assert time.monotonic() < deadline and worker.poll() is None, (
                                tmp_path / "worker.log"
                            ).read_text()[-3000:]
                            time.sleep(0.1)
                        assert len(summary_requests(upstream)) == (n - 2) // 2, n
            # Every summary folded in exactly the two turns that left the window since the one before.
            summaries = summary_requests(upstream)
            assert len(summaries) == 19
            for k, request in enumerate(summaries):
                transcript = request["messages"][-1]["content"]
                new_turns = transcript.rsplit("New turns:\n", 1)[1]  # the summary so far may quote a transcript
                assert [line for line in new_turns.splitlines() if line.startswith("Shopper: ")] == [
                    f"Shopper: {q}" for q in MODEL_QUESTIONS[2 * k : 2 * k + 2]
                ]

            # The summaries' cost is on the shopper's budget with her answers': the conversation's
            # counter holds every ledger row of the conversation (the ledger's rows land shortly after).
            deadline = time.monotonic() + SUMMARY_WAIT_S
            while True:
                with psycopg.connect(pg_database) as db:
                    rows = db.execute(
                        "SELECT purpose, cost_usd FROM routing_upstreamcall WHERE conversation_id = %s",
                        (uuid.UUID(conversation),),
                    ).fetchall()
                    counter = db.execute(
                        "SELECT spent_usd, reserved_usd FROM routing_budgetcounter "
                        "WHERE kind = 'conversation' AND key = %s AND period = 'day'",
                        (conversation,),
                    ).fetchone()
                if len(rows) == 40 + 19 and counter is not None and counter[1] == 0:
                    break
                assert time.monotonic() < deadline, (len(rows), counter)
                time.sleep(0.1)
            summary_cost = sum((cost for purpose, cost in rows if purpose == "summary"), Decimal(0))
            assert sorted({purpose for purpose, _ in rows}) == ["answer", "summary"]
            assert summary_cost > 0
            assert counter[0] == sum((cost for _, cost in rows), Decimal(0))
            assert stored_summary(pg_database, faq_conversation) == 0
        finally:
            worker.terminate()
            worker.wait(20)
        assert len(summary_requests(upstream)) == 19  # and none came late, from either conversation
